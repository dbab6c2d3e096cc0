"""`mempipe plan`: which stages a run would run and why, and the calls, tokens and cost it expects,
from a dry run on the simulated endpoint (pipeline/plan/, pipeline/plan/simulated.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.artifacts import StageDir
from pipeline.config import LLMConfig
from pipeline.llm.prices import BATCH_DISCOUNT, DEFAULT_PRICES, prices_for, role_prices
from pipeline.plan import make_plan
from pipeline.engine.progress import PLAN_FILE, planned_calls
from pipeline.engine.runner import Runner

RSUM = ("methods=[rsum]", "stages=[ingest,probes,memory_rsum,respond_rsum,judge_answers]")


def _registry(cfg):
    from stages import registry

    return registry(cfg)


def _states(plan) -> dict[str, str]:
    return {s.name: s.state for s in plan.stages}


def _real(run_dir: Path, stage: str) -> dict[str, float]:
    """A finished stage's calls (answered + failed), prompt and completion tokens over its roles."""
    m = StageDir(run_dir, stage).manifest()
    out = {"calls": 0.0, "prompt_tokens": 0.0, "completion_tokens": 0.0}
    for u in (m.llm_usage or {}).values():
        out["calls"] += u.calls + u.failed_calls
        out["prompt_tokens"] += u.prompt_tokens
        out["completion_tokens"] += u.completion_tokens
    return out


def _est(plan, stage: str) -> dict[str, float]:
    return next(s for s in plan.stages if s.name == stage).total()


def test_plan_says_new_done_stale_forced_and_never_calls_the_real_endpoint(run_cfg, fake_llm):
    cfg = run_cfg("corpus.limit=2", *RSUM)
    plan = make_plan(cfg, _registry)
    assert fake_llm.total == 0  # the dry run went to the simulated endpoint only
    assert set(_states(plan).values()) == {"new"}
    assert all(s.runs for s in plan.stages)
    assert _est(plan, "memory_rsum")["calls"] > 0 and _est(plan, "judge_answers")["calls"] > 0
    assert _est(plan, "ingest")["calls"] == 0  # no LLM role

    Runner(cfg, _registry(cfg)).run()
    after_run = fake_llm.total
    plan = make_plan(cfg, _registry)
    assert set(_states(plan).values()) == {"done"}
    assert plan.total()["calls"] == 0 and not any(s.runs for s in plan.stages)

    # A judge setting changes the judge stage only; an RSum setting RSum's stages, and the judge after them.
    edited = run_cfg("corpus.limit=2", *RSUM, "judge_answers.max_tokens=40")
    assert _states(make_plan(edited, _registry)) == {
        "ingest": "done", "probes": "done", "memory_rsum": "done", "respond_rsum": "done", "judge_answers": "stale"}
    edited = run_cfg("corpus.limit=2", *RSUM, "method.rsum.max_words=40")
    plan = make_plan(edited, _registry)
    assert _states(plan) == {"ingest": "done", "probes": "done", "memory_rsum": "stale", "respond_rsum": "stale",
                             "judge_answers": "stale"}
    why = {s.name: s.why for s in plan.stages}
    assert "settings" in why["memory_rsum"] and why["respond_rsum"] == "upstream changed: memory_rsum"

    # The selectors of `mempipe run`, through the same Runner.select.
    assert _states(make_plan(cfg, _registry, force=["respond_rsum"]))["respond_rsum"] == "forced"
    plan = make_plan(cfg, _registry, from_="respond_rsum")
    assert _states(plan) == {"ingest": "not selected", "probes": "not selected", "memory_rsum": "not selected",
                             "respond_rsum": "forced", "judge_answers": "forced"}
    assert _states(make_plan(edited, _registry, only=["memory_rsum"]))["respond_rsum"] == "not selected"
    assert fake_llm.total == after_run  # no plan ever reached the real endpoint
    assert StageDir(cfg.run_dir, "respond_rsum").manifest() is not None  # a forced plan invalidates nothing


