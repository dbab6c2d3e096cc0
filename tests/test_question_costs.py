"""What one question costs each method (issue 64, part 2): build cost spread over the probes, answer
tokens and latency, and dollars per correct answer under the first correct / wrong judge."""

from __future__ import annotations

import polars as pl
import pytest

from pipeline.artifacts import StageDir
from pipeline.engine.runner import Runner
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


def test_each_probe_carries_its_own_episodes_build_split_over_that_episodes_probes():
    # e1 cost 900 build tokens and has 3 probes of method a; e2 cost 100 and has 1; e3 was built but
    # none of its probes was answered, so its 1000 tokens reach no probe.
    responses = pl.DataFrame({"episode_id": ["e1", "e1", "e1", "e2", "e1"], "method": ["a"] * 4 + ["b"],
                              "error": [None] * 5, "prompt_tokens": [10] * 5, "completion_tokens": [0] * 5,
                              "latency_s": [1.0] * 5})
    costs = pl.DataFrame({"method": ["a", "b"], "stage_kind": ["memory", "memory"],
                          "prompt_tokens": [1800.0, 50.0], "completion_tokens": [200.0, 0.0], "cost_usd": [2.0, 0.5]})
    per_episode = {"a": {"e1": {"calls": 3, "prompt_tokens": 800, "completion_tokens": 100},
                         "e2": {"calls": 1, "prompt_tokens": 90, "completion_tokens": 10},
                         "e3": {"calls": 9, "prompt_tokens": 1000, "completion_tokens": 0}}}
    rows = {r["method"]: r for r in question_costs(responses, costs, pl.DataFrame(), per_episode).iter_rows(named=True)}
    a, b = rows["a"], rows["b"]
    # per probe 300, 300, 300, 100: the mean over a's probes, not the run's 2000 over its 4 probes
    assert a["build_spread"] == "episode" and a["build_tokens_per_probe"] == pytest.approx(250.0)
    # $2 split by token share: e1 0.9, e2 0.1 (e3 1.0 reaches no probe); per probe 0.3 x 3 and 0.1
    assert a["build_usd_per_probe"] == pytest.approx(0.25)
    # b's manifest records no episodes: the run-wide division, as before
    assert b["build_spread"] == "run" and b["build_tokens_per_probe"] == 50.0 and b["build_usd_per_probe"] == 0.5
    # a method with no memory stage built nothing
    plain = question_costs(responses.filter(pl.col("method") == "b").with_columns(pl.lit("c").alias("method")),
                           costs, pl.DataFrame(), per_episode).row(0, named=True)
    assert plain["build_spread"] is None and plain["build_tokens_per_probe"] == 0.0


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
    # rsum's memory manifest records its calls per episode: its build is spread episode by episode
    assert rsum["build_spread"] == "episode"
    assert next(r for r in rows if r["method"] == "full_history")["build_spread"] is None
    html = (cfg.run_dir / "report" / "report.html").read_text()
    assert "Cost and latency per question" in html
    # The same run's report reads the diagnose stage's buckets (on by default): table, section, figure.
    diagnosed = StageDir(cfg.run_dir, "report").read_table("diagnosis").to_pylist()
    assert {r["method"] for r in diagnosed} == {"rsum", "full_history"} and all(r["probes"] for r in diagnosed)
    assert "Why answers fail: write, retrieval, read" in html and (cfg.run_dir / "report" / "diagnosis.png").is_file()
