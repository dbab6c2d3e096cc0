"""LD-Agent's event memory, retrieval, persona banks, prompts and its "ChatGPT" baseline, with a fake
LLM and a fake embedder whose vectors differ (a bag of the vocabulary's words)."""

from __future__ import annotations

import asyncio
import json
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from pipeline.testing.fake_chat import FakeChat
from pipeline.llm.types import LLMError
from stages.methods.base import EpisodeInput, MethodContext, ProbeInput, visible_memory
from stages.methods.ld_agent import LDAgent, LDAgentSettings
from stages.methods.ld_agent.method import (elapsed_words, gap_seconds, no_memory_shares, persona_turns,
                                            retrieval_scores, session_times, timeline, topic_overlap)
from stages.methods.ld_agent.prompts import NO_TRAIT, persona_messages, summary_messages
from stages.methods.baselines.chatgpt import LDAgentBase, LDAgentBaseSettings

VOCAB = ["dog", "park", "leash", "car", "garden", "cello"]
TAU = 1e7


class VocabNouns(LDAgent):
    """LD-Agent with the vocabulary's words standing in for spaCy's nouns, so these tests need no model."""

    nouns = staticmethod(lambda text: [w for w in VOCAB if w in text.lower()])


class Embedder:
    """A bag of the vocabulary's words: texts on different topics get different vectors. Records its inputs."""

    def __init__(self) -> None:
        self.inputs: list[list[str]] = []

    async def __call__(self, texts: list[str]) -> np.ndarray:
        self.inputs.append(list(texts))
        return np.array([[float(w in t.lower()) for w in VOCAB] for t in texts], dtype=np.float32)


def dialogue(sessions: list[list[tuple[str, str]]], labels: list[str | None] | None = None,
             dates: list[datetime | None] | None = None) -> EpisodeInput:
    """An episode from (speaker, text) turns per session; labels[k] / dates[k]: session k+1's gap label / date."""
    out = {}
    for s, turns in enumerate(sessions, start=1):
        label = labels[s - 1] if labels else None
        when = dates[s - 1] if dates else None
        out[s] = [{"speaker": who, "text": text, "turn_idx": i, "session_idx": s, "session_time": when,
                   "session_gap_label": label} for i, (who, text) in enumerate(turns)]
    return EpisodeInput(episode={"episode_id": "e1", "speakers": ["Ann", "Bob"]}, sessions=out)


def sentence_of(messages) -> str:
    return messages[-1]["content"].rsplit("\n", 1)[-1]


def responder(messages, schema):
    text = messages[-1]["content"]
    if text.endswith("SUMMARY:"):
        return "SUMMARY: " + ("Ann talked about her dog." if "dog" in text else "They chatted.")
    if "personal traits of" in text:
        said = sentence_of(messages)
        return {"my dog": "Extracted Traits: I have a dog.", "old car": "I restore old cars."}.get(
            next((k for k in ("my dog", "old car") if k in said), ""), NO_TRAIT)
    return "RESPONSE: That sounds fun!"


def build(ep: EpisodeInput, llm: FakeChat | None = None, embed: Embedder | None = None, **settings):
    llm = llm or FakeChat(responder=responder)
    ctx = MethodContext(settings=LDAgentSettings(**settings), llm=llm, embed=embed or Embedder())
    return asyncio.run(VocabNouns().build(ctx, ep)), llm


def probe_at(ep: EpisodeInput, session: int, turn: int, respondent: str = "Bob") -> ProbeInput:
    turns = ep.sessions[session]
    row = {"probe_id": f"nr:{session}:{turn}", "kind": "next_response", "session_idx": session, "turn_idx": turn,
           "respondent": respondent, "request": turns[turn - 1]["text"]}
    return ProbeInput(probe=row, episode=ep.episode, history={s: t for s, t in ep.sessions.items() if s < session},
                      current=[t for t in turns if t["turn_idx"] < turn])


def answer(ep: EpisodeInput, built: dict, probe: ProbeInput, llm: FakeChat | None = None,
           embed: Embedder | None = None, **settings):
    llm = llm or FakeChat(responder=responder)
    memory = {t: visible_memory(rows, probe.probe["session_idx"], probe.probe["turn_idx"], "log")
              for t, rows in built.items()}
    ctx = MethodContext(settings=LDAgentSettings(**settings), llm=llm, embed=embed or Embedder())
    return asyncio.run(VocabNouns().answer(ctx, probe, memory)), llm


