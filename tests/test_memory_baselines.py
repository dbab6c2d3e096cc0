"""RSum and the memory baselines with a fake LLM, and every one of them through the runner."""

from __future__ import annotations

import asyncio
import json
import re

import numpy as np
import pytest

from pipeline.testing.fake_chat import FakeChat
from pipeline.llm.types import LLMError
from stages.methods.base import EpisodeInput, MethodContext, ProbeInput, visible_memory
from stages.methods.baselines.gold_memory import GoldMemory, GoldMemorySettings, gold_memory
from stages.methods.baselines.memory_baselines import (AllMemories, AllMemoriesUpdate, MemoryRetrieval, MemorySettings,
                                             Operation, Operations, RetrievalSettings, apply_operations,
                                             check_operations)
from stages.methods.rsum import (EXAMPLE_NEW_MEMORY, EXAMPLE_SESSION, RSum, RSumSettings, memory_example,
                                 response_example)


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
    return ProbeInput(probe=row, episode=ep.episode, history={}, current=current)


async def embed(texts: list[str]) -> np.ndarray:
    return np.array([[1.0, float(sum(map(ord, t)) % 7)] for t in texts], dtype=np.float32)


def answering(settings, llm: FakeChat, embed=embed) -> MethodContext:
    """What an answer gets: these settings and LLM, and the embedder above unless told otherwise."""
    return MethodContext(settings=settings, llm=llm, embed=embed)


def rsum_responder(messages, schema):
    text = messages[-1]["content"]
    if "Memory so far" in text:
        previous = text.split("Memory so far:\n")[1].split("\n\n")[0]
        session = re.search(r"news (\d+)", text).group(1)
        return ("" if previous.startswith("(empty") else previous + " ") + f"S{session}"
    return "Bob: sure"


def test_rsum_builds_each_memory_from_the_previous_one_and_that_session_only():
    llm = FakeChat(responder=rsum_responder)
    out = asyncio.run(RSum().build(MethodContext(settings=RSumSettings(), llm=llm), episode(4)))
    assert [r["memory"] for r in out["summary"]] == ["S1", "S1 S2", "S1 S2 S3", "S1 S2 S3 S4"]
    third = llm.calls[2]["messages"][-1]["content"]
    assert "S1 S2" in third and "news 3" in third and "news 4" not in third and "news 2" not in third
    assert all(c["params"].get("temperature") == 0.0 for c in llm.calls)
    # A probe in session 4 sees exactly the memory after session 3.
    seen = {"summary": visible_memory(out["summary"], 4, 1, "snapshots")}
    answer_llm = FakeChat(responder=rsum_responder)
    answer = asyncio.run(RSum().answer(answering(RSumSettings(), answer_llm), probe(4), seen))
    prompt = answer_llm.calls[0]["messages"][-1]["content"]
    assert "S1 S2 S3" in prompt and "S4" not in prompt
    assert answer.text == "sure" and answer.used_ids == ["summary:3"]
    assert answer.details["memory_after_session"] == 3


def test_rsum_llm_selects_relevant_memory_first_and_options_reach_the_prompt():
    llm = FakeChat(["S1 only", "ok"])
    settings = RSumSettings(select_relevant=True)
    memory = {"summary": [{"episode_id": "e1", "snapshot_session": 1, "snapshot_turn": None, "memory": "S1 and S9",
                           "tokens": 3, "error": None}]}
    answer = asyncio.run(RSum().answer(answering(settings, llm), probe(2), memory))
    assert answer.details["selected"] == "S1 only" and "S1 only" in llm.calls[1]["messages"][-1]["content"]
    limited = FakeChat(responder=rsum_responder)
    asyncio.run(RSum().build(MethodContext(settings=RSumSettings(max_words=50, one_shot=True), llm=limited),
                             episode(1)))
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
    out = asyncio.run(AllMemoriesUpdate().build(MethodContext(settings=MemorySettings(), llm=llm), episode(3)))
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

    out = asyncio.run(MemoryRetrieval().build(MethodContext(settings=RetrievalSettings(k=4),
                                                            llm=FakeChat(responder=responder)), episode(4)))
    seen = {"memories": visible_memory(out["memories"], 3, 1, "log")}
    answer = asyncio.run(MemoryRetrieval().answer(answering(RetrievalSettings(k=4), FakeChat(["ok"])), probe(3), seen))
    assert len(answer.used_ids) == 4 and all(int(i.split(":")[0]) < 3 for i in answer.used_ids)
    assert RetrievalSettings().k == 6


