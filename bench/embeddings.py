"""Benchmark: the `banks` stage (embedding every memory unit) on a LoCoMo-sized corpus: without
the vector cache, with it cold, and warm (another run on the same cache, as a rerun whose upstream
settings changed); against the code before the change, with retrieval recall@5 of each (part
`local`). Part `api`: the same stage with `embedding.provider: openai` against the fake
OpenAI-compatible server with a fixed latency and concurrency cap, its embedding throughput against
the endpoint's ideal (cap / latency requests per second, each carrying a full batch of texts).

A synthetic corpus the size of LoCoMo's units (4,857 turn, session and segment units): 19
conversations x 20 sessions of 12 exchanges, 4,940 exchange ("turn") and session units. Each configuration is one `mempipe run` on local Ray (2 workers); the stage's
wall time is its manifest's. `--baseline-checkout DIR` runs the same stages with another
checkout's code (e.g. a worktree of the commit before the change) as "before". Recall@5: every
question's evidence turn among the 5 turn units nearest to it, with the vectors the run stored.

    python bench/embeddings.py
    git worktree add --detach /tmp/mempipe-before <commit>
    python bench/embeddings.py --baseline-checkout /tmp/mempipe-before
    python bench/embeddings.py --part api     # the local part's table is kept from the last run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from harness import EXIT_ROWS_FAILED, KEY_ENV, RESULTS, ROOT, FakeServer, fake_sets, manifest, mempipe, table, write_results
from make_corpus import WORDS, write_corpus

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
    if proc.returncode not in (0, EXIT_ROWS_FAILED):
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


def local_part(a: argparse.Namespace) -> dict:
    """The packaged MiniLM: before / no cache / cold / warm, with recall@5."""
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
    cold = reference / results["cold"]["wall_s"]
    drop = max(results["before" if "before" in results else "nocache"]["recall_at_5"] - r["recall_at_5"]
               for r in results.values())
    return {"results": results, "max_vector_difference": same, "reference_wall_s": reference,
            "cold_speedup": cold, "warm_speedup": reference / results["warm"]["wall_s"], "recall_drop": drop,
            "met": cold >= 5 and drop <= 0.01,
            "args": {k: getattr(a, k) for k in ("episodes", "sessions", "turns", "questions")},
            "baseline": "before" in results}


# A record of the checks behind the cold figure (not measured by this script): why the 5x cold target
# is out of reach on 2 cores with the packaged model, and which faster CPU paths were tried.
COLD_PATH_CHECKS = """Why the cold target is missed (checks of 2026-11-25/26): cold `banks` embeds every distinct text
once with MiniLM, about 180 short texts/s per core on this CPU, so 4,940 texts take tens of seconds of
model time on 2 cores whatever the pipeline does; 5x would need the model itself ~3x faster at unchanged
recall. Tried: torch dynamic int8 (1.26x, vectors at cosine 0.92-0.96 to float32, API deprecated: not
adopted); ONNX Runtime int8 (1.7x on encoding, cosine >= 0.98), but sentence-transformers' ONNX backend
needs `optimum-onnx`, whose latest release (0.1.0) requires `transformers<4.58` beside our 5.x; `fastembed`
0.9.1 installs (onnxruntime, tokenizers, no transformers) but only runs ONNX files it downloads from the
Hugging Face hub (unreachable here) or an export we would make ourselves, i.e. the same ONNX Runtime
path at ~1.7x: not enough for 5x, and not adopted."""


def local_body(part: dict) -> str:
    results, same, a = part["results"], part["max_vector_difference"], part["args"]
    reference = part["reference_wall_s"]
    rows = [[r["label"], r["units"], f"{r['wall_s']:.1f}", f"{reference / r['wall_s']:.1f}x", f"{r['recall_at_5']:.3f}",
             f"{same[name]:.1e}", r["errors"]] for name, r in results.items()]
    cold, warm, drop = part["cold_speedup"], part["warm_speedup"], part["recall_drop"]
    return (f"`banks` over a synthetic LoCoMo-sized corpus ({a['episodes']} conversations x {a['sessions']} sessions x "
            f"{a['turns']} turns; turn and session units, no compression) on local Ray, 2 workers; wall time of the "
            "stage from its manifest. Speed-up against "
            + ("the checkout before this change" if part["baseline"] else "the run without the vector cache")
            + "; largest |difference| of the stored vectors from those of the run without the cache.\n\n"
            + table(["run", "units", "banks wall s", "speed-up", "recall@5", "vectors vs no cache", "failed rows"], rows)
            + f"\n\nTargets: banks at least 5x faster: cold {cold:.1f}x ({'met' if cold >= 5 else 'MISSED'}), "
            f"warm {warm:.1f}x ({'met' if warm >= 5 else 'MISSED'}); recall@5 within 0.01: largest drop "
            f"{drop:+.3f} ({'met' if drop <= 0.01 else 'MISSED'}).\n\n"
            + (COLD_PATH_CHECKS.replace("\n", " ") if part["cold_speedup"] < 5 else ""))


def served_embeddings(stats: dict) -> dict:
    """Embedding requests answered (200s), the texts they carried, and the span from the first
    arrival to the last completion."""
    done = [e for e in stats["embeddings"] if e["done"] is not None and e["outcome"] is None]
    if not done:
        return {"requests": 0, "texts": 0, "span_s": float("nan")}
    start, end = min(e["t"] for e in done), max(e["done"] for e in done)
    arrivals = sorted(e["t"] - start for e in done)
    return {"requests": len(done), "texts": sum(e["inputs"] for e in done), "span_s": end - start,
            # When the requests came, from the first: a late tail means the client, not the endpoint, set the pace.
            "arrival_s": {str(q): round(arrivals[int(q * (len(arrivals) - 1))], 3) for q in (0.5, 0.9, 1.0)},
            # Requests at the endpoint on average (served or queued): at most cap are served at once.
            "mean_at_endpoint": sum(e["done"] - e["t"] for e in done) / (end - start)}


def client_run(base_url: str, workdir: Path, cap: int, episodes: int, per_episode: int) -> dict:
    """The client `banks` embeds with (`OpenAIEmbedder` over `LLMClient.embed`, LLM cache on, as
    the inline executor builds it) in this process: `episodes` lists of `per_episode` distinct texts,
    each sent twice in one call as `banks` sends a unit's key and text, all episodes at once as a
    worker's shards run them. CPU seconds of this process per text."""
    import asyncio

    from pipeline.config import LLMConfig
    from pipeline.embeddings import OpenAIEmbedder
    from pipeline.llm.shared import make_client

    cfg = LLMConfig(provider="openai", base_url=base_url, model="fake-embed", api_key_env=KEY_ENV,
                    cache_dir=str(workdir / f"client-cache-{cap}"), max_concurrency=cap)
    lists = [[f"episode {e} unit {u}: " + " ".join(WORDS[(e * 7 + u * 3 + k) % len(WORDS)] for k in range(10))
              for u in range(per_episode)] for e in range(episodes)]

    async def go() -> None:
        client = make_client(cfg)
        embedder = OpenAIEmbedder(client.embed, "fake-embed")
        await asyncio.gather(*(embedder.aencode(texts + texts) for texts in lists))
        await client.aclose()

    os.environ.setdefault(KEY_ENV, "sk-bench-not-a-secret")
    cpu = time.process_time()
    asyncio.run(go())
    return {"client_cpu_s_per_text": (time.process_time() - cpu) / (episodes * per_episode)}