def chats(n: int, topic: str = "weather") -> list[tuple[str, str]]:
    return [("Ann" if i % 2 == 0 else "Bob", f"some {topic} chat {i}") for i in range(n)]


# ------------------------------------------------------------------------------- scores and times

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


def test_a_session_starts_its_gap_after_the_previous_one_ended():
    assert gap_seconds("3 days later") == 3 * 86400 and gap_seconds("a few months later") == 3 * 30 * 86400
    assert gap_seconds("some time later") is None and gap_seconds("1 hour later") == 3600
    day = datetime(2024, 3, 1)
    dated = {1: [{"session_time": day}], 2: [{"session_time": day + timedelta(days=2)}]}
    assert session_times(dated, 100.0)[2] == (datetime(2024, 3, 3, tzinfo=timezone.utc).timestamp(), "date")
    # Session 1 has turns 0..2 a minute apart: it ends at 180 s, one minute after its last utterance.
    labelled = {1: [{"turn_idx": i} for i in range(3)], 2: [{"session_gap_label": "2 weeks later", "turn_idx": 0}],
                3: [{"turn_idx": 0}]}
    assert session_times(labelled, 100.0, 60.0) == {1: (0.0, "fixed_gap"), 2: (180 + 14 * 86400, "gap_label"),
                                                   3: (180 + 14 * 86400 + 60 + 100.0, "fixed_gap")}
    assert elapsed_words(3 * 86400 + 5) == "3 days ago" and elapsed_words(61 * 86400) == "2 months ago"
    assert elapsed_words(10) == "just now"


# ------------------------------------------------------------------------------- short-term cache (R-L3)

def test_an_msc_one_hour_gap_flushes_the_cache_so_each_session_is_its_own_event():
    ep = dialogue([chats(24), chats(12), chats(8)], labels=[None, "1 hour later", "1 hour later"])
    times = [t for t, _, _ in timeline(ep.sessions, LDAgentSettings())]
    assert times[24] - times[23] == 3600 + 60  # the gap, and the turn the last utterance took
    out, _ = build(ep)
    assert [(e["session_idx"], e["turns"]) for e in out["events"]] == [(1, 24), (2, 12), (3, 8)]
    assert [e["time_source"] for e in out["events"]] == ["fixed_gap", "gap_label", "gap_label"]
    # A session-2 probe sees session 1's event and a context of session 2 only.
    answered, llm = answer(ep, out, probe_at(ep, 2, 5), gamma=-1.0)
    assert answered.used_ids == ["e0"]
    context = llm.calls[0]["messages"][1]["content"].split("<MEMORY>")[0]
    assert "chat 4" in context and "chat 23" not in context


def test_half_an_hour_apart_sessions_share_one_cache_and_the_context_spans_both():
    ep = dialogue([chats(4), chats(4, "garden"), chats(2)], labels=[None, "30 minutes later", "1 day later"])
    out, _ = build(ep)
    assert [(e["session_idx"], e["turns"]) for e in out["events"]] == [(2, 8), (3, 2)]
    answered, llm = answer(ep, out, probe_at(ep, 2, 3), gamma=-1.0)
    assert answered.used_ids == [] and answered.details["events"] == 0  # nothing flushed yet
    context = llm.calls[0]["messages"][1]["content"]
    assert "some weather chat 3" in context and "some garden chat 2" in context


def test_dated_sessions_flush_on_the_gap_between_their_dates():
    t0 = datetime(2024, 3, 1, 9)
    ep = dialogue([chats(2), chats(2), chats(2)], dates=[t0, t0 + timedelta(minutes=10), t0 + timedelta(days=1)])
    out, _ = build(ep)
    assert [(e["session_idx"], e["turns"]) for e in out["events"]] == [(2, 4), (3, 2)]
    assert {e["time_source"] for e in out["events"]} == {"date"}


# ------------------------------------------------------------------------------- the query (R-L2)

LONG = [("Ann", "my dog ran off at the park"), ("Bob", "oh no"), *chats(10), ("Ann", "I repaired the old car")]


