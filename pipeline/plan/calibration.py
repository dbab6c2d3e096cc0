"""Completion tokens, and corrections to the counted calls and prompt tokens, from real runs: `--like
RUN_DIR`, `--calibrate K` or this run's own manifests (`calibrate`: real over simulated)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from pipeline import storage
from pipeline.artifacts import StageDir
from pipeline.config import RunConfig
from pipeline.errors import PipelineError
from pipeline.llm.prices import cost_usd, role_prices
from pipeline.llm.usage import Usage
from pipeline.manifest import Manifest
from pipeline.plan.configs import calibration_config
from pipeline.plan.estimates import PlanOptions, Registry
from pipeline.plan.sampling import _per_episode, _take
from pipeline.engine.stage import GlobalStage, Stage
from pipeline.storage import Location


@dataclass
class Calibration:
    """Real over simulated, for one (stage, role), from a source's manifest."""

    source: str
    calls: float | None  # multiply the counted calls by this (None: no ratio, keep counted)
    prompt: float | None
    completion_per_call: float | None
    rate: dict[str, float] | None = None  # real calls / prompt tokens per episode, when nothing was counted


class CalibrationSource:
    """Manifests of real runs to calibrate against: another run directory, the calibration run, or
    this run's own directory (any fingerprint)."""

    def __init__(self, run_dir: Location, label: str) -> None:
        self.run_dir = storage.location(run_dir)
        self.label = label

    def manifest(self, stage: str) -> Manifest | None:
        return StageDir(self.run_dir, stage).manifest()

    def episodes(self) -> int | None:
        m = self.manifest("ingest")
        return None if m is None else int(m.tables.get("episodes", 0)) or None


def _sent(u: Usage) -> float:
    return float(u.calls + u.failed_calls)


def calibrate(stage: Stage, role: str, dry: Manifest, dry_chat: tuple[float, float], dry_episodes: int,
              src: CalibrationSource, embeds: tuple[float, float],
              probe_factor: Mapping[str, float] | None = None) -> Calibration | None:
    """Ratios real / simulated for `role` of `stage` from the source's manifest of that stage.

    dry_chat: the dry run's (calls, prompt tokens) of the role's chat requests; embeds: the source's
    embedding (calls, tokens) to leave out of its role totals (estimated from the dry run). Over the
    episodes both ran, from the per-episode counts (chat calls only), when the stage has one role;
    else per episode from the role's totals. probe_factor: per episode, the run's probes over the
    dry run's (it sampled them): its per-episode counts are multiplied by it (dry_chat already is)."""
    real = src.manifest(stage.name)
    if real is None or not real.llm_usage or role not in real.llm_usage:
        return None
    ru = real.llm_usage[role]
    real_sent = max(ru.calls - embeds[0], 0.0) + ru.failed_calls  # chat calls, answered or failed
    if real_sent <= 0:
        return None
    real_prompt_total = max(ru.prompt_tokens - embeds[1], 0.0)
    # Per call, failed calls included (a failed structured call was answered, invalidly, and billed).
    cpc = ru.completion_tokens / real_sent
    dry_calls, dry_prompt = dry_chat
    mine, theirs = _per_episode(dry), _per_episode(real)
    if probe_factor:
        mine = {e: {k: v * probe_factor.get(e, 1.0) for k, v in c.items()} for e, c in mine.items()}
    common = sorted(set(mine) & set(theirs)) if len(stage.roles) == 1 else []
    if common and sum(theirs[e].get("calls", 0) for e in common):
        # Per-episode counts hold answered calls only: each side's totals over its per-episode sums
        # put the failed calls (and their prompts) back, so like is compared with like.
        def share(total: float, per: dict[str, dict[str, float]], key: str) -> float:
            summed = sum(v.get(key, 0) for v in per.values())
            return total / summed if summed else 1.0

        r_calls = sum(theirs[e].get("calls", 0) for e in common) * share(real_sent, theirs, "calls")
        r_prompt = sum(theirs[e].get("prompt_tokens", 0) for e in common) * share(real_prompt_total, theirs,
                                                                                  "prompt_tokens")
        d_calls = sum(mine[e].get("calls", 0) for e in common) * share(dry_calls, mine, "calls")
        d_prompt = sum(mine[e].get("prompt_tokens", 0) for e in common) * share(dry_prompt, mine, "prompt_tokens")
        where = f"{src.label} ({len(common)} episode{'s' * (len(common) != 1)})"
        if d_calls <= 0:
            return Calibration(where, None, None, cpc, rate={"calls": r_calls / len(common),
                                                              "prompt_tokens": r_prompt / len(common)})
        return Calibration(where, r_calls / d_calls, r_prompt / d_prompt if d_prompt else None, cpc)
    # Per episode from the totals (several roles, or no per-episode counts).
    n_real = 1 if isinstance(stage, GlobalStage) else (len(theirs) or src.episodes() or 1)
    n_dry = 1 if isinstance(stage, GlobalStage) else max(dry_episodes, 1)
    real_calls = real_sent / n_real
    real_prompt = real_prompt_total / n_real
    if dry_calls <= 0:
        return Calibration(src.label, None, None, cpc, rate={"calls": real_calls, "prompt_tokens": real_prompt})
    return Calibration(src.label, real_calls / (dry_calls / n_dry),
                       real_prompt / (dry_prompt / n_dry) if dry_prompt else None, cpc)