def api_part(a: argparse.Namespace) -> dict:
    """`banks` through the `embedder` role against a capped fake endpoint with fixed latency."""
    from pipeline.llm.client import EMBED_BATCH

    workdir = Path(tempfile.mkdtemp(prefix="mempipe-embeddings-api-"))
    results: dict[str, dict] = {}
    client: dict[str, dict] = {}

    def measured(srv: FakeServer, cap: int, latency: float) -> dict:
        served = served_embeddings(srv.stats())
        ideal = cap / latency
        rate = served["requests"] / served["span_s"]
        return {**served, "cap": cap, "latency_s": latency, "ideal_requests_per_s": ideal, "requests_per_s": rate,
                "share_of_ideal": rate / ideal, "min_requests": math.ceil(served["texts"] / EMBED_BATCH),
                "texts_per_s": served["texts"] / served["span_s"],
                "share_of_ideal_texts": served["texts"] / served["span_s"] / (ideal * EMBED_BATCH)}

    try:
        for cap in a.client_caps:
            # Enough full batches for `waves` rounds of `cap` requests; latency such that the ideal
            # stays within what 2 cores can send, answer and cache (`--max-ideal-texts`).
            latency = max(a.latency, cap * EMBED_BATCH / a.max_ideal_texts)
            episodes = a.waves * cap // 2  # two full requests per episode
            with FakeServer(latency=latency, max_concurrency=cap) as srv:
                extra = client_run(srv.base_url, workdir, cap, episodes, 2 * EMBED_BATCH)
                client[str(cap)] = {**measured(srv, cap, latency), **extra}
        corpus = write_corpus(workdir / "corpus.jsonl", a.api_episodes, sessions=a.sessions, turns=a.turns, questions=1)
        # Upstream stages talk to an uncapped server that lives through every run, so their
        # fingerprints stay put and only `banks` (whose embedder endpoint changes) runs again.
        with FakeServer() if a.caps else contextlib.nullcontext() as upstream:
            sets = fake_sets(workdir, upstream.base_url if upstream else "", corpus, run_name="api") + [
                STAGES, "compress.method=none", "compress.granularities=[turn,session]",
                "banks.granularities=[turn,session]", "embedding.provider=openai", "embedding.model=fake-embed"]
            if a.caps:
                mempipe(["run"], sets + ["stages=[ingest,guidance,segment,compress]"])
            for cap in a.caps:
                latency = max(a.latency, cap * EMBED_BATCH / a.max_ideal_texts)
                with FakeServer(latency=latency, max_concurrency=cap) as srv:
                    wall, _ = mempipe(["run"], sets + [f"roles.embedder.base_url={srv.base_url}",
                                                       f"roles.embedder.max_concurrency={cap}"])
                    got = measured(srv, cap, latency)
                m = manifest(workdir / "artifacts" / "api", "banks")
                results[str(cap)] = {**got, "stage_wall_s": m["timings"]["wall_s"], "command_wall_s": wall,
                                     "units": m["tables"]["memory_units"], "errors": m["errors"]}
    finally:
        if a.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return {"client": client, "results": results, "batch": EMBED_BATCH,
            "met": all(r["share_of_ideal"] >= 0.9 for r in client.values()),
            "args": {"episodes": a.api_episodes, "sessions": a.sessions, "turns": a.turns, "caps": a.caps,
                     "client_caps": a.client_caps, "waves": a.waves, "latency": a.latency,
                     "max_ideal_texts": a.max_ideal_texts}}


