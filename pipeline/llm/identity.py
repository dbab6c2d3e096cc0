"""What identifies an LLM endpoint and the answers it gives, for cache keys and fingerprints."""

from __future__ import annotations

from typing import Any

from pipeline.config import LLMConfig

OPENAI_BASE_URL = "https://api.openai.com/v1"


def endpoint_identity(cfg: LLMConfig) -> str:
    """The endpoint in cache keys and fingerprints.

    The embedded server gets a new free port each run, so its identity is the model file rather
    than the URL; otherwise a warm rerun would miss every entry.
    """
    if cfg.provider == "local":
        local = cfg.local
        # What the served weights are and how attention is computed change the answers.
        weights = local.model_path or ("default" if local.packaged_as == "shipped" else f"default:{local.packaged_as}")
        return f"local:{weights}" + (":flash_attn" if local.flash_attn else "")
    return (cfg.base_url or OPENAI_BASE_URL).rstrip("/")


def answer_identity(cfg: LLMConfig) -> dict[str, Any]:
    """The settings that change what a role answers (not concurrency, limits or cache paths)."""
    ident = cfg.model_dump(mode="json", include={"model", "temperature", "top_p", "max_tokens", "seed",
                                                 "structured_retries", "structured_mode"})
    ident["endpoint"] = endpoint_identity(cfg)
    return ident
