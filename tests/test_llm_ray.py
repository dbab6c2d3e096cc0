"""Several Ray workers sharing the job's cache and rate limiter (services in the job's host actor)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import ray

from conftest import llm_config
from pipeline.testing.fake_openai import FakeOpenAI
from pipeline.config import LLMConfig
from pipeline.llm.shared import SharedLLMHandles, make_client

N_TASKS = 3  # worker processes: each starts and imports the client (seconds of CPU)
PER_TASK = 16


@ray.remote(num_cpus=0.25)
def ask_all(cfg: LLMConfig, handles: SharedLLMHandles, prompts: list[str]) -> tuple[list[str], dict[str, Any]]:
    async def go() -> tuple[list[str], dict[str, Any]]:
        client = make_client(cfg, handles)
        try:
            results = await asyncio.gather(*(client.chat([{"role": "user", "content": p}]) for p in prompts))
        finally:
            await client.aclose()
        return [r.text for r in results], client.usage.to_dict()

    return asyncio.run(go())


def max_in_window(ts: list[float], width: float) -> int:
    ts = sorted(ts)
    return max(sum(1 for u in ts if t <= u < t + width) for t in ts)


@pytest.fixture
def handles(fake_llm: FakeOpenAI, ray_local: None) -> Any:
    made: list[SharedLLMHandles] = []

    def make(cfg: LLMConfig, job_key: str | None = None) -> SharedLLMHandles:
        h = SharedLLMHandles.get_or_create(cfg, job_key=job_key or uuid.uuid4().hex[:8])
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


@pytest.mark.heavy(seconds=15)
def test_workers_share_rpm_limit_and_cache(fake_llm: FakeOpenAI, handles: Any) -> None:
    rpm = 600  # one request per 100 ms for the whole job
    cfg = llm_config(fake_llm, rpm=rpm, max_concurrency=8)
    job = uuid.uuid4().hex[:8]
    h = handles(cfg, job)
    assert h.cache is not None and h.limiter is not None
    same = SharedLLMHandles.get_or_create(cfg, job)  # a second lookup finds the same services
    assert same.limiter == h.limiter and same.cache == h.cache
    other = handles(cfg)  # another job gets its own limiter
    assert other.limiter != h.limiter

    # Warm-up: worker processes start and import the client first, so the measured phase shows
    # the limiter rather than process start-up (a first request can reach the server long after
    # its slot on a loaded machine).
    ray.get([ask_all.remote(cfg.model_copy(update={"cache_enabled": False}), h, [f"warm {t}"])
             for t in range(N_TASKS)], timeout=60)
    fake_llm.reset()
    prompts = [[f"task {t} prompt {i}" for i in range(PER_TASK)] for t in range(N_TASKS)]
    cold = ray.get([ask_all.remote(cfg, h, p) for p in prompts], timeout=60)
    n = N_TASKS * PER_TASK
    assert fake_llm.count() == n
    ts = sorted(fake_llm.timestamps)
    per_s = rpm / 60
    # The whole job, across 3 worker processes, stays at the limit: the limiter spaces send slots
    # exactly 60/rpm apart. A request can reach the server up to ~0.2 s after its slot on a busy
    # 2-core machine, so windows are a few seconds wide with five requests of slack (the benchmark
    # checks 5% over 60 s windows). A burst-then-stall limiter would put all 48 in one window.
    gaps = [round(b - a, 3) for a, b in zip(ts, ts[1:])]
    # Each task's first request also pays for its client and connection, so the first few can
    # arrive late and together (seen: 5 within 5 ms, and a first request 0.4 s later than the last
    # one's lag; beside a busy loop, 0.7 s late, and the span 0.52 s short): the span is measured
    # from the last of them, with a second of slack (a limiter per worker would span a third).
    late = N_TASKS + 1
    assert ts[-1] - ts[late - 1] >= (n - late) / per_s - 1.0, gaps
    for width in (3.0, 4.0):
        assert max_in_window(ts, width) <= per_s * width * 1.05 + 5, (width, gaps)
    assert sum(u["calls"] for _, u in cold) == n

    # Cross-worker cache hits: every task now asks what another task asked.
    rotated = prompts[1:] + prompts[:1]
    warm = ray.get([ask_all.remote(cfg, h, p) for p in rotated], timeout=60)
    assert fake_llm.count() == n  # zero new requests
    assert [texts for texts, _ in warm] == [texts for texts, _ in cold[1:] + cold[:1]]
    assert all(u["cached_calls"] == PER_TASK and u["prompt_tokens"] > 0 for _, u in warm)


def test_retry_after_pauses_every_worker(fake_llm: FakeOpenAI, handles: Any) -> None:
    # Slots 0.3 s apart: the 429's pause reaches the limiter through the worker that got it and an
    # actor call, which on a loaded 2-core machine takes a good part of 0.1 s.
    cfg = llm_config(fake_llm, rpm=200, cache_enabled=False, backoff_max_s=0.01)
    h = handles(cfg)
    assert h.cache is None
    # The workers are up before the measured phase (a process started late sends late anyway).
    ray.get([ask_all.remote(cfg, h, [f"warm {t}"]) for t in range(3)], timeout=300)
    fake_llm.reset()
    fake_llm.retry_after_s = 2
    fake_llm.force = ["429"]  # the first request of the job is told to wait 2 s
    out = ray.get([ask_all.remote(cfg, h, [f"t{t} q{i}" for i in range(3)]) for t in range(3)], timeout=60)
    first, *rest = sorted(fake_llm.requests, key=lambda r: r["t"])
    assert first["outcome"] == "429" and len(rest) == 9
    # Slots handed out before the 429 are voided by the pause: nothing else is sent until it ends
    # (one request of slack: a slot due while the pause is still travelling to the actor).
    early = [r for r in rest if r["t"] - first["t"] < 1.95]
    assert len(early) <= 1, [round(r["t"] - first["t"], 3) for r in rest]
    assert sum(u["retries"] for _, u in out) == 1 and sum(u["calls"] for _, u in out) == 9
