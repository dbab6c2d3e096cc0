"""LD-Agent's event memory, retrieval score and persona banks with a fake LLM."""

from __future__ import annotations

import asyncio
import math
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from fake_chat import FakeChat
from stages.methods.base import BuildContext, EpisodeInput, ProbeInput, visible_memory
from stages.methods.ld_agent import (NO_TRAIT, LDAgent, LDAgentSettings, elapsed_words, gap_seconds,
                                     retrieval_scores, session_times, topic_overlap)


class WordNouns(LDAgent):
    """LD-Agent with words standing in for spaCy's nouns, so these tests need no model."""

    nouns = staticmethod(lambda text: [w.strip(".,:").lower() for w in text.split() if len(w) > 3])


def test_retrieval_score_is_decay_times_semantic_plus_topic_overlap():
    # |Vq & Vk| = 2 of |Vq| = 2 and |Vk| = 4: s_top = (2/2 + 2/4) / 2 = 0.75
    top = topic_overlap({"dog", "park"}, {"dog", "walk", "park", "leash"})
    assert top == pytest.approx(0.75)
    paper = LDAgentSettings(tau_s=1e7, gamma=0.3)
    [score] = retrieval_scores([0.6], [top], [1e7], paper)
    assert score == pytest.approx(math.exp(-1) * 1.35)
    reference = LDAgentSettings(tau_s=1e7, scoring="reference_code")
    assert retrieval_scores([0.6], [top], [1e7], reference) == [pytest.approx(math.exp(-1) * 0.75)]
    # below gamma (paper) or without shared nouns (reference code): not retrievable
    assert retrieval_scores([0.2, 0.9], [0.75, 0.0], [0, 0], paper) == [None, pytest.approx(0.9)]
    assert retrieval_scores([0.9], [0.0], [0], reference) == [None]
    assert topic_overlap(set(), {"dog"}) == 0.0


def test_times_come_from_dates_gap_labels_or_a_fixed_gap():
    assert gap_seconds("3 days later") == 3 * 86400 and gap_seconds("a few months later") == 3 * 30 * 86400
    assert gap_seconds("some time later") is None and gap_seconds("a year later") == 365 * 86400
    day = datetime(2024, 3, 1)
    dated = {1: [{"session_time": day}], 2: [{"session_time": day + timedelta(days=2)}]}
    assert session_times(dated, 100.0)[2] == (datetime(2024, 3, 3, tzinfo=timezone.utc).timestamp(), "date")
    labelled = {1: [{}], 2: [{"session_gap_label": "2 weeks later"}], 3: [{}]}
    assert session_times(labelled, 100.0) == {1: (0.0, "fixed_gap"), 2: (14 * 86400, "gap_label"),
                                             3: (14 * 86400 + 100.0, "fixed_gap")}
    assert elapsed_words(3 * 86400 + 5) == "3 days ago" and elapsed_words(61 * 86400) == "2 months ago"
    assert elapsed_words(10) == "just now"


def episode(times: list[datetime | None]) -> EpisodeInput:
    sessions = {}
    for s, when in enumerate(times, start=1):
        sessions[s] = [{"speaker": "Ann", "text": f"my dog park story {s}", "turn_idx": 0, "session_time": when},
                       {"speaker": "Bob", "text": f"nice weather {s}", "turn_idx": 1, "session_time": when}]
    return EpisodeInput(episode={"episode_id": "e1", "speakers": ["Ann", "Bob"]}, sessions=sessions)


def responder(messages, schema):
    text = messages[-1]["content"]
    if "Summary:" in text:
        return "Ann talked about her dog."
    if "personal trait" in text:
        return NO_TRAIT if "Bob said" in text else "I have a dog."
    return "Bob: That sounds fun!"


def embed(texts: list[str]) -> np.ndarray:
    return np.array([[1.0, 0.1 * len(t) % 1] for t in texts], dtype=np.float32)


def build(times, **settings):
    llm = FakeChat(responder=responder)
    out = asyncio.run(WordNouns().build(BuildContext(llm=llm, settings=LDAgentSettings(**settings), embed=embed),
                                        episode(times)))
    return out, llm


