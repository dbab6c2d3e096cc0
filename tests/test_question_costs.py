"""What one question costs each method (issue 64, part 2): build cost spread over the probes, answer
tokens and latency, and dollars per correct answer under the first correct / wrong judge."""

from __future__ import annotations

import polars as pl
import pytest

from pipeline.artifacts import StageDir
from pipeline.runner import Runner
from stages import registry
from stages.report.question_costs import question_costs, verdict_judge


def test_costs_are_spread_over_probes_and_divided_by_the_correct_answers():
    responses = pl.DataFrame({"method": ["a", "a", "b", "b"], "error": [None, None, None, "boom"],
                              "prompt_tokens": [100, 300, 50, None], "completion_tokens": [10, 30, 5, None],
                              "latency_s": [1.0, 3.0, 0.5, None]})
    costs = pl.DataFrame({"method": ["a", "a", "b"], "stage_kind": ["memory", "respond", "respond"],
                          "prompt_tokens": [1000.0, 400.0, 50.0], "completion_tokens": [200.0, 40.0, 5.0],
                          "cost_usd": [0.4, 0.2, 0.1]})
    answers = pl.DataFrame({"dataset": ["d"] * 6, "episode_id": ["e"] * 6, "probe_id": ["p1", "p2", "p1", "p2", "p1", "p1"],
                            "method": ["a", "a", "b", "b", "a", "b"],
                            "judge": ["strict", "strict", "strict", "strict", "gpt4score", "gpt4score"],
                            "judge_kind": ["strict"] * 4 + ["gpt4score"] * 2, "run": [0] * 6,
                            "score": [1.0, 1.0, 0.0, 0.0, 80.0, 20.0], "skipped": [None] * 6,
                            "error": [None, None, None, "no response from b", None, None]})
    assert verdict_judge(answers) == "strict"
    rows = {r["method"]: r for r in question_costs(responses, costs, answers).iter_rows(named=True)}
    a, b = rows["a"], rows["b"]
    assert a["build_tokens_per_probe"] == 600.0 and a["build_usd_per_probe"] == pytest.approx(0.2)
    assert a["answer_tokens_per_probe"] == 220.0 and a["answer_usd_per_probe"] == pytest.approx(0.1)
    assert a["latency_p50_s"] == pytest.approx(2.0) and a["correct"] == 2.0 and a["accuracy"] == 1.0
    assert a["usd_per_correct"] == pytest.approx(0.3)  # (0.4 + 0.2) / 2
    assert b["correct"] == 0.0 and b["usd_per_correct"] is None and b["latency_p95_s"] == 0.5  # failed: not timed


def test_the_report_shows_each_methods_cost_and_latency_per_question(run_cfg, fake_llm):
    fake_llm.latency_s = 0.02
    cfg = run_cfg("corpus.limit=1", "methods=[rsum,full_history]", "judge_memory.enabled=false",
                  "judge_pairwise.enabled=false", "judge_answers.correctness=[strict]")
    Runner(cfg, registry(cfg)).run()
    rows = StageDir(cfg.run_dir, "report").read_table("question_costs").to_pylist()
    assert {r["method"] for r in rows} == {"rsum", "full_history"}
    rsum = next(r for r in rows if r["method"] == "rsum")
    assert rsum["build_tokens_per_probe"] > 0 and rsum["answer_tokens_per_probe"] > 0
    assert rsum["latency_p50_s"] >= 0.02 and rsum["judge"] == "strict" and rsum["judged"] > 0
    html = (cfg.run_dir / "report" / "report.html").read_text()
    assert "Cost and latency per question" in html
