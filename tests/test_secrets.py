"""The API key never reaches disk or logs: artifacts, manifests, the call cache, the run's logs, the
command's output (what `ray job logs` shows) and Ray's session logs, also when the endpoint echoes
the key in its error messages and when the run fails. The runs are jobs on a running Ray (this
session's, as `ray job submit` starts them) whose processes were started with the key in their
environment, as a user exports it before `ray start`: every Ray process holds it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray

from conftest import SESSION_RAY_KEY_ENV, segmenting_responder

ROOT = Path(__file__).resolve().parent.parent


def _files_holding(root: Path, needle: bytes) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if needle in path.read_bytes():
                    found.append(str(path))
            except OSError:
                continue  # a socket or a file Ray removed meanwhile
    return found


def _session_dir() -> Path:
    """The session folder (logs included) of the Ray this test process is connected to."""
    from ray._private import worker

    return Path(worker._global_node.get_session_dir_path())


@pytest.mark.heavy(seconds=20)
def test_a_recognisable_key_is_found_nowhere_after_a_run_that_works_and_one_that_fails(tmp_path, fake_llm, ray_local):
    key = os.environ[SESSION_RAY_KEY_ENV]  # a recognisable fake key the session's Ray started with (conftest)
    fake_llm.responder = segmenting_responder
    fake_llm.echo_auth = True  # every error body repeats "Bearer <key>"
    fake_llm.faults = {"500": 0.15, "400": 0.1}
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONPATH": str(ROOT)}
    common = ["-c", str(ROOT / "configs" / "default.yaml"), "--set", f"artifacts_dir={tmp_path / 'a'}",
              "--set", "llm.provider=openai", "--set", f"llm.base_url={fake_llm.base_url}",
              "--set", f"llm.api_key_env={SESSION_RAY_KEY_ENV}", "--set", f"llm.cache_dir={tmp_path / 'cache'}",
              "--set", "llm.model=fake-model", "--set", "llm.backoff_base_s=0.01", "--set", "llm.max_retries=1",
              "--set", "teabag.enabled=false", "--set", "corpus.limit=2", "--set", "report.compare_with=[]"]
    logs = _session_dir() / "logs"
    logs_before = set(logs.rglob("*"))
    outputs = []
    works = subprocess.run([sys.executable, "-m", "stages.cli", "run", "--until", "segment", *common],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert works.returncode == 0, works.stderr
    outputs += [works.stdout, works.stderr]
    # What the endpoint said on a rejected request is kept on the failed row, with the key blotted
    # out (checked now: the forced run below replaces the stage).
    assert fake_llm.outcomes["400"] and _files_holding(tmp_path / "a", b"***")
    # A run that fails: the endpoint goes down for good and the run stops on llm.max_outage_s.
    fake_llm.faults = {"500": 1.0}
    fails = subprocess.run([sys.executable, "-m", "stages.cli", "run", "--force", "segment", *common,
                            "--set", "llm.max_outage_s=2", "--set", f"llm.cache_dir={tmp_path / 'cache2'}"],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert fails.returncode == 4, fails.stderr
    outputs += [fails.stdout, fails.stderr]

    # The check can fail: the key did go out with every request, the errors did carry it back, and
    # the jobs' drivers and workers did write Ray logs.
    assert fake_llm.requests and all(r["auth"] == f"Bearer {key}" for r in fake_llm.requests)
    assert fake_llm.outcomes["500"] and fake_llm.outcomes["400"]
    assert set(logs.rglob("*")) - logs_before
    needle = key.encode()
    for root in (tmp_path / "a", tmp_path / "cache", tmp_path / "cache2", logs):
        assert _files_holding(root, needle) == [], root
    for text in outputs:
        assert key not in text