def test_retrieval_is_queried_with_what_the_user_just_said():
    ep = dialogue([[("Ann", "my dog likes the park"), ("Bob", "so does mine")], [("Ann", "hello"), ("Bob", "hi")],
                   LONG + [("Bob", "nice")]])
    out, _ = build(ep)
    embed = Embedder()
    probe = probe_at(ep, 3, len(LONG))
    assert probe.request == "I repaired the old car"
    answered, _ = answer(ep, out, probe, embed=embed)
    assert embed.inputs == [["I repaired the old car"]]  # the embedding input is the request alone
    assert answered.details["query_nouns"] == ["car"]  # not "dog" / "park" said earlier in the session


def test_a_context_query_puts_the_newest_turn_first():
    ep = dialogue([[("Ann", "my dog likes the park"), ("Bob", "so does mine")], LONG + [("Bob", "nice")]])
    out, _ = build(ep)
    embed = Embedder()
    answered, _ = answer(ep, out, probe_at(ep, 2, len(LONG)), embed=embed, query="context")
    [[query]] = embed.inputs
    assert query.startswith("Ann: I repaired the old car\n") and query.endswith("Ann: my dog ran off at the park")
    assert answered.details["query_nouns"] == ["car", "dog", "park"]


# ------------------------------------------------------------------------------- ranking

def ranked_events() -> list[dict]:
    """Events at `now` = 0: A matches the query best but is old; B half matches and is recent; C is off
    topic; D matches as A does and is older still."""
    def event(eid, nouns, age, summary):
        return {"episode_id": "e1", "snapshot_session": 1, "snapshot_turn": 0, "event_id": eid, "session_idx": 1,
                "summary": summary, "time_s": -age, "time_source": "fixed_gap", "nouns": nouns,
                "vector": [float(w in nouns) for w in VOCAB], "turns": 2, "error": None, "raw": None}
    return [event("A", ["dog", "park"], TAU, "walked the dog in the park"),
            event("B", ["dog", "leash"], 86400, "bought the dog a leash"),
            event("C", ["car"], 3600, "fixed the car"),
            event("D", ["dog", "park"], 5 * TAU, "a dog show in the park")]


def ask_ranked(**settings):
    ep = dialogue([[("Ann", "my dog loves the park"), ("Bob", "sure")]])
    probe = probe_at(ep, 1, 1)
    llm = FakeChat(responder=responder)
    ctx = MethodContext(settings=LDAgentSettings(turn_gap_s=0.0, **settings), llm=llm, embed=Embedder())
    answered = asyncio.run(VocabNouns().answer(ctx, probe, {"events": ranked_events(), "personas": []}))
    return answered, llm.calls[0]["messages"][1]["content"]


def test_events_compete_on_decay_semantic_and_topic_overlap():
    # Query nouns {dog, park}, vector (1, 1, 0, ...). A: sem 1, top 1, decay e^-1. B: sem 0.5 and
    # top (1/2 + 1/2) / 2 = 0.5, decay e^-0.00864. C: sem 0 <= gamma. D: as A with decay e^-5.
    answered, prompt = ask_ranked(top_n=3)
    scores = {r["event_id"]: r["score"] for r in answered.details["retrieved"]}
    assert [r["event_id"] for r in answered.details["retrieved"]] == ["B", "A", "D"]
    assert scores["B"] == pytest.approx(math.exp(-86400 / TAU) * 1.0, rel=1e-5)
    assert scores["A"] == pytest.approx(math.exp(-1) * 2.0, rel=1e-5)
    assert scores["D"] == pytest.approx(math.exp(-5) * 2.0, rel=1e-5)
    assert answered.details["passing"] == 3 and answered.details["events"] == 4
    # top 1: the recent half match wins, shown with its age
    answered, prompt = ask_ranked(top_n=1)
    assert answered.used_ids == ["B"] and "(1 day ago) bought the dog a leash" in prompt
    assert "walked the dog" not in prompt and "fixed the car" not in prompt
    # With a slow decay the full match wins, then the older full match, then the half match.
    answered, _ = ask_ranked(top_n=3, tau_s=1e9)
    assert answered.used_ids == ["A", "D", "B"]
    # The reference code: of the top_n events nearest the query's nouns ("dog,park": A and D, then B), the one
    # best by decay x overlap among those sharing a noun; one at most. Top 1: the nearest, A, whatever its age.
    answered, _ = ask_ranked(top_n=3, scoring="reference_code")
    assert answered.used_ids == ["B"]
    assert answered.details["retrieved"][0]["score"] == pytest.approx(math.exp(-86400 / TAU) * 0.5, rel=1e-5)
    answered, _ = ask_ranked(top_n=1, scoring="reference_code")
    assert answered.used_ids == ["A"]


