"""The configs plan derives from the run's: the dry run's (every role on the simulated endpoint) and
`--calibrate K`'s (the run's own on its first K episodes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.config import RunConfig
from pipeline.errors import PipelineError

SIM_KEY_ENV = "MEMPIPE_SIMULATED_KEY"  # the dry run's roles read their (dummy) API key here


def _with_limits(data: dict[str, Any], limits: list[int] | None) -> None:
    if limits is None:
        return
    corpus = data.setdefault("corpus", {})
    corpus["limit"] = limits[0]
    for extra, n in zip(corpus.get("extra", []), limits[1:]):
        extra["limit"] = n


def _config_data(cfg: RunConfig) -> dict[str, Any]:
    # exclude_unset: a role keeps overriding only what it set (an explicit None would override `llm`)
    data = cfg.model_dump(mode="json", exclude_unset=True)
    data.pop("paper", None)  # the reproduction sheet changes no LLM call
    return data


def _derive(cfg: RunConfig, data: dict[str, Any]) -> RunConfig:
    try:
        return type(cfg).model_validate(data)
    except Exception as e:  # noqa: BLE001 - a config that loaded must derive; say which when not
        raise PipelineError(f"plan: cannot derive the dry-run config: {e}") from e


PROBE_CAPS = ("max_qa_per_episode", "max_per_episode")  # probes.*: questions, next-response turns


def _probe_caps(cfg: RunConfig, cap: int | None) -> dict[str, int]:
    """The `probes` settings a dry run lowers to `cap` (None or a larger value in the run's config)."""
    probes = getattr(cfg, "probes", None)
    if cap is None or probes is None:
        return {}
    set_to = {k: getattr(probes, k) for k in PROBE_CAPS if hasattr(probes, k)}
    return {k: cap for k, v in set_to.items() if v is None or v > cap}


def dry_run_config(cfg: RunConfig, base_url: str, scratch: Path, stages: list[str] | None,
                   limits: list[int] | None, probe_cap: int | None = None) -> RunConfig:
    """The config of a dry run: every role on the simulated endpoint (model names kept), no cache,
    no budget, no batch API, no rate limits, inline executor, the sampled episodes, at most
    `probe_cap` probes per episode and kind (`_probe_caps`), in `scratch`. (No model either:
    `dry_run` embeds and compresses inside `_no_models`.)"""
    data = _config_data(cfg)
    data.update(run_name="dry-run", artifacts_dir=str(scratch), stages=stages)
    _with_limits(data, limits)
    caps = _probe_caps(cfg, probe_cap)
    if caps:
        data.setdefault("probes", {}).update(caps)
    sim = {"provider": "openai", "base_url": base_url, "api_key_env": SIM_KEY_ENV, "cache_enabled": False,
           "max_cost_usd": None, "batch": False, "rpm": None, "tpm": None, "max_retries": 2, "timeout_s": 600.0}
    data.setdefault("llm", {}).update(sim)
    for role in (data.get("roles") or {}).values():
        role.update(sim)
    data.setdefault("ray", {})["executor"] = "inline"
    return _derive(cfg, data)


def calibration_config(cfg: RunConfig, stages: list[str] | None, limits: list[int], k: int) -> RunConfig:
    """The config of `--calibrate K`: the run's own, on its first K episodes, in `<run>-calibrate-K`
    beside it; the LLM cache stays the run's, so the real run replays these calls for free."""
    data = _config_data(cfg)
    data.update(run_name=f"{cfg.run_name}-calibrate-{k}", stages=stages)
    _with_limits(data, limits)
    return _derive(cfg, data)

