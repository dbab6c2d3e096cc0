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
# The built-in methods that write memory; the library systems' (mem0, graphiti, ...) operation rows are
# checked where every method runs (tests/test_all_methods.py): graphiti alone takes ~45 s here.
WRITERS = [name for name, m in METHODS.items() if writes_memory(m) and not type(m).__module__.endswith("_library")]
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


@pytest.mark.heavy(seconds=40)
def test_every_memory_writing_method_gets_halumems_operation_scores_offline(tmp_path, fake_llm, models_cache,
                                                                            monkeypatch):
    assert {"rsum", "creem", "ld_agent", "theanine", "mem0_style", "memochat", "comedy"} <= set(WRITERS)
    cfg = run_shipped_config_offline("halumem", [f"corpus.path={FIXTURE}",
                                                 f"methods={json.dumps(WRITERS)}"],
                                     tmp_path, fake_llm, models_cache, monkeypatch, responder)
    ops = StageDir(cfg.run_dir, "memory_ops").read_table("operations").to_pylist()
    points = StageDir(cfg.run_dir, "ingest").read_table("memory_points").to_pylist()
    updates = {p["point_id"] for p in points if p["is_update"]}
    assert points and updates
    for method in WRITERS:
        mine = [r for r in ops if r["method"] == method]
        judged = {r["item_id"] for r in mine if r["op"] in ("integrity", "update")}
        assert judged == {p["point_id"] for p in points}, method  # every gold point, once
        assert {r["op"] for r in mine if r["item_id"] in updates} <= {"update", "integrity"}
        assert all(r["gold_points"] for r in mine if r["op"] == "accuracy")
    summary = {r["method"]: r for r in StageDir(cfg.run_dir, "report").read_table("memory_ops").to_pylist()}
    assert set(summary) == set(WRITERS)
    for method, row in summary.items():
        assert row["recall"] is not None and row["failed"] == 0, method
    answers = StageDir(cfg.run_dir, "judge_answers").read_table("answer_judgments").to_pylist()
    assert answers and {r["judge"] for r in answers} == {"halumem"} and {r["score"] for r in answers} == {1.0}