def test_gold_memory_falls_back_to_episode_personas_only_without_per_session_ones_and_says_so():
    annotated = {"speakers": ["Ann", "Bob"], "personas": [["I have a dog."], []],
                 "notes": [{"session_idx": 1, "kind": "summary", "speaker": None, "text": "They met."},
                           {"session_idx": 3, "kind": "summary", "speaker": None, "text": "Later news."}]}
    p = probe(2)
    p.episode = annotated
    llm = FakeChat(["ok"])
    answer = asyncio.run(GoldMemory().answer(answering(GoldMemorySettings(), llm), p, {}))
    prompt = llm.calls[0]["messages"][-1]["content"]
    assert "Ann: I have a dog." in prompt and "They met." in prompt and "Later news." not in prompt
    assert answer.details == {"gold_sources": ["episode_persona", "summary"], "personas_from": "episode"}
    assert len(answer.used_ids) == 2
    bare = probe(2)
    llm = FakeChat(["ok"])
    answer = asyncio.run(GoldMemory().answer(answering(GoldMemorySettings(), llm), bare, {}))
    assert answer.used_ids == [] and "Memory:\n(empty)" in llm.calls[0]["messages"][-1]["content"]


def msc_episode(tmp_path) -> dict:
    """A 5-session ParlAI MSC record through the loader: each previous session k+1 has its own persona
    line, and the top-level personas (as of the last session) hold all of them."""
    from pipeline.corpus import load_corpus

    lines = {k: f"Speaker 1 fact of session {k}." for k in range(1, 5)}
    rec = {"metadata": {"initial_data_id": "g1"},
           "personas": [list(lines.values()), ["Speaker 2 likes jazz."]],
           "previous_dialogs": [{"dialog": [{"text": f"news {k}"}, {"text": f"reply {k}"}],
                                 "personas": [[lines[k]], ["Speaker 2 likes jazz."] if k == 1 else []]}
                                for k in range(1, 5)],
           "dialog": [{"text": "news 5"}, {"text": "reply 5"}]}
    path = tmp_path / "msc.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    return load_corpus("msc", path).episodes[0]


def test_a_session_3_gold_memory_probe_sees_only_the_persona_summaries_of_sessions_1_and_2(tmp_path):
    p = probe(3)
    p.episode = msc_episode(tmp_path)
    llm = FakeChat(["ok"])
    answer = asyncio.run(GoldMemory().answer(answering(GoldMemorySettings(), llm), p, {}))
    memory = llm.calls[0]["messages"][-1]["content"].split("Memory:\n")[1].split("\n\n")[0]
    assert memory.splitlines() == ["[session 1 persona] Speaker 1: Speaker 1 fact of session 1.",
                                   "[session 1 persona] Speaker 2: Speaker 2 likes jazz.",
                                   "[session 2 persona] Speaker 1: Speaker 1 fact of session 2."]
    assert "session 3." not in memory and "session 4." not in memory
    assert answer.details == {"gold_sources": ["persona"], "personas_from": "sessions"}
    # The whole-episode view (after the last session) holds every session's lines, repeated ones once.
    view = GoldMemory().memory_view(EpisodeInput(episode=p.episode, sessions={s: [] for s in range(1, 6)}), {},
                                    GoldMemorySettings())
    assert view.count("likes jazz") == 1 and "fact of session 4." in view


def test_gold_memory_shows_a_persona_line_repeated_by_a_later_session_once():
    notes = [{"session_idx": s, "kind": "persona", "speaker": "Ann", "text": t}
             for s, t in [(1, "I run."), (2, "I run."), (2, "I swim.")]]
    text, ids, _ = gold_memory({"speakers": ["Ann"], "notes": notes}, 3, ["persona"])
    assert text.splitlines() == ["[session 1 persona] Ann: I run.", "[session 2 persona] Ann: I swim."]
    assert ids == ["persona:1:0", "persona:2:2"]


