"""configs/halumem.yaml runs offline on the HaluMem fixture (the release's layout) against the fake server:
every method that writes its own memory gets HaluMem's operation scores (integrity, accuracy, update),
its answers HaluMem's QA judge, and the report its operation table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_shipped_config_offline
from pipeline.artifacts import StageDir
from stages.judging import halumem
from stages.judging.memory_ops import writes_memory
from stages.methods import METHODS
from test_all_methods import answering_validly

FIXTURE = Path(__file__).parent / "fixtures" / "corpora" / "halumem" / "HaluMem-Long.jsonl"
# The methods that write memory: built in, and the library systems (their extras), run apart (graphiti's
# build alone takes ~45 s).
ALL_WRITERS = [name for name, m in METHODS.items() if writes_memory(m)]
LIBRARIES = [name for name in ALL_WRITERS if type(METHODS[name]).__module__.endswith("_library")]
WRITERS = [name for name in ALL_WRITERS if name not in LIBRARIES]
REPLIES = {halumem.INTEGRITY_PROMPT[:60]: {"reasoning": "x", "score": "2"},
           halumem.ACCURACY_PROMPT[:60]: {"accuracy_score": "2", "is_included_in_golden_memories": "true", "reason": "x"},
           halumem.UPDATE_PROMPT[:60]: {"reason": "x", "evaluation_result": "Correct"},
           halumem.QA_PROMPT[:60]: {"reasoning": "x", "evaluation_result": "Correct"}}


def responder(body: dict) -> str | None:
    text = body["messages"][-1]["content"]
    for opening, reply in REPLIES.items():
        if text.startswith(opening):
            return f"```json\n{json.dumps(reply)}\n```"
    return answering_validly(body)


def run_writers(methods: list[str], tmp_path, fake_llm, models_cache, monkeypatch) -> tuple:
    cfg = run_shipped_config_offline("halumem", [f"corpus.path={FIXTURE}", f"methods={json.dumps(methods)}"],
                                     tmp_path, fake_llm, models_cache, monkeypatch, responder)
    ops = StageDir(cfg.run_dir, "memory_ops").read_table("operations").to_pylist()
    points = StageDir(cfg.run_dir, "ingest").read_table("memory_points").to_pylist()
    assert points and any(p["is_update"] for p in points)
    for method in methods:
        judged = {r["item_id"] for r in ops if r["method"] == method and r["op"] in ("integrity", "update")}
        assert judged == {p["point_id"] for p in points}, method  # every gold point, once
    summary = {r["method"]: r for r in StageDir(cfg.run_dir, "report").read_table("memory_ops").to_pylist()}
    assert set(summary) == set(methods)
    for method, row in summary.items():
        assert row["recall"] is not None and row["failed"] == 0, method
    return cfg, ops


@pytest.mark.heavy(seconds=40)
def test_every_builtin_memory_writer_gets_halumems_operation_scores_offline(tmp_path, fake_llm, models_cache,
                                                                           monkeypatch):
    assert {"rsum", "creem", "ld_agent", "theanine", "mem0_style", "memochat", "comedy"} <= set(WRITERS)
    cfg, ops = run_writers(WRITERS, tmp_path, fake_llm, models_cache, monkeypatch)
    updates = {r["item_id"] for r in ops if r["op"] == "update"}
    assert updates  # the built-in writers' memories answer the update search
    assert all(r["gold_points"] for r in ops if r["op"] == "accuracy")
    answers = StageDir(cfg.run_dir, "judge_answers").read_table("answer_judgments").to_pylist()
    assert answers and {r["judge"] for r in answers} == {"halumem"} and {r["score"] for r in answers} == {1.0}


@pytest.mark.heavy(seconds=60)
def test_every_library_memory_system_gets_halumems_operation_scores_offline(tmp_path, fake_llm, models_cache,
                                                                           monkeypatch):
    assert set(LIBRARIES) == {"mem0", "langmem", "a_mem", "graphiti"}
    run_writers(LIBRARIES, tmp_path, fake_llm, models_cache, monkeypatch)