def test_calls_known_upfront_are_exact_and_a_previous_run_calibrates_the_rest(run_cfg, fake_llm):
    cfg = run_cfg("corpus.limit=2", *RSUM)
    before = make_plan(cfg, _registry)
    assert "assumed" in before.stages[-1].roles[0].method["completion_tokens"]
    Runner(cfg, _registry(cfg)).run()
    # One call per probe and method: known before the run, counted exactly by the dry run (RSum's
    # memory, one call per session, too).
    for stage in ("memory_rsum", "respond_rsum", "judge_answers"):
        assert _est(before, stage)["calls"] == _real(cfg.run_dir, stage)["calls"] > 0, stage
    # The fake server counts words, the dry run cl100k tokens: calibrated on this run's manifests
    # (a forced rebuild of the same config), the estimate is the run's own figures.
    again = make_plan(cfg, _registry, from_="memory_rsum")
    for stage in ("memory_rsum", "respond_rsum", "judge_answers"):
        est, real = _est(again, stage), _real(cfg.run_dir, stage)
        for k in ("calls", "prompt_tokens", "completion_tokens"):
            assert est[k] == pytest.approx(real[k], rel=1e-6), (stage, k)
        assert "calibrated on this run's manifests" in next(s for s in again.stages if s.name == stage).roles[0].method[
            "completion_tokens"]
    assert again.method["calibration"] == "this run's manifests"


def test_json_total_is_the_sum_of_its_stages_and_plan_file_feeds_the_progress_line(
        run_cfg, fake_llm, capsys, tmp_path, models_cache):
    from stages.cli import main

    sets = [f"artifacts_dir={tmp_path / 'artifacts'}", "llm.provider=openai", f"llm.base_url={fake_llm.base_url}",
            "llm.api_key_env=MEMPIPE_TEST_KEY", f"llm.cache_dir={tmp_path / 'llm-cache'}",
            f"embedding.cache_dir={models_cache}", "teabag.enabled=false", "corpus.limit=1",
            "llm.model=gpt-4o-mini", *RSUM]
    config = str(Path(__file__).resolve().parent.parent / "configs" / "default.yaml")
    assert main(["plan", "--json", "-c", config, *(a for s in sets for a in ("--set", s))]) == 0
    data = json.loads(capsys.readouterr().out)
    running = [s for s in data["stages"] if s["runs"]]
    for key in ("calls", "prompt_tokens", "completion_tokens"):
        assert data["total"][key] == sum(s[key] for s in running) > 0
        for s in running:
            assert s[key] == sum(r[key] for r in s["roles"])
    assert data["total"]["cost_usd"] == pytest.approx(sum(s["cost_usd"] for s in running), abs=1e-9)
    assert data["total"]["cost_usd"] > 0  # gpt-4o-mini has a price in the default table
    assert {"dry_run", "calibration", "prices"} <= set(data["method"])
    assert fake_llm.total == 0

    # `_plan.json` holds each stage's estimate under its fingerprint: `mempipe run` with the same
    # config finds its expected calls; another fingerprint finds none.
    run = run_cfg(*sets)
    plan_file = json.loads((run.run_dir / PLAN_FILE).read_text())
    judge = next(s for s in data["stages"] if s["name"] == "judge_answers")
    assert plan_file["stages"]["judge_answers"] == {"fingerprint": judge["fingerprint"],
                                                   **{k: judge[k] for k in data["total"]}}
    fps = Runner(run, _registry(run)).fingerprints()
    assert planned_calls(run.run_dir, "judge_answers", fps["judge_answers"]) == judge["calls"]
    assert planned_calls(run.run_dir, "judge_answers", "another-fingerprint") is None


def test_prices_default_table_config_override_and_batch():
    table = prices_for(LLMConfig(provider="openai", model="gpt-4o-mini"))
    assert table["gpt-4o-mini"] == {"input": 0.15, "cached_input": 0.075, "output": 0.6} == DEFAULT_PRICES["gpt-4o-mini"]
    assert table["gpt-4-0125-preview"] == {"input": 10.0, "output": 30.0}
    over = LLMConfig(provider="openai", model="gpt-4o-mini",
                     prices={"gpt-4o-mini": {"input": 1.0}, "my-model": {"input": 2.0, "output": 3.0}})
    # the config wins, key by key; a new input price without a cached one bills cached tokens at it
    assert prices_for(over)["gpt-4o-mini"] == {"input": 1.0, "output": 0.6}
    cached = LLMConfig(provider="openai", model="gpt-4o", prices={"gpt-4o": {"output": 9.0}})
    assert role_prices(cached) == {"input": 2.5, "cached_input": 1.25, "output": 9.0}
    assert prices_for(over)["my-model"] == {"input": 2.0, "output": 3.0}
    assert role_prices(LLMConfig(provider="openai", model="gpt-4", batch=True)) == {
        "input": 30.0 * BATCH_DISCOUNT, "output": 60.0 * BATCH_DISCOUNT}
    assert role_prices(LLMConfig(provider="local", model="anything-local")) == {"input": 0.0, "output": 0.0}
    assert role_prices(LLMConfig(provider="openai", model="unpriced")) is None