def test_rsum_paper_style_asks_for_no_length_and_short_style_for_a_short_reply():
    memory = {"summary": [{"episode_id": "e1", "snapshot_session": 1, "snapshot_turn": None, "memory": "S1",
                           "tokens": 1, "error": None}]}
    prompts = {}
    for style in ("paper", "short"):
        llm = FakeChat(["ok"])
        asyncio.run(RSum().answer(answering(RSumSettings(response_style=style), llm), probe(2), memory))
        prompts[style] = llm.calls[0]["messages"][-1]["content"]
    assert prompts["paper"].endswith("Write Bob's next utterance only, without a speaker label.")
    assert "short" not in prompts["paper"].lower()
    assert prompts["short"].endswith(
        "Write Bob's next utterance only: a short, natural reply, without a speaker label.")
    assert RSumSettings().response_style == "short" and RSumSettings().temperature == 0.0


def test_rsum_temperature_null_leaves_the_role_temperature_in_force():
    assert RSum().params(RSumSettings(temperature=None)) == {}
    assert RSum().params(RSumSettings()) == {"temperature": 0.0}
    llm = FakeChat(responder=rsum_responder)
    asyncio.run(RSum().build(MethodContext(settings=RSumSettings(temperature=None), llm=llm), episode(2)))
    assert all("temperature" not in c["params"] for c in llm.calls)


def test_rsum_one_shot_shows_our_worked_dialogue_in_both_the_memory_and_the_response_prompt():
    settings = RSumSettings(one_shot=True)
    build_llm = FakeChat(responder=rsum_responder)
    asyncio.run(RSum().build(MethodContext(settings=settings, llm=build_llm), episode(1)))
    memory_system = build_llm.calls[0]["messages"][0]["content"]
    assert f"Example:\n{memory_example()}" in memory_system and EXAMPLE_NEW_MEMORY in memory_system
    memory = {"summary": [{"episode_id": "e1", "snapshot_session": 1, "snapshot_turn": None, "memory": "S1",
                           "tokens": 1, "error": None}]}
    answer_llm = FakeChat(["ok"])
    asyncio.run(RSum().answer(answering(settings, answer_llm), probe(2), memory))
    response_system = answer_llm.calls[0]["messages"][0]["content"]
    assert f"Example:\n{response_example()}" in response_system
    assert response_example().endswith(f"Sam's next utterance: {EXAMPLE_SESSION[-1]['text']}")
    plain = FakeChat(["ok"])
    asyncio.run(RSum().answer(answering(RSumSettings(), plain), probe(2), memory))
    assert "Example:" not in plain.calls[0]["messages"][0]["content"]


def test_an_update_target_outside_the_pool_is_re_asked_for_every_op():
    ops = [Operation(new=1, op="keep", target=99)]
    with pytest.raises(ValueError, match=r"pool memory 1\.\.3.*keep of new memory 1 -> 99"):
        check_operations(Operations(operations=ops), 1, 3)
    with pytest.raises(ValueError, match="pool memory"):
        check_operations(Operations(operations=[Operation(new=1, op="append", target=4)]), 1, 3)
    check_operations(Operations(operations=[Operation(new=1, op="keep", target=3)]), 1, 3)


def update_responder(update_answers: list):
    def responder(messages, schema):
        if schema and schema.__name__ == "SessionMemories":
            s = re.search(r"news (\d+)", messages[-1]["content"]).group(1)
            return {"memories": [f"fact {s}"]}
        return update_answers.pop(0)
    return responder


def test_a_keep_with_target_99_is_re_asked_instead_of_failing_the_episode():
    answers = [{"operations": [{"new": 1, "op": "keep", "target": 99}]},
               {"operations": [{"new": 1, "op": "keep", "target": 1}]}]
    llm = FakeChat(responder=update_responder(answers))
    out = asyncio.run(AllMemoriesUpdate().build(MethodContext(settings=MemorySettings(), llm=llm), episode(2)))
    update = next(c for c in llm.calls if c["schema"].__name__ == "Operations")
    assert update["attempts"] == 2 and "99" in update["errors"][0]
    assert [(r["op"], r["target_id"], r["error"]) for r in out["operations"] if r["snapshot_session"] == 2
            ] == [("keep", "1:0", None)]
    assert [m["event"] for m in out["pool"] if m["snapshot_session"] == 2] == ["fact 1"]