def test_when_nothing_passes_gamma_the_generator_is_told_there_is_no_relevant_memory():
    answered, prompt = ask_ranked(gamma=1.0)  # a cosine never exceeds 1
    assert "<MEMORY>" in prompt and "No relevant memory." in prompt
    assert answered.used_ids == [] and answered.details["no_relevant_memory"] and answered.details["passing"] == 0


def test_the_share_of_probes_without_memory_is_reported_per_session():
    ep = dialogue([[("Ann", "my dog likes the park"), ("Bob", "so does mine")],
                   [("Ann", "my dog again"), ("Bob", "ha"), ("Ann", "the old car broke"), ("Bob", "oh")]],
                  labels=[None, "2 days later"])
    out, _ = build(ep)
    rows = []
    for turn in (1, 3):  # "my dog again" finds session 1's dog event; "the old car broke" finds nothing
        answered, _ = answer(ep, out, probe_at(ep, 2, turn), gamma=0.5)
        rows.append({"probe_id": f"nr:2:{turn}", "error": None, "details_json": json.dumps(answered.details)})
    rows.append({"probe_id": "nr:2:5", "error": "LLMError: down", "details_json": None})  # failed: not counted
    assert [json.loads(r["details_json"])["no_relevant_memory"] for r in rows[:2]] == [False, True]
    panel = VocabNouns().report_panel({}, rows)
    assert panel is not None and panel.rows == no_memory_shares("ld_agent", rows)
    assert [(r["session_idx"], r["probes"], r["no_relevant_memory"], r["no_relevant_memory_share"], r["gamma"])
            for r in panel.rows] == [(2, 2, 1, 0.5, 0.5), (None, 2, 1, 0.5, 0.5)]
    # The dog probe's best s_sem is 1 and the car probe's 0: at 0.2 / 0.3 / 0.4 the share stays 1/2.
    assert [json.loads(r["details_json"])["max_semantic"] for r in rows[:2]] == [pytest.approx(1.0), 0.0]
    assert {k: v for k, v in panel.rows[0].items() if k.startswith("share_at")} == {
        "share_at_gamma_0_2": 0.5, "share_at_gamma_0_3": 0.5, "share_at_gamma_0_4": 0.5}
    rows[1]["details_json"] = json.dumps({**json.loads(rows[1]["details_json"]), "max_semantic": 0.35})
    assert [no_memory_shares("ld_agent", rows)[0][f"share_at_gamma_0_{g}"] for g in (2, 3, 4)] == [0.0, 0.0, 0.5]
    assert set(panel.rows[0]) == set(VocabNouns.report_table[1].names)


# ------------------------------------------------------------------------------- personas (R-L4)

def test_a_trait_said_at_turn_2_is_seen_by_a_probe_at_turn_4_and_not_by_one_at_turn_2():
    ep = dialogue([[("Ann", "hello"), ("Bob", "hi")],
                   [("Ann", "hello again"), ("Bob", "hi Ann"), ("Ann", "I walked my dog today"),
                    ("Bob", "I spent the day on my old car"), ("Ann", "fun"), ("Bob", "yes")]])
    out, _ = build(ep)
    assert {(p["snapshot_session"], p["snapshot_turn"], p["trait"]) for p in out["personas"] if p["trait"]} == {
        (2, 2, "I have a dog."), (2, 3, "I restore old cars.")}
    # Ann answers at turns 2 and 4; Bob is the user.
    later, llm = answer(ep, out, probe_at(ep, 2, 4, respondent="Ann"))
    system, user = (m["content"] for m in llm.calls[0]["messages"])
    assert "I have a dog." in system  # her own trait from turn 2
    assert "I restore old cars." in user.split("<USER TRAITS>")[1]  # what Bob has just said
    assert (later.details["agent_traits"], later.details["user_traits"]) == (1, 1)
    earlier, llm = answer(ep, out, probe_at(ep, 2, 2, respondent="Ann"))
    prompt = "".join(m["content"] for m in llm.calls[0]["messages"])
    assert "I have a dog." not in prompt and "I restore old cars." not in prompt  # not the gold turn 2's trait
    assert (earlier.details["agent_traits"], earlier.details["user_traits"]) == (0, 0)


