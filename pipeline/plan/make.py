"""`make_plan`: the selection `mempipe run` would execute, the dry run, calibration and the estimate
per stage, put together (see the package docstring)."""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from pipeline.artifacts import StageDir, atomic_write_json, make_dirs
from pipeline.config import RunConfig
from pipeline.llm.prices import BATCH_DISCOUNT
from pipeline.llm.usage import SHARED
from pipeline.manifest import Manifest
from pipeline.plan.calibration import CalibrationSource, calibration_source
from pipeline.plan.configs import _probe_caps
from pipeline.plan.costing import _estimate_stage
from pipeline.plan.dryrun import DryRun, dry_run
from pipeline.plan.estimates import CACHED_PROMPT_RULE, Plan, PlanOptions, Registry, RoleEstimate, StageEstimate
from pipeline.plan.sampling import EpisodeSize, Scaling, _episode_sizes, _scales, _take, _take_within
from pipeline.engine.progress import PLAN_FILE
from pipeline.engine.selection import Selection

NOT_ESTIMATED = "not estimated: run plan --calibrate 1 (a library's calls are its own, not ours to model)"
from pipeline.engine.stage import GlobalStage, Stage
from pipeline.storage import Location, join

log = logging.getLogger("mempipe")

_SELECTORS = ("only", "from_", "force", "until", "retry_failed")  # make_plan's fields that are Selection's


def _why(state: str, stage: Stage, status_manifest: Manifest | None, fps: Mapping[str, str],
         partial: tuple[int, int] | None) -> str:
    if state == "new":
        return "no output yet"
    if state == "forced":
        return "forced rebuild"
    if state == "partial" and partial:
        return f"interrupted: {partial[0]} of {partial[1]} episodes done, the rest to run"
    if state == "stale" and status_manifest is not None:
        changed = [i for i in stage.inputs if status_manifest.upstream.get(i) != fps.get(i)]
        if changed:
            return "upstream changed: " + ", ".join(changed)
        return "its settings, prompts, code or LLM roles changed"
    if state == "done":
        return "up to date (skipped)"
    return ""


def _done_episodes(run_dir: Location, stage: str) -> int:
    return sum(int(m.get("episodes", 0)) for m in StageDir(run_dir, stage).finished_shards().values())


@dataclass
class _Scope:
    """What the steps of one plan share: the run, what `Runner.select` picked, and its episodes."""

    cfg: RunConfig
    registry_of: Registry
    runner: Any  # pipeline.engine.runner.Runner, imported when plan runs (it brings the executors)
    picked: dict[str, str]  # stage -> why it would run (Runner.select's reason)
    fps: dict[str, str]
    manifests: dict[str, Manifest | None]
    sizes: list[list[EpisodeSize]]  # per corpus source (read only when an LLM stage would run)
    opts: PlanOptions
    say: Callable[[str], None]

    @property
    def counts(self) -> list[int]:
        return [len(x) for x in self.sizes]

    @property
    def n_episodes(self) -> int:
        return sum(self.counts)


@dataclass
class _Sample:
    """The dry run's episodes: `limits` per corpus source (None: all), and the done stages it links in."""

    k: int
    limits: list[int] | None
    in_dry: list[EpisodeSize]
    reuse: set[str]


def make_plan(cfg: RunConfig, registry_of: Registry, selection: Selection | None = None,
              options: PlanOptions | None = None, *, write: bool = True, say: Callable[[str], None] | None = None,
              **fields: Any) -> Plan:
    """The estimate of what `mempipe run` with this selection would call (see the package docstring).
    `registry_of(cfg)` builds the stages of a config (the App's `registry`). `fields`: the Selection's
    and PlanOptions' fields by name (`only=`, `sample=`, `probe_cap=`, ...), for a caller that makes
    neither. Writes `_plan.json` into the run directory unless `write` is False. `say` gets progress
    lines (default: nothing)."""
    from pipeline.engine.runner import Runner

    selectors = {k: fields.pop(k) for k in _SELECTORS if k in fields}
    if options is not None and fields:
        raise TypeError(f"pass PlanOptions or its fields, not both ({sorted(fields)})")
    opts = options if options is not None else PlanOptions(**fields)
    runner = Runner(cfg, dict(registry_of(cfg)))
    picked = {s.name: reason for s, reason in runner.select(selection, **selectors)}
    to_run = [s for s in runner.plan if picked.get(s.name, "done") != "done"]
    # With `embedding.provider: openai`, stages that only embed (banks) call the `embedder` role too.
    llm_run = [s for s in to_run if s.llm_roles(cfg)]
    scope = _Scope(cfg, registry_of, runner, picked, runner.fingerprints(),
                   {st.name: st.manifest for st in runner.status()}, _episode_sizes(cfg) if llm_run else [[]],
                   opts, say or (lambda _: None))
    method = _method_notes(scope)
    estimates: dict[str, list[RoleEstimate]] = {}
    calibration_run: dict[str, Any] | None = None
    if llm_run:
        estimates, calibration_run = _estimate_llm_stages(scope, llm_run, to_run, method)
    else:
        method["dry_run"] = "none: no stage with an LLM role would run"
        method["calibration"] = None
    plan = Plan(cfg.run_name, str(cfg.run_dir), _stage_estimates(scope, estimates), method, calibration_run)
    if write:
        make_dirs(cfg.run_dir)
        atomic_write_json(join(cfg.run_dir, PLAN_FILE), plan.plan_file())
    return plan


