"""What the workers of one Ray job share: the call cache and the rate limiter, as named actors.

Both actors are pinned to the node of the driver that creates them. The cache actor is the only
process that opens the cache's SQLite file, so a multi-node cluster never has two nodes (or NFS)
writing it; the limiter actor hands out send times so the job's rpm / tpm hold across all workers.

A Ray task receives `(cfg, handles)` (both picklable; no key inside) and calls `make_client`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from pipeline.config import LLMConfig
from pipeline.llm.cache import DiskCallCache
from pipeline.llm.client import LLMClient
from pipeline.llm.identity import endpoint_identity
from pipeline.llm.ratelimit import LocalRateLimiter, PacingSchedule

# Threads let cache reads overlap SQLite writes; diskcache keeps one connection per thread.
_CACHE_ACTOR_THREADS = 8


@ray.remote(num_cpus=0)
class CallCacheActor:
    def __init__(self, directory: str) -> None:
        self._cache = DiskCallCache(directory)

    def get(self, key: str) -> dict[str, Any] | None:
        return self._cache.get_sync(key)

    def set(self, key: str, value: dict[str, Any]) -> None:
        self._cache.set_sync(key, value)

    def close(self) -> None:
        self._cache.close()


@ray.remote(num_cpus=0)
class RateLimiterActor:
    # Default max_concurrency 1: calls are serialised, which is what the schedule needs.
    def __init__(self, rpm: int | None, tpm: int | None) -> None:
        self._clock = time.monotonic
        self._schedule = PacingSchedule(rpm, tpm)

    def reserve(self, tokens: int) -> tuple[float, float]:
        """(delay, the same slot as wall-clock time); see ActorRateLimiter.acquire."""
        delay = self._schedule.reserve(tokens, self._clock())
        return delay, time.time() + delay

    def pause(self, seconds: float) -> None:
        self._schedule.pause(seconds, self._clock())

    def paused_for(self) -> float:
        return self._schedule.paused_for(self._clock())


class ActorCallCache:
    """`CallCache` proxy to a `CallCacheActor`."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def get(self, key: str) -> dict[str, Any] | None:
        return await self.handle.get.remote(key)

    async def set(self, key: str, value: dict[str, Any]) -> None:
        await self.handle.set.remote(key, value)

    def __repr__(self) -> str:
        return "ActorCallCache()"


class ActorRateLimiter:
    """`RateLimiter` proxy to a `RateLimiterActor` shared by every worker of a job."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def acquire(self, tokens: int) -> None:
        while True:
            delay, slot = await self.handle.reserve.remote(tokens)
            # Time spent getting the answer back already counts towards the wait: on one node the
            # wall clocks agree, so the slot time absorbs it (a busy worker would otherwise send
            # late and bunch up with later slots). Across nodes, trust it only within 1 s of skew.
            delay = min(delay, max(slot - time.time(), delay - 1.0))
            if delay <= 0:
                return
            await asyncio.sleep(delay)
            # A Retry-After pause that arrived while we slept voids the slot we were given
            # (one extra round trip, paid only by requests that had to wait anyway).
            if await self.handle.paused_for.remote() <= 0:
                return

    async def pause(self, seconds: float) -> None:
        await self.handle.pause.remote(seconds)

    def __repr__(self) -> str:
        return "ActorRateLimiter()"


def _digest(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class SharedLLMHandles:
    """Actor handles for one (job, LLM config). Picklable: pass it to Ray tasks with the config."""

    cache: Any | None = None  # CallCacheActor handle, None when the cache is disabled
    limiter: Any | None = None  # RateLimiterActor handle, None when neither rpm nor tpm is set

    @classmethod
    def get_or_create(cls, cfg: LLMConfig, job_key: str) -> SharedLLMHandles:
        """Look up or start the job's actors (call on the driver, after ray.init).

        Names include `job_key`, so two jobs never share a limiter. Two configs of one job with the
        same cache directory share one cache actor (one owner per SQLite file); two with the same
        endpoint, model and limits share one limiter.
        """
        if not ray.is_initialized():
            raise RuntimeError("SharedLLMHandles.get_or_create needs ray.init() first")
        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        cache = limiter = None
        if cfg.cache_enabled:
            # Resolved on the driver: the actor's working directory may differ from ours.
            directory = str(Path(cfg.cache_dir).expanduser().resolve())
            cache = CallCacheActor.options(  # type: ignore[attr-defined]
                name=f"mempipe-llm-cache-{job_key}-{_digest(directory)}", get_if_exists=True,
                scheduling_strategy=here, max_concurrency=_CACHE_ACTOR_THREADS,
            ).remote(directory)
        if cfg.rpm or cfg.tpm:
            limiter = RateLimiterActor.options(  # type: ignore[attr-defined]
                name=f"mempipe-llm-limiter-{job_key}-{_digest(endpoint_identity(cfg), cfg.model, cfg.rpm, cfg.tpm)}",
                get_if_exists=True, scheduling_strategy=here,
            ).remote(cfg.rpm, cfg.tpm)
        return cls(cache=cache, limiter=limiter)

    def close(self) -> None:
        """Close the cache file and stop the actors (end of job). Safe to call twice."""
        if self.cache is not None:
            try:
                ray.get(self.cache.close.remote())
            except ray.exceptions.RayError:
                pass  # already gone
        for actor in (self.cache, self.limiter):
            if actor is not None:
                try:
                    ray.kill(actor)
                except ray.exceptions.RayError:
                    pass


def make_client(cfg: LLMConfig, handles: SharedLLMHandles | None = None, *, section: str = "llm",
                retry_samples: int = 0) -> LLMClient:
    """Build a client in this process.

    With handles: the job's shared cache and limiter. Without (inline runs, tests): the cache
    directory opened here, and a limiter local to this process.
    """
    if handles is None:
        cache = DiskCallCache(cfg.cache_dir) if cfg.cache_enabled else None
        return LLMClient(cfg, cache=cache, limiter=LocalRateLimiter(cfg.rpm, cfg.tpm), section=section,
                         retry_samples=retry_samples)
    cache = ActorCallCache(handles.cache) if handles.cache is not None and cfg.cache_enabled else None
    # Without a shared limiter (no rpm/tpm) a local one still honours Retry-After within the worker.
    limiter = ActorRateLimiter(handles.limiter) if handles.limiter is not None else LocalRateLimiter()
    return LLMClient(cfg, cache=cache, limiter=limiter, section=section, retry_samples=retry_samples)