def test_no_trait_is_dropped_and_persona_banks_stay_per_speaker():
    ep = dialogue([[("Ann", "my dog barks"), ("Bob", "ok")], [("Ann", "my dog sleeps"), ("Bob", "nice")]])
    out, llm = build(ep)
    personas = out["personas"]
    assert {p["speaker"] for p in personas if p["trait"]} == {"Ann"}
    assert all(p["trait"] is None for p in personas if p["speaker"] == "Bob")
    assert len([c for c in llm.calls if "personal traits of" in c["messages"][-1]["content"]]) == 4  # one each
    answered, llm = answer(ep, out, probe_at(ep, 2, 1), dedupe_personas=True)
    assert llm.calls[0]["messages"][1]["content"].count("I have a dog.") == 1  # deduplicated


def test_persona_every_samples_each_speakers_utterances_per_session_and_max_tokens_caps_the_build_calls():
    ep = dialogue([chats(7), [("Ann", "my dog"), ("Ann", "a"), ("Bob", "old car"), ("Ann", "b"), ("Ann", "c")]])
    every, llm = build(ep)
    assert len(every["personas"]) == 12 and all(c["params"] == {} for c in llm.calls)  # the paper: every utterance
    out, llm = build(ep, persona_every=3, max_tokens=48)
    # Each speaker's 1st and 4th utterance of a session: Ann's turns 0 and 6, Bob's 1 (session 1, 4 x Ann,
    # 3 x Bob); Ann's turns 0 and 4 and Bob's 2 (session 2).
    assert [(p["session_idx"], p["turn_idx"], p["speaker"]) for p in out["personas"]] == [
        (1, 0, "Ann"), (1, 1, "Bob"), (1, 6, "Ann"), (2, 0, "Ann"), (2, 2, "Bob"), (2, 4, "Ann")]
    assert {p["trait"] for p in out["personas"] if p["trait"]} == {"I have a dog.", "I restore old cars."}
    assert len(out["events"]) == len(every["events"]) == 2  # event summaries stay one per flushed cache
    assert len(llm.calls) == 6 + 2 and all(c["params"] == {"max_tokens": 48} for c in llm.calls)


# ------------------------------------------------------------------------------- prompts (R-P)

def test_the_summary_prompt_carries_every_instruction_of_d1():
    system, user = (m["content"] for m in summary_messages(
        [{"speaker": "Ann", "text": "my dog"}, {"speaker": "Bob", "text": "nice"}], ["Ann", "Bob"], 20))
    assert "events" in system and "short sentences" in system and "between Ann and Bob" in system
    assert user.startswith("Conversation:\nAnn: my dog\nBob: nice")
    assert "main points" in user and "English" in user and "20 words at most" in user and user.endswith("SUMMARY:")


def test_the_persona_prompt_carries_every_instruction_of_d2_with_two_examples():
    system, user = (m["content"] for m in persona_messages("I sold my bike.", 20))
    assert "expert on communication" in system and "personal traits" in system
    assert user.startswith(f"If the sentence reveals no personal trait, reply {NO_TRAIT}.")
    examples = user.split("Two examples of the format:\n")[1].split("\n\nNow")[0].split("\n")
    assert examples[0].startswith("1. ") and examples[1].startswith("Extracted Traits: I ")
    assert examples[2].startswith("2. ") and examples[3] == NO_TRAIT
    # the bare sentence, as D.2 and the reference code send it: no speaker named
    assert "personal traits of the person who said" in user and "no more than 20 words" in user
    assert user.endswith("\nI sold my bike.")


