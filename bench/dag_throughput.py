"""Benchmark: the whole run's request rate with its stages run as a DAG, against the same run one
stage at a time and against a bare `openai` client holding the same cap.

The run is the default job's six methods (secom, theanine, rsum, ld_agent, creem, full_history) with
their default-job settings, its metrics and judges, over synthetic LoCoMo-sized conversations,
against the fake server at a fixed latency with `llm.max_concurrency` C (ideal rate: C / latency).
The rate is measured at the server: chat requests completed over the span from the first arrival
to the last completion, the whole run's tails included. LLMLingua is off (`compress.method=none`):
its minutes of CPU would measure the compressor, not the run's use of the endpoint.

    python bench/dag_throughput.py                          # 10 conversations, C = 64, 0.4 s
    python bench/dag_throughput.py --episodes 4 --sessions 10 --turns 16
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from harness import KEY_ENV, FakeServer, mempipe, table, write_results
from make_corpus import write_corpus
from throughput import CpuSampler, bare_client, served_rate

METHODS = "methods=[secom,theanine,rsum,ld_agent,creem,full_history]"


def run(srv: FakeServer, workdir: Path, corpus: Path, name: str, cap: int, parallel: bool) -> dict:
    """One whole run (every stage, a fresh cache) and what the server saw of it."""
    sets = [f"run_name={name}", f"artifacts_dir={workdir / 'artifacts'}", "corpus.format=sample",
            f"corpus.path={corpus}", "corpus.limit=null", "llm.provider=openai", f"llm.base_url={srv.base_url}",
            "llm.model=fake-model", f"llm.api_key_env={KEY_ENV}", f"llm.cache_dir={workdir / ('cache-' + name)}",
            "roles={}", METHODS, "teabag.enabled=false", "compress.method=none", f"llm.max_concurrency={cap}",
            f"ray.parallel_stages={str(parallel).lower()}", "ray.episodes_per_shard=1"]
    srv.reset()
    with CpuSampler(srv.proc.pid) as cpu:
        wall, rc = mempipe(["run"], sets)
    stats = srv.stats()
    rate = served_rate(stats, cap, structured=None)
    # What the cores allowed: the run's own CPU-seconds over the span (its methods, embeddings, spaCy,
    # tables, Ray, imports: not only its calls) spread over every core is the shortest span possible.
    cpu_s = cpu.client_cpu_s_between(rate["start"], rate["end"])
    return {**rate, "command_wall_s": wall, "rc": rc, "max_in_flight": stats["max_in_flight"],
            "cpu_busy": cpu.busy_between(rate["start"], rate["end"]), "run_cpu_s": cpu_s,
            "cpu_floor_s": cpu_s / (len(os.sched_getaffinity(0)))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--sessions", type=int, default=19)  # LoCoMo: 19.3 sessions, ~300 turns a conversation
    ap.add_argument("--turns", type=int, default=16)
    ap.add_argument("--cap", type=int, default=64)
    ap.add_argument("--latency", type=float, default=0.4)
    a = ap.parse_args()
    ideal = a.cap / a.latency
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-dag-") as tmp:
        work = Path(tmp)
        corpus = write_corpus(work / "corpus.jsonl", a.episodes, a.sessions, a.turns, questions=4)
        with FakeServer(latency=a.latency, max_concurrency=a.cap) as srv:
            results["bare"] = {"rate": bare_client(srv.base_url, 3000, a.cap)}
            results["one_at_a_time"] = run(srv, work, corpus, "seq", a.cap, parallel=False)
            results["dag"] = run(srv, work, corpus, "dag", a.cap, parallel=True)
    bare = results["bare"]["rate"]
    rows = [["bare openai client", f"{bare:.1f}", f"{bare / ideal:.2f}", "1.00", "", "", "", "", "", "", ""]]
    for key, label in (("one_at_a_time", "run, one stage at a time (before)"), ("dag", "run as a DAG")):
        r = results[key]
        rows.append([label, f"{r['rate']:.1f}", f"{r['rate'] / ideal:.2f}", f"{r['rate'] / bare:.2f}",
                     r["calls"], f"{r['command_wall_s']:.0f}", f"{r['span_s']:.1f}", r["max_in_flight"],
                     f"{r['cpu_busy']:.0%}", f"{r['run_cpu_s']:.0f}", f"{r['cpu_floor_s']:.1f}"])
    dag = results["dag"]
    bound = min(bare, dag["calls"] / dag["cpu_floor_s"])
    body = (f"{a.episodes} synthetic conversations of {a.sessions} sessions x {a.turns} turns; the default job's "
            f"six methods, metrics and judges; fake server at C = {a.cap}, {a.latency} s (ideal {ideal:.0f} "
            "requests/s); LLMLingua off.\n\n"
            + table(["what", "requests/s", "of ideal", "of bare client", "requests", "wall s", "span s", "max in flight",
                     "machine CPU busy", "run CPU-s in span", "span the cores allow s"], rows)
            + f"\n\nThe run's own CPU in the DAG's span ({dag['run_cpu_s']:.0f} CPU-s: methods, embeddings, spaCy, "
            f"tables, Ray, imports, calls) needs {dag['cpu_floor_s']:.1f} s of this machine's {len(os.sched_getaffinity(0))} cores; "
            f"with the bare client's rate that bounds the whole run at {bound:.1f} requests/s, "
            f"{bound / bare:.2f} of the bare client. Target 0.9 of the bare client: "
            f"{'met' if dag['rate'] >= 0.9 * bare else 'MISSED'} ({dag['rate'] / bare:.2f}).")
    write_results("dag_throughput", "The run as one DAG: whole-run request rate", body,
                  {"args": vars(a), "ideal": ideal, **results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