def api_body(part: dict) -> str:
    a, batch = part["args"], part["batch"]

    def row(label: str, r: dict) -> list:
        return [label, r["cap"], f"{r['latency_s']:.2f}", f"{r['ideal_requests_per_s']:.1f}", r["texts"], r["requests"],
                r["min_requests"], f"{r['span_s']:.1f}", f"{r['requests_per_s']:.1f}", f"{r['share_of_ideal']:.0%}",
                f"{r['texts_per_s']:.0f}", f"{r['share_of_ideal_texts']:.0%}", f"{r['mean_at_endpoint']:.1f}",
                f"{r['arrival_s']['1.0']:.1f}"]

    rows = [row("embedder client (`OpenAIEmbedder` + `LLMClient.embed`, cache on)", r) for r in part["client"].values()]
    rows += [row(f"`banks` stage, {r['units']} units, stage wall {r['stage_wall_s']:.1f} s", r)
             for r in part["results"].values()]
    verdicts = [f"cap {r['cap']}: {r['share_of_ideal']:.0%} ({'met' if r['share_of_ideal'] >= 0.9 else 'MISSED'})"
                for r in part["client"].values()]
    stage = "; ".join(f"cap {r['cap']}: {r['share_of_ideal']:.0%}" for r in part["results"].values())
    return (f"Against the fake server with at most `cap` requests served at once and the latency listed: "
            f"{a['latency']:g} s, longer where cap x {batch} / latency would pass {a['max_ideal_texts']:g} texts/s (past "
            "that the 2 cores that send, answer and cache them, not the client's concurrency, set the rate). "
            f"Ideal = cap / latency requests/s, each of up to {batch} texts. Rate = requests answered / (last "
            "completion - first arrival), at the server. Fewest requests = texts / batch, rounded up; text share "
            f"= texts/s over (ideal x {batch}), which also counts batches sent less than full. At endpoint = "
            "requests the server held on average (served or queued; `cap` at most are served). Last arrival: "
            "seconds after the first request that the last one came.\n\n"
            f"Rows: the embedder client `banks` uses, in one process: {a['waves']} x cap requests' worth of "
            f"distinct texts in lists of {2 * batch} (each sent twice in one call, as `banks` sends a unit's key "
            "and text), all at once; and the `banks` stage itself with `embedding.provider: openai` (the "
            f"`embedder` role, `roles.embedder.max_concurrency` = cap per LLM worker) over {a['episodes']} synthetic "
            f"conversations x {a['sessions']} sessions x {a['turns']} turns (turn and session units, no "
            "compression), cold LLM cache, local Ray.\n\n"
            + table(["run", "cap", "latency s", "ideal req/s", "texts", "requests", "fewest requests", "span s",
                     "requests/s", "share of ideal", "texts/s", "text share of ideal", "at endpoint",
                     "last arrival s"], rows)
            + "\n\nTarget: embedding throughput at least 90% of the endpoint's ideal (embedder client): "
            + "; ".join(verdicts) + "." + (f" The `banks` stage: {stage}." if stage else ""))


