"""Benchmark: the `banks` stage (embedding every memory unit) on a LoCoMo-sized corpus: without
the vector cache, with it cold, and warm (another run on the same cache, as a rerun whose upstream
settings changed); against the code before the change, with retrieval recall@5 of each.

A synthetic corpus the size of LoCoMo's units (4,857 turn, session and segment units): 19
conversations x 20 sessions of 12 exchanges, 4,940 exchange ("turn") and session units. Each configuration is one `mempipe run` on local Ray (2 workers); the stage's
wall time is its manifest's. `--baseline-checkout DIR` runs the same stages with another
checkout's code (e.g. a worktree of the commit before the change) as "before". Recall@5: every
question's evidence turn among the 5 turn units nearest to it, with the vectors the run stored.

    python bench/embeddings.py
    git worktree add --detach /tmp/mempipe-before <commit>
    python bench/embeddings.py --baseline-checkout /tmp/mempipe-before
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from harness import KEY_ENV, ROOT, FakeServer, fake_sets, manifest, table, write_results
from make_corpus import write_corpus

STAGES = "stages=[ingest,guidance,segment,compress,banks]"


def run_banks(srv: FakeServer, workdir: Path, corpus: Path, name: str, extra: list[str],
              checkout: Path = ROOT) -> dict:
    sets = fake_sets(workdir, srv.base_url, corpus, run_name=name) + [
        STAGES, "compress.method=none", "compress.granularities=[turn,session]",
        "banks.granularities=[turn,session]", f"embedding.cache_dir={ROOT / '.cache' / 'models'}", *extra]
    cmd = [sys.executable, "-m", "stages.cli", "run", "-c", str(checkout / "configs" / "default.yaml")]
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, KEY_ENV: "sk-bench-not-a-secret", "PYTHONPATH": str(checkout)}
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
    m = manifest(workdir / "artifacts" / name, "banks")
    return {"wall_s": m["timings"]["wall_s"], "units": m["tables"]["memory_units"], "errors": m["errors"]}


def recall_at_5(run_dir: Path) -> tuple[float, np.ndarray]:
    """Mean recall@5 of the questions' evidence over the run's turn units (its stored vectors, the
    questions embedded by the packaged model), and the stored vectors in unit order."""
    from pipeline.config import EmbeddingConfig
    from pipeline.embeddings import LocalEmbedder
    from stages.metrics.retrieval import recall_at_k

    units = sorted(pq.read_table(run_dir / "banks" / "memory_units").to_pylist(), key=lambda u: (u["episode_id"], u["unit_id"]))
    qa = pq.read_table(run_dir / "ingest" / "qa").to_pylist()
    embedder = LocalEmbedder(EmbeddingConfig(cache_dir=str(ROOT / ".cache" / "models")))
    by_episode: dict[str, list[dict]] = {}
    for u in units:
        if u["granularity"] == "turn":
            by_episode.setdefault(u["episode_id"], []).append(u)
    asked = [q for q in qa if q["evidence"] and q["episode_id"] in by_episode]
    qvecs = embedder.encode([q["question"] for q in asked])
    scores = []
    for q, qv in zip(asked, qvecs):
        pool = by_episode[q["episode_id"]]
        vectors = np.asarray([u["vector"] for u in pool], dtype=np.float32)
        order = np.argsort(-(vectors @ qv), kind="stable")[:5]
        scores.append(recall_at_k([pool[i]["source_turn_ids"] for i in order], q["evidence"], 5))
    stored = np.asarray([u["vector"] + u["text_vector"] for u in units], dtype=np.float32)
    return (float(np.mean(scores)) if scores else float("nan")), stored


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=19)
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--turns", type=int, default=24)
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--baseline-checkout", type=Path, default=None)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="mempipe-embeddings-"))
    results: dict[str, dict] = {}
    vectors = ["embedding.vector_cache_dir=" + str(workdir / "vectors")]
    runs = [("now, vector cache off", "nocache", ["embedding.vector_cache_dir=null"]),
            ("now, vector cache cold", "cold", vectors),
            # A new run name on the same cache: what a rerun pays whose upstream settings changed.
            ("now, vector cache warm (another run)", "warm", vectors)]
    try:
        corpus = write_corpus(workdir / "corpus.jsonl", a.episodes, sessions=a.sessions, turns=a.turns,
                              questions=a.questions)
        with FakeServer() as srv:
            if a.baseline_checkout:
                results["before"] = {"label": "before (--baseline-checkout)",
                                     **run_banks(srv, workdir, corpus, "before", [], a.baseline_checkout)}
            for label, name, extra in runs:
                results[name] = {"label": label, **run_banks(srv, workdir, corpus, name, extra)}
        stored = {}
        for name in results:
            results[name]["recall_at_5"], stored[name] = recall_at_5(workdir / "artifacts" / name)
        first = stored["nocache"]
        same = {name: float(np.abs(v - first).max()) for name, v in stored.items()}
    finally:
        if a.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    reference = results.get("before", results["nocache"])["wall_s"]
    rows = [[r["label"], r["units"], f"{r['wall_s']:.1f}", f"{reference / r['wall_s']:.1f}x", f"{r['recall_at_5']:.3f}",
             f"{same[name]:.1e}", r["errors"]] for name, r in results.items()]
    cold = reference / results["cold"]["wall_s"]
    warm = reference / results["warm"]["wall_s"]
    drop = max(results["before" if "before" in results else "nocache"]["recall_at_5"] - r["recall_at_5"]
               for r in results.values())
    body = (f"`banks` over a synthetic LoCoMo-sized corpus ({a.episodes} conversations x {a.sessions} sessions x "
            f"{a.turns} turns; turn and session units, no compression) on local Ray, 2 workers; wall time of the "
            "stage from its manifest. Speed-up against "
            + ("the checkout before this change" if "before" in results else "the run without the vector cache")
            + "; largest |difference| of the stored vectors from those of the run without the cache.\n\n"
            + table(["run", "units", "banks wall s", "speed-up", "recall@5", "vectors vs no cache", "failed rows"], rows)
            + f"\n\nTargets: banks at least 5x faster: cold {cold:.1f}x ({'met' if cold >= 5 else 'MISSED'}), "
            f"warm {warm:.1f}x ({'met' if warm >= 5 else 'MISSED'}); recall@5 within 0.01: largest drop "
            f"{drop:+.3f} ({'met' if drop <= 0.01 else 'MISSED'}).")
    write_results("embeddings", "Embeddings: banks on a LoCoMo-sized corpus", body,
                  {"results": results, "max_vector_difference": same, "args": vars(a)})
    return 0 if cold >= 5 and drop <= 0.01 else 1


if __name__ == "__main__":
    sys.exit(main())