def test_plan_prices_each_role_through_its_model_with_config_overrides(run_cfg, fake_llm):
    cfg = run_cfg("corpus.limit=1", *RSUM, "llm.model=gpt-4o-mini", "roles.judge.model=gpt-4",
                  "llm.prices={gpt-4o-mini: {input: 100.0, output: 1000.0}}")
    plan = make_plan(cfg, _registry, write=False)
    memory = next(s for s in plan.stages if s.name == "memory_rsum").roles[0]
    judge = next(s for s in plan.stages if s.name == "judge_answers").roles[0]
    assert memory.model == "gpt-4o-mini" and memory.price == {"input": 100.0, "output": 1000.0}
    assert memory.cost_usd == pytest.approx((memory.prompt_tokens * 100 + memory.completion_tokens * 1000) / 1e6)
    assert judge.model == "gpt-4" and judge.price == {"input": 30.0, "output": 60.0}
    assert judge.cost_usd == pytest.approx((judge.prompt_tokens * 30 + judge.completion_tokens * 60) / 1e6)
    assert not (cfg.run_dir / PLAN_FILE).exists()


def test_sampled_dry_run_scales_per_episode_stages(run_cfg, fake_llm):
    cfg = run_cfg("corpus.limit=null", "methods=[rsum]", "stages=[ingest,probes,respond_rsum,memory_rsum]")
    full = make_plan(cfg, _registry, write=False)
    sampled = make_plan(cfg, _registry, sample=2, write=False)
    assert full.method["episodes"] == 4 and sampled.method["dry_run_episodes"] == 2
    # The sample corpus's episodes all have one probe each: scaling 2 -> 4 episodes is exact here.
    assert _est(sampled, "respond_rsum")["calls"] == _est(full, "respond_rsum")["calls"]
    assert "x 2" in next(s for s in sampled.stages if s.name == "respond_rsum").roles[0].method["calls"]