def test_the_generator_prompt_carries_every_instruction_of_prompt_4():
    ep = dialogue([[("Ann", "my dog likes the park"), ("Bob", "so does mine")],
                   [("Ann", "my dog is ill"), ("Bob", "oh"), ("Ann", "the vet is at the park"), ("Bob", "good")]],
                  labels=[None, "3 days later"])
    out, _ = build(ep)
    answered, llm = answer(ep, out, probe_at(ep, 2, 3), gamma=-1.0)
    system, user = (m["content"] for m in llm.calls[0]["messages"])
    assert "expert communicator" in system and "play the part of Bob" in system
    assert "Personal traits that make you distinct" in system
    sections = [user.index(s) for s in ("<CONTEXT>", "<MEMORY>", "<USER TRAITS>", "carry on the dialogue")]
    assert sections == sorted(sections)
    assert "recent conversation with Ann" in user and "Ann: the vet is at the park" in user.split("<MEMORY>")[0]
    assert "(3 days ago) Ann talked about her dog." in user and "- I have a dog." in user
    assert "Ann has just said: the vet is at the park" in user
    assert "English" in user and "30 words at most" in user and user.endswith("RESPONSE: <your reply>")
    assert answered.text == "That sounds fun!"  # the RESPONSE label is stripped


def test_ablation_switches_drop_their_part_and_its_prompt_section():
    ep = dialogue([[("Ann", "my dog likes the park"), ("Bob", "so does mine")], [("Ann", "my dog"), ("Bob", "ok")]],
                  labels=[None, "3 days later"])
    out, llm = build(ep, events=False, user_personas=False, agent_personas=False)
    assert out == {"events": [], "personas": []} and llm.calls == []  # no summary and no persona calls
    answered, llm = answer(ep, out, probe_at(ep, 2, 1), events=False, user_personas=False, agent_personas=False)
    system, user = (m["content"] for m in llm.calls[0]["messages"])
    assert "traits" not in system and "<MEMORY>" not in user and "<USER TRAITS>" not in user and "<CONTEXT>" in user
    assert answered.details["no_relevant_memory"] is None  # no retrieval, so no gamma pass to count
    full, _ = build(ep)
    _, llm = answer(ep, full, probe_at(ep, 2, 1), user_personas=False, gamma=-1.0)
    system, user = (m["content"] for m in llm.calls[0]["messages"])
    assert "<MEMORY>" in user and "<USER TRAITS>" not in user and "personal traits" in system.lower()


def test_a_failed_summary_is_a_counted_row_never_retrieved():
    def failing(messages, schema):
        if messages[-1]["content"].endswith("SUMMARY:") and "park" in messages[-1]["content"]:
            return LLMError("upstream down")
        return responder(messages, schema)

    ep = dialogue([[("Ann", "my dog likes the park"), ("Bob", "ok")], [("Ann", "my dog"), ("Bob", "ok")]],
                  labels=[None, "3 days later"])
    out, _ = build(ep, llm=FakeChat(responder=failing))
    failed = out["events"][0]
    assert failed["summary"] is None and failed["error"] == "upstream down" and failed["nouns"] == ["dog", "park"]
    assert VocabNouns().build_stats(out) == {"events": 1, "summary_failures": 1, "traits": 2, "persona_failures": 0}
    answered, llm = answer(ep, out, probe_at(ep, 2, 1), gamma=-1.0)
    assert answered.used_ids == [] and answered.details["events"] == 0


# ------------------------------------------------------------------------------- the baseline (R-L1c)

def test_the_chatgpt_baseline_sees_only_the_current_session_under_prompt_3():
    ep = dialogue([[("Ann", "I play the cello"), ("Bob", "lovely")],
                   [("Ann", "hello again"), ("Bob", "hi"), ("Ann", "my garden is blooming"), ("Bob", "nice")]])
    probe = probe_at(ep, 2, 3)
    llm = FakeChat(answers=["RESPONSE: Bob: What did you plant?"])
    answered = asyncio.run(LDAgentBase().answer(MethodContext(settings=LDAgentBaseSettings(), llm=llm), probe, {}))
    system, user = (m["content"] for m in llm.calls[0]["messages"])
    assert "expert communicator" in system and "play the part of Bob" in system and "traits" not in system
    assert "cello" not in user and "<MEMORY>" not in user and "<USER TRAITS>" not in user
    assert "Ann: hello again\nBob: hi\nAnn: my garden is blooming" in user
    assert "Ann has just said: my garden is blooming" in user and "30 words at most" in user and "English" in user
    assert answered.text == "What did you plant?"
    # the generator's reply as LD-Agent's reference code scored it, frame and all
    assert answered.details == {"context_turns": 3, "raw_reply": "RESPONSE: Bob: What did you plant?"}
    # The same frame, word cap and context length as LD-Agent's.
    assert LDAgentBaseSettings().response_words == LDAgentSettings().response_words == 30
    assert LDAgentBaseSettings().short_term_turns == LDAgentSettings().short_term_turns == 30


