"""Benchmark: LLM throughput of a real stage against an endpoint with fixed latency and a
concurrency cap, against the ideal rate (cap / latency); the same stage one call at a time (how
per-paper scripts run); and a bare `openai` client on the same endpoint, as the reference of what
this machine can do (it replays the stage's own requests, as the server received them).

The stage is `respond_turn` (SeCom's turn-level retrieval answering every QA probe) on a synthetic
corpus, cold cache, as one `mempipe run` on local Ray with several workers. The rate is measured at
the fake server: responses completed over the time from the first request's arrival to the last
response (ramp-up and tail included).

    python bench/throughput.py                       # 120 episodes x 30 questions, caps 32 and 64
    python bench/throughput.py --episodes 40 --caps 32
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import threading
import time
from pathlib import Path

import psutil

from harness import FakeServer, fake_sets, manifest, mempipe, table, write_results
from make_corpus import write_corpus

STAGES = "stages=[ingest,guidance,segment,compress,banks,probes,respond_turn]"


def served_rate(stats: dict, cap: int, structured: bool | None = False) -> dict:
    """Completed chat requests (plain ones: the responses; segmentation asks for JSON; None: all), their rate
    from the first arrival to the last completion, and the share of that span in which the endpoint
    held fewer than `cap` of them (served or queued): time its capacity went unused."""
    chat = [c for c in stats["chat"] if structured in (None, c["structured"]) and c["done"] is not None]
    if len(chat) < 2:
        return {"calls": len(chat), "span_s": float("nan"), "rate": float("nan"), "under_cap": float("nan"),
                "start": float("nan"), "end": float("nan")}
    start, end = min(c["t"] for c in chat), max(c["done"] for c in chat)
    events = sorted([(c["t"], 1) for c in chat] + [(c["done"], -1) for c in chat])
    held, last, under = 0, start, 0.0
    for t, step in events:
        if held < cap:
            under += t - last
        held, last = held + step, t
    return {"calls": len(chat), "span_s": end - start, "rate": len(chat) / (end - start),
            "under_cap": under / (end - start), "start": start, "end": end}


class CpuSampler:
    """Every 0.25 s: the machine's CPU busy share, and the CPU-seconds of this process and its
    descendants (the `mempipe` run, its Ray processes) other than the fake server, to tell whether
    a run was bound by the cores and what each call cost in CPU outside the endpoint. Counted per
    process, not for the whole machine: other work on a shared machine does not count, and neither
    does this sampler's own thread."""

    def __init__(self, server_pid: int | None = None) -> None:
        self.samples: list[tuple[float, float]] = []  # (time.time() at the end of the interval, busy %)
        # (time, CPU-s of each process of the tree seen so far: its last reading) per sample
        self.seconds: list[tuple[float, dict[tuple[int, float], float]]] = []
        self._server = server_pid
        self._me = psutil.Process()
        self._procs: dict[tuple[int, float], psutil.Process] = {}  # (pid, create time) -> process
        self._last: dict[tuple[int, float], float] = {}
        self._own = 0.0  # this thread's CPU-s so far
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        started = time.thread_time()
        try:
            tree = [self._me, *self._me.children(recursive=True)]
        except psutil.Error:
            tree = [self._me]
        for proc in tree:
            if proc.pid == self._server:
                continue
            try:
                key = (proc.pid, proc.create_time())
                if key not in self._procs and proc.pid != self._me.pid:
                    try:
                        if self._server in {p.pid for p in proc.parents()}:
                            continue
                    except psutil.Error:
                        continue
                self._procs.setdefault(key, proc)
                t = self._procs[key].cpu_times()
                self._last[key] = t.user + t.system - (self._own if proc.pid == self._me.pid else 0.0)
            except psutil.Error:
                continue  # gone: its last reading stays
        self.seconds.append((time.time(), dict(self._last)))
        self._own += time.thread_time() - started

    def _run(self) -> None:
        psutil.cpu_percent()
        self._sample()
        while not self._stop.wait(0.25):
            self.samples.append((time.time(), psutil.cpu_percent()))
            self._sample()

    def __enter__(self) -> "CpuSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def busy_between(self, start: float, end: float) -> float:
        inside = [busy for t, busy in self.samples if start + 0.25 <= t <= end]
        return sum(inside) / len(inside) / 100 if inside else float("nan")

    def client_cpu_s_between(self, start: float, end: float) -> float:
        """CPU-seconds this process tree (less the fake server and this sampler) spent from `start`
        to `end` (the samples around them: within 0.25 s at each end)."""
        before = [s for s in self.seconds if s[0] <= start] or self.seconds[:1]
        after = [s for s in self.seconds if s[0] >= end] or self.seconds[-1:]
        b0, b1 = before[-1][1], after[0][1]
        return sum(v - b0.get(k, 0.0) for k, v in b1.items())


