"""Benchmark: the default job (configs/default.yaml) cold, then warm.

Cold = fresh artifacts and a fresh LLM call cache (packaged models already unpacked, as after
the first run); warm = the same command again, which must skip every stage. Prints a table per
stage from the manifests and writes it to bench/results/default_job.md.

    python bench/default_job.py            # about 6 minutes on 2 cores
    python bench/default_job.py --keep     # keep the run's folder (its path is printed)
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "default_job.md"
LIMIT_S = 600  # the product's budget for the default job on a 2-core machine


def run_job(workdir: Path) -> float:
    cmd = [sys.executable, "-m", "pipeline.cli", "run", "-c", str(ROOT / "configs" / "default.yaml"),
           "--set", f"artifacts_dir={workdir / 'artifacts'}", "--set", f"llm.cache_dir={workdir / 'llm-cache'}"]
    started = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def stage_rows(run_dir: Path) -> list[list[str]]:
    rows = []
    for manifest in sorted(run_dir.glob("*/_manifest.json"), key=lambda p: p.stat().st_mtime):
        m = json.loads(manifest.read_text())
        per_role = m.get("llm_usage") or {}  # {role: usage}
        fresh = sum(u.get("calls", 0) - u.get("cached_calls", 0) for u in per_role.values())
        failed = sum(u.get("failed_calls", 0) for u in per_role.values())
        tokens = sum(u.get("prompt_tokens", 0) + u.get("completion_tokens", 0) for u in per_role.values())
        calls = f"{fresh}/{failed}" if per_role else "-"
        fallback = f"{m['fallback_sessions']}/{m['sessions']}" if "sessions" in m else "-"
        rows.append([m["stage"], f"{m['timings']['wall_s']:.1f}", str(m["rows"]), calls,
                     str(tokens) if per_role else "-", fallback])
    return rows


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def teafarm_rows(run_dir: Path) -> list[list[str]]:
    """TeaFarm correct / total per method over every dataset, from the report's summary."""
    import pyarrow.parquet as pq

    folder = run_dir / "report" / "teafarm_summary"
    if not folder.is_dir():
        return []
    rows = [r for f in sorted(folder.glob("*.parquet")) for r in pq.read_table(f).to_pylist() if r["dataset"] == "all"]
    return [[r["method"], f"{r['correct']}/{r['total']}", str(r["failed"])] for r in rows]


def main() -> int:
    load_before = os.getloadavg()[0]
    workdir = Path(tempfile.mkdtemp(prefix="mempipe-bench-"))
    try:
        cold = run_job(workdir)
        per_stage = stage_rows(workdir / "artifacts" / "default")
        teafarm = teafarm_rows(workdir / "artifacts" / "default")
        warm = run_job(workdir)
    finally:
        if "--keep" in sys.argv:
            print(f"run kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    summary = table(
        ["run", "wall s", "budget s", "within budget"],
        [["cold", f"{cold:.1f}", str(LIMIT_S), str(cold <= LIMIT_S)],
         ["warm (every stage skipped)", f"{warm:.1f}", "-", f"{warm / cold:.1%} of cold"]],
    )
    stages = table(["stage", "wall s (cold)", "rows", "LLM fresh/failed", "tokens", "fallback sessions"], per_stage)
    text = (
        f"# Default job benchmark\n\n{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}; load average before: "
        f"{load_before:.2f}\n\n{summary}\n\nCold run per stage (from the manifests):\n\n{stages}\n"
    )
    if teafarm:
        text += ("\nTeaFarm on the default job (the embedded 135M model answers and judges: this shows the "
                 "pipeline, not a score):\n\n" + table(["method", "correct/total", "failed"], teafarm) + "\n")
    print(text)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    return 0 if cold <= LIMIT_S else 1


if __name__ == "__main__":
    sys.exit(main())