def _calibration_cost(ccfg: RunConfig, crunner: Any) -> dict[str, Any]:
    """What the calibration run's calls were, and what its fresh ones cost at plan's prices."""
    calls = fresh = 0.0
    cost = 0.0
    for st in crunner.status():
        m = st.manifest
        for role, u in ((m.llm_usage or {}) if m is not None else {}).items():
            sent = u.calls + u.failed_calls
            calls += sent
            share = (u.calls - u.cached_calls) / u.calls if u.calls else 0.0
            fresh += u.calls - u.cached_calls
            cost += cost_usd(role_prices(ccfg.role(role)), u.prompt_tokens * share, u.completion_tokens * share,
                             u.cached_prompt_tokens * share)
    return {"run_dir": str(ccfg.run_dir), "calls": int(calls), "fresh_calls": int(fresh), "cost_usd": round(cost, 6),
            "note": "its answers are in the run's LLM cache: the real run replays them without paying again"}


def calibration_source(cfg: RunConfig, registry_of: Registry, opts: PlanOptions, needed: list[str],
                       counts: list[int], limits: list[int] | None,
                       say: Callable[[str], None]) -> tuple[CalibrationSource, dict[str, Any] | None]:
    """Where completions come from: --like's run directory, --calibrate's run (made here, on the dry
    run's episodes at most; its cost is the second value), else this run's own manifests."""
    from pipeline.engine.runner import Runner

    if opts.like is not None:
        like_dir = Path(opts.like)
        if not like_dir.is_dir():
            raise PipelineError(f"plan: --like {opts.like}: no such run directory")
        return CalibrationSource(like_dir, f"--like {like_dir}"), None
    k = opts.calibrate_k
    if k is None:
        return CalibrationSource(cfg.run_dir, "this run's manifests"), None
    if k >= sum(counts):
        raise PipelineError(f"plan: --calibrate {k} covers all {sum(counts)} episodes of the run: "
                            "that is the run itself; calibrate on fewer")
    limits_cal = _take(counts, k)
    if limits is not None:
        limits_cal = [min(a, b) for a, b in zip(limits_cal, limits)]
    ccfg = calibration_config(cfg, needed, limits_cal, k)
    say(f"plan: calibration run of {k} episode(s) into {ccfg.run_dir} (real calls, cached for the run)")
    crunner = Runner(ccfg, dict(registry_of(ccfg)))
    crunner.run()
    return CalibrationSource(ccfg.run_dir, f"calibration run {ccfg.run_name}"), _calibration_cost(ccfg, crunner)