def run_stage(srv: FakeServer, workdir: Path, corpus: Path, name: str, cap: int, extra: list[str],
              stage: str = "respond_turn", structured: bool | None = False) -> dict:
    sets = fake_sets(workdir, srv.base_url, corpus, run_name=name) + [
        "methods=[turn]", STAGES, "compress.method=none", "compress.granularities=[turn]",
        "banks.granularities=[turn]", "probes.next_response=false", "probes.max_qa_per_episode=null",
        # One LLM worker per core (ray.llm_task_cpus=1, the default); `cap` requests in flight at
        # the endpoint for the whole run, shared by the workers (pipeline.llm.slots).
        f"llm.max_concurrency={cap}", "ray.episodes_per_shard=4", *extra]
    srv.reset()
    with CpuSampler(srv.proc.pid) as cpu:
        wall, _ = mempipe(["run"], sets)  # one run as a user starts it
    stats = srv.stats()
    m = manifest(workdir / "artifacts" / name, stage)
    rate = served_rate(stats, cap, structured)
    busy = cpu.busy_between(rate["start"], rate["end"])
    cpu_s = cpu.client_cpu_s_between(rate["start"], rate["end"])
    return {**rate, "cpu_busy": busy, "cpu_s_per_call": cpu_s / rate["calls"] if rate["calls"] else float("nan"),
            "stage_wall_s": m["timings"]["wall_s"], "command_wall_s": wall, "max_in_flight": stats["max_in_flight"],
            "errors": m["errors"], "rows": m["rows"]}


def bare_client(base_url: str, calls: int, in_flight: int, bodies: list[dict] | None = None) -> float:
    """Requests/s of one AsyncOpenAI client in this process with `in_flight` requests at a time:
    `bodies` sent as they are (the pipeline's own requests, replayed: the same prompts to encode and
    answers to parse), or short questions."""
    from openai import AsyncOpenAI

    async def go() -> float:
        client = AsyncOpenAI(base_url=base_url, api_key="sk-bench-not-a-secret", max_retries=0)
        gate = asyncio.Semaphore(in_flight)

        async def one(i: int) -> None:
            body = bodies[i % len(bodies)] if bodies else {
                "model": "fake-model", "max_tokens": 64, "messages": [{"role": "user", "content": f"question {i}"}]}
            async with gate:
                await client.chat.completions.create(**body)

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(calls)))
        rate = calls / (time.perf_counter() - started)
        await client.close()
        return rate

    return asyncio.run(go())


def bare_run(srv: FakeServer, calls: int, cap: int, bodies: list[dict] | None = None) -> dict:
    """The bare client's rate and CPU at the cap, as the pipeline keeps it: never more in flight."""
    srv.reset()
    with CpuSampler(srv.proc.pid) as cpu:
        started = time.time()
        rate = bare_client(srv.base_url, calls, cap, bodies)
        ended = time.time()
    return {"rate": rate, "cpu_busy": cpu.busy_between(started, ended),
            "cpu_s_per_call": cpu.client_cpu_s_between(started, ended) / calls,
            "under_cap": served_rate(srv.stats(), cap)["under_cap"]}


