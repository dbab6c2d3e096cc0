"""The LLM layer: client, cache, rate limiting, usage, and the Ray-shared handles.

Ray-dependent names (`SharedLLMHandles`, `make_client`, actor proxies) load on first use, so
algorithms and unit tests that only need the contract do not import Ray.
"""

from __future__ import annotations

from typing import Any

from pipeline.llm.cache import CallCache, DiskCallCache, cache_stats, export_cache, import_cache
from pipeline.llm.client import LLMClient, resolve_api_key
from pipeline.llm.identity import answer_identity, endpoint_identity
from pipeline.llm.ratelimit import LocalRateLimiter, RateLimiter
from pipeline.llm.types import ChatLLM, InvalidAnswer, LLMError, LLMResult, Messages
from pipeline.llm.usage import Usage

_SHARED = {"SharedLLMHandles", "make_client", "ActorCallCache", "ActorRateLimiter"}

__all__ = [
    "CallCache", "DiskCallCache", "cache_stats", "export_cache", "import_cache",
    "LLMClient", "answer_identity", "endpoint_identity", "resolve_api_key", "LocalRateLimiter", "RateLimiter",
    "ChatLLM", "InvalidAnswer", "LLMError", "LLMResult", "Messages", "Usage", *sorted(_SHARED),
]


def __getattr__(name: str) -> Any:
    if name in _SHARED:
        from pipeline.llm import shared

        return getattr(shared, name)
    raise AttributeError(f"module 'pipeline.llm' has no attribute {name!r}")
