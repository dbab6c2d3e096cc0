"""What the benchmarks share: a fake OpenAI-compatible server in its own process, `mempipe`
runs in subprocesses against it, manifests, and the results files (Markdown + JSON)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
KEY_ENV = "MEMPIPE_BENCH_KEY"


class FakeServer:
    """`python -m pipeline.testing.fake_openai` as a child process (its own CPU, like a real endpoint)."""

    def __init__(self, latency: float = 0.0, max_concurrency: int | None = None, faults: str = "",
                 retry_after: float = 1.0, timeout_sleep: float = 3.0) -> None:
        self.args = ["--latency", str(latency), "--faults", faults, "--retry-after", str(retry_after),
                     "--timeout-sleep", str(timeout_sleep)]
        if max_concurrency:
            self.args += ["--max-concurrency", str(max_concurrency)]
        self.proc: subprocess.Popen | None = None
        self.base_url = ""

    def __enter__(self) -> "FakeServer":
        self.proc = subprocess.Popen([sys.executable, "-m", "pipeline.testing.fake_openai", *self.args], cwd=ROOT,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        self.base_url = line.strip().rsplit(" ", 1)[-1]
        if not self.base_url.startswith("http"):
            raise RuntimeError(f"fake server did not start: {line!r}")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)

    def _url(self, path: str) -> str:
        return self.base_url.removesuffix("/v1") + path

    def stats(self, bodies: bool = False) -> dict[str, Any]:
        with urllib.request.urlopen(self._url("/stats" + ("?bodies=1" if bodies else "")), timeout=30) as r:
            return json.loads(r.read())

    def reset(self) -> None:
        urllib.request.urlopen(urllib.request.Request(self._url("/reset"), method="POST"), timeout=30).read()


def fake_sets(workdir: Path, base_url: str, corpus: Path, run_name: str = "bench") -> list[str]:
    """Config overrides pointing a run at the fake server with its own artifacts and cache."""
    return [f"run_name={run_name}", f"artifacts_dir={workdir / 'artifacts'}", "corpus.format=sample",
            f"corpus.path={corpus}", "corpus.limit=null", "llm.provider=openai", f"llm.base_url={base_url}",
            "llm.model=fake-model", f"llm.api_key_env={KEY_ENV}", f"llm.cache_dir={workdir / ('llm-cache-' + run_name)}",
            "llm.max_tokens=64", "roles={}",
            "method={}", "teabag.enabled=false", "judge_pairwise.enabled=false", "judge_answers.enabled=false",
            "judge_memory.enabled=false"]


def mempipe_cmd(args: list[str], sets: list[str]) -> list[str]:
    """The command line of `mempipe ARGS -c configs/default.yaml --set ...` in this interpreter."""
    cmd = [sys.executable, "-m", "stages.cli", *args, "-c", str(ROOT / "configs" / "default.yaml")]
    for s in sets:
        cmd += ["--set", s]
    return cmd


EXIT_ROWS_FAILED = 6  # pipeline.cli's: the run finished and some rows failed (the embedded model's)


def mempipe(args: list[str], sets: list[str], *, check: bool = True, timeout: float | None = None,
            env: dict[str, str] | None = None) -> tuple[float, int]:
    """Run `mempipe ARGS --set ...` (default config) in a subprocess: (wall seconds, exit code)."""
    cmd = mempipe_cmd(args, sets)
    full_env = {**os.environ, KEY_ENV: "sk-bench-not-a-secret", **(env or {})}
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - started
    if check and proc.returncode not in (0, EXIT_ROWS_FAILED):  # 6: finished, some rows failed
        raise RuntimeError(f"mempipe {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, proc.returncode


def manifest(run_dir: Path, stage: str) -> dict[str, Any]:
    return json.loads((run_dir / stage / "_manifest.json").read_text())


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def machine() -> str:
    return (f"{os.cpu_count()} cores, Python {platform.python_version()}, {platform.machine()}, "
            f"load average before {os.getloadavg()[0]:.2f}")


def write_results(name: str, title: str, body: str, data: dict[str, Any]) -> None:
    """Print and write bench/results/<name>.md and <name>.json."""
    stamp = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    text = f"# {title}\n\n{stamp}; {machine()}\n\n{body}\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.md").write_text(text)
    (RESULTS / f"{name}.json").write_text(json.dumps({"when": stamp, **data}, indent=2, default=str))


@contextlib.contextmanager
def temp_workdir(prefix: str, keep: bool) -> Iterator[Path]:
    """A fresh temporary folder for one benchmark run, removed after it unless `keep` (then named)."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield workdir
    finally:
        if keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