def test_a_gap_longer_than_beta_flushes_the_cache_into_an_event():
    # No times: sessions are a fixed week apart, so every session becomes one event.
    out, _ = build([None, None, None])
    assert [e["session_idx"] for e in out["events"]] == [1, 2, 3]
    assert {e["time_source"] for e in out["events"]} == {"fixed_gap"}
    assert {"park", "story", "weather"} <= set(out["events"][0]["nouns"])  # from the conversation, not the summary
    # Dated sessions ten minutes apart stay in one cache (gap < beta); a day later flushes.
    t0 = datetime(2024, 3, 1, 9)
    out, _ = build([t0, t0 + timedelta(minutes=10), t0 + timedelta(days=1)])
    assert [(e["session_idx"], e["turns"]) for e in out["events"]] == [(2, 4), (3, 2)]
    assert {e["time_source"] for e in out["events"]} == {"date"}


def test_no_trait_is_dropped_and_persona_banks_stay_per_speaker():
    out, llm = build([None, None])
    personas = out["personas"]
    assert {p["speaker"] for p in personas if p["trait"]} == {"Ann"}
    assert all(p["trait"] is None for p in personas if p["speaker"] == "Bob")
    assert len([c for c in llm.calls if "personal trait" in c["messages"][-1]["content"]]) == 4  # one per utterance


def probe_in(session: int, ep: EpisodeInput) -> ProbeInput:
    row = {"probe_id": "p", "kind": "next_response", "session_idx": session, "turn_idx": 1, "respondent": "Bob",
           "request": ep.sessions[session][0]["text"]}
    return ProbeInput(probe=row, episode=ep.episode, history={s: t for s, t in ep.sessions.items() if s < session},
                      current=ep.sessions[session][:1], embed=embed)


def test_the_generator_gets_traits_memory_in_words_and_no_memory_from_its_own_session():
    ep = episode([None, None, None])
    out, _ = build([None, None, None], dedupe_personas=True, gamma=-1.0)
    memory = {t: visible_memory(rows, 3, 1, "log") for t, rows in out.items()}
    assert {e["session_idx"] for e in memory["events"]} == {1, 2}
    llm = FakeChat(responder=responder)
    answer = asyncio.run(WordNouns().answer(llm, probe_in(3, ep), memory, LDAgentSettings(dedupe_personas=True,
                                                                                           gamma=-1.0)))
    prompt = llm.calls[0]["messages"]
    assert "Traits of yours" in prompt[0]["content"] and "I have a dog." in prompt[1]["content"]
    assert prompt[1]["content"].count("I have a dog.") == 1  # deduplicated
    assert "1 week ago" in prompt[1]["content"] and answer.text == "That sounds fun!"
    assert len(answer.used_ids) == 1 and not answer.details["no_relevant_memory"]


def test_when_nothing_passes_gamma_the_generator_is_told_there_is_no_relevant_memory():
    ep = episode([None, None, None])
    out, _ = build([None, None, None])
    memory = {t: visible_memory(rows, 3, 1, "log") for t, rows in out.items()}
    llm = FakeChat(responder=responder)
    answer = asyncio.run(WordNouns().answer(llm, probe_in(3, ep), memory, LDAgentSettings(gamma=0.9999)))
    assert "No relevant memory." in llm.calls[0]["messages"][1]["content"]
    assert answer.used_ids == [] and answer.details["no_relevant_memory"]


def test_spacy_nouns_are_lemmas_of_noun_tokens():
    from stages.methods.ld_agent import spacy_nouns

    assert spacy_nouns("I walked my dogs in the parks with two friends") == ["dog", "park", "friend"]


def test_on_the_sample_corpus_ld_agent_answers_every_probe(run_cfg, fake_llm):
    from pipeline.artifacts import StageDir
    from pipeline.runner import Runner
    from stages import registry

    cfg = run_cfg("corpus.limit=1", "methods=[ld_agent]", "stages=[ingest,probes,memory_ld_agent,respond_ld_agent]")
    Runner(cfg, registry(cfg)).run()
    memory = StageDir(cfg.run_dir, "memory_ld_agent")
    events = memory.read_table("events").to_pylist()
    sessions = StageDir(cfg.run_dir, "ingest").read_table("episodes").to_pylist()[0]["n_sessions"]
    assert len(events) == sessions and all(e["nouns"] for e in events)  # dated sessions days apart: one each
    assert memory.read_table("personas").num_rows == StageDir(cfg.run_dir, "ingest").read_table("turns").num_rows
    responses = StageDir(cfg.run_dir, "respond_ld_agent").read_table("responses").to_pylist()
    assert len(responses) == StageDir(cfg.run_dir, "probes").manifest().rows
    assert all(r["error"] is None and r["response"] is not None for r in responses)
