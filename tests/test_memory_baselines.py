"""RSum and the memory baselines with a fake LLM, and every one of them through the runner."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

from fake_chat import FakeChat
from stages.methods.base import BuildContext, EpisodeInput, ProbeInput, visible_memory
from stages.methods.gold_memory import GoldMemory, GoldMemorySettings
from stages.methods.memory_baselines import (AllMemoriesUpdate, MemoryRetrieval, MemorySettings, Operation,
                                             Operations, RetrievalSettings, apply_operations, check_operations)
from stages.methods.rsum import RSum, RSumSettings


def episode(n: int) -> EpisodeInput:
    sessions = {s: [{"speaker": "Ann", "text": f"news {s}", "turn_idx": 0, "source_turn_id": f"D{s}:1"},
                    {"speaker": "Bob", "text": f"reply {s}", "turn_idx": 1, "source_turn_id": f"D{s}:2"}]
                for s in range(1, n + 1)}
    return EpisodeInput(episode={"episode_id": "e1", "speakers": ["Ann", "Bob"]}, sessions=sessions)


def probe(session: int, kind: str = "next_response", turn: int | None = 1) -> ProbeInput:
    row = {"probe_id": f"p{session}", "kind": kind, "session_idx": session, "turn_idx": turn, "respondent": "Bob",
           "request": f"news {session}"}
    ep = episode(session)
    current = ep.sessions[session][:1] if turn else []
    return ProbeInput(probe=row, episode=ep.episode, history={}, current=current, embed=embed)


def embed(texts: list[str]) -> np.ndarray:
    return np.array([[1.0, float(sum(map(ord, t)) % 7)] for t in texts], dtype=np.float32)


def rsum_responder(messages, schema):
    text = messages[-1]["content"]
    if "Memory so far" in text:
        previous = text.split("Memory so far:\n")[1].split("\n\n")[0]
        session = re.search(r"news (\d+)", text).group(1)
        return ("" if previous.startswith("(empty") else previous + " ") + f"S{session}"
    return "Bob: sure"


def test_rsum_builds_each_memory_from_the_previous_one_and_that_session_only():
    llm = FakeChat(responder=rsum_responder)
    out = asyncio.run(RSum().build(BuildContext(llm=llm, settings=RSumSettings()), episode(4)))
    assert [r["memory"] for r in out["summary"]] == ["S1", "S1 S2", "S1 S2 S3", "S1 S2 S3 S4"]
    third = llm.calls[2]["messages"][-1]["content"]
    assert "S1 S2" in third and "news 3" in third and "news 4" not in third and "news 2" not in third
    assert all(c["params"].get("temperature") == 0.0 for c in llm.calls)
    # A probe in session 4 sees exactly the memory after session 3.
    seen = {"summary": visible_memory(out["summary"], 4, 1, "snapshots")}
    answer_llm = FakeChat(responder=rsum_responder)
    answer = asyncio.run(RSum().answer(answer_llm, probe(4), seen, RSumSettings()))
    prompt = answer_llm.calls[0]["messages"][-1]["content"]
    assert "S1 S2 S3" in prompt and "S4" not in prompt
    assert answer.text == "sure" and answer.used_ids == ["summary:3"]
    assert answer.details["memory_after_session"] == 3


def test_rsum_llm_selects_relevant_memory_first_and_options_reach_the_prompt():
    llm = FakeChat(["S1 only", "ok"])
    settings = RSumSettings(select_relevant=True)
    memory = {"summary": [{"episode_id": "e1", "snapshot_session": 1, "snapshot_turn": None, "memory": "S1 and S9",
                           "tokens": 3, "error": None}]}
    answer = asyncio.run(RSum().answer(llm, probe(2), memory, settings))
    assert answer.details["selected"] == "S1 only" and "S1 only" in llm.calls[1]["messages"][-1]["content"]
    limited = FakeChat(responder=rsum_responder)
    asyncio.run(RSum().build(BuildContext(llm=limited, settings=RSumSettings(max_words=50, one_shot=True)), episode(1)))
    system = limited.calls[0]["messages"][0]["content"]
    assert "under 50 words" in system and "Example:" in system


def test_memory_update_operations_apply_as_stated():
    pool = [{"memory_id": "1:0", "event": "Ann has a dog"}, {"memory_id": "1:1", "event": "Bob lives in Oslo"},
            {"memory_id": "1:2", "event": "Ann likes tea"}]
    new = [{"memory_id": "2:0", "event": "Bob moved to Rome"}, {"memory_id": "2:1", "event": "Ann's dog died"},
           {"memory_id": "2:2", "event": "Ann likes tea"}, {"memory_id": "2:3", "event": "Bob got a job"}]
    ops = [Operation(new=1, op="replace", target=2), Operation(new=2, op="delete", target=1),
           Operation(new=3, op="keep"), Operation(new=4, op="append")]
    after = apply_operations(pool, new, ops)
    assert [m["event"] for m in after] == ["Bob moved to Rome", "Ann likes tea", "Bob got a job"]
    check_operations(Operations(operations=ops), 4, 3)
    with pytest.raises(ValueError, match="exactly one operation"):
        check_operations(Operations(operations=ops[:3]), 4, 3)
    with pytest.raises(ValueError, match="target"):
        check_operations(Operations(operations=[Operation(new=1, op="replace", target=9)]), 1, 3)


def test_the_memory_pool_is_updated_at_each_session_end_and_never_sees_later_sessions():
    def responder(messages, schema):
        text = messages[-1]["content"]
        if schema and schema.__name__ == "SessionMemories":
            s = re.search(r"news (\d+)", text).group(1)
            return {"memories": [f"fact {s}a", f"fact {s}b"]}
        return {"operations": [{"new": 1, "op": "replace", "target": 1}, {"new": 2, "op": "append"}]}

    llm = FakeChat(responder=responder)
    out = asyncio.run(AllMemoriesUpdate().build(BuildContext(llm=llm, settings=MemorySettings()), episode(3)))
    pools = {s: [m["event"] for m in out["pool"] if m["snapshot_session"] == s] for s in (1, 2, 3)}
    assert pools == {1: ["fact 1a", "fact 1b"], 2: ["fact 2a", "fact 1b", "fact 2b"],
                     3: ["fact 3a", "fact 1b", "fact 2b", "fact 3b"]}
    updates = [c for c in llm.calls if c["schema"].__name__ == "Operations"]
    assert len(updates) == 2 and "fact 3" not in updates[0]["messages"][-1]["content"]
    ops = [(r["snapshot_session"], r["op"], r["target_id"]) for r in out["operations"]]
    assert (2, "replace", "1:0") in ops and (3, "replace", "2:0") in ops


def test_memory_retrieval_returns_k_memories_from_earlier_sessions_only():
    def responder(messages, schema):
        if schema and schema.__name__ == "SessionMemories":
            s = re.search(r"news (\d+)", messages[-1]["content"]).group(1)
            return {"memories": [f"fact {s}{c}" for c in "abc"]}
        return "ok"

    out = asyncio.run(MemoryRetrieval().build(BuildContext(llm=FakeChat(responder=responder),
                                                           settings=RetrievalSettings(k=4)), episode(4)))
    seen = {"memories": visible_memory(out["memories"], 3, 1, "log")}
    answer = asyncio.run(MemoryRetrieval().answer(FakeChat(["ok"]), probe(3), seen, RetrievalSettings(k=4)))
    assert len(answer.used_ids) == 4 and all(int(i.split(":")[0]) < 3 for i in answer.used_ids)
    assert RetrievalSettings().k == 6


def test_gold_memory_appears_only_when_the_corpus_has_it():
    annotated = {"speakers": ["Ann", "Bob"], "personas": [["I have a dog."], []],
                 "notes": [{"session_idx": 1, "kind": "summary", "speaker": None, "text": "They met."},
                           {"session_idx": 3, "kind": "summary", "speaker": None, "text": "Later news."}]}
    p = probe(2)
    p.episode = annotated
    llm = FakeChat(["ok"])
    answer = asyncio.run(GoldMemory().answer(llm, p, {}, GoldMemorySettings()))
    prompt = llm.calls[0]["messages"][-1]["content"]
    assert "Ann: I have a dog." in prompt and "They met." in prompt and "Later news." not in prompt
    assert answer.details["gold_sources"] == ["persona", "summary"] and len(answer.used_ids) == 2
    bare = probe(2)
    llm = FakeChat(["ok"])
    answer = asyncio.run(GoldMemory().answer(llm, bare, {}, GoldMemorySettings()))
    assert answer.used_ids == [] and "Memory:\n(empty)" in llm.calls[0]["messages"][-1]["content"]


BASELINES = ["rsum", "all_memories", "memory_retrieval", "all_memories_update", "memory_retrieval_update",
             "gold_memory", "part_context", "all_context"]


def test_on_the_sample_corpus_every_baseline_answers_every_probe(run_cfg, fake_llm):
    from pipeline.artifacts import StageDir
    from pipeline.runner import Runner
    from stages import registry

    cfg = run_cfg("corpus.limit=1", "compress.method=none", f"methods=[{','.join(BASELINES)}]",
                  "judge_memory.enabled=false", "judge_pairwise.enabled=false", "judge_answers.enabled=false")
    assert set(Runner(cfg, registry(cfg)).run().values()) == {"ran"}
    n_probes = StageDir(cfg.run_dir, "probes").manifest().rows
    for m in BASELINES:
        rows = StageDir(cfg.run_dir, f"respond_{m}").read_table("responses").to_pylist()
        assert len(rows) == n_probes and all(r["error"] is None and r["response"] is not None for r in rows), m
    for m, tables in {"rsum": ["summary"], "all_memories": ["memories"], "memory_retrieval": ["memories"],
                      "all_memories_update": ["pool", "operations"], "memory_retrieval_update": ["pool", "operations"]
                      }.items():
        sd = StageDir(cfg.run_dir, f"memory_{m}")
        assert all(sd.read_table(t).num_rows > 0 for t in tables), m
    sessions = StageDir(cfg.run_dir, "ingest").read_table("episodes").to_pylist()[0]["n_sessions"]
    assert StageDir(cfg.run_dir, "memory_rsum").manifest().stats["memory_calls_per_episode"] == {"sample-01": sessions}


def test_manifests_report_llm_calls_and_tokens_per_episode(run_cfg, fake_llm):
    from pipeline.artifacts import StageDir
    from pipeline.runner import Runner
    from stages import registry

    cfg = run_cfg("corpus.limit=2", "methods=[rsum]", "stages=[ingest,probes,memory_rsum,respond_rsum]")
    Runner(cfg, registry(cfg)).run()
    for stage in ("memory_rsum", "respond_rsum"):
        m = StageDir(cfg.run_dir, stage).manifest()
        per_episode = m.stats["llm_per_episode"]
        assert set(per_episode) == {"sample-01", "sample-02"}
        usage = next(iter(m.llm_usage.values()))
        assert sum(e["calls"] for e in per_episode.values()) == usage.calls
        assert sum(e["prompt_tokens"] for e in per_episode.values()) == usage.prompt_tokens > 0


def test_every_response_records_after_which_session_its_memory_was_built(run_cfg, fake_llm):
    from pipeline.artifacts import StageDir
    from pipeline.runner import Runner
    from stages import registry

    cfg = run_cfg("corpus.limit=1", "methods=[rsum,zero_history]", "probes.max_per_episode=3",
                  "stages=[ingest,probes,memory_rsum,respond_rsum,respond_zero_history]")
    Runner(cfg, registry(cfg)).run()
    probes = {p["probe_id"]: p for p in StageDir(cfg.run_dir, "probes").read_table("probes").to_pylist()}
    for r in StageDir(cfg.run_dir, "respond_rsum").read_table("responses").to_pylist():
        assert r["memory_after_session"] == probes[r["probe_id"]]["session_idx"] - 1
    for r in StageDir(cfg.run_dir, "respond_zero_history").read_table("responses").to_pylist():
        assert r["memory_after_session"] is None
