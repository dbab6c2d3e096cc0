"""One `llm.max_concurrency` per endpoint: the requests in flight at an endpoint, across every LLM
worker and node of a run, never pass it.

Two sides. A named service per (job, endpoint, model, cap) in the job's host actor
(pipeline.llm.service_host), `SlotPoolService`, leases slots
to the workers in blocks: each event loop that sends requests is one holder, tells the actor how
many slots it could use (`want`), and is granted up to its max-min fair share (`target`) of the cap.
Inside the loop, `_LoopSlots` hands leased slots to requests with plain counters and futures, so a
request's slot costs no actor call: a reply's slot goes straight to the next waiting request. A
holder above its share (another holder started wanting) gives slots back as its requests end; a
holder whose slots sat unused for `LINGER_S` gives them back, so an idle worker's share flows to a
busy one. Inline runs (no Ray) use one asyncio semaphore per event loop.

    slots = EndpointSlots.for_role(cfg, handle)   # handle: `start_slot_pool(cfg, job)` on the driver, or None
    async with slots.slot():                      # one slot per HTTP request
        ...

`llm.max_concurrency_per_worker` (optional; None: no extra cap), when the config has it, also caps
one event loop's requests.

An endpoint served by several single-request servers (the embedded llama.cpp servers: one identity,
several URLs) has one slot per server; a request holding a slot asks `take_server()` which server
to send to (the pool's `ServerPicker`: the least busy) and gives it back with `give_server()`.

Wiring: `SharedLLMHandles` starts the pool with the job's other actors and `make_client` hands each
client its role's `EndpointSlots`; the client takes one slot per request (never keeps a loop's
side beyond a run: an LLM worker's loop outlives runs, and each run's pool is a new actor).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
import uuid
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# Slots unused this long go back to the pool (a worker between shards lends its share to the others).
LINGER_S = 0.05
# A holder's long poll returns at least this often (its heartbeat); one silent for EXPIRY_S (its
# process died) loses its slots.
POLL_S = 1.0
EXPIRY_S = 20.0


def fair_shares(cap: int, wants: dict[str, int]) -> dict[str, int]:
    """Max-min fair split of `cap` slots over the holders' wants (water filling): a holder wanting
    less than an equal share gets what it wants, the rest split the remainder evenly. Sums to
    min(cap, sum of wants)."""
    out: dict[str, int] = {}
    remaining = cap
    items = sorted(wants.items(), key=lambda kv: (kv[1], kv[0]))
    for i, (holder, want) in enumerate(items):
        give = min(max(want, 0), -(-remaining // (len(items) - i)))
        out[holder] = give
        remaining -= give
    return out


class SlotPool:
    """The pure core of the actor: who holds how many of `cap` slots, and who wants how many.
    Not thread-safe: one owner calls it."""

    def __init__(self, cap: int, expiry_s: float = EXPIRY_S) -> None:
        if cap < 1:
            raise ValueError("llm.max_concurrency must be at least 1")
        self.cap = cap
        self.expiry_s = expiry_s
        self.held: dict[str, int] = {}
        self.want: dict[str, int] = {}
        self.seen: dict[str, float] = {}
        self.dropped: set[str] = set()
        self.targets: dict[str, int] = {}
        self.peak_held = 0

    def free(self) -> int:
        return self.cap - sum(self.held.values())

    def tell(self, holder: str, want: int, returned: int, now: float) -> bool:
        """A holder's news: it wants `want` slots in all, and gives `returned` back. True when
        another holder's share changed or slots came free (its poll should look again)."""
        if holder in self.dropped:
            return False
        self.seen[holder] = now
        self.held[holder] = max(self.held.get(holder, 0) - returned, 0)
        self.want[holder] = max(want, 0)
        if not self.want[holder] and not self.held[holder]:
            self._forget(holder)
        before = self.targets
        self.targets = fair_shares(self.cap, self.want)
        self.reap(now)
        return returned > 0 or before != self.targets

    def grant(self, holder: str) -> int:
        """Slots granted to `holder` now: up to its share, out of what is free."""
        if holder in self.dropped:
            return 0
        n = min(max(self.targets.get(holder, 0) - self.held.get(holder, 0), 0), self.free())
        if n:
            self.held[holder] = self.held.get(holder, 0) + n
            self.peak_held = max(self.peak_held, self.cap - self.free())
        return n

    def drop(self, holder: str) -> None:
        """The holder's loop ended: everything it held is free, and it is never granted again."""
        self.dropped.add(holder)
        self._forget(holder)
        self.targets = fair_shares(self.cap, self.want)

    def reap(self, now: float) -> bool:
        """Free the slots of holders not heard from for `expiry_s` (their process died)."""
        gone = [h for h, t in self.seen.items() if now - t > self.expiry_s]
        for h in gone:
            log.warning("slot holder %s silent for %.0f s: its %d slots are free again", h, now - self.seen[h],
                        self.held.get(h, 0))
            self.drop(h)
        return bool(gone)

    def _forget(self, holder: str) -> None:
        for d in (self.held, self.want, self.seen):
            d.pop(holder, None)