def test_simulated_endpoint_answers_schemas_and_counts_like_openai():
    import openai

    from pipeline.plan.simulated import SimulatedEndpoint, chat_prompt_tokens
    from pipeline.retrieval import count_tokens

    schema = {"type": "object", "properties": {"label": {"enum": ["a", "b"]}, "items": {
        "type": "array", "items": {"type": "integer", "minimum": 3}}}, "required": ["label", "items"]}
    messages = [{"role": "system", "content": "You label."}, {"role": "user", "content": "Label this, please."}]
    with SimulatedEndpoint(completion_fraction=0.5) as sim:
        client = openai.OpenAI(base_url=sim.base_url, api_key="x")
        sim.stage = "s"
        r = client.chat.completions.create(model="m", messages=messages, max_tokens=40, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
        assert json.loads(r.choices[0].message.content) == {"label": "a", "items": [4, 4]}
        plain = client.chat.completions.create(model="m", messages=messages, max_tokens=40)
        text = plain.choices[0].message.content
        assert 15 <= count_tokens(text) <= 25  # half of max_tokens
        assert plain.usage.prompt_tokens == chat_prompt_tokens(messages) == (
            3 + sum(3 + count_tokens(m["role"]) + count_tokens(m["content"]) for m in messages))
        client.embeddings.create(model="e", input=["one two", "three"])
        counts = sim.stage_counts("s")
    assert counts[("chat", "m")]["requests"] == 2 and counts[("chat", "m")]["max_tokens"] == 80
    assert counts[("embeddings", "e")]["texts"] == 2


def test_a_partial_stage_is_estimated_for_the_episodes_it_has_left(run_cfg, fake_llm):
    from pipeline.artifacts import atomic_write_json

    cfg = run_cfg("corpus.limit=2", *RSUM)
    full = make_plan(cfg, _registry, write=False)
    runner = Runner(cfg, _registry(cfg))
    runner.run(until="memory_rsum")
    sd = StageDir(cfg.run_dir, "respond_rsum")  # as a run killed after its first shard leaves it
    sd.open_partial(runner.fingerprints()["respond_rsum"])
    atomic_write_json(sd.shard_marker(0), {"episodes": 1, "rows": {"responses": 2}, "errors": 0})
    plan = make_plan(cfg, _registry, write=False)
    stage = next(s for s in plan.stages if s.name == "respond_rsum")
    assert stage.state == "partial" and stage.why == "interrupted: 1 of 2 episodes done, the rest to run"
    assert stage.total()["calls"] == _est(full, "respond_rsum")["calls"] / 2
    assert _states(plan)["judge_answers"] == "new" and _states(plan)["memory_rsum"] == "done"


def test_calibration_compares_failed_calls_with_failed_calls(tmp_path):
    """Per-episode counts hold answered calls only; a stage whose calls fail as often in the dry
    run as in the real one calibrates to a ratio of 1, not to the failure share."""
    from pipeline.artifacts import atomic_write_json
    from pipeline.llm.usage import Usage
    from pipeline.manifest import Manifest
    from pipeline.plan import CalibrationSource, calibrate
    from stages.method_stages.memory import MemoryStage
    from stages.methods import METHODS

    stage = MemoryStage(METHODS["all_memories_update"])
    role = stage.roles[0]

    def manifest(prompt_per_call: int) -> Manifest:
        per = {"e1": {"calls": 6, "cached_calls": 0, "prompt_tokens": 6 * prompt_per_call, "completion_tokens": 30}}
        usage = Usage(calls=6, failed_calls=5, prompt_tokens=11 * prompt_per_call, completion_tokens=55)
        return Manifest(stage=stage.name, fingerprint="x", llm_usage={role: usage}, stats={"llm_per_episode": per})

    atomic_write_json(tmp_path / stage.name / "_manifest.json", manifest(20).to_json())
    cal = calibrate(stage, role, manifest(10), (11.0, 110.0), 1, CalibrationSource(tmp_path, "src"), (0.0, 0.0))
    assert cal.calls == pytest.approx(1.0) and cal.prompt == pytest.approx(2.0)
    assert cal.completion_per_call == pytest.approx(55 / 11)


def test_a_stage_that_embeds_through_an_endpoint_counts_its_embedder_calls_tokens_and_price(run_cfg, fake_llm):
    """With `embedding.provider: openai`, banks calls no chat role but the `embedder` role: one call
    per distinct text (as its manifest counts them), in requests of up to 128 texts, at the
    embedding model's input price; a model without a price says so."""
    # Turn and session units only: their texts do not depend on what the segmenter answers.
    sets = ("corpus.limit=1", "stages=[ingest,guidance,segment,compress,banks]", "compress.method=none",
            "compress.granularities=[turn,session]", "banks.granularities=[turn,session]", "embedding.provider=openai")
    cfg = run_cfg(*sets, "embedding.model=text-embedding-3-small")
    plan = make_plan(cfg, _registry, write=False)
    banks = next(s for s in plan.stages if s.name == "banks")
    assert [r.role for r in banks.roles] == ["embedder"] and "no LLM role" not in banks.why
    emb = banks.roles[0]
    assert emb.model == "text-embedding-3-small" and emb.calls > 0 and emb.prompt_tokens > 0
    assert emb.completion_tokens == 0 and "requests of up to 128 texts" in emb.method["calls"]
    price = DEFAULT_PRICES["text-embedding-3-small"]["input"]
    assert emb.cost_usd == pytest.approx(emb.prompt_tokens * price / 1e6) and emb.cost_usd > 0
    assert emb.counted["requests"] >= emb.calls / 128
    assert fake_llm.total == 0

    Runner(cfg, _registry(cfg)).run()
    real = StageDir(cfg.run_dir, "banks").manifest().llm_usage["embedder"]
    assert emb.calls == real.calls + real.failed_calls

    unpriced = make_plan(run_cfg(*sets, "embedding.model=my-own-embedder"), _registry, write=False)
    emb = next(s for s in unpriced.stages if s.name == "banks").roles[0]
    assert emb.model == "my-own-embedder" and emb.calls > 0 and emb.cost_usd is None
