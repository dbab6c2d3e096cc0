"""One Ray actor per job that hosts the job's shared services (the call cache, the rate limiter, the
endpoint slot pools, the run's ledger), each under its own name.

Each service used to be an actor of its own: a new worker process per service and run, ~1-2 CPU-s
to start (Python, Ray and our modules imported again), four or five per run. The host starts
once per driver (its owner: it ends with the driver) on the driver's node, and a run's services
come and go as objects inside it.

A service is a plain object, hosted as it is (the cache's `DiskCallCache`, the limiter's
`PacingSchedule`, the ledger's `LedgerBook`): no wrapper class restates its methods. How the host
calls them keeps what each one relied on as an actor of its own:
- `async def` methods are awaited on the host's event loop (the slot pool's long polls);
- a service whose class sets `THREADED = True` (the cache: SQLite reads overlap writes) has its
  methods run on the host's thread pool, `HOST_THREADS` at once;
- any other method runs on the event loop itself, so one service's calls never interleave (the
  limiter's schedule, the ledger's book), in the order each caller sent them.

`ServiceRef` looks like an actor handle to its callers: `ref.method.remote(*args)` returns an
ObjectRef, so code written against the service actors did not change. `InProcess` is the same
for a service in the caller's own process (inline runs, tests), so a client is written once.
"""

from __future__ import annotations

import asyncio
import inspect
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generator

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

HOST_THREADS = 8


class ServiceGone(LookupError):
    """The service was stopped (its run ended) or never started in this host."""


class ServiceHost:
    """The job's services by name (an async Ray actor; see the module's docstring)."""

    def __init__(self) -> None:
        self._services: dict[str, Any] = {}
        self._threads = ThreadPoolExecutor(HOST_THREADS, thread_name_prefix="service")

    def start(self, name: str, cls: type, args: tuple) -> bool:
        """Start `cls(*args)` as `name` unless one runs under that name; True when it started."""
        if name in self._services:
            return False
        self._services[name] = cls(*args)
        return True

    async def call(self, name: str, method: str, args: tuple) -> Any:
        service = self._services.get(name)
        if service is None:
            raise ServiceGone(f"no service {name!r} in this job's host (stopped at the end of its run?)")
        fn = getattr(service, method)
        if inspect.iscoroutinefunction(fn):
            return await fn(*args)
        if getattr(service, "THREADED", False):
            return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)
        return fn(*args)

    async def stop(self, name: str) -> None:
        """Close (when it has `close`) and forget `name`; nothing when it is not running."""
        service = self._services.pop(name, None)
        close = getattr(service, "close", None)
        if close is not None:
            await asyncio.get_running_loop().run_in_executor(self._threads, close)

    def names(self) -> list[str]:
        return sorted(self._services)


# Ray's default for an async actor is up to 1000 calls at once (set again above: the pools' polls).
_HostActor = ray.remote(num_cpus=0)(ServiceHost)


@dataclass(frozen=True)
class _Method:
    host: Any
    name: str
    method: str

    def remote(self, *args: Any) -> Any:
        return self.host.call.remote(self.name, self.method, args)


@dataclass(frozen=True)
class ServiceRef:
    """A service in the job's host, called like an actor: `ref.get_many.remote(keys)`. Picklable."""

    host: Any
    name: str

    def __getattr__(self, method: str) -> _Method:
        if method.startswith("__"):  # pickling and copying look for dunders: not service methods
            raise AttributeError(method)
        return _Method(self.host, self.name, method)

    def sync(self, method: str, *args: Any) -> Any:
        """The method's result, waited for (the driver's reads, outside an event loop)."""
        return ray.get(self.host.call.remote(self.name, method, args))

    def stop(self) -> None:
        """Close and drop the service (end of its run). Safe to call twice, and after Ray ended."""
        try:
            ray.get(self.host.stop.remote(self.name))
        except (ray.exceptions.RayError, AttributeError):  # the host (or Ray) is already gone
            pass


class _Done:
    """A result already there, awaited like the ObjectRef of a hosted call (or left unawaited)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __await__(self) -> Generator[Any, None, Any]:
        return self.value
        yield  # a generator that returns at once: nothing to wait for


@dataclass(frozen=True)
class _LocalMethod:
    fn: Callable[..., Any]

    def remote(self, *args: Any) -> Awaitable[Any]:
        out = self.fn(*args)  # run now: a fire-and-forget call is done too
        return out if inspect.isawaitable(out) else _Done(out)


class InProcess:
    """A service in this process, called like a `ServiceRef`: `ref.method.remote(*args)` runs the
    method now and returns an awaitable of its result; `ref.sync(method, *args)` the result."""

    name = None  # not one of the host's services

    def __init__(self, service: Any) -> None:
        self.service = service

    def __getattr__(self, method: str) -> _LocalMethod:
        if method.startswith("__"):
            raise AttributeError(method)
        return _LocalMethod(getattr(self.service, method))

    def sync(self, method: str, *args: Any) -> Any:
        return getattr(self.service, method)(*args)

    def stop(self) -> None:
        """Nothing to stop: the service ends with its last reference."""


# The driver keeps its host's handle: Ray ends an actor (named or not) once no handle to it is left,
# which would otherwise happen between two runs of one process.
_HOSTS: dict[str, Any] = {}


def job_host() -> Any:
    """This driver's host: started on its node at the first call (call on the driver, after ray.init)."""
    ctx = ray.get_runtime_context()
    # The driver's job id and node id: one host per driver (job ids repeat across Ray instances).
    name = f"mempipe-services-{ctx.get_job_id()}-{ctx.get_node_id()[:12]}"
    if name not in _HOSTS:
        _HOSTS.clear()  # an earlier Ray instance's host is gone with it
        here = NodeAffinitySchedulingStrategy(node_id=ctx.get_node_id(), soft=False)
        _HOSTS[name] = _HostActor.options(
            name=name, get_if_exists=True, scheduling_strategy=here, max_concurrency=1000).remote()
    return _HOSTS[name]


def start_service(name: str, cls: type, *args: Any) -> ServiceRef:
    """The job's service `name`: `cls(*args)` started in the job's host unless one runs under that
    name (then that one, as `get_if_exists` did for the service actors)."""
    host = job_host()
    ray.get(host.start.remote(name, cls, args))
    return ServiceRef(host, name)
