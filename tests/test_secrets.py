"""The API key never reaches disk or logs: artifacts, manifests, the call cache, the run's logs, the
command's output (what `ray job logs` shows) and Ray's session logs, also when the endpoint echoes
the key in its error messages and when the run fails."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import segmenting_responder

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


@pytest.fixture
def ray_tmp():
    """Ray's session folder for these runs, short: a socket path may not pass 107 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.heavy(seconds=48)
def test_a_recognisable_key_is_found_nowhere_after_a_run_that_works_and_one_that_fails(tmp_path, fake_llm, ray_tmp):
    key = f"sk-mempipe-canary-{secrets.token_hex(12)}"
    fake_llm.responder = segmenting_responder
    fake_llm.echo_auth = True  # every error body repeats "Bearer <key>"
    fake_llm.faults = {"500": 0.15, "400": 0.1}
    env = {**os.environ, "MEMPIPE_CANARY_KEY": key, "RAY_ADDRESS": "", "PYTHONPATH": str(ROOT),
           "RAY_TMPDIR": str(ray_tmp)}
    common = ["-c", str(ROOT / "configs" / "default.yaml"), "--set", f"artifacts_dir={tmp_path / 'a'}",
              "--set", "llm.provider=openai", "--set", f"llm.base_url={fake_llm.base_url}",
              "--set", "llm.api_key_env=MEMPIPE_CANARY_KEY", "--set", f"llm.cache_dir={tmp_path / 'cache'}",
              "--set", "llm.model=fake-model", "--set", "llm.backoff_base_s=0.01", "--set", "llm.max_retries=1",
              "--set", "ray.num_cpus=1", "--set", "teabag.enabled=false", "--set", "corpus.limit=2",
              "--set", "report.compare_with=[]"]
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

    # The check can fail: the key did go out with every request, and the errors did carry it back.
    assert fake_llm.requests and all(r["auth"] == f"Bearer {key}" for r in fake_llm.requests)
    assert fake_llm.outcomes["500"] and fake_llm.outcomes["400"]
    assert any(ray_tmp.rglob("*.log"))
    needle = key.encode()
    for root in (tmp_path / "a", tmp_path / "cache", tmp_path / "cache2", ray_tmp):
        assert _files_holding(root, needle) == [], root
    for text in outputs:
        assert key not in text