def previous(part: str) -> dict | None:
    """A part's figures from the last results file (older files hold the local part at the top level)."""
    try:
        old = json.loads((RESULTS / "embeddings.json").read_text())
    except (OSError, ValueError):
        return None
    if part in old:  # a part run that time has no "when" of its own: the file's
        return {**old[part], "when": old[part].get("when") or old.get("when")}
    if part == "local" and "results" in old:  # the file before parts existed
        res = old["results"]
        reference = res.get("before", res["nocache"])["wall_s"]
        drop = max(res["before" if "before" in res else "nocache"]["recall_at_5"] - r["recall_at_5"] for r in res.values())
        cold = reference / res["cold"]["wall_s"]
        return {"results": res, "max_vector_difference": old["max_vector_difference"], "reference_wall_s": reference,
                "cold_speedup": cold, "warm_speedup": reference / res["warm"]["wall_s"], "recall_drop": drop,
                "met": cold >= 5 and drop <= 0.01, "baseline": "before" in res,
                "args": {k: old["args"][k] for k in ("episodes", "sessions", "turns", "questions")}, "when": old["when"]}
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", nargs="+", choices=["local", "api"], default=["local", "api"])
    ap.add_argument("--episodes", type=int, default=19)
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--turns", type=int, default=24)
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--baseline-checkout", type=Path, default=None)
    ap.add_argument("--api-episodes", type=int, default=80, help="conversations of the api part")
    ap.add_argument("--client-caps", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--waves", type=int, default=3, help="the client rows send waves x cap full requests")
    ap.add_argument("--caps", type=int, nargs="*", default=[32], help="caps of the banks-stage rows")
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--max-ideal-texts", type=float, default=600.0,
                    help="highest ideal rate (texts/s) to ask of this machine; larger caps get a longer latency")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    parts: dict[str, dict] = {}
    for name, run in (("local", local_part), ("api", api_part)):
        if name in a.part:
            parts[name] = run(a)
        elif (old := previous(name)) is not None:
            parts[name] = old
    sections = []
    if "local" in parts:
        when = parts["local"].get("when")
        sections.append("## Local model (packaged MiniLM)\n\n"
                        + (f"(Figures from the previous run, {when}; `--part local` reruns it.)\n\n" if when else "")
                        + local_body(parts["local"]))
    if "api" in parts:
        when = parts["api"].get("when")
        sections.append("## OpenAI-compatible endpoint\n\n"
                        + (f"(Figures from the previous run, {when}; `--part api` reruns it.)\n\n" if when else "")
                        + api_body(parts["api"]))
    write_results("embeddings", "Embeddings: banks on a LoCoMo-sized corpus", "\n\n".join(sections), parts)
    return 0 if all(p["met"] for name, p in parts.items() if name in a.part) else 1


if __name__ == "__main__":
    sys.exit(main())