def median_run(runs: list[dict]) -> dict:
    """The run with the median CPU per call, every run's CPU per call beside it (`cpu_s_per_call_runs`)."""
    ordered = sorted(runs, key=lambda r: r["cpu_s_per_call"])
    return {**ordered[(len(ordered) - 1) // 2], "cpu_s_per_call_runs": [r["cpu_s_per_call"] for r in runs]}


def latency_for(cap: int, base: float, max_ideal: float) -> float:
    """The endpoint's latency at `cap`: `base`, longer where cap / base would ask more requests per
    second than this machine's cores can send and serve (what is measured is the pipeline's
    concurrency, not the fake server's CPU)."""
    return max(base, cap / max_ideal)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=120)
    ap.add_argument("--questions", type=int, default=30)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--max-ideal", type=float, default=160.0,
                    help="longest ideal rate (req/s) to ask of this machine; larger caps get a longer latency")
    ap.add_argument("--caps", type=int, nargs="+", default=[32, 64, 256])
    ap.add_argument("--waves", type=int, default=28,
                    help="at least this many times cap calls per run (more episodes for a large cap), so that "
                         "the last, partial wave is a small share of the span")
    ap.add_argument("--memory-cap", type=int, default=64, help="cap of the memory_rsum run (0: none)")
    ap.add_argument("--memory-latency", type=float, default=0.5,
                    help="latency of the memory_rsum run: its per-call CPU (the method's own) binds 2 cores sooner")
    ap.add_argument("--sequential-episodes", type=int, default=2, help="episodes for the one-at-a-time run")
    ap.add_argument("--repeats", type=int, default=1,
                    help="bare client and cache-on runs per cap, alternating; each reported, the median taken "
                         "(a bare client's CPU per call varies by a third from run to run on a shared machine)")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="mempipe-throughput-"))
    results: dict[str, dict] = {}
    latency = {cap: latency_for(cap, a.latency, a.max_ideal) for cap in a.caps}
    memory_latency = a.memory_latency
    try:
        corpus = write_corpus(workdir / "corpus.jsonl", a.episodes, sessions=3, turns=8, questions=a.questions)
        episodes = {cap: max(a.episodes, -(-cap * a.waves // a.questions)) for cap in a.caps}
        for cap in a.caps:
            corpus_cap = corpus if episodes[cap] == a.episodes else write_corpus(
                workdir / f"corpus-{cap}.jsonl", episodes[cap], sessions=3, turns=8, questions=a.questions)
            with FakeServer(latency=latency[cap], max_concurrency=cap) as srv:
                bares, cached, bodies = [], [], None
                for i in range(a.repeats):  # alternating, so a busy spell of the machine falls on both
                    cached.append(run_stage(srv, workdir, corpus_cap, f"cache{cap}" + (f"-{i}" if i else ""), cap, []))
                    # The reference sends the very requests the stage sent (its prompts and parameters).
                    bodies = bodies or [c["body"] for c in srv.stats(bodies=True)["chat"] if not c["structured"]]
                    bares.append(bare_run(srv, episodes[cap] * a.questions, cap, bodies))
                results[f"bare_{cap}"], results[f"cache_{cap}"] = median_run(bares), median_run(cached)
                results[f"nocache_{cap}"] = run_stage(srv, workdir, corpus_cap, f"nocache{cap}", cap,
                                                      ["llm.cache_enabled=false"])
                if cap == a.caps[0]:
                    results["sequential"] = run_stage(srv, workdir, corpus, "sequential", cap, [
                        f"corpus.limit={a.sequential_episodes}", "ray.executor=inline", "llm.max_concurrency=1"])
        if a.memory_cap:
            cap = a.memory_cap
            # RSum's memory: each session's summary is made from the last one, so the calls of an
            # episode go one at a time and only episodes overlap (10 sessions: 10 calls each).
            sessions = write_corpus(workdir / "sessions.jsonl", a.episodes, sessions=10, turns=4, questions=1)
            with FakeServer(latency=memory_latency, max_concurrency=cap) as srv:
                results["memory_rsum"] = run_stage(
                    srv, workdir, sessions, "rsum", cap,
                    ["methods=[rsum]", "stages=[ingest,probes,memory_rsum]"],
                    stage="memory_rsum", structured=None)
    finally:
        if a.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    rows, verdicts = [], []
    seq = results["sequential"]

    def row(label: str, cap: int, r: dict, bare: dict, lat: float | None = None) -> list:
        lat = lat or latency[cap]
        ideal = cap / lat
        return [label, cap, f"{lat:g}", f"{ideal:.0f}", r["calls"], f"{r['span_s']:.1f}", f"{r['rate']:.1f}",
                f"{r['rate'] / ideal:.2f}", f"{r['rate'] / bare['rate']:.2f}", f"{r['stage_wall_s']:.1f}",
                r["max_in_flight"], f"{r['under_cap']:.0%}", f"{r['cpu_busy']:.0%}",
                f"{r['cpu_s_per_call'] * 1000:.2f}", f"{r['cpu_s_per_call'] / bare['cpu_s_per_call']:.2f}", r["errors"]]

    for cap in a.caps:
        ideal = cap / latency[cap]
        bare = results[f"bare_{cap}"]
        rows.append([f"bare `openai` client, {cap} in flight (reference)", cap, f"{latency[cap]:g}", f"{ideal:.0f}",
                     "-", "-", f"{bare['rate']:.1f}", f"{bare['rate'] / ideal:.2f}", "1.00", "-", "-",
                     f"{bare['under_cap']:.0%}", f"{bare['cpu_busy']:.0%}", f"{bare['cpu_s_per_call'] * 1000:.2f}",
                     "1.00", "-"])
        rows.append(row("pipeline, cache on (default)", cap, results[f"cache_{cap}"], bare))
        rows.append(row("pipeline, cache off", cap, results[f"nocache_{cap}"], bare))
        share = results[f"cache_{cap}"]["rate"] / ideal
        ratio = results[f"cache_{cap}"]["cpu_s_per_call"] / bare["cpu_s_per_call"]
        runs = "" if a.repeats == 1 else (
            f" (median of {a.repeats} alternating runs each; CPU ms per call, bare: "
            + ", ".join(f"{x * 1000:.2f}" for x in bare["cpu_s_per_call_runs"]) + "; pipeline: "
            + ", ".join(f"{x * 1000:.2f}" for x in results[f"cache_{cap}"]["cpu_s_per_call_runs"]) + ")")
        verdicts.append(f"cap {cap}{runs}: {share:.0%} of ideal with the cache on, "
                        + ("target met" if share >= 0.95 else f"target MISSED by {0.95 - share:.0%}")
                        + f" (the bare client on this machine: {bare['rate'] / ideal:.0%}); CPU per call "
                        f"{ratio:.2f}x the bare client's (target 1.3x: {'met' if ratio <= 1.3 else 'MISSED'})")
    if "memory_rsum" in results:
        cap = a.memory_cap
        r = results["memory_rsum"]
        bare = results.get(f"bare_{cap}") or results[f"bare_{a.caps[-1]}"]
        rows.append(row(f"`memory_rsum` over {a.episodes} episodes x 10 sessions (calls of an episode one after "
                        "another), cache on", cap, r, bare, memory_latency))
        share = r["rate"] * memory_latency / cap
        verdicts.append(f"memory_rsum at cap {cap}: {share:.0%} of ideal, "
                        + ("target met" if share >= 0.95 else f"target MISSED by {0.95 - share:.0%}"))
    rows.append(row("one call at a time (inline, concurrency 1)", a.caps[0], seq, results[f"bare_{a.caps[0]}"]))
    met = all(results[f"cache_{cap}"]["rate"] >= 0.95 * cap / latency[cap] for cap in a.caps)
    body = (f"Stage `respond_turn` over synthetic episodes of {a.questions} questions (chat calls column: "
            f"{a.episodes} episodes, more where {a.waves} x cap calls need them), cold cache; endpoint latency as "
            f"listed (longer for caps whose ideal would pass {a.max_ideal:g} req/s: past that the 2 cores that send "
            "and serve the requests, not the pipeline's concurrency, set the rate) and at most `cap` requests "
            "served at once (more wait in its queue): ideal = cap / latency. Rate = responses completed / (last "
            "completion - first arrival). Endpoint under cap: share of that span in which the endpoint held fewer "
            "than `cap` requests (served or queued), i.e. capacity the client left unused. CPU busy: the whole "
            "machine's (fake server, driver, Ray and its workers), averaged over that span; near 100% the run "
            "is bound by the cores, not by the pipeline's concurrency. CPU ms per call: CPU-seconds (user + system) "
            "of the benchmark's process tree less the fake server over that span, per completed call (for the "
            "pipeline: the `mempipe` driver, Ray and its workers; for the bare client: the benchmark's process, "
            "less its CPU sampler); other work on a shared machine is not counted. The bare client sends the "
            "stage's own requests, as the fake server received them in the cache-on run before it (same prompts "
            "to encode, same parameters, same answers to parse).\n\n"
            + "Settings: `llm.max_concurrency` = cap for the whole run (the workers share it), `ray.episodes_per_shard=4`, defaults otherwise "
            "(one LLM worker per core, `ray.llm_shards_per_worker` shards at once on each).\n\n"
            + table(["run", "cap", "latency s", "ideal req/s", "chat calls", "span s", "requests/s", "share of ideal",
                     "share of bare client", "stage wall s", "max in flight", "endpoint under cap", "CPU busy",
                     "CPU ms per call", "CPU per call vs bare", "failed rows"], rows)
            + f"\n\nSpeed-up over one call at a time (cap {a.caps[0]}): "
            f"{results[f'cache_{a.caps[0]}']['rate'] / seq['rate']:.1f}x. Targets (>= 95% of ideal, CPU per call "
            "<= 1.3x the bare client's): " + "; ".join(verdicts) + ".")
    write_results("throughput", "Throughput against the ideal rate", body,
                  {"results": results, "target_met": met, "latency": latency, "episodes": episodes,
                   "memory_latency": memory_latency,
                   "args": vars(a)})
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
