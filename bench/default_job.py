"""Benchmark: the default job (configs/default.yaml) cold, then warm.

Cold = fresh artifacts and a fresh LLM call cache (packaged models already unpacked, as after
the first run); warm = the same command again, which must skip every stage. Prints a table per
stage from the manifests (wall time, rows, LLM calls fresh / from the cache / failed, tokens) and
writes bench/results/default_job.md and .json.

    python bench/default_job.py            # about 6 minutes on 2 cores
    python bench/default_job.py --keep     # keep the run's folder (its path is printed)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import mempipe, table, write_results

LIMIT_S = 600  # the product's budget for the default job on a 2-core machine


def run_job(workdir: Path) -> float:
    return mempipe(["run"], [f"artifacts_dir={workdir / 'artifacts'}", f"llm.cache_dir={workdir / 'llm-cache'}"])[0]


def stage_stats(run_dir: Path) -> list[dict[str, Any]]:
    """Per stage, in the order they ran: wall time, rows, LLM calls and tokens (every role)."""
    out = []
    for path in sorted(run_dir.glob("*/_manifest.json"), key=lambda p: p.stat().st_mtime):
        m = json.loads(path.read_text())
        usage = (m.get("llm_usage") or {}).values()
        out.append({"stage": m["stage"], "wall_s": m["timings"]["wall_s"], "rows": m["rows"],
                    "finished_at": m["timings"].get("finished_at"), "llm": bool(m.get("llm_usage")),
                    "calls": sum(u.get("calls", 0) for u in usage),
                    "cached_calls": sum(u.get("cached_calls", 0) for u in usage),
                    "failed_calls": sum(u.get("failed_calls", 0) for u in usage),
                    "tokens": sum(u.get("prompt_tokens", 0) + u.get("completion_tokens", 0) for u in usage),
                    "fallback_sessions": f"{m['fallback_sessions']}/{m['sessions']}" if "sessions" in m else "-"})
    return out


def teafarm_rows(run_dir: Path) -> list[list[str]]:
    """TeaFarm correct / total per method over every dataset, from the report's summary."""
    import pyarrow.parquet as pq

    folder = run_dir / "report" / "teafarm_summary"
    if not folder.is_dir():
        return []
    rows = [r for f in sorted(folder.glob("*.parquet")) for r in pq.read_table(f).to_pylist() if r["dataset"] == "all"]
    return [[r["method"], f"{r['correct']}/{r['total']}", str(r["failed"])] for r in rows]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", action="store_true", help="keep the run's folder (its path is printed)")
    a = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="mempipe-bench-"))
    run_dir = workdir / "artifacts" / "default"
    try:
        cold = run_job(workdir)
        per_stage = stage_stats(run_dir)
        teafarm = teafarm_rows(run_dir)
        warm = run_job(workdir)
        rerun = {s["stage"]: s for s in stage_stats(run_dir)}
    finally:
        if a.keep:
            print(f"run kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    # A skipped stage keeps its manifest: the warm run reran exactly the stages whose finish time moved.
    rerun_stages = [s["stage"] for s in per_stage if rerun[s["stage"]]["finished_at"] != s["finished_at"]]
    llm = [s for s in per_stage if s["llm"]]
    fresh = sum(s["calls"] - s["cached_calls"] for s in llm)
    summary = table(["run", "wall s", "budget s", "result"],
                    [["cold", f"{cold:.1f}", LIMIT_S, "within budget" if cold <= LIMIT_S else "OVER BUDGET"],
                     ["warm (same command again)", f"{warm:.1f}", "-",
                      f"{warm / cold:.1%} of cold; stages rerun: {', '.join(rerun_stages) or 'none'}"]])
    rows = [[s["stage"], f"{s['wall_s']:.1f}", s["rows"],
             f"{s['calls'] - s['cached_calls']}/{s['cached_calls']}/{s['failed_calls']}" if s["llm"] else "-",
             s["tokens"] if s["llm"] else "-", s["fallback_sessions"]] for s in per_stage]
    rows.append(["all", f"{sum(s['wall_s'] for s in per_stage):.1f}", "-",
                 f"{fresh}/{sum(s['cached_calls'] for s in llm)}/{sum(s['failed_calls'] for s in llm)}",
                 sum(s["tokens"] for s in llm), "-"])
    body = (f"{summary}\n\nCold run per stage (from the manifests; the embedded SmolLM2-135M on local Ray):\n\n"
            + table(["stage", "wall s", "rows", "LLM calls fresh/cached/failed", "tokens", "fallback sessions"], rows)
            + "\n")
    if teafarm:
        body += ("\nTeaFarm on the default job (the embedded 135M model answers and judges: this shows the "
                 "pipeline, not a score):\n\n" + table(["method", "correct/total", "failed"], teafarm) + "\n")
    ok = cold <= LIMIT_S and not rerun_stages
    write_results("default_job", "Default job, cold and warm", body,
                  {"cold_s": cold, "warm_s": warm, "limit_s": LIMIT_S, "stages": per_stage,
                   "warm_rerun_stages": rerun_stages, "teafarm": teafarm, "targets_met": ok})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
