"""Benchmark: a warm rerun sends nothing and costs a small fraction of the cold run.

Cold: the pipeline up to `respond_turn` (SeCom's turn-level answering of every QA probe; a few
thousand calls) on a synthetic corpus, fresh artifacts and a fresh LLM call cache, against the
fake server (fixed latency, concurrency cap). Then the same command twice more:

- forced: `--force respond_turn`, which rebuilds the stage; every call must come from the cache;
- plain: no flags, which skips every stage (all up to date).

Measured: chat requests reaching the server (target 0 for both reruns), the stage's wall time
(manifest `timings.wall_s`) forced vs cold, and the whole command's wall time vs cold (target:
under 10% of cold for each).

Where the forced replay's time goes (information): the same forced rerun with `ray.executor=inline`
(no Ray: shards one after another in the driver, the cache opened in-process), the time a fresh
Python process takes to import what a shard task needs (every new Ray worker pays it before its
first shard), and with `--profile` the cost of cache reads through the job's cache service from
1 to 8 tasks at once.

    python bench/warm_rerun.py                        # 100 episodes x 30 questions = 3000 calls
    python bench/warm_rerun.py --episodes 20 --profile
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import ROOT, FakeServer, fake_sets, manifest, mempipe, table, write_results
from make_corpus import write_corpus

STAGES = "stages=[ingest,guidance,segment,compress,banks,probes,respond_turn]"
STAGE = "respond_turn"
MAX_SHARE = 0.10  # target: a warm rerun costs under 10% of the cold run


def usage_calls(m: dict[str, Any]) -> tuple[int, int]:
    """(calls, calls answered from the cache) summed over the manifest's roles."""
    per_role = (m.get("llm_usage") or {}).values()
    return sum(u.get("calls", 0) for u in per_role), sum(u.get("cached_calls", 0) for u in per_role)


def run(srv: FakeServer, workdir: Path, sets: list[str], args: list[str]) -> dict[str, Any]:
    """One `mempipe run ARGS`: requests that reached the server, command wall, the stage's manifest."""
    srv.reset()
    wall, _ = mempipe(["run", *args], sets)
    stats = srv.stats()
    m = manifest(workdir / "artifacts" / "warm", STAGE)
    calls, cached = usage_calls(m)
    return {"requests": stats["by_path"].get("/v1/chat/completions", 0), "all_requests": stats["total"],
            "command_wall_s": wall, "stage_wall_s": m["timings"]["wall_s"], "shard_s": m["timings"]["shard_s"],
            "finished_at": m["timings"]["finished_at"], "calls": calls, "cached_calls": cached,
            "rows": m["rows"], "errors": m["errors"], "shards": m["shards"]}


def import_seconds() -> float:
    """Seconds a fresh interpreter takes to import the runner and every stage (a shard task's needs)."""
    code = ("import time; t = time.perf_counter(); import pipeline.engine.runner, stages; "
            "print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def actor_reads(cache_dir: Path, in_flight: int, tasks: tuple[int, ...] = (1, 4, 8)) -> list[dict[str, Any]]:
    """Every key of `cache_dir` read through the job's `DiskCallCache` (as shard tasks do), from n tasks at
    once, each with `in_flight` reads outstanding (a shard asks for all its calls at once).

    Starts and stops its own local Ray; returns per n: wall s, reads, ms per read overall.
    """
    import diskcache
    import ray

    from pipeline.llm.service_host import start_service
    from pipeline.llm.cache import DiskCallCache

    with diskcache.Cache(str(cache_dir)) as c:
        keys = list(c.iterkeys())
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR",
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        actor = start_service("bench-cache", DiskCallCache, str(cache_dir))
        reader = ray.remote(num_cpus=0.25)(_read_all)
        # one worker per task started and its imports done (each holds its CPU share a while)
        ray.get([reader.remote(actor, keys[:8], 1, 2.0) for _ in range(max(tasks))])
        out = []
        for n in tasks:
            started = time.perf_counter()
            ray.get([reader.remote(actor, keys, in_flight) for _ in range(n)])
            wall = time.perf_counter() - started
            out.append({"tasks": n, "reads": n * len(keys), "in_flight": in_flight, "wall_s": wall,
                        "ms_per_read": wall / (n * len(keys)) * 1000})
        return out
    finally:
        ray.shutdown()


def _read_all(handle: Any, keys: list[str], in_flight: int, hold_s: float = 0.0) -> None:
    """A Ray task: read `keys` through ActorCallCache, `in_flight` at a time (like one client),
    then hold the worker `hold_s` seconds."""
    import asyncio

    from pipeline.llm.shared import ActorCallCache

    cache = ActorCallCache(handle)

    async def main() -> None:
        gate = asyncio.Semaphore(in_flight)

        async def one(key: str) -> None:
            async with gate:
                await cache.get(key)

        await asyncio.gather(*(one(k) for k in keys))

    asyncio.run(main())
    time.sleep(hold_s)


def share_cell(part: float, whole: float) -> tuple[str, bool]:
    share = part / whole if whole else float("inf")
    ok = share < MAX_SHARE
    return f"{share:.2%}" + ("" if ok else f" (MISSED by {(share - MAX_SHARE) * 100:.2f} points)"), ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--questions", type=int, default=30)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--cap", type=int, default=32)
    ap.add_argument("--episodes-per-shard", type=int, default=4)
    ap.add_argument("--profile", action="store_true", help="also time cache reads through the cache service")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="mempipe-warm-"))
    reads: list[dict[str, Any]] = []
    try:
        corpus = write_corpus(workdir / "corpus.jsonl", a.episodes, sessions=3, turns=8, questions=a.questions)
        with FakeServer(latency=a.latency, max_concurrency=a.cap) as srv:
            sets = fake_sets(workdir, srv.base_url, corpus, run_name="warm") + [
                "methods=[turn]", STAGES, "compress.method=none", "compress.granularities=[turn]",
                "banks.granularities=[turn]", "probes.next_response=false", "probes.max_qa_per_episode=null",
                "llm.max_concurrency=8", f"ray.episodes_per_shard={a.episodes_per_shard}"]
            cold = run(srv, workdir, sets, [])
            forced = run(srv, workdir, sets, ["--force", STAGE])
            plain = run(srv, workdir, sets, [])
            # profile (after the measured runs, so they see nothing of it)
            inline = run(srv, workdir, sets + ["ray.executor=inline"], ["--force", STAGE])
        imports = import_seconds()
        if a.profile:
            reads = actor_reads(workdir / "llm-cache-warm", a.episodes_per_shard * a.questions)
    finally:
        if a.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return report(a, cold, forced, plain, {"inline": inline, "import_s": imports, "actor_reads": reads})


