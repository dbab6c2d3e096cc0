"""What the workers of one Ray job share: the call cache (`DiskCallCache`), the rate limiter
(`PacingSchedule`) and the endpoint's concurrency slots (pipeline.llm.slots), each hosted as it is
in the job's host actor (pipeline.llm.service_host), on the node of the driver that starts them;
the run's ledger is hosted there too (pipeline.llm.ledger.RunLedger). This module holds what a
worker's client uses of them: batched cache calls, the shared limiter, and `make_client`.

The host is the only process that opens the cache's SQLite file, so a multi-node cluster never has
two nodes (or NFS) writing it; the limiter hands out send times so the job's rpm / tpm hold across
all workers.

A Ray task receives `(cfg, handles)` (both picklable; no key inside) and calls `make_client`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import ray

from pipeline.config import LLMConfig
from pipeline.hashing import canonical_json
from pipeline.llm.cache import DB_FILE, CallCache, DiskCallCache
from pipeline.llm.client import LLMClient
from pipeline.llm.identity import endpoint_identity
from pipeline.llm.ledger import Tally
from pipeline.llm.ratelimit import LocalRateLimiter, PacingSchedule
from pipeline.llm.service_host import ServiceRef, start_service
from pipeline.llm.slots import EndpointSlots, SlotsHandle, start_slot_pool

# A worker's cache calls within this window travel as one actor call (a lookup or write waits at
# most this). An actor call costs ~2 ms of CPU on a 2-core machine (caller and host); at 2 ms most
# went alone, at 20 ms several share one: 1.1 ms less CPU per completed request (bench/throughput.py,
# cap 32), against at most 40 ms more per request on a 0.2-2 s endpoint.
log = logging.getLogger(__name__)

_BATCH_WINDOW_S = 0.02
_BATCH_MAX = 256


class _Batcher:
    """Coalesces a worker's cache writes and lookups of the same few milliseconds into one actor call.

    Every worker's lookups and writes go to one actor, and each actor call costs far more CPU (the
    caller's and the host's: Ray's serialisation, its threads and event loops) than the SQLite
    work it carries: one round trip per item made them a large share of a 2-core machine at a few
    hundred requests per second, and one per kind (lookups, writes) still near one per item.
    Writes and lookups share one window and one call (`DiskCallCache.ops`: the writes first),
    so a request's write and another's lookup go together. Each caller still awaits its own
    result, so a write is on disk before the caller goes on.
    """

    def __init__(self, send: Callable[[list[tuple[str, str]], list[str]], Any], window_s: float,
                 max_items: int) -> None:
        self._send = send  # (writes, lookups) -> ObjectRef of (lookup results, the writes' failure or None)
        self._window_s = window_s
        self._max_items = max_items
        # Per loop: (writes and their futures, lookups and their futures).
        self._pending: dict[asyncio.AbstractEventLoop, tuple[list, list]] = {}

    def get(self, key: str) -> asyncio.Future:
        return self._add(1, key)

    def set(self, item: tuple[str, str]) -> asyncio.Future:
        return self._add(0, item)

    def _add(self, kind: int, item: Any) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        pending = self._pending.get(loop)
        if pending is None:
            pending = self._pending[loop] = ([], [])
            loop.call_later(self._window_s, self._flush, loop, pending)
        pending[kind].append((item, future))
        if len(pending[0]) + len(pending[1]) >= self._max_items:
            self._flush(loop, pending)
        return future

    def _flush(self, loop: asyncio.AbstractEventLoop, pending: tuple[list, list]) -> None:
        if self._pending.get(loop) is pending:  # not already sent (full before its window ended)
            del self._pending[loop]
            loop.create_task(self._deliver(*pending))

    async def _deliver(self, sets: list[tuple[Any, asyncio.Future]], gets: list[tuple[Any, asyncio.Future]]) -> None:
        try:
            found, failed = await self._send([item for item, _ in sets], [key for key, _ in gets])
        except BaseException as e:  # every caller of the batch sees the failure
            for _, future in sets + gets:
                if not future.done():
                    future.set_exception(e)
            return
        for _, future in sets:
            if not future.done():
                future.set_result(None) if failed is None else future.set_exception(failed)
        for raw, (_, future) in zip(found, gets):
            if not future.done():
                future.set_result(raw)


class ActorCallCache:
    """`CallCache` proxy to the job's hosted `DiskCallCache`: lookups and writes batched per few milliseconds,
    values (de)serialised here so the one actor only moves text.

    A worker on the host's node (`node`, with the cache's `directory`) opens the SQLite file itself
    and runs each batch on a thread: diskcache is process-safe on one machine's disk, and an actor
    call per batch cost more CPU than the SQLite work it carried (about 1.5 ms per request at cap
    32, bench/throughput.py). Workers on other nodes go through the host, so only the host's node
    ever writes the file (never two nodes, never NFS)."""

    def __init__(self, handle: Any, window_s: float = _BATCH_WINDOW_S, max_items: int = _BATCH_MAX,
                 directory: str | None = None, node: str | None = None) -> None:
        self.handle, self.directory, self.node = handle, directory, node
        local = _same_node_cache(directory, node)
        send = ((lambda sets, gets: asyncio.to_thread(local.ops, sets, gets)) if local is not None
                else (lambda sets, gets: handle.ops.remote(sets, gets)))
        self.local = local is not None
        self._batch = _Batcher(send, window_s, max_items)

    async def get(self, key: str) -> dict[str, Any] | None:
        raw = await self._batch.get(key)
        return None if raw is None else json.loads(raw)

    async def set(self, key: str, value: dict[str, Any]) -> None:
        await self._batch.set((key, canonical_json(value)))

    def __getstate__(self) -> dict[str, Any]:
        # Pending batches belong to this process's loops; the receiving process decides its own path.
        return {"handle": self.handle, "directory": self.directory, "node": self.node}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["handle"], directory=state["directory"], node=state["node"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return "ActorCallCache()"


# This process's own connections to the caches of its node, by directory: (the database file's
# identity when opened, the service). A directory removed and made again is opened again.
_LOCAL_CACHES: dict[str, tuple[tuple[int, int], DiskCallCache]] = {}
_LOCAL_LOCK = threading.Lock()


def _same_node_cache(directory: str | None, node: str | None) -> DiskCallCache | None:
    """This process's connection to the cache in `directory` when it runs on `node` (the host's);
    None elsewhere, or when the file cannot be opened here (then the host serves it)."""
    if not directory or not node or not ray.is_initialized():
        return None
    try:
        if ray.get_runtime_context().get_node_id() != node:
            return None
    except Exception:  # noqa: BLE001 - no runtime context (a plain process): the host serves it
        return None
    with _LOCAL_LOCK:
        known = _LOCAL_CACHES.get(directory)
        try:
            st = os.stat(Path(directory) / DB_FILE)
            if known is not None and known[0] == (st.st_dev, st.st_ino):
                return known[1]
            service = DiskCallCache(directory)
        except Exception as e:  # noqa: BLE001 - the host's connection still works
            log.warning("LLM cache %s: this worker cannot open it (%s); its host serves it", directory, e)
            return None
        if known is not None:
            known[1].close()
        _LOCAL_CACHES[directory] = ((st.st_dev, st.st_ino), service)
        return service


class ActorRateLimiter:
    """`RateLimiter` proxy to the `PacingSchedule` the job's host keeps for every worker of a job."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def acquire(self, tokens: int) -> None:
        while True:
            delay, slot = await self.handle.reserve_shared.remote(tokens)
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


