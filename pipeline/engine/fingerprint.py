"""Stage fingerprints: what a stage's output depends on, hashed.

A stage is skipped when its stored fingerprint equals the one computed now. Upstream
fingerprints are inputs, so a change anywhere invalidates exactly the stages downstream of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.engine.code_closure import code_hashes
from pipeline.hashing import canonical_json, sha256
from pipeline.llm.identity import answer_identity

if TYPE_CHECKING:
    from pipeline.config import RunConfig
    from collections.abc import Iterable

    from pipeline.engine.stage import Stage


def fingerprint_inputs(stage: "Stage", cfg: "RunConfig", upstream: dict[str, str]) -> dict[str, Any]:
    try:
        settings = stage.settings_of(cfg)
    except KeyError:  # a stage without settings
        settings = None
    inputs: dict[str, Any] = {
        "stage": stage.name,
        "version": stage.version,
        "code": code_hashes(*stage.code_roots()),
        "section": settings.model_dump(mode="json") if settings is not None else None,
        "prompts": {k: sha256(v) for k, v in sorted(stage.prompts.items())},
        "upstream": dict(sorted(upstream.items())),
        "extra": stage.extra_fingerprint(cfg),
        "roles": {role: answer_identity(cfg.role(role)) for role in stage.llm_roles(cfg)},
    }
    if stage.uses_embedder:
        inputs["embedding"] = cfg.embedding.model_dump(mode="json", include={"provider", "model", "normalize"})
    for key in stage.config_keys:
        value = getattr(cfg, key)
        inputs[f"config.{key}"] = value.model_dump(mode="json") if hasattr(value, "model_dump") else value
    return _relative_to_cwd(inputs, str(Path.cwd()))


def _relative_to_cwd(value: Any, cwd: str) -> Any:
    """Paths inside the current directory enter as relative paths: `ray job submit --working-dir .`
    runs the driver in an uploaded copy of the checkout, and `mempipe status` in the checkout must
    compute the same fingerprints as that copy did."""
    if isinstance(value, str) and value.startswith(cwd + "/"):
        return value[len(cwd) + 1:]
    if isinstance(value, dict):
        return {k: _relative_to_cwd(v, cwd) for k, v in value.items()}
    if isinstance(value, list):
        return [_relative_to_cwd(v, cwd) for v in value]
    return value


def compute_fingerprint(stage: "Stage", cfg: "RunConfig", upstream: dict[str, str]) -> str:
    return sha256(canonical_json(fingerprint_inputs(stage, cfg, upstream)))[:16]


def stage_fingerprints(cfg: "RunConfig", plan: "Iterable[Stage]") -> dict[str, str]:
    """Each stage's fingerprint, `plan` in pipeline order (every stage after its inputs)."""
    fps: dict[str, str] = {}
    for stage in plan:
        fps[stage.name] = compute_fingerprint(stage, cfg, {i: fps[i] for i in stage.inputs})
    return fps