def report(a: argparse.Namespace, cold: dict[str, Any], forced: dict[str, Any], plain: dict[str, Any],
           prof: dict[str, Any]) -> int:
    """The table, the results files; the exit code."""
    stage_share, stage_ok = share_cell(forced["stage_wall_s"], cold["stage_wall_s"])
    forced_share, forced_ok = share_cell(forced["command_wall_s"], cold["command_wall_s"])
    plain_share, plain_ok = share_cell(plain["command_wall_s"], cold["command_wall_s"])
    # the plain rerun must not have rebuilt the stage: its manifest is the forced run's
    plain_skipped = plain["finished_at"] == forced["finished_at"]
    zero_ok = forced["requests"] == 0 and plain["requests"] == 0
    rows = [
        ["cold", cold["requests"], f"{cold['calls'] - cold['cached_calls']}/{cold['calls']}",
         f"{cold['stage_wall_s']:.1f}", "-", f"{cold['command_wall_s']:.1f}", "-"],
        [f"forced (`--force {STAGE}`)", forced["requests"],
         f"{forced['calls'] - forced['cached_calls']}/{forced['calls']}",
         f"{forced['stage_wall_s']:.2f}", stage_share, f"{forced['command_wall_s']:.1f}", forced_share],
        ["plain (every stage skipped)", plain["requests"], "-" if plain_skipped else "REBUILT",
         "-", "-", f"{plain['command_wall_s']:.1f}", plain_share],
    ]
    checks = {"0 requests on both reruns": zero_ok, "forced stage under 10% of cold": stage_ok,
              "forced command under 10% of cold": forced_ok, "plain command under 10% of cold": plain_ok,
              "plain rerun skipped every stage": plain_skipped}
    ok = all(checks.values())
    body = (f"Pipeline up to `{STAGE}` over {a.episodes} synthetic episodes x {a.questions} questions, "
            f"{a.episodes_per_shard} episodes per shard; fake server latency {a.latency} s, at most {a.cap} "
            f"requests served at once. Targets: 0 requests reach the server on either rerun; forced stage "
            f"and both rerun commands under {MAX_SHARE:.0%} of cold.\n\n"
            + table(["run", "chat requests at the server", f"`{STAGE}` calls sent/total", "stage wall s",
                     "stage vs cold", "command wall s", "command vs cold"], rows)
            + "\n\n" + profile_text(forced, prof)
            + "\n\nTargets: " + "; ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in checks.items()) + ".")
    write_results("warm_rerun", "Warm rerun against cold", body,
                  {"args": vars(a), "cold": cold, "forced": forced, "plain": plain, "plain_skipped": plain_skipped,
                   "profile": prof, "targets": checks, "targets_met": ok})
    return 0 if ok else 1


def profile_text(forced: dict[str, Any], prof: dict[str, Any]) -> str:
    """Where the forced replay's time goes, as a table."""
    inline = prof["inline"]
    calls = max(forced["calls"], 1)
    rows = [
        ["forced rerun, Ray: stage wall", f"{forced['stage_wall_s']:.2f}",
         f"{forced['shards']} shards; {forced['stage_wall_s'] / calls * 1000:.2f} ms per call"],
        ["forced rerun, Ray: shard tasks' own time, summed", f"{forced['shard_s']:.2f}",
         f"{forced['shard_s'] / max(forced['shards'], 1):.2f} s per shard; from the task's start, so "
         "without worker start-up"],
        ["forced rerun, Ray: command outside the stage", f"{forced['command_wall_s'] - forced['stage_wall_s']:.2f}",
         "interpreter, config, Ray start and stop, fingerprints"],
        ["forced rerun, inline (no Ray): stage wall", f"{inline['stage_wall_s']:.2f}",
         f"shards one after another, cache opened in-process; {inline['requests']} requests; "
         f"command {inline['command_wall_s']:.1f} s"],
        ["import of pipeline.engine.runner + stages in a fresh interpreter", f"{prof['import_s']:.2f}",
         "paid by every new Ray worker before its first shard"],
    ]
    for r in prof["actor_reads"]:
        rows.append([f"{r['reads']} cache reads through the cache service from {r['tasks']} task(s), "
                     f"{r['in_flight']} in flight each",
                     f"{r['wall_s']:.2f}", f"{r['ms_per_read']:.3f} ms per read"])
    return "Where the forced replay's time goes (information):\n\n" + table(["what", "seconds", "note"], rows)


if __name__ == "__main__":
    raise SystemExit(main())
