"""The job's service host (pipeline.llm.service_host): one actor process for every run of a driver,
and each service called the way it was as an actor of its own: a threaded one's calls overlap,
another's never interleave, async ones are awaited; a stopped service is gone."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

from pipeline.config import LLMConfig
from pipeline.llm.service_host import ServiceGone, job_host, start_service
from pipeline.llm.shared import SharedLLMHandles


class Spans:
    """Records (start, end) of each call that sleeps `s` seconds."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self.closed = False
        self._lock = threading.Lock()

    def nap(self, s: float) -> None:
        start = time.monotonic()
        time.sleep(s)
        with self._lock:
            self.spans.append((start, time.monotonic()))

    def record(self) -> list[tuple[float, float]]:
        return list(self.spans)

    def close(self) -> None:
        self.closed = True


class ThreadedSpans(Spans):
    THREADED = True


class Waiter:
    """An async service: `wait` returns once `release` was called (or after `s` seconds)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    async def wait(self, s: float) -> bool:
        try:
            await asyncio.wait_for(self.event.wait(), s)
            return True
        except asyncio.TimeoutError:
            return False

    def release(self) -> None:
        self.event.set()


def _overlapping(spans: list[tuple[float, float]]) -> bool:
    spans = sorted(spans)
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:]))


@pytest.fixture
def name() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def test_a_threaded_services_calls_overlap_and_a_plain_ones_never_do(ray_local, name) -> None:
    import ray

    threaded, plain = start_service(name + "-t", ThreadedSpans), start_service(name + "-p", Spans)
    try:
        ray.get([threaded.nap.remote(0.3) for _ in range(4)] + [plain.nap.remote(0.1) for _ in range(4)])
        assert _overlapping(ray.get(threaded.record.remote()))
        plain_spans = ray.get(plain.record.remote())
        assert len(plain_spans) == 4 and not _overlapping(plain_spans)
    finally:
        threaded.stop()
        plain.stop()


def test_an_async_service_waits_without_holding_the_host_and_a_stopped_one_is_gone(ray_local, name) -> None:
    import ray

    waiter, other = start_service(name + "-w", Waiter), start_service(name + "-s", Spans)
    waiting = waiter.wait.remote(30.0)
    ray.get(other.nap.remote(0.0), timeout=30)  # served while the wait is pending
    ray.get(waiter.release.remote())
    assert ray.get(waiting, timeout=30) is True

    other.stop()
    other.stop()  # twice is fine
    with pytest.raises(ServiceGone):
        try:
            ray.get(other.nap.remote(0.0))
        except ray.exceptions.RayTaskError as e:
            raise e.cause
    assert name + "-s" not in ray.get(job_host().names.remote())
    waiter.stop()


def test_starting_a_running_name_returns_it_and_every_run_of_a_driver_uses_one_host(ray_local, name) -> None:
    import ray

    first = start_service(name, Spans)
    ray.get(first.nap.remote(0.0))
    again = start_service(name, Spans)  # the running one, with its calls
    assert again == first and len(ray.get(again.record.remote())) == 1
    first.stop()

    hosts = set()
    for run in range(2):
        cfg = LLMConfig(base_url="http://127.0.0.1:9/v1", model="m", rpm=60, cache_dir=f"/tmp/{name}-{run}")
        handles = SharedLLMHandles.get_or_create(cfg, f"{name}-run{run}")
        hosts.add(handles.cache.host)
        assert len([n for n in ray.get(job_host().names.remote()) if name in n]) == 3  # cache, limiter, slots
        handles.close()
    assert len(hosts) == 1 and not [n for n in ray.get(job_host().names.remote()) if name in n]
