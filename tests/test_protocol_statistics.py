"""Statistics the paper protocols report, on hand-worked cases: SeCom's "# Turns" counts exchanges (a
user-agent interaction), not utterances, for every method of the shared response frame (full history,
turn, session and segment units), on LoCoMo-shaped sessions and on Long-MT-Bench+ as released; and
LoCoMo's QA protocol samples as its task_eval does (greedy, 32 answer tokens), in the request the
server sees and so in the call's cache key."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pipeline.testing.fake_chat import FakeChat

from conftest import TEST_KEY_ENV, llm_config
from pipeline.corpus import load_corpus
from pipeline.llm import DiskCallCache, LLMClient, LocalRateLimiter
from stages.methods.shared import response
from stages.methods.base import MethodContext, ProbeInput
from stages.dialogue import sessions_of
from stages.methods.baselines.history import FullHistory, FullHistorySettings
from stages.methods.secom.units import build_units, make_units

RELEASE = Path(__file__).resolve().parent / "fixtures" / "corpora" / "longmtbench" / "longmt_hf_release.jsonl"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def locomo_session(s: int, speakers: list[str]) -> list[dict]:
    """One LoCoMo session: a dia_id per utterance ("D<s>:<n>"), the two speakers in the given order."""
    return [{"episode_id": "locomo-conv-1", "session_idx": s, "turn_idx": i, "speaker": who,
             "text": f"{who} says thing {s}.{i}", "session_time": None, "source_turn_id": f"D{s}:{i + 1}"}
            for i, who in enumerate(speakers)]


C, M = "Caroline", "Melanie"
# Session 1: 6 utterances, 3 exchanges (C-M, C-M, C-M). Session 2 opens with Melanie: 5 utterances,
# 3 exchanges (M-C, M-C, M alone). 11 utterances, 6 exchanges in all.
HISTORY = {1: locomo_session(1, [C, M, C, M, C, M]), 2: locomo_session(2, [M, C, M, C, M])}


def qa_probe(history: dict, dataset: str = "locomo", speakers: list[str] = [C, M]) -> ProbeInput:
    return ProbeInput(probe={"probe_id": "qa:q0", "kind": "qa", "category": "single-hop", "request": "What?",
                             "session_idx": len(history) + 1, "respondent": speakers[-1]},
                      episode={"dataset": dataset, "speakers": speakers}, history=history, current=[])


def full_history(settings: FullHistorySettings, probe: ProbeInput):
    """FullHistory's answer to `probe` under `settings`, from a fake LLM."""
    return run(FullHistory().answer(MethodContext(settings=settings, llm=FakeChat(["x"])), probe, {}))


def test_full_history_counts_locomo_exchanges_not_its_per_utterance_ids():
    answer = full_history(FullHistorySettings(), qa_probe(HISTORY))
    assert answer.context_turns == 6  # not 11, the distinct dia_ids
    # Cut to the newest session by the token budget: its 3 exchanges only.
    one = FullHistorySettings(token_budget=response.context_tokens(
        [{"text": f"{t['speaker']}: {t['text']}"} for t in HISTORY[2]]) + 5)
    assert full_history(one, qa_probe(HISTORY)).context_turns == 3


def test_turn_session_and_segment_units_count_the_exchanges_they_hold_once_each():
    turn = build_units(HISTORY, [], "turn")
    session = build_units(HISTORY, [], "session")
    assert [(u["session_idx"], u["turn_start"], u["turn_end"]) for u in turn] == \
        [(1, 0, 1), (1, 2, 3), (1, 4, 5), (2, 0, 1), (2, 2, 3), (2, 4, 4)]
    count = lambda units: response.context_turns(units, HISTORY)  # noqa: E731
    assert count(turn[:3]) == 3 and count([turn[5]]) == 1  # a turn-level unit is one exchange
    assert count(session) == 6 and count([session[1]]) == 3
    # A segment cut inside exchanges (Melanie's reply, then Caroline's next question) touches two.
    segment = make_units(HISTORY[1], [(1, 2)], "segment")
    assert count(segment) == 2
    # Units that share an exchange count it once.
    assert count([session[0], turn[0], *segment]) == 3
    # What a retrieval method records: the same count on its answer.
    answer = run(response.generate(FakeChat(["x"]), qa_probe(HISTORY), [turn[0], session[1]]))
    assert answer.context_turns == 4 and answer.context_tokens > 0


def test_a_unit_of_a_session_the_probe_does_not_hold_falls_back_to_its_source_ids():
    unit = make_units(locomo_session(7, [C, M, C]), [(0, 2)], "session")
    assert response.context_turns(unit, HISTORY) == 3 == response.context_turns(unit)
    assert response.context_turns([{**unit[0], "source_turn_ids": []}]) == 3  # no ids: its utterances


def test_long_mt_bench_plus_as_released_counts_one_turn_per_exchange_as_before():
    corpus = load_corpus("longmtbench", RELEASE)
    turns = [t for t in corpus.turns if t["episode_id"] == "longmtbench-0"]
    history = sessions_of(turns)
    session = build_units(history, [], "session")
    turn = build_units(history, [], "turn")
    assert len(turn) == 5 and all(u["turn_end"] - u["turn_start"] == 1 for u in turn)  # user + assistant
    assert response.context_turns(session, history) == 5 == len({t["source_turn_id"] for t in turns})
    assert response.context_turns(turn[:3], history) == 3 and response.context_turns([session[1]], history) == 2
    answer = full_history(FullHistorySettings(), qa_probe(history, "longmtbench", ["user", "assistant"]))
    assert answer.context_turns == 5  # Table 1's Full History "# Turns" is the conversation's exchanges


# --- LoCoMo's QA sampling ------------------------------------------------------------------------------

UNITS = [{"session_idx": 1, "turn_start": 0, "turn_end": 1, "session_time": "1:56 pm on 8 May, 2023",
          "text": "Caroline: I bought a red bicycle.\nMelanie: Nice!", "unit_id": "session:1:0"}]


def test_locomo_protocol_answers_greedily_with_32_tokens_in_the_request_and_its_cache_key(fake_llm, monkeypatch):
    monkeypatch.setenv(TEST_KEY_ENV, "sk-test-not-a-real-key")
    cfg = llm_config(fake_llm, temperature=0.7, max_tokens=1024, seed=42)  # SeCom's generator sampling
    client = LLMClient(cfg, cache=DiskCallCache(cfg.cache_dir), limiter=LocalRateLimiter(cfg.rpm, cfg.tpm))
    probe = qa_probe(HISTORY)

    official = run(response.generate(client, probe, UNITS, "locomo_official"))
    ours = run(response.generate(client, probe, UNITS, "ours"))
    bodies = [r["body"] for r in fake_llm.requests if r["path"] == "/v1/chat/completions"]
    assert len(bodies) == 2
    assert (bodies[0]["temperature"], bodies[0]["max_tokens"]) == (0.0, 32)
    assert (bodies[1]["temperature"], bodies[1]["max_tokens"]) == (0.7, 1024)  # our prompt keeps the role's
    assert official.details["sampling"] == {"temperature": 0.0, "max_tokens": 32}
    assert "sampling" not in ours.details

    # The same official call again is answered from the cache: the sampling is part of its key.
    again = run(response.generate(client, probe, UNITS, "locomo_official"))
    assert again.text == official.text
    assert len([r for r in fake_llm.requests if r["path"] == "/v1/chat/completions"]) == 2
