"""CREEM's blend-and-refine memory with a fake LLM, and through the runner."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from pydantic import ValidationError

from fake_chat import FakeChat
from stages.methods.base import BuildContext, EpisodeInput, ProbeInput, visible_memory
from stages.methods.creem import Creem, CreemNoPreblendSettings, CreemNoRefineSettings, CreemSettings


def mem(i: int, speaker: str = "Ann") -> dict:
    return {"memory_id": f"m{i}", "speaker": speaker, "text": f"{speaker} fact {i}", "session_idx": 1, "turn_idx": 0,
            "label": "New"}


def turns(n: int, session: int = 2) -> list[dict]:
    return [{"speaker": "Ann" if i % 2 == 0 else "Bob", "text": f"line {session}.{i}", "turn_idx": i}
            for i in range(n)]


def refined(label: str, removes: list[int]):
    def answer(messages, schema):
        if schema.__name__ == "Question":
            return {"question": "What changed for Ann?"}
        return {"insights": [{"text": "Ann moved to Rome", "label": label, "removes": removes}]}
    return answer


def step(memory, llm, settings=None, first=False, k=3):
    settings = settings or CreemSettings(k=k)
    return asyncio.run(Creem().step(llm, None, settings, memory, "Ann", 2, turns(3), first, [10]))


def test_an_updated_insight_removes_exactly_the_retrieved_memories_it_names():
    # Without an embedder the k most recent pieces are retrieved: memory m3 and utterances 2.0, 2.1.
    memory = {"Ann": [mem(1), mem(2), mem(3)], "Bob": [mem(4, "Bob")]}
    rows = step(memory, FakeChat(responder=refined("Updated", [1])))
    assert [m["memory_id"] for m in memory["Ann"]] == ["m1", "m2", "c11"]  # m3 gone, m1 and m2 never shown
    assert rows[0]["removed_ids"] == ["m3"] and rows[0]["label"] == "Updated"
    assert memory["Bob"] == [mem(4, "Bob")]  # memory about the other speaker is untouched


def test_a_new_insight_removes_nothing_and_a_removal_outside_the_retrieved_is_re_asked():
    memory = {"Ann": [mem(1), mem(2), mem(3)]}
    step(memory, FakeChat(responder=refined("New", [1])))
    assert [m["memory_id"] for m in memory["Ann"]] == ["m1", "m2", "m3", "c11"]
    answers = iter([{"insights": [{"text": "x", "label": "Redundant", "removes": [3]}]},
                    {"insights": [{"text": "x", "label": "Redundant", "removes": [1]}]}])
    llm = FakeChat(responder=lambda m, s: {"question": "q"} if s.__name__ == "Question" else next(answers))
    memory = {"Ann": [mem(1), mem(2), mem(3)]}
    step(memory, llm)
    refine_call = llm.calls[-1]
    assert refine_call["attempts"] == 2 and refine_call["errors"]  # "removes": [3] when only M1 was shown
    assert [m["memory_id"] for m in memory["Ann"]] == ["m1", "m2", "c11"]


def test_the_first_session_blends_without_refining():
    llm = FakeChat(responder=lambda m, s: {"insights": [{"text": "Ann likes tea"}, {"text": "Ann is a nurse"}]})
    memory: dict = {}
    rows = step(memory, llm, first=True)
    assert [r["label"] for r in rows] == ["Blended", "Blended"] and len(llm.calls) == 1
    assert llm.calls[0]["schema"].__name__ == "Blended" and "just met" in llm.calls[0]["messages"][0]["content"]


def test_without_refinement_insights_are_new_and_nothing_is_removed():
    memory = {"Ann": [mem(1), mem(2), mem(3)]}
    llm = FakeChat(responder=lambda m, s: {"question": "q"} if s.__name__ == "Question"
                   else {"insights": [{"text": "Ann moved"}]})
    rows = step(memory, llm, settings=CreemNoRefineSettings(k=3))
    assert rows[0]["label"] == "New" and len(memory["Ann"]) == 4
    assert "Redundant" not in llm.calls[-1]["messages"][0]["content"]


def builder(messages, schema):
    name = schema.__name__ if schema else None
    if name == "Question":
        return {"question": "What is new?"}
    if name == "Blended":
        return {"insights": [{"text": "insight"}]}
    if name == "BlendedAndRefined":  # the schema built for the number of memories retrieved
        return {"insights": [{"text": "insight", "label": "New", "removes": []}]}
    return "Bob: I remember!"


def test_memory_per_session_is_what_a_later_probe_sees_and_preblend_is_an_ablation():
    sessions = {1: turns(2, 1), 2: turns(4, 2), 3: turns(2, 3)}
    episode = EpisodeInput(episode={"episode_id": "e1", "speakers": ["Ann", "Bob"], "dataset": "sample"},
                           sessions=sessions)
    out = asyncio.run(Creem().build(BuildContext(llm=FakeChat(responder=builder), settings=CreemSettings()), episode))
    assert {r["label"] for r in out["evolution"] if r["session_idx"] == 1} == {"Blended"}
    assert {r["label"] for r in out["evolution"] if r["session_idx"] == 2} == {"New"}
    assert {m["speaker"] for m in out["memories"]} == {"Ann", "Bob"}
    seen = {t: visible_memory(rows, 3, 1, "snapshots") for t, rows in out.items()}
    assert {m["snapshot_session"] for m in seen["memories"]} == {2}
    assert max(m["session_idx"] for m in seen["memories"]) == 2
    probe = ProbeInput(probe={"probe_id": "p", "kind": "next_response", "session_idx": 3, "turn_idx": 1,
                              "respondent": "Bob", "request": "line 3.0"},
                       episode=episode.episode, history={}, current=sessions[3][:1])
    llm = FakeChat(responder=builder)
    answer = asyncio.run(Creem().answer(llm, probe, seen, CreemSettings()))
    assert answer.text == "I remember!" and answer.details["question"] == "What is new?"
    assert [c["schema"].__name__ for c in llm.calls if c["schema"]] == ["Question", "Blended"]
    llm = FakeChat(responder=builder)
    asyncio.run(Creem().answer(llm, probe, seen, CreemNoPreblendSettings()))
    assert [c["schema"].__name__ if c["schema"] else None for c in llm.calls] == ["Question", None]


def test_on_the_sample_corpus_creem_answers_every_probe_and_logs_its_evolution(run_cfg, fake_llm):
    from pipeline.artifacts import StageDir
    from pipeline.runner import Runner
    from stages import registry

    methods = ["creem", "creem_no_refine", "creem_no_preblend"]
    cfg = run_cfg("corpus.limit=1", f"methods=[{','.join(methods)}]", "method.creem.update_every=4",
                  "method.creem_no_refine.update_every=4", "method.creem_no_preblend.update_every=4",
                  "judge_memory.enabled=false", "judge_pairwise.enabled=false", "judge_answers.enabled=false")
    Runner(cfg, registry(cfg)).run()
    n_probes = StageDir(cfg.run_dir, "probes").manifest().rows
    for m in methods:
        rows = StageDir(cfg.run_dir, f"respond_{m}").read_table("responses").to_pylist()
        assert len(rows) == n_probes and all(r["error"] is None for r in rows), m
        sd = StageDir(cfg.run_dir, f"memory_{m}")
        assert sd.read_table("memories").num_rows > 0 and sd.read_table("evolution").num_rows > 0
    manifest = StageDir(cfg.run_dir, "memory_creem").manifest()
    logged = StageDir(cfg.run_dir, "memory_creem").read_table("evolution").to_pylist()
    assert manifest.stats["insights"] == dict(Counter(r["label"] for r in logged if r["label"])) != {}
    evolution = StageDir(cfg.run_dir, "report").read_table("evolution_summary").to_pylist()
    assert {r["method"] for r in evolution} == set(methods)
    for m in methods:
        assert abs(sum(r["share"] for r in evolution if r["method"] == m) - 1.0) < 1e-9


def test_the_refine_schema_lets_removals_name_only_the_memories_shown():
    from stages.methods.creem import blend_refine_schema

    schema = blend_refine_schema(2)
    assert schema.model_validate({"insights": [{"text": "x", "label": "Updated", "removes": [2]}]})
    for bad in ([3], [0], [1, 2, 1]):
        with pytest.raises(ValidationError):
            schema.model_validate({"insights": [{"text": "x", "label": "Updated", "removes": bad}]})
    assert blend_refine_schema(0).model_validate({"insights": [{"text": "x", "label": "New"}]})