def test_spacy_nouns_are_lemmas_of_noun_tokens():
    from stages.methods.ld_agent.method import spacy_nouns

    assert spacy_nouns("I walked my dogs in the parks with two friends") == ["dog", "park", "friend"]


# ------------------------------------------------------------------------------- config and run

def test_the_ldagent_config_runs_table_1_chatgpt_rows():
    import stages
    from pipeline.engine.runner import Runner

    cfg = stages.load_config(Path(__file__).resolve().parent.parent / "configs" / "ldagent_msc.yaml")
    assert cfg.methods == ["ld_agent", "ld_agent_base"]
    plan = [s.name for s in Runner(cfg, stages.registry(cfg)).plan]
    assert not {"respond_part_context", "respond_all_context", "segment", "judge_answers"} & set(plan)
    assert {"memory_ld_agent", "respond_ld_agent", "respond_ld_agent_base", "report"} <= set(plan)
    for role in ("memory", "generator"):  # App. C: gpt-3.5-turbo-1106; the reference code's API default
        assert (cfg.role(role).model, cfg.role(role).temperature) == ("gpt-3.5-turbo-1106", 1.0)
    assert cfg.embedding.model == "all-MiniLM-L6-v2"
    assert (cfg.probes.from_session, cfg.probes.to_session, cfg.probes.max_per_episode) == (2, 5, None)
    assert cfg.probes.next_response and not cfg.probes.qa and cfg.corpus.limit is None
    ld, base = cfg.method.ld_agent, cfg.method.ld_agent_base
    # Table 1 came from the reference code's retrieval and memory lines (Eq. 2 is `scoring: paper`)
    assert (ld.scoring, ld.query, ld.tau_s, ld.beta_s, ld.top_n) == ("reference_code", "utterance", 1e7, 3600.0, 1)
    assert ld.age_format == "all_units"
    assert ld.events and ld.user_personas and ld.agent_personas
    assert (ld.persona_every, ld.max_tokens) == (1, None)  # every utterance, the role's limit
    assert (ld.response_words, ld.short_term_turns) == (base.response_words, base.short_term_turns) == (30, 30)


def test_on_the_sample_corpus_ld_agent_and_its_baseline_answer_every_probe(run_cfg, fake_llm):
    from pipeline.artifacts import StageDir
    from pipeline.engine.runner import Runner
    from stages import registry

    cfg = run_cfg("corpus.limit=1", "methods=[ld_agent,ld_agent_base]", "judge_memory.enabled=false",
                  "judge_pairwise.enabled=false", "judge_answers.enabled=false")
    Runner(cfg, registry(cfg)).run()
    memory = StageDir(cfg.run_dir, "memory_ld_agent")
    events = memory.read_table("events").to_pylist()
    sessions = StageDir(cfg.run_dir, "ingest").read_table("episodes").to_pylist()[0]["n_sessions"]
    assert len(events) == sessions and all(e["nouns"] and e["error"] is None for e in events)
    assert memory.manifest().stats["summary_failures"] == 0 and memory.manifest().stats["events"] == sessions
    personas = memory.read_table("personas").to_pylist()
    turns = sorted(StageDir(cfg.run_dir, "ingest").read_table("turns").to_pylist(), key=lambda t: t["turn_idx"])
    every = cfg.method.ld_agent.persona_every  # the default job samples the utterances it extracts traits from
    assert every > 1 and len(personas) == sum(len(persona_turns([t for t in turns if t["session_idx"] == s], every))
                                              for s in {t["session_idx"] for t in turns})
    assert all(p["snapshot_turn"] == p["turn_idx"] for p in personas)
    probes = StageDir(cfg.run_dir, "probes").manifest().rows
    for method in ("ld_agent", "ld_agent_base"):
        responses = StageDir(cfg.run_dir, f"respond_{method}").read_table("responses").to_pylist()
        assert len(responses) == probes
        assert all(r["error"] is None and r["response"] is not None for r in responses)
    # The report's gamma table: one row per probe session and one over every probe.
    shares = StageDir(cfg.run_dir, "report").read_table("ld_agent_retrieval").to_pylist()
    assert [r["probes"] for r in shares if r["session_idx"] is None] == [probes]