def _method_notes(scope: _Scope) -> dict[str, Any]:
    """How the plan estimates, before the dry run adds its own notes (`Plan.method`)."""
    return {
        "selection": "Runner.select: the stages `mempipe run` with the same selectors runs",
        "episodes": scope.n_episodes, "completion_fraction": scope.opts.completion_fraction,
        "prices": "pipeline.llm.prices.DEFAULT_PRICES with llm.prices / roles.<role>.prices over it"
                  f"; batch roles x{BATCH_DISCOUNT}",
        "cache": "not consulted: calls the LLM cache already holds are free in the run, counted here",
        "cached_prompt_tokens": CACHED_PROMPT_RULE + " (the dry run's share of each stage and role's prompt tokens)",
        "by_method": "each method's memory and respond stages, and its share of each judge stage: a stage and role's "
                     "cost split by the dry run's cost per method (a judge bills each judged row to its method; "
                     "head-to-head, to the non-reference one); without one, a method's own stage is wholly its, "
                     f"any other {SHARED}",
    }


def _estimate_llm_stages(scope: _Scope, llm_run: list[Stage], to_run: list[Stage],
                         method: dict[str, Any]) -> tuple[dict[str, list[RoleEstimate]], dict[str, Any] | None]:
    """The dry run of the LLM stages to run and those they need, calibrated: per stage its roles'
    estimates, and what a --calibrate run cost (None: none ran). Adds the dry run's notes to `method`."""
    cfg, opts = scope.cfg, scope.opts
    needed_set: set[str] = set()
    for s in llm_run:
        needed_set |= scope.runner.upstream(s.name)
    needed = [s.name for s in scope.runner.plan if s.name in needed_set]
    sample = _sample(scope, needed)
    method["dry_run"] = _dry_run_note(scope, sample)
    source, calibration_run = calibration_source(cfg, scope.registry_of, opts, needed, scope.counts,
                                                 sample.limits, scope.say)
    scope.say(f"plan: dry run of {len(needed) - len(sample.reuse)} stage(s) on the simulated endpoint")
    scratch = Path(tempfile.mkdtemp(prefix="mempipe-plan-"))
    try:
        dry = dry_run(cfg, scope.registry_of, needed, sample.reuse, sample.limits, scope.n_episodes,
                      opts.completion_fraction, scratch, opts.probe_cap)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    method["dry_run_episodes"] = dry.episodes
    method["dry_run_s"] = round(sum(dry.seconds.values()), 1)
    method["dry_run_slowest_s"] = dict(sorted(dry.seconds.items(), key=lambda kv: -kv[1])[:3])
    log.debug("plan: dry run seconds per stage: %s", dry.seconds)
    method["models"] = _model_notes(cfg, dry, [s.name for s in to_run if s.name not in needed_set])
    estimates = {stage.name: _estimate(scope, stage, dry, sample.in_dry, source) for stage in llm_run}
    used = any("calibrated" in v for ests in estimates.values() for e in ests for v in e.method.values())
    method["calibration"] = source.label if used else (
        f"none ({source.label}: nothing for these stages)" if opts.like or opts.calibrate_k else
        "none (no manifest of these stages in this run directory; --calibrate K or --like RUN_DIR give one)")
    return estimates, calibration_run


def _sample(scope: _Scope, needed: list[str]) -> _Sample:
    """The episodes the dry run reads (`_take_within`). Done stages are linked into the dry run (real
    inputs for the stages after them), unless it samples episodes: their outputs hold every episode."""
    opts, counts = scope.opts, scope.counts
    k = _take_within(scope.sizes, max(opts.sample, opts.calibrate_k or 0), opts.max_turns, opts.calibrate_k or 1)
    sampled = k < scope.n_episodes
    limits = _take(counts, k) if sampled else None
    in_dry = [e for src, n in zip(scope.sizes, limits or counts) for e in src[:n]]
    reuse = set() if sampled else {n for n in needed if scope.picked.get(n, "done") == "done"
                                   and (m := scope.manifests.get(n)) is not None and m.fingerprint == scope.fps[n]}
    return _Sample(k if sampled else scope.n_episodes, limits, in_dry, reuse)


