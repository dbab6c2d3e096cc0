"""Benchmark: CPU per call of one LLM client with many requests in flight, by HTTP pool size.

One `LLMClient` (cache off, no Ray) sends N plain chat calls to the fake server with `cap` requests
in flight, once per pool size (`pipeline.llm.transport._POOL_REQUESTS`: requests in flight per HTTP
connection pool): wall time, requests/s and the CPU-seconds of this process per call. httpcore
scans every connection and waiting request of a pool on each event, so one pool holding all
`cap` requests spends more CPU per call than several small ones.

    python bench/http_pools.py                       # 4,000 calls, 256 in flight, pools of 256 and 32
    python bench/http_pools.py --calls 2000 --pools 256 64 32 16
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
from typing import Any

from harness import ROOT, FakeServer, table, write_results

sys.path.insert(0, str(ROOT))

from pipeline.config import LLMConfig
from pipeline.llm import transport as client_module
from pipeline.llm.shared import make_client

KEY_ENV = "MEMPIPE_BENCH_POOL_KEY"


def one_pass(base_url: str, calls: int, cap: int, pool: int) -> dict[str, Any]:
    """`calls` chat calls at `cap` in flight with pools of `pool` requests: wall, rate, CPU ms per call."""
    client_module._POOL_REQUESTS = pool  # the module's setting, read when a loop's pools are made
    cfg = LLMConfig(provider="openai", base_url=base_url, model="fake-model", api_key_env=KEY_ENV,
                    cache_enabled=False, max_concurrency=cap, max_tokens=16)

    async def go() -> dict[str, Any]:
        llm = make_client(cfg)
        started, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.gather(*(llm.chat([{"role": "user", "content": f"question {pool} {i}"}]) for i in range(calls)))
        after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - started
        await llm.aclose()
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return {"pool": pool, "pools": -(-cap // pool), "wall_s": wall, "rate": calls / wall,
                "cpu_ms_per_call": cpu / calls * 1000}

    return asyncio.run(go())  # a loop per pass: its pools are made afresh


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=4000)
    ap.add_argument("--cap", type=int, default=256, help="requests in flight (llm.max_concurrency) and the server's cap")
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--pools", type=int, nargs="+", default=[256, 32], help="requests per pool to compare")
    a = ap.parse_args()
    os.environ[KEY_ENV] = "sk-bench-not-a-secret"
    with FakeServer(latency=a.latency, max_concurrency=a.cap) as srv:
        results = [one_pass(srv.base_url, a.calls, a.cap, pool) for pool in a.pools]
    base = results[0]["cpu_ms_per_call"]
    rows = [[r["pool"], r["pools"], f"{r['wall_s']:.1f}", f"{r['rate']:.0f}", f"{r['cpu_ms_per_call']:.2f}",
             f"{r['cpu_ms_per_call'] / base:.2f}"] for r in results]
    body = (f"{a.calls} plain chat calls from one client (cache off, no Ray) with {a.cap} in flight against the fake "
            f"server (latency {a.latency:g} s, cap {a.cap}, ideal {a.cap / a.latency:.0f} req/s), the server in its own "
            "process on the same cores. CPU = this process's user + system time.\n\n"
            + table(["requests per pool", "pools", "wall s", "requests/s", "client CPU ms per call",
                     f"vs pools of {a.pools[0]}"], rows))
    write_results("http_pools", "CPU per call by HTTP pool size", body, {"results": results, "args": vars(a)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