class ServerPicker:
    """Which of an endpoint's servers a request goes to: one with the fewest requests in flight
    (each answers one at a time), and among those the one that lately read the longest start of
    the request's prompt, as its prompt cache can skip reading it again (llama.cpp: its last
    prompt, and with `llm.local.prompt_cache_mb` the longest cached prefix of any recent one).
    Ties go to the first, so requests one at a time keep to server 0."""

    RECENT = 16  # prompts remembered per server: about what its prompt cache holds

    def __init__(self, servers: int) -> None:
        self.busy = [0] * max(1, servers)
        self.recent: list[deque[str]] = [deque(maxlen=self.RECENT) for _ in self.busy]
        self._lock = threading.Lock()  # inline runs may send from several threads' loops

    def take(self, prompt: str = "") -> int:
        with self._lock:
            least = min(self.busy)
            idle = [i for i, b in enumerate(self.busy) if b == least]
            i = max(idle, key=lambda j: (max((shared_start(prompt, p) for p in self.recent[j]), default=0), -j))
            self.busy[i] += 1
            if prompt:
                self.recent[i].append(prompt)
            return i

    def give(self, server: int) -> None:
        with self._lock:
            self.busy[server] = max(self.busy[server] - 1, 0)


def shared_start(a: str, b: str) -> int:
    """The length of the longest common prefix of `a` and `b` (slice comparisons, not a loop per
    character: prompts run to many kilobytes)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


try:
    import ray
except ImportError:  # pragma: no cover - Ray is a dependency; inline slots work without it
    ray = None  # type: ignore[assignment]


class SlotPoolService:
    """The job's slots for one endpoint; `lease` is async, so a holder's long poll waits without
    blocking the host; the other calls run one at a time on its loop."""

    def __init__(self, cap: int, expiry_s: float = EXPIRY_S, servers: int = 1) -> None:
        self._pool = SlotPool(cap, expiry_s)
        self._changed = asyncio.Event()
        self._token = uuid.uuid4().hex
        self._servers = ServerPicker(servers)

    def take_server(self, prompt: str = "") -> int:
        return self._servers.take(prompt)

    def give_server(self, server: int) -> None:
        self._servers.give(server)

    def token(self) -> str:
        return self._token

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def tell(self, holder: str, want: int, returned: int = 0) -> None:
        if self._pool.tell(holder, want, returned, time.monotonic()):
            self._notify()

    async def lease(self, holder: str, want: int, known_target: int, wait_s: float = POLL_S) -> tuple[int, int]:
        """(slots granted, this holder's share) once it is granted some, its share changes, or
        `wait_s` passes; `want`: the slots it could use in all, `known_target`: the share it knows."""
        self.tell(holder, want, 0)
        deadline = time.monotonic() + wait_s
        while True:
            granted = self._pool.grant(holder)
            target = self._pool.targets.get(holder, 0)
            left = deadline - time.monotonic()
            if holder in self._pool.dropped:
                return 0, -1  # silent past EXPIRY_S: its slots were freed; it starts over as a new holder
            if granted or target != known_target or left <= 0:
                return granted, target
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), left)
            except asyncio.TimeoutError:
                pass
            if self._pool.reap(time.monotonic()):
                self._notify()

    def drop(self, holder: str) -> None:
        self._pool.drop(holder)
        self._notify()

    def stats(self) -> dict[str, Any]:
        p = self._pool
        return {"cap": p.cap, "held": dict(p.held), "want": dict(p.want), "targets": dict(p.targets),
                "in_use": p.cap - p.free(), "peak_held": p.peak_held, "servers_busy": list(self._servers.busy)}


@dataclass(frozen=True)
class SlotsHandle:
    """What a worker needs of the job's `SlotPoolService` (picklable; made by the driver)."""

    actor: Any  # the service's ServiceRef, called like an actor
    cap: int
    token: str  # this pool's own id: a new run's pool of the same name gets new local sides
    servers: int = 1  # the endpoint's single-request servers (SlotPoolService.take_server)

    def close(self) -> None:
        """Stop the pool (end of run). Safe to call twice."""
        self.actor.stop()


def _servers(cfg: Any) -> tuple[str, ...]:
    """The single-request servers behind a role's endpoint (pipeline.config.LLMConfig.server_urls)."""
    return tuple(getattr(cfg, "server_urls", ()))


def slot_pool_name(cfg: Any, job_key: str) -> str:
    from pipeline.llm.identity import endpoint_identity

    # The servers' URLs too (runtime names, not cache keys): each set of servers picks its own.
    digest = hashlib.sha256(repr((endpoint_identity(cfg), cfg.model, cfg.max_concurrency,
                                  _servers(cfg))).encode()).hexdigest()[:12]
    return f"mempipe-llm-slots-{job_key}-{digest}"


def start_slot_pool(cfg: Any, job_key: str) -> SlotsHandle:
    """Look up or start the job's slot pool for this role's endpoint, model and
    `max_concurrency` (call on the driver, after ray.init), in the job's host on the driver's
    node. Roles with the same endpoint, model and cap share it, as they share a rate limiter."""
    from pipeline.llm.service_host import start_service

    servers = len(_servers(cfg)) or 1
    pool = start_service(slot_pool_name(cfg, job_key), SlotPoolService, cfg.max_concurrency, EXPIRY_S, servers)
    return SlotsHandle(pool, cfg.max_concurrency, ray.get(pool.token.remote()), servers)


class _LoopSlots:
    """One event loop's share of the endpoint's slots: leased from the actor in blocks, handed to
    requests locally. `async with` takes one slot."""

    def __init__(self, handle: SlotsHandle, local_cap: int | None) -> None:
        self.handle = handle
        self.actor = handle.actor
        self.most = min(handle.cap, local_cap or handle.cap)  # never want more than this
        self.holder = uuid.uuid4().hex[:16]
        self.loop = asyncio.get_running_loop()
        self.held = 0  # leased from the actor
        self.in_use = 0
        self.target = 0  # the share the actor last gave
        self.waiters: deque[asyncio.Future] = deque()
        self.reported = 0  # the want the actor last heard
        self.returning = 0  # slots to give back at the next flush
        self.flush_pending = False
        self.sync_task: asyncio.Task | None = None
        self.trim_timer: asyncio.TimerHandle | None = None
        self.min_idle = 0  # fewest unused slots since the last trim: those were unused throughout
        self.broken = False

    # ---------------------------------------------------------------- requests

    async def __aenter__(self) -> None:
        if self.in_use < self.held and not self.waiters:
            self.in_use += 1
            idle = self.held - self.in_use
            if idle < self.min_idle:
                self.min_idle = idle
            return
        fut = self.loop.create_future()
        self.waiters.append(fut)
        self._news()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # handed a slot, then cancelled: pass it on
                self._release()
            else:
                try:
                    self.waiters.remove(fut)
                except ValueError:
                    pass
                self._news()
            raise

    async def __aexit__(self, *exc: Any) -> None:
        self._release()

    def _release(self) -> None:
        self.in_use -= 1
        if self.held > self.target and not self.broken:
            # Above our share (another holder wants): this slot goes back, not to our next request.
            self.held -= 1
            self.returning += 1
            self._news()
            return
        self._dispatch()
        if self.in_use < self.held and self.trim_timer is None and not self.broken:
            self.min_idle = self.held - self.in_use
            self.trim_timer = self.loop.call_later(LINGER_S, self._trim)

    def _dispatch(self) -> None:
        while self.waiters and self.in_use < self.held:
            fut = self.waiters.popleft()
            if not fut.done():
                self.in_use += 1
                fut.set_result(None)

    def _trim(self) -> None:
        """Give back the slots unused since the last trim; look again while some are unused."""
        self.trim_timer = None
        unused = min(self.held - self.in_use, self.min_idle)
        if unused > 0 and not self.waiters:
            self.held -= unused
            self.returning += unused
            self._news()
        if self.in_use < self.held:
            self.min_idle = self.held - self.in_use
            self.trim_timer = self.loop.call_later(LINGER_S, self._trim)

    # ---------------------------------------------------------------- the actor

    def _want(self) -> int:
        return min(self.in_use + len(self.waiters), self.most)

    def _news(self) -> None:
        """Something the actor may need to hear (slots back, a want that concerns slots we do not
        hold): one `tell` per loop turn, and a lease poll running while we hold or wait."""
        if self.broken:
            self._dispatch()
            return
        if self.sync_task is None and (self.waiters or self.held):
            self.sync_task = self.loop.create_task(self._sync())
            return  # its first poll carries the want
        want = self._want()
        if not self.flush_pending and (self.returning or (want != self.reported and max(want, self.reported) > self.held)):
            self.flush_pending = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_pending = False
        want, returned = self._want(), self.returning
        if returned or want != self.reported:
            self.returning = 0
            self.reported = want
            self.actor.tell.remote(self.holder, want, returned)  # fire and forget; calls keep their order

    async def _sync(self) -> None:
        """The lease poll: one actor call at a time while this loop holds or wants slots."""
        try:
            while self.held or self.waiters:
                if self.returning:
                    self._flush()
                self.reported = want = self._want()
                granted, target = await self.actor.lease.remote(self.holder, want, self.target, POLL_S)
                if target < 0:  # the actor took our slots back (we were silent too long)
                    self.holder, self.held, self.target = uuid.uuid4().hex[:16], 0, 0
                    continue
                self.held += granted
                self.target = target
                while self.held > self.target and self.in_use < self.held:  # unused slots above our share
                    self.held -= 1
                    self.returning += 1
                self._dispatch()
                if self.returning:
                    self._flush()
        except asyncio.CancelledError:
            self._close()
            raise
        except Exception as e:  # noqa: BLE001 - the actor is gone: go on with a per-loop cap
            log.warning("endpoint slots unavailable (%s); this worker keeps at most %d requests in flight",
                        e, self.most)
            self.broken = True
            self.held = self.target = self.most
            self._dispatch()
        finally:
            self.sync_task = None

    def _close(self) -> None:
        """The loop is ending: every slot this holder has (or was being granted) is free again."""
        if not self.broken:
            self.broken = True
            try:
                self.actor.drop.remote(self.holder)
            except Exception:  # noqa: BLE001 - Ray already shut down
                pass
        self.held = self.target = 0


_SHARED: dict[tuple, "EndpointSlots"] = {}


@dataclass(eq=False)
class EndpointSlots:
    """The endpoint's concurrency slots for one role in this process. `slot()` is an async context
    manager holding one slot; each event loop gets its own local side."""

    cap: int
    handle: SlotsHandle | None = None
    local_cap: int | None = None
    servers: int = 1  # the endpoint's single-request servers: take_server() picks one per request
    _loops: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    _picker: ServerPicker | None = None  # this process's own: inline runs, or the pool gone

    @classmethod
    def for_role(cls, cfg: Any, handle: SlotsHandle | None = None) -> EndpointSlots:
        """The slots of a role's config: the job's shared pool through `handle`, or (None: inline
        runs, tests) `cfg.max_concurrency` per event loop. Clients of one process with the same
        pool (or, inline, the same endpoint, model and cap) share one object."""
        from pipeline.llm.identity import endpoint_identity

        local_cap = getattr(cfg, "max_concurrency_per_worker", None)
        key = ((handle.token,) if handle is not None else
               (endpoint_identity(cfg), cfg.model, cfg.max_concurrency, _servers(cfg))) + (local_cap,)
        slots = _SHARED.get(key)
        if slots is None:
            servers = handle.servers if handle is not None else len(_servers(cfg)) or 1
            slots = _SHARED[key] = cls(cfg.max_concurrency, handle, local_cap, servers)
        return slots

    async def take_server(self, prompt: str = "") -> int:
        """The server (0 .. servers-1) for a request that holds a slot, across every worker of the
        run: the least busy, then the one that read most of `prompt`'s start (ServerPicker). Give it
        back with `give_server`."""
        if self.handle is not None and self._picker is None:
            try:
                return await self.handle.actor.take_server.remote(prompt)
            except Exception as e:  # noqa: BLE001 - the pool is gone: this process picks alone
                log.warning("endpoint servers unavailable from the pool (%s); this worker picks its own", e)
        return self._own_picker().take(prompt)

    def give_server(self, server: int) -> None:
        if self.handle is not None and self._picker is None:
            self.handle.actor.give_server.remote(server)  # fire and forget: ordered before our slot's return
        else:
            self._own_picker().give(server)

    def _own_picker(self) -> ServerPicker:
        if self._picker is None:
            self._picker = ServerPicker(self.servers)
        return self._picker

    def slot(self) -> Any:
        """`async with slots.slot():` around one HTTP request (call inside the running loop)."""
        loop = asyncio.get_running_loop()
        side = self._loops.get(loop)
        if side is None:
            side = self._loops[loop] = self._local_side(loop)
        return side

    def _local_side(self, loop: asyncio.AbstractEventLoop) -> Any:
        if self.handle is None:
            return asyncio.Semaphore(min(self.cap, self.local_cap or self.cap))
        # Its lease poll runs while it holds slots; asyncio.run's end cancels the poll, which
        # gives everything back (pipeline.llm.slots._LoopSlots._close).
        return _LoopSlots(self.handle, self.local_cap)
