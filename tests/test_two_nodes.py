"""A pipeline run on a two-node Ray cluster on this machine: shards run on both nodes, every node's
workers go through the driver's one cache and one limiter (a rerun on the same cache sends
nothing; llm.rpm holds for the job, not per node). The heavier story (token auth, `ray job submit`,
a node killed mid-stage) is bench/cluster.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.testing.fake_openai import FakeOpenAI

ROOT = Path(__file__).resolve().parent.parent
RPM = 120


@pytest.mark.heavy(seconds=45)
def test_two_node_run_shares_the_cache_and_the_limiter(fake_llm: FakeOpenAI, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MEMPIPE_TEST_KEY", "sk-test-secret-value-123")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "two_node_run.py"), fake_llm.base_url, str(tmp_path), str(RPM)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(out["nodes"]) == 2
    assert (out["first_rc"], out["again_rc"]) == (0, 0)
    assert out["errors"] == 0 and out["rows"] > 0
    assert set(out["shards_per_node"]) == set(out["nodes"])  # both nodes answered probes
    assert sum(out["shards_per_node"].values()) == out["shards"]

    chat = [t for r, t in zip(fake_llm.requests, fake_llm.timestamps) if r["path"].endswith("/chat/completions")]
    assert len(chat) >= out["shards"]
    # The second run (a new run name on the same cache) sent nothing: every request is the first's.
    keys = [json.dumps(r["body"], sort_keys=True) for r in fake_llm.requests if r["path"].endswith("/chat/completions")]
    assert len(set(keys)) == len(keys)
    # One limiter for the job: at most RPM requests in any 60 s window (+1 for both ends of a window).
    chat.sort()
    assert max(sum(1 for u in chat if t <= u <= t + 60) for t in chat) <= RPM + 1
    # ... and it paced them: slots one per 60/RPM s for the whole job. No request leaves before its
    # slot, but a worker that gets its slot back late sends late, so the span shrinks by how late
    # the first one left (0.4 s seen on a loaded 2-core machine). A limiter per node would span
    # about half of this and none at all ~0 s, so 0.7 of the full span still tells them apart.
    assert chat[-1] - chat[0] >= (len(chat) - 1) * 60 / RPM * 0.7, (len(chat), chat[-1] - chat[0])
