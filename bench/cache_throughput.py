"""Benchmark: how many lookups per second the job's call cache (a service in the job's host actor) serves, and whether it limits the
LLM throughput benchmark at a 64-request endpoint cap.

Several Ray tasks (workers) each run an event loop with the same cache proxy the LLM client uses
(`ActorCallCache`), many lookups in flight, against the job's `DiskCallCache` (in its service host) on a fresh cache
directory: misses, writes, then hits, as a cold run and a warm rerun do. A cold LLM request costs
one lookup and one write; a warm one one lookup. The need at cap C and latency L is C / L requests/s.

    python bench/cache_throughput.py                 # 4 workers x 4000 keys
    python bench/cache_throughput.py --workers 2 --keys 1000
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, table, write_results

sys.path.insert(0, str(ROOT))

from pipeline.config import LLMConfig  # noqa: E402
from pipeline.llm.shared import ActorCallCache, SharedLLMHandles  # noqa: E402


class OneCallPerOperation:
    """The proxy as it was before batching: one actor round trip per lookup or write."""

    def __init__(self, handle) -> None:
        self.handle = handle

    async def get(self, key: str):
        return await self.handle.get.remote(key)

    async def set(self, key: str, value: dict) -> None:
        await self.handle.set.remote(key, value)


def worker(handles: SharedLLMHandles, worker_idx: int, keys: int, in_flight: int, batched: bool) -> dict[str, float]:
    """Misses, writes, hits of `keys` keys of this worker; seconds each phase took."""
    cache = ActorCallCache(handles.cache) if batched else OneCallPerOperation(handles.cache)
    names = [f"{batched}-w{worker_idx}-k{i}" for i in range(keys)]
    value = {"text": "a cached answer of a typical length " * 4, "prompt_tokens": 300, "completion_tokens": 40,
             "model": "fake-model"}

    async def phase(op) -> float:
        gate = asyncio.Semaphore(in_flight)

        async def one(name: str) -> None:
            async with gate:
                await op(name)

        started = time.perf_counter()
        await asyncio.gather(*(one(n) for n in names))
        return time.perf_counter() - started

    async def main() -> dict[str, float]:
        miss = await phase(cache.get)
        write = await phase(lambda n: cache.set(n, value))
        hit = await phase(cache.get)
        return {"miss_s": miss, "set_s": write, "hit_s": hit}

    return asyncio.run(main())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--keys", type=int, default=4000, help="keys per worker")
    ap.add_argument("--in-flight", type=int, default=64, help="lookups in flight per worker")
    ap.add_argument("--cap", type=int, default=64, help="endpoint cap the need is computed for")
    ap.add_argument("--latency", type=float, default=0.2)
    a = ap.parse_args()
    import ray

    workdir = Path(tempfile.mkdtemp(prefix="mempipe-cache-bench-"))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        cfg = LLMConfig(provider="openai", base_url="http://127.0.0.1:9/v1", cache_dir=str(workdir / "cache"))
        handles = SharedLLMHandles.get_or_create(cfg, "bench")
        ray.get(handles.cache.get.remote("warm-up"))
        remote = ray.remote(worker).options(num_cpus=0.25)
        measured = {}
        for batched in (False, True):
            results = ray.get([remote.remote(handles, i, a.keys, a.in_flight, batched) for i in range(a.workers)])
            # Workers run their phases at the same time; a phase's rate is its keys over the slowest worker.
            rates = {p: a.workers * a.keys / max(r[f"{p}_s"] for r in results) for p in ("miss", "set", "hit")}
            rates["cold_requests"] = 1 / (1 / rates["miss"] + 1 / rates["set"])  # one miss + one write each
            measured["batched" if batched else "one_call_per_operation"] = rates
        handles.close()
    finally:
        ray.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)
    need = a.cap / a.latency
    labels = {"miss": "lookups/s, miss", "set": "writes/s", "hit": "lookups/s, hit",
              "cold_requests": "cold LLM requests/s it can serve (a miss + a write each)"}
    rows = [[label, f"{measured['one_call_per_operation'][k]:.0f}", f"{measured['batched'][k]:.0f}"]
            for k, label in labels.items()]
    capacity = measured["batched"]["cold_requests"]
    limits = capacity < 1.1 * need
    body = (f"{a.workers} Ray workers x {a.keys} keys, {a.in_flight} operations in flight per worker, one "
            "`DiskCallCache` (diskcache, in the job's service host) on a fresh directory.\n\n"
            + table(["", "one actor call per operation (before)", "batched per 2 ms (now)"], rows)
            + f"\n\nNeed at cap {a.cap} and latency {a.latency} s: {need:.0f} cold requests/s "
            f"({2 * need:.0f} cache operations/s). The cache {'LIMITS' if limits else 'does not limit'} it "
            f"({capacity / need:.1f}x the need; one call per operation: "
            f"{measured['one_call_per_operation']['cold_requests'] / need:.1f}x, and every operation costs the "
            "workers' and the actor's CPU that the LLM requests need).")
    write_results("cache_throughput", "Call-cache service throughput", body,
                  {"measured": measured, "need": need, "limits": limits, "args": vars(a)})
    return 1 if limits else 0


if __name__ == "__main__":
    raise SystemExit(main())