def _dry_run_note(scope: _Scope, sample: _Sample) -> str:
    opts, sampled = scope.opts, sample.limits is not None
    return (f"simulated endpoint (pipeline.plan.simulated), {sample.k} of {scope.n_episodes} episodes"
            + (f" (the first {max(opts.sample, opts.calibrate_k or 0)}, at most "
               f"{opts.max_turns} turns in all)" if sampled and opts.max_turns else "")
            + (", per-episode stages scaled by the size each grows with (episodes, turns, sessions "
               "or questions)" if sampled else "")
            + (f"; at most {opts.probe_cap} probes per episode and kind, scaled back by the run's probes"
               if _probe_caps(scope.cfg, opts.probe_cap) else "")
            + (f"; done stages linked in: {', '.join(sorted(sample.reuse))}" if sample.reuse else ""))


def _estimate(scope: _Scope, stage: Stage, dry: DryRun, in_dry: list[EpisodeSize],
              source: CalibrationSource) -> list[RoleEstimate]:
    """One LLM stage's roles: its dry-run counts scaled to what is left of the run, calibrated, priced."""
    cfg, reason, n_episodes = scope.cfg, scope.picked[stage.name], scope.n_episodes
    remaining = n_episodes
    if reason == "partial" and not isinstance(stage, GlobalStage):
        remaining = max(n_episodes - _done_episodes(cfg.run_dir, stage.name), 0)
    if isinstance(stage, GlobalStage):
        scale = 0.0 if reason == "partial" and StageDir(cfg.run_dir, stage.name).finished_shards() else 1.0
        scaling = Scaling.flat(scale, "counted" if scale == 1.0 else f"counted x {scale:.3g}")
    else:
        scaling = _scales(stage, dry, [e for src in scope.sizes for e in src], in_dry, remaining)
    return _estimate_stage(cfg, stage, dry, scaling, source, scope.opts.completion_fraction, n_episodes, remaining)


def _stage_estimates(scope: _Scope, estimates: dict[str, list[RoleEstimate]]) -> list[StageEstimate]:
    """Every stage of the run: its state, why, and (where it runs) its roles' estimates."""
    stages: list[StageEstimate] = []
    for s in scope.runner.plan:
        reason = scope.picked.get(s.name)
        state = reason if reason is not None else "not selected"
        partial = None
        if reason == "partial":
            partial = (_done_episodes(scope.cfg.run_dir, s.name), scope.n_episodes)
        why = (_why(state, s, scope.manifests.get(s.name), scope.fps, partial) if reason
               else "not picked by the selectors")
        runs = reason is not None and reason != "done"
        roles = estimates.get(s.name, []) if runs else []
        if runs and not s.llm_roles(scope.cfg):
            why += "; no LLM role"
        if runs and not s.dry_run_estimates and not any("calibrated" in v for r in roles for v in r.method.values()):
            # a library's calls are its own: the simulated endpoint's count would be a guess
            roles = [RoleEstimate(r.role, r.model, cost_usd=None, method={"calls": NOT_ESTIMATED}) for r in roles]
            why += f"; {NOT_ESTIMATED}"
        stages.append(StageEstimate(s.name, state, why, scope.fps[s.name], runs, roles, s.billed_method, s.why))
    return stages


def _model_notes(cfg: RunConfig, dry: DryRun, skipped: list[str]) -> dict[str, str]:
    """What the dry run estimated instead of running a model (`_no_models`), and what it left out."""
    notes: dict[str, str] = {}
    compressed = {k: v["units"] for k, v in dry.simulated.items() if v["units"]}
    embedded = {k: v["texts"] for k, v in dry.simulated.items() if v["texts"]}
    compress = getattr(cfg, "compress", None)
    if compressed:
        how = f"{compress.method} at rate {compress.rate}" if compress is not None else "the compressor"
        notes["compress"] = (f"estimated from sizes: {how} not run; rate x the words of each utterance kept (evenly "
                             f"spread, speaker tags and lines intact), no model loaded ({_listed(compressed)} units)")
    if embedded:
        notes["embeddings"] = (f"simulated vectors: hashed words, {cfg.embedding.model}'s dimension where known, no "
                               f"model loaded ({_listed(embedded)} texts)")
    if skipped:
        notes["not run"] = (f"{', '.join(skipped)}: no LLM role, and no LLM stage reads them "
                            "(no BERTScore or other model)")
    return notes


def _listed(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in counts.items())

