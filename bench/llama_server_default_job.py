"""Benchmark: the default job against llama-cpp-python's own server, as a new user would point it.

Starts `python -m llama_cpp.server --model <packaged SmolLM2>` (no shim: it answers a json_schema
response_format with HTTP 500 and a validation body), runs `mempipe run -c configs/default.yaml
--set llm.provider=openai --set llm.base_url=http://127.0.0.1:<port>/v1` with fresh artifacts and a
fresh call cache, and prints a table: stages done, the structured mode each role ended in (and why),
requests the server refused (its 500s, from its access log), and the wall time. A run that passes
`--timeout` is stopped and reported as such. Writes bench/results/llama_server_default_job.md / .json.

    python bench/llama_server_default_job.py                 # stops the job after 480 s
    python bench/llama_server_default_job.py --timeout 1800  # let it finish
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import ROOT, mempipe, table, write_results  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(log_path: Path) -> tuple[subprocess.Popen, str]:
    from pipeline.models import smollm2_gguf_path

    port = _free_port()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_gguf_path()),
                                 "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048"],
                                stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + 120
    while True:
        try:
            urllib.request.urlopen(f"{base_url}/models", timeout=2).read()
            return proc, base_url
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                raise RuntimeError(f"llama_cpp.server did not start:\n{log_path.read_text()[-2000:]}")
            time.sleep(0.3)


def access_counts(log_path: Path) -> dict[str, int]:
    """Chat requests per HTTP status, from uvicorn's access log."""
    counts: dict[str, int] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        if '"POST /v1/chat/completions HTTP/1.1"' in line:
            status = line.split('HTTP/1.1"', 1)[1].split()[0]
            counts[status] = counts.get(status, 0) + 1
    return counts


def stages_done(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(run_dir.glob("*/_manifest.json"), key=lambda p: p.stat().st_mtime):
        m = json.loads(path.read_text())
        out.append({"stage": path.parent.name, "llm_usage": m.get("llm_usage") or {}})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timeout", type=float, default=480.0, help="stop the job after this many seconds")
    ap.add_argument("--keep", action="store_true", help="keep the run's folder")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="mempipe-llama-server-"))
    log_path = work / "llama_server.log"
    proc, base_url = start_server(log_path)
    sets = [f"artifacts_dir={work / 'artifacts'}", f"llm.cache_dir={work / 'llm-cache'}", "llm.provider=openai",
            f"llm.base_url={base_url}"]
    try:
        try:
            wall, code = mempipe(["run"], sets, check=False, timeout=args.timeout)
            finished = True
        except subprocess.TimeoutExpired:
            wall, code, finished = args.timeout, None, False
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    run_dirs = [p for p in (work / "artifacts").glob("*") if p.is_dir()]
    done = stages_done(run_dirs[0]) if run_dirs else []
    statuses = access_counts(log_path)
    modes: dict[str, dict[str, Any]] = {}
    for s in done:
        for role, u in s["llm_usage"].items():
            entry = modes.setdefault(role, {"modes": {}, "why": {}, "failed_calls": 0, "retries": 0})
            for mode, n in (u.get("structured_modes") or {}).items():
                entry["modes"][mode] = entry["modes"].get(mode, 0) + n
            entry["why"].update(u.get("structured_fallbacks") or {})
            entry["failed_calls"] += u.get("failed_calls", 0)
            entry["retries"] += u.get("retries", 0)
    rows = [[role, ", ".join(f"{m} x{n}" for m, n in e["modes"].items()) or "-",
             "; ".join(f"{m}: {w}" for m, w in e["why"].items())[:120] or "-", e["failed_calls"], e["retries"]]
            for role, e in sorted(modes.items())]
    outcome = (f"exit {code}" if finished else f"stopped after {args.timeout:.0f} s (still running)")
    body = "\n\n".join([
        f"`mempipe run -c configs/default.yaml --set llm.provider=openai --set llm.base_url={base_url}` against "
        "`python -m llama_cpp.server` with the packaged SmolLM2-135M (no shim).",
        table(["wall time", "outcome", "stages done", "chat requests refused (HTTP 500)", "chat requests answered"],
              [[f"{wall:.0f} s", outcome, f"{len(done)}: {', '.join(s['stage'] for s in done)}",
                statuses.get("500", 0), statuses.get("200", 0)]]),
        table(["role", "structured modes", "why", "failed calls", "retries"], rows) if rows else "No role finished a stage.",
    ])
    write_results("llama_server_default_job", "The default job against llama-cpp-python's own server", body,
                  {"wall_s": wall, "finished": finished, "exit_code": code, "stages_done": [s["stage"] for s in done],
                   "http_statuses": statuses, "roles": modes})
    if args.keep:
        print(f"kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
