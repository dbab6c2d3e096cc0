"""Benchmark: scale to thousands of episodes.

For each corpus size (synthetic, written by `make_corpus.py` into a temporary folder, never
committed):
1. the pipeline's LLM-free stages, `ingest` and `probes`, as `mempipe run` on local Ray:
   wall time, episodes/s, peak memory of the driver and of the Ray workers (sampled with psutil),
   and how many upstream part files a shard opens;
2. the memory algorithms on every episode with an in-process fake LLM (no server, no Ray):
   Theanine's memory graph (Algorithm 1: summaries, associative memories, relation labels,
   linking) and its timeline retrieval (Algorithm 2), and turn-level BM25 retrieval over the
   episode's exchanges for every question: episodes/s.

Targets: time grows linearly with episodes (seconds per episode at the largest size within 1.5x
of the smallest), the driver's peak memory stays flat (largest within 1.5x of smallest).

    python bench/scale.py                            # 1k, 5k and 10k episodes
    python bench/scale.py --sizes 200 1000
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import psutil

from harness import EXIT_ROWS_FAILED, ROOT, mempipe_cmd, table, write_results
from make_corpus import write_corpus

sys.path.insert(0, str(ROOT))

from pipeline.artifacts import StageDir  # noqa: E402
from pipeline.llm.types import LLMResult  # noqa: E402
from stages.dialogue import sessions_of  # noqa: E402
from stages.methods.base import EpisodeInput, MethodContext, ProbeInput, visible_memory  # noqa: E402
from stages.methods.secom.retrieval import TurnLevel  # noqa: E402
from stages.methods.theanine import Theanine  # noqa: E402
from stages.methods.secom.units import build_units  # noqa: E402

SAMPLE_S = 0.2  # memory sampling period


# ---------------------------------------------------------------- 1. the pipeline's LLM-free stages

def tree_memory(proc: psutil.Process) -> tuple[int, int, int]:
    """(driver RSS, largest Ray worker RSS, all Ray workers' RSS) in bytes."""
    driver = proc.memory_info().rss
    workers = []
    for child in proc.children(recursive=True):
        try:
            if child.name().startswith("ray::") or "default_worker.py" in " ".join(child.cmdline()):
                workers.append(child.memory_info().rss)
        except psutil.Error:
            continue
    return driver, max(workers, default=0), sum(workers)


def watch_peaks(proc: psutil.Popen, each_sample: Callable[[], None] = lambda: None) -> list[int]:
    """Until `proc` exits, every SAMPLE_S: the peak memory of its driver, its largest worker and all
    its workers (`tree_memory`), and whatever else a benchmark samples (`each_sample`)."""
    peak = [0, 0, 0]
    while proc.poll() is None:
        try:
            peak = [max(a, b) for a, b in zip(peak, tree_memory(proc))]
        except psutil.Error:
            pass
        each_sample()
        time.sleep(SAMPLE_S)
    return peak


def run_pipeline(corpus: Path, workdir: Path, episodes_per_shard: int) -> dict[str, Any]:
    cmd = mempipe_cmd(["run"], [f"artifacts_dir={workdir / 'artifacts'}", "run_name=scale", "corpus.format=sample",
                                f"corpus.path={corpus}", "corpus.limit=null", "methods=[]", "stages=[ingest,probes]",
                                "teabag.enabled=false", f"ray.episodes_per_shard={episodes_per_shard}"])
    started = time.perf_counter()
    proc = psutil.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = watch_peaks(proc)
    wall = time.perf_counter() - started
    if proc.returncode not in (0, EXIT_ROWS_FAILED):
        raise RuntimeError(f"mempipe failed: {proc.stderr.read()[-2000:]}")  # type: ignore[union-attr]
    run_dir = workdir / "artifacts" / "scale"
    stages = {s: json.loads((run_dir / s / "_manifest.json").read_text()) for s in ("ingest", "probes")}
    layout = stages["ingest"].get("parts") or {}
    return {"wall_s": wall, "driver_peak_mb": peak[0] / 2**20, "worker_peak_mb": peak[1] / 2**20,
            "workers_total_peak_mb": peak[2] / 2**20,
            "stage_s": {s: m["timings"]["wall_s"] for s, m in stages.items()},
            "probes": stages["probes"]["rows"], "shards": stages["probes"]["shards"],
            "ingest_parts": len(layout), "parts_read_per_shard": 1 if layout else len(layout)}


# ---------------------------------------------------------------- 2. the algorithms, fake LLM

class InstantLLM:
    """A fake ChatLLM answering at once: a few memories per session summary, a relation label from a
    hash of the pair, a short rationale and response; enough for the algorithms to do all their work."""

    def __init__(self) -> None:
        self.calls = 0

    async def chat(self, messages: list[dict], *, schema: Any = None, validate: Any = None, sample: int = 0,
                   **params: Any) -> LLMResult:
        self.calls += 1
        text = messages[-1]["content"]
        digest = int(hashlib.sha1(text.encode()).hexdigest()[:8], 16)
        name = getattr(schema, "__name__", "")
        if name == "SessionMemories":
            words = text.split()[-60:]
            value: dict[str, Any] = {"memories": [" ".join(words[i:i + 8]) for i in range(0, 24, 8)]}
        elif name == "RelationLabel":
            value = {"relation": ("SameTopic", "Changed", "Cause", "None")[digest % 4]}
        elif name == "Refined":
            value = {"information": text[-120:]}
        elif name == "ReasonedResponse":
            value = {"rationale": "from the timeline", "response": "Sounds good."}
        elif schema is None:
            return LLMResult(text="A fake answer.", model="instant")
        else:
            raise ValueError(f"InstantLLM has no answer for schema {name}")
        parsed = schema.model_validate(value) if schema is not None else None
        return LLMResult(text=json.dumps(value), parsed=parsed, model="instant")


async def hashed_embed(texts: list[str], dim: int = 64) -> np.ndarray:
    """Bag-of-words vectors from hashed words: similar texts get similar vectors, at no model cost."""
    out = np.zeros((len(texts), dim), dtype=np.float32)
    for i, t in enumerate(texts):
        for w in t.lower().split():
            out[i, int(hashlib.md5(w.encode()).hexdigest()[:6], 16) % dim] += 1.0
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.where(norms == 0, 1, norms)


async def algorithms_on(records: list[dict[str, Any]]) -> dict[str, float]:
    """Theanine build + one timeline response per episode, and turn-level BM25 for every question."""
    theanine, turn = Theanine(), TurnLevel()
    t_settings, r_settings = Theanine.Settings(), TurnLevel.Settings()
    llm = InstantLLM()
    t_ctx = MethodContext(settings=t_settings, llm=llm, embed=hashed_embed)
    r_ctx = MethodContext(settings=r_settings, llm=llm)  # BM25: no embedder
    graph_s = retrieval_s = 0.0
    edges = questions = 0
    for rec in records:
        episode, sessions = rec["episode"], sessions_of(rec["turns"])
        started = time.perf_counter()
        memory = await theanine.build(t_ctx, EpisodeInput(episode=episode, sessions=sessions))
        edges += len(memory["edges"])
        last = max(sessions)
        probe = {"probe_id": "p", "kind": "next_response", "session_idx": last, "turn_idx": 2,
                 "request": sessions[last][1]["text"], "respondent": episode["speakers"][0],
                 "episode_id": episode["episode_id"]}
        seen = {t: visible_memory(rows, last, 2, theanine.memory_kind) for t, rows in memory.items()}
        await theanine.answer(t_ctx, ProbeInput(probe=probe, episode=episode, history={}, current=sessions[last][:2]),
                              seen)
        graph_s += time.perf_counter() - started
        started = time.perf_counter()
        bank = build_units(sessions, [], "turn")
        for q in rec["qa"]:
            questions += 1
            qprobe = {"probe_id": q["qa_id"], "kind": "qa", "session_idx": last + 1, "turn_idx": None,
                      "request": q["question"], "episode_id": episode["episode_id"]}
            await turn.rank(r_ctx, ProbeInput(probe=qprobe, episode=episode, history=sessions, current=[],
                                              upstream={"banks.memory_units": bank}))
        retrieval_s += time.perf_counter() - started
    n = len(records)
    return {"episodes": n, "graph_s": graph_s, "graph_eps": n / graph_s, "edges": edges, "llm_calls": llm.calls,
            "retrieval_s": retrieval_s, "questions": questions, "retrieval_eps": n / retrieval_s}


def load_records(run_dir: Path) -> list[dict[str, Any]]:
    """The ingested corpus as canonical rows, episode by episode (what a shard hands a method)."""
    ingest = StageDir(run_dir, "ingest")
    turns: dict[str, list[dict]] = {}
    for t in ingest.read_table("turns").to_pylist():
        turns.setdefault(t["episode_id"], []).append(t)
    qa: dict[str, list[dict]] = {}
    for q in ingest.read_table("qa").to_pylist():
        qa.setdefault(q["episode_id"], []).append(q)
    return [{"episode": e, "turns": turns.get(e["episode_id"], []), "qa": qa.get(e["episode_id"], [])}
            for e in ingest.read_table("episodes").to_pylist()]


# ---------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 10000])
    ap.add_argument("--sessions", type=int, default=5)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--episodes-per-shard", type=int, default=16)
    a = ap.parse_args()
    results = []
    for n in a.sizes:
        workdir = Path(tempfile.mkdtemp(prefix=f"mempipe-scale-{n}-"))
        try:
            corpus = write_corpus(workdir / "corpus.jsonl", n, a.sessions, a.turns, a.questions)
            pipe = run_pipeline(corpus, workdir, a.episodes_per_shard)
            algo = asyncio.run(algorithms_on(load_records(workdir / "artifacts" / "scale")))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        results.append({"episodes": n, "pipeline": pipe, "algorithms": algo})
        print(f"{n} episodes: pipeline {pipe['wall_s']:.1f} s, algorithms {algo['graph_s'] + algo['retrieval_s']:.1f} s",
              flush=True)
    rows = []
    for r in results:
        p, g = r["pipeline"], r["algorithms"]
        rows.append([r["episodes"], f"{p['wall_s']:.1f}", f"{p['stage_s']['ingest']:.1f}", f"{p['stage_s']['probes']:.1f}",
                     f"{r['episodes'] / p['wall_s']:.0f}", f"{p['driver_peak_mb']:.0f}", f"{p['worker_peak_mb']:.0f}",
                     f"{p['workers_total_peak_mb']:.0f}", p["shards"], f"{g['graph_eps']:.0f}", g["edges"],
                     f"{g['retrieval_eps']:.0f}"])
    first, last = results[0], results[-1]
    # The run's time has a fixed part (Ray start, planning); growth is judged on the marginal cost of
    # each added episode between consecutive sizes. The algorithms have no fixed part.
    marginal = [(b["pipeline"]["wall_s"] - a_["pipeline"]["wall_s"]) / (b["episodes"] - a_["episodes"])
                for a_, b in zip(results, results[1:])]
    algo_per_ep = [(r["algorithms"]["graph_s"] + r["algorithms"]["retrieval_s"]) / r["episodes"] for r in (first, last)]
    linear = (len(marginal) < 2 or marginal[-1] <= 1.5 * max(marginal[0], 1e-9)) and algo_per_ep[1] <= 1.5 * algo_per_ep[0]
    flat = last["pipeline"]["driver_peak_mb"] <= 1.5 * first["pipeline"]["driver_peak_mb"]
    body = (f"Synthetic episodes of {a.sessions} sessions x {a.turns} turns and {a.questions} questions; "
            f"`mempipe run` of ingest and probes on local Ray ({a.episodes_per_shard} episodes per shard; every "
            "shard reads only the upstream part holding its episodes), then the algorithms in one process with a "
            "fake LLM that answers at once.\n\n"
            + table(["episodes", "run wall s", "ingest s", "probes s", "episodes/s (run)", "driver peak MB",
                     "largest worker peak MB", "all workers peak MB", "probe shards", "Theanine build+answer eps/s",
                     "graph edges", "BM25 turn retrieval eps/s"], rows)
            + "\n\nMarginal run time per added episode between consecutive sizes: "
            + ", ".join(f"{m * 1000:.1f} ms" for m in marginal)
            + f"; algorithms per episode: {algo_per_ep[0] * 1000:.1f} ms at {first['episodes']} -> "
            f"{algo_per_ep[1] * 1000:.1f} ms at {last['episodes']}. Target (linear: the last marginal cost and the "
            f"algorithms' cost per episode at most 1.5x the first): {'met' if linear else 'MISSED'}. Driver peak "
            f"{first['pipeline']['driver_peak_mb']:.0f} MB -> {last['pipeline']['driver_peak_mb']:.0f} MB; target "
            f"(flat: at most 1.5x): {'met' if flat else 'MISSED'}.")
    write_results("scale", "Scale to thousands of episodes", body,
                  {"results": results, "linear": linear, "flat_driver_memory": flat, "args": vars(a)})
    return 0 if linear and flat else 1


if __name__ == "__main__":
    raise SystemExit(main())
