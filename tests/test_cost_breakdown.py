"""Where the money goes: the report's `cost_breakdown` (per stage, role and method) from hand-made
manifests, and `mempipe plan`'s per-method split of the judges (pipeline/plan/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.artifacts import MANIFEST, atomic_write_json
from pipeline.llm.prices import cost_usd, role_prices
from pipeline.llm.usage import Usage
from pipeline.manifest import Manifest, Timings
from pipeline.llm.usage import SHARED
from pipeline.plan import DryRun, Plan, StageEstimate, _estimate_stage, render
from stages import load_config
from pipeline.engine.shard import in_pipeline_order, with_their_upstream
from stages.report import ReportStage, stage_usage, tables

ROOT = Path(__file__).resolve().parent.parent


def _manifest(stage: str, role: str, u: Usage, finished: str = "", upstream: dict[str, str] | None = None,
              fingerprint: str = "fp") -> Manifest:
    return Manifest(stage, fingerprint, upstream=upstream or {}, llm_usage={role: u}, roles={role: "gpt-4o"},
                    timings=Timings(finished_at=finished))


def test_cost_breakdown_splits_a_judge_by_method_and_falls_back_to_the_stage_owner():
    judge = Usage(calls=8, requests=6, prompt_tokens=8000, cached_prompt_tokens=2000, completion_tokens=400,
                  cost_usd=0.04, cached_cost_usd=0.01, cost_by_method={"rsum": 0.03, "turn": 0.01},
                  cached_cost_by_method={"turn": 0.01})
    memory = Usage(calls=4, requests=4, prompt_tokens=1000, completion_tokens=100, cost_usd=0.005)  # an older manifest
    segment = Usage(calls=2, requests=2, prompt_tokens=500, completion_tokens=50, cost_usd=0.002)
    manifests = {"segment": _manifest("segment", "segmenter", segment),
                 "memory_rsum": _manifest("memory_rsum", "memory", memory),
                 "judge_answers": _manifest("judge_answers", "judge", judge)}
    out = tables.cost_breakdown(manifests, {"memory_rsum": "rsum", "respond_rsum": "rsum"})
    assert out.columns == tables.COST_BREAKDOWN.names
    rows = {(r["stage"], r["method"]): r for r in out.iter_rows(named=True)}
    assert set(rows) == {("segment", SHARED), ("memory_rsum", "rsum"), ("judge_answers", "rsum"),
                         ("judge_answers", "turn")}
    # Without a split: the whole (stage, role) to the stage's method, or shared.
    assert rows[("memory_rsum", "rsum")]["stage_kind"] == "memory" and rows[("memory_rsum", "rsum")]["calls"] == 4
    assert rows[("memory_rsum", "rsum")]["spent_usd"] == pytest.approx(0.005)
    shared = rows[("segment", SHARED)]
    assert shared["stage_kind"] == "other" and shared["cost_usd"] == pytest.approx(0.002)
    # With one: cost per method, tokens and calls in proportion to it, the cache's savings where they fell.
    rsum, turn = rows[("judge_answers", "rsum")], rows[("judge_answers", "turn")]
    assert rsum["stage_kind"] == turn["stage_kind"] == "judge" and rsum["model"] == "gpt-4o"
    assert (rsum["cost_usd"], turn["cost_usd"]) == (pytest.approx(0.03), pytest.approx(0.01))
    assert (rsum["calls"], rsum["requests"], rsum["prompt_tokens"], rsum["cached_prompt_tokens"],
            rsum["completion_tokens"]) == (6, 4.5, 6000, 1500, 300)
    assert (rsum["spent_usd"], turn["spent_usd"]) == (pytest.approx(0.03), pytest.approx(0.0))
    judged = out.filter(out["stage"] == "judge_answers")
    assert judged["calls"].sum() == pytest.approx(8) and judged["cost_usd"].sum() == pytest.approx(0.04)

    views = dict(tables.cost_views(out))
    per_method = {r["method"]: r for r in views["Per method"].iter_rows(named=True)}
    assert list(per_method) == ["rsum", "turn", SHARED]  # shared last
    assert per_method["rsum"]["memory_usd"] == pytest.approx(0.005)
    assert per_method["rsum"]["judges_usd"] == pytest.approx(0.03)
    assert per_method["rsum"]["total_usd"] == pytest.approx(0.035)
    assert per_method[SHARED]["other_usd"] == pytest.approx(0.002)
    assert views["Per stage"]["stage"].to_list() == ["segment", "memory_rsum", "judge_answers"]
    assert views["Per role"].filter(views["Per role"]["role"] == "judge")["cost_usd"].item() == pytest.approx(0.04)
    assert tables.to_arrow(out, tables.COST_BREAKDOWN).num_rows == 4  # written as the others are
    assert tables.cost_breakdown({}, {}).is_empty() and tables.cost_views(tables.cost_breakdown({}, {})) == []


def test_method_summary_usage_counts_cached_prompt_tokens():
    u = Usage(calls=3, prompt_tokens=900, cached_prompt_tokens=300, completion_tokens=30, cost_usd=0.01)
    got = stage_usage({"respond_rsum": _manifest("respond_rsum", "generator", u)}, ["respond_rsum", "memory_rsum"])
    assert got["cached_prompt_tokens"] == 300 and got["prompt_tokens"] == 900 and got["calls"] == 3
    assert "cached_prompt_tokens" in tables.METHOD_SUMMARY.names


def test_the_report_also_counts_the_stages_upstream_of_its_inputs_that_fed_it(tmp_path):
    """segment feeds memory_secom, which the report reads: its manifest is found through the
    recorded upstream fingerprint; a manifest of another fingerprint (a rerun since) is not."""
    seg = _manifest("segment", "segmenter", Usage(calls=1, cost_usd=0.1), "2026-01-01T00:00:01", fingerprint="seg1")
    (tmp_path / "segment").mkdir()
    atomic_write_json(tmp_path / "segment" / MANIFEST, seg.to_json())
    # (finished "before" segment, as a clock may say: still listed after the stage it read)
    memory = _manifest("memory_secom", "memory", Usage(calls=1), "2026-01-01T00:00:00", {"segment": "seg1"})
    assert ReportStage.whole_upstream  # the runner hands the report these (tests/test_runner.py)
    got = in_pipeline_order(with_their_upstream(tmp_path, {"memory_secom": memory}))
    assert list(got) == ["segment", "memory_secom"] and got["segment"].llm_usage["segmenter"].cost_usd == 0.1
    stale = _manifest("memory_secom", "memory", Usage(calls=1), "", {"segment": "seg0"})
    assert list(in_pipeline_order(with_their_upstream(tmp_path, {"memory_secom": stale}))) == ["memory_secom"]


def test_the_report_has_a_where_the_money_goes_section(tmp_path):
    from types import SimpleNamespace

    import polars as pl

    from stages.report import REPORT_MD, ReportSettings, ReportStage

    t = {name: tables.empty(schema) for name, schema in tables.SUMMARY_TABLES.items()}
    t["method_summary"] = pl.concat([t["method_summary"], pl.DataFrame({"method": ["rsum"], "probes": [2]})],
                                    how="diagonal_relaxed")
    judge = Usage(calls=2, prompt_tokens=100, cost_usd=0.02, cost_by_method={"rsum": 0.02})
    t["cost_breakdown"] = tables.cost_breakdown({"judge_answers": _manifest("judge_answers", "judge", judge)}, {})
    cfg = SimpleNamespace(judge_pairwise=SimpleNamespace(reference=None), paper=None, report=ReportSettings(),
                          roles={}, role=lambda r: SimpleNamespace(model="m"), run_name="r",
                          corpus=SimpleNamespace(sources=list))
    stage = ReportStage()
    stage.write_report(SimpleNamespace(out_dir=tmp_path, cfg=cfg), ReportSettings(), t, [], pl.DataFrame(),
                       pl.DataFrame(), pl.DataFrame())
    md = (tmp_path / REPORT_MD).read_text()
    section = md[md.index("## Where the money goes"):]
    assert "| method | memory_usd | respond_usd | judges_usd | other_usd | total_usd | spent_usd |" in section
    assert "| rsum | 0.000 | 0.000 | 0.020 | 0.000 | 0.020 | 0.020 |" in section and "**Per role**" in section


def _dry_estimate(cfg, stage, u: Usage) -> list:
    manifest = Manifest(stage.name, "fp", llm_usage={stage.roles[0]: u})
    dry = DryRun({stage.name: manifest}, {}, {stage.name: 100.0}, 2, [])  # max_tokens 100, 2 episodes
    return _estimate_stage(cfg, stage, dry, 1.0, None, 0.5, 2, 2)


def test_plan_splits_a_judge_by_the_dry_runs_cost_per_method_and_prices_cached_prompts():
    from stages import registry

    cfg = load_config(ROOT / "configs" / "default.yaml", [
        "llm.provider=openai", "llm.model=gpt-4o", "methods=[rsum,full_history]", "teabag.enabled=false",
        "stages=[ingest,probes,memory_rsum,respond_rsum,respond_full_history,judge_answers]"])
    stages = registry(cfg)
    judge, memory = stages["judge_answers"], stages["memory_rsum"]
    assert judge.billed_method == "" and memory.billed_method == "rsum"
    [j] = _dry_estimate(cfg, judge, Usage(calls=10, prompt_tokens=10_000, cached_prompt_tokens=4_000,
                                          completion_tokens=1, cost_usd=0.3,
                                          cost_by_method={"rsum": 0.225, "full_history": 0.075}))
    # 50 completion tokens per call (half of max_tokens 100); 40% of the prompts from the prompt cache.
    assert (j.calls, j.prompt_tokens, j.cached_prompt_tokens, j.completion_tokens) == (10, 10_000, 4_000, 500)
    price = role_prices(cfg.role("judge"))
    assert price["cached_input"] < price["input"]
    assert j.cost_usd == pytest.approx(cost_usd(price, 10_000, 500, 4_000))
    assert j.cost_usd < cost_usd(price, 10_000, 500)
    assert j.by_method == pytest.approx({"rsum": 0.75 * j.cost_usd, "full_history": 0.25 * j.cost_usd})
    # No split in the dry run's manifest: a method's own stage is its; a judge is shared.
    [m] = _dry_estimate(cfg, memory, Usage(calls=4, prompt_tokens=1000))
    assert m.cached_prompt_tokens == 0 and m.by_method == {"rsum": m.cost_usd}
    [shared] = _dry_estimate(cfg, judge, Usage(calls=4, prompt_tokens=1000))
    assert shared.by_method == {SHARED: shared.cost_usd}

    plan = Plan("r", "/tmp/r", [StageEstimate("memory_rsum", "new", "", "fp", True, [m], "rsum"),
                                StageEstimate("judge_answers", "new", "", "fp", True, [j], ""),
                                StageEstimate("judge_memory", "done", "", "fp", False, [shared], "")],
                {"prices": "", "cache": "", "cached_prompt_tokens": "rule", "by_method": "split"})
    rsum = plan.by_method()["rsum"]
    assert rsum["memory"] == pytest.approx(m.cost_usd)
    assert rsum["judges"] == {"judge_answers": pytest.approx(0.75 * j.cost_usd)}
    assert rsum["total"] == pytest.approx(m.cost_usd + 0.75 * j.cost_usd)
    assert SHARED not in plan.by_method()  # judge_memory does not run
    data = plan.to_json()
    assert sum(row["total"] for row in data["by_method"].values()) == pytest.approx(data["total"]["cost_usd"], abs=1e-5)
    assert data["by_role"]["judge"]["cached_prompt_tokens"] == 4_000 == data["total"]["cached_prompt_tokens"]
    text = render(plan)
    assert "where the money goes, per method" in text and "judge_answers $" in text and "per role:" in text


def test_plan_json_has_the_per_method_and_per_role_views(run_cfg, fake_llm):
    """End to end on the simulated endpoint: every method's stages and the judge's share add up to the total."""
    from pipeline.plan import make_plan
    from stages import registry

    cfg = run_cfg("corpus.limit=1", "methods=[rsum]", "llm.model=gpt-4o-mini",
                  "stages=[ingest,probes,memory_rsum,respond_rsum,judge_answers]")
    plan = make_plan(cfg, registry, write=False)
    data = plan.to_json()
    assert fake_llm.total == 0
    by_method = data["by_method"]
    assert by_method["rsum"]["memory"] > 0 and by_method["rsum"]["respond"] > 0
    judge = next(s for s in data["stages"] if s["name"] == "judge_answers")
    assert sum(row["judges"].get("judge_answers", 0) for row in by_method.values()) == pytest.approx(
        judge["cost_usd"], abs=1e-5)
    assert sum(row["total"] for row in by_method.values()) == pytest.approx(data["total"]["cost_usd"], abs=1e-5)
    assert set(data["by_role"]) == {"memory", "generator", "judge"}
    assert "cached_prompt_tokens" in data["method"] and "1024 tokens" in data["method"]["cached_prompt_tokens"]
    assert "where the money goes" in render(plan)
