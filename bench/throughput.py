"""Benchmark: LLM throughput of a real stage against an endpoint with fixed latency and a
concurrency cap, against the ideal rate (cap / latency), and the same stage one call at a time
(how per-paper scripts run).

The stage is `respond_turn` (SeCom's turn-level retrieval answering every QA probe) on a synthetic
corpus, cold cache, on local Ray with several workers. The rate is measured where the requests
arrive (the fake server's clock), from the first to the last chat request of the stage.

    python bench/throughput.py                       # 120 episodes x 30 questions = 3600 calls
    python bench/throughput.py --episodes 40 --latency 0.2 --cap 32
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from harness import FakeServer, fake_sets, manifest, mempipe, table, write_results
from make_corpus import write_corpus

STAGES = "stages=[ingest,guidance,segment,compress,banks,probes,respond_turn]"


def run_stage(srv: FakeServer, workdir: Path, corpus: Path, name: str, extra: list[str]) -> dict:
    sets = fake_sets(workdir, srv.base_url, corpus, run_name=name) + [
        "methods=[turn]", STAGES, "compress.method=none", "compress.granularities=[turn]",
        "banks.granularities=[turn]", "probes.next_response=false", "probes.max_qa_per_episode=null",
        # what a run against a real endpoint uses (default.yaml is sized for the embedded model)
        "llm.max_concurrency=8", "ray.episodes_per_shard=4", *extra]
    srv.reset()
    wall, _ = mempipe(["run"], sets)  # one run as a user starts it; workers are warm by the respond stage
    stats = srv.stats()
    times = sorted(stats["plain_chat_times"])  # the responses: segmentation asks for JSON, they do not
    span = times[-1] - times[0] if len(times) > 1 else float("nan")
    m = manifest(workdir / "artifacts" / name, "respond_turn")
    return {"calls": len(times), "span_s": span, "rate": (len(times) - 1) / span if span else float("nan"),
            "stage_wall_s": m["timings"]["wall_s"], "command_wall_s": wall, "max_in_flight": stats["max_in_flight"],
            "errors": m["errors"], "rows": m["rows"], "stage_rate": len(times) / m["timings"]["wall_s"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=120)
    ap.add_argument("--questions", type=int, default=30)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--cap", type=int, default=32)
    ap.add_argument("--sequential-episodes", type=int, default=2, help="episodes for the one-at-a-time run")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    ideal = a.cap / a.latency
    workdir = Path(tempfile.mkdtemp(prefix="mempipe-throughput-"))
    try:
        corpus = write_corpus(workdir / "corpus.jsonl", a.episodes, sessions=3, turns=8, questions=a.questions)
        with FakeServer(latency=a.latency, max_concurrency=a.cap) as srv:
            concurrent = run_stage(srv, workdir, corpus, "concurrent", [])
            no_cache = run_stage(srv, workdir, corpus, "nocache", ["llm.cache_enabled=false"])
            sequential = run_stage(srv, workdir, corpus, "sequential", [
                f"corpus.limit={a.sequential_episodes}", "ray.executor=inline", "llm.max_concurrency=1"])
    finally:
        if a.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    rows = []
    for label, r in (("pipeline, cache on (default)", concurrent), ("pipeline, cache off", no_cache),
                     ("one call at a time", sequential)):
        rows.append([label, r["calls"], f"{r['span_s']:.1f}", f"{r['rate']:.1f}", f"{r['rate'] / ideal:.2f}",
                     f"{r['stage_wall_s']:.1f}", f"{r['stage_rate']:.1f}", r["max_in_flight"], r["errors"]])
    target = concurrent["rate"] >= 0.9 * ideal
    body = (f"Stage `respond_turn` over {a.episodes} synthetic episodes x {a.questions} questions; endpoint latency "
            f"{a.latency} s, at most {a.cap} requests served at once: ideal {ideal:.0f} requests/s.\n\n"
            + table(["run", "chat calls", "span s", "requests/s (first to last)", "share of ideal", "stage wall s",
                     "calls / stage wall", "max in flight", "failed rows"], rows)
            + f"\n\nSpeed-up over one call at a time: {concurrent['rate'] / sequential['rate']:.1f}x. "
            f"Target (>= 90% of ideal): {'met' if target else 'MISSED by ' + format(0.9 - concurrent['rate'] / ideal, '.0%')}.")
    write_results("throughput", "Throughput against the ideal rate", body,
                  {"ideal": ideal, "concurrent": concurrent, "no_cache": no_cache, "sequential": sequential,
                   "target_met": target, "args": vars(a)})
    return 0 if target else 1


if __name__ == "__main__":
    raise SystemExit(main())