def test_an_update_that_stays_out_of_range_is_recorded_and_appends_without_crashing():
    answers = [{"operations": [{"new": 1, "op": "keep", "target": 99}]}] * 2
    llm = FakeChat(responder=update_responder(list(answers)))
    method = AllMemoriesUpdate()
    out = asyncio.run(method.build(MethodContext(settings=MemorySettings(), llm=llm), episode(2)))
    op = next(r for r in out["operations"] if r["snapshot_session"] == 2)
    assert (op["op"], op["target_id"]) == ("append", None) and "99" in op["error"] and "keep" in op["raw"]
    assert [m["event"] for m in out["pool"] if m["snapshot_session"] == 2] == ["fact 1", "fact 2"]
    assert method.build_stats(out)["failed_updates"] == 1


def test_an_append_target_is_dropped_from_the_operation_record():
    answers = [{"operations": [{"new": 1, "op": "append", "target": 1}]}]
    llm = FakeChat(responder=update_responder(answers))
    out = asyncio.run(AllMemoriesUpdate().build(MethodContext(settings=MemorySettings(), llm=llm), episode(2)))
    assert [(r["op"], r["target_id"]) for r in out["operations"] if r["snapshot_session"] == 2] == [("append", None)]


def test_memory_retrieval_without_an_embedder_raises_instead_of_showing_every_memory():
    memories = [{"memory_id": f"1:{i}", "session_idx": 1, "memory_idx": i, "event": f"fact {i}",
                 "snapshot_session": 1, "source_turn_ids": []} for i in range(8)]
    no_embedder = answering(RetrievalSettings(), FakeChat(["ok"]), embed=None)
    with pytest.raises(RuntimeError, match="memory_retrieval .*no embedder"):
        asyncio.run(MemoryRetrieval().answer(no_embedder, probe(2), {"memories": memories}))
    few = asyncio.run(MemoryRetrieval().answer(answering(RetrievalSettings(), FakeChat(["ok"])), probe(2),
                                               {"memories": memories[:3]}))
    assert len(few.used_ids) == 3  # fewer memories than k: all of them, with an embedder present
    everything = asyncio.run(AllMemories().answer(answering(MemorySettings(), FakeChat(["ok"]), embed=None),
                                                  probe(2), {"memories": memories}))
    assert len(everything.used_ids) == 8  # all_memories needs no embedder


def test_a_failed_session_summary_is_logged_for_its_session_and_counted():
    def responder(messages, schema):
        s = re.search(r"news (\d+)", messages[-1]["content"]).group(1)
        if s == "2":
            return LLMError("summary call failed")
        return {"memories": [f"fact {s}a", f"fact {s}b"]}

    method = AllMemories()
    out = asyncio.run(method.build(MethodContext(settings=MemorySettings(), llm=FakeChat(responder=responder)),
                                   episode(3)))
    log = [(r["snapshot_session"], r["memories"], r["error"]) for r in out["build_log"]]
    assert log == [(1, 2, None), (2, 0, "summary call failed"), (3, 2, None)]
    assert {m["session_idx"] for m in out["memories"]} == {1, 3}
    assert method.build_stats(out) == {"summary_calls": 3, "failed_summaries": 1,
                                       "failed_summaries_per_episode": {"e1": 1}}
    assert set(AllMemoriesUpdate.memory) == {"pool", "operations", "build_log"}


BASELINES = ["rsum", "all_memories", "memory_retrieval", "all_memories_update", "memory_retrieval_update",
             "gold_memory", "part_context", "all_context"]


def test_on_the_sample_corpus_every_baseline_answers_every_probe(run_cfg, fake_llm):
    from pipeline.artifacts import StageDir
    from pipeline.engine.runner import Runner
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
    from pipeline.engine.runner import Runner
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
    from pipeline.engine.runner import Runner
    from stages import registry

    cfg = run_cfg("corpus.limit=1", "methods=[rsum,zero_history]", "probes.max_per_episode=3",
                  "stages=[ingest,probes,memory_rsum,respond_rsum,respond_zero_history]")
    Runner(cfg, registry(cfg)).run()
    probes = {p["probe_id"]: p for p in StageDir(cfg.run_dir, "probes").read_table("probes").to_pylist()}
    for r in StageDir(cfg.run_dir, "respond_rsum").read_table("responses").to_pylist():
        assert r["memory_after_session"] == probes[r["probe_id"]]["session_idx"] - 1
    for r in StageDir(cfg.run_dir, "respond_zero_history").read_table("responses").to_pylist():
        assert r["memory_after_session"] is None