def _digest(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class SharedLLMHandles:
    """Service refs for one (job, LLM config). Picklable: pass it to Ray tasks with the config."""

    cache: ServiceRef | None = None  # the hosted DiskCallCache, None when the cache is disabled
    cache_dir: str | None = None  # its directory, and the host's node: workers there open it themselves
    cache_node: str | None = None
    limiter: ServiceRef | None = None  # the hosted PacingSchedule, None when neither rpm nor tpm is set
    slots: SlotsHandle | None = None  # the endpoint's `max_concurrency` slots for every worker of the job

    @classmethod
    def get_or_create(cls, cfg: LLMConfig, job_key: str) -> SharedLLMHandles:
        """Look up or start the job's services (call on the driver, after ray.init).

        Names include `job_key`, so two jobs never share a limiter. Two configs of one job with the
        same cache directory share one cache (one owner per SQLite file); two with the same
        endpoint, model and limits share one limiter.
        """
        if not ray.is_initialized():
            raise RuntimeError("SharedLLMHandles.get_or_create needs ray.init() first")
        cache = limiter = None
        if cfg.cache_enabled:
            # Resolved on the driver: the host's working directory may differ from ours.
            directory = str(Path(cfg.cache_dir).expanduser().resolve())
            cache = start_service(f"mempipe-llm-cache-{job_key}-{_digest(directory)}", DiskCallCache, directory)
        if cfg.rpm or cfg.tpm:
            limiter = start_service(
                f"mempipe-llm-limiter-{job_key}-{_digest(endpoint_identity(cfg), cfg.model, cfg.rpm, cfg.tpm)}",
                PacingSchedule, cfg.rpm, cfg.tpm)
        node = ray.get_runtime_context().get_node_id()  # the host's: it starts on the driver's node
        return cls(cache=cache, cache_dir=directory if cache is not None else None, cache_node=node,
                   limiter=limiter, slots=start_slot_pool(cfg, job_key))

    def close(self) -> None:
        """Close the cache file and stop the services (end of run). Safe to call twice."""
        for service in (self.cache, self.limiter):
            if service is not None:
                service.stop()
        if self.slots is not None:
            self.slots.close()


# A run's shared services per LLM role ({} for inline runs: each client keeps its own).
RoleHandles = dict[str, SharedLLMHandles]


def make_client(cfg: LLMConfig, handles: SharedLLMHandles | None = None, *, section: str = "llm",
                retry_samples: int = 0, tally: Tally | None = None) -> LLMClient:
    """Build a client in this process.

    With handles: the job's shared cache and limiter. Without (inline runs, tests): the cache
    directory opened here, and a limiter local to this process. tally: the run ledger's
    `StageTally` for this stage and role (progress, budget), when the runner keeps one.
    """
    cache: CallCache | None
    if handles is None:
        cache = DiskCallCache(cfg.cache_dir) if cfg.cache_enabled else None
        return LLMClient(cfg, cache=cache, limiter=LocalRateLimiter(cfg.rpm, cfg.tpm), section=section,
                         retry_samples=retry_samples, tally=tally)
    cache = (ActorCallCache(handles.cache, directory=handles.cache_dir, node=handles.cache_node)
             if handles.cache is not None and cfg.cache_enabled else None)
    # Without a shared limiter (no rpm/tpm) a local one still honours Retry-After within the worker.
    limiter = ActorRateLimiter(handles.limiter) if handles.limiter is not None else LocalRateLimiter()
    return LLMClient(cfg, cache=cache, limiter=limiter, section=section, retry_samples=retry_samples,
                     tally=tally, slots=EndpointSlots.for_role(cfg, handles.slots))
