"""The default config's embedded models run offline on Ray: no key, no network. The packaged
SmolLM2 answers the segmenter through the embedded server, and scores SeCom's LLMLingua
compression in a Ray worker (the suite's one run of that model in a worker: each utterance costs
a forward pass, so on this tiny corpus, not on the sample's)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pipeline.artifacts import StageDir
from pipeline.config import resolve_paths
from stages import load_config, registry
from pipeline.engine.runner import Runner

ROOT = Path(__file__).resolve().parent.parent
TINY = Path(__file__).resolve().parent / "fixtures" / "corpora" / "tiny"


def _servers() -> list[str]:
    """The embedded servers this process started (a test beside it, under xdist, may run its own)."""
    out = subprocess.run(["pgrep", "-P", str(os.getpid()), "-f", "pipeline.llm.local_server"],
                         capture_output=True, text=True)
    return out.stdout.split()


@pytest.mark.heavy(seconds=23)
def test_default_config_segments_and_compresses_with_its_embedded_models(tmp_path, monkeypatch, ray_local, models_cache):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    before = _servers()
    cfg = resolve_paths(load_config(ROOT / "configs" / "default.yaml", [
        f"artifacts_dir={tmp_path / 'a'}", f"corpus.path={TINY}", f"llm.cache_dir={tmp_path / 'cache'}",
        f"embedding.cache_dir={models_cache}", "stages=[ingest,guidance,segment,compress,probes]",
        "teabag.enabled=false",
        # Two single-thread servers, as the default on 2 cores (one per core, one thread each): a
        # second llama.cpp thread of one server would spin waiting for the other test worker's busy
        # core (seen: 55 CPU-s instead of 19).
        "llm.local.servers=2", "llm.local.n_threads=1",
    ]))
    assert cfg.llm.provider == "local" and cfg.compress.method == "llmlingua" and cfg.ray.executor == "ray"
    assert set(Runner(cfg, registry(cfg)).run().values()) == {"ran"}
    sd = StageDir(cfg.run_dir, "segment")
    m = sd.manifest()
    usage = m.llm_usage["segmenter"]  # usage is reported per LLM role
    # One segmentation call per session reached the embedded server (answered or recorded as fallback).
    assert usage.calls + usage.failed_calls == 3 and usage.prompt_tokens > 0
    rows = sd.read_table("segments").to_pylist()
    for s in (1, 2, 3):
        spans = sorted((r["turn_start"], r["turn_end"]) for r in rows if r["session_idx"] == s)
        assert spans[0][0] == 0 and spans[-1][1] == 3  # every turn of the session is covered
        assert all(a[1] + 1 == b[0] for a, b in zip(spans, spans[1:]))
    assert m.stats["fallback_sessions"] == sum(1 for s in (1, 2, 3) if any(r["fallback"] for r in rows if r["session_idx"] == s))
    # LLMLingua with the packaged scorer, line by line: every unit compressed, none failed, and the
    # long utterances shortened (short ones stay verbatim).
    units = StageDir(cfg.run_dir, "compress").read_table("units").to_pylist()
    assert units and {u["compression"] for u in units} == {"llmlingua@0.75"}
    assert {u["compression_path"] for u in units} == {"per_line"} and not any(u["error"] for u in units)
    assert any(len(u["compressed_text"].split()) < len(u["text"].split()) for u in units)
    assert (cfg.run_dir / "_logs" / "llm-server.log").exists() and (cfg.run_dir / "_logs" / "llm-server.1.log").exists()
    assert _servers() == before  # both embedded servers were stopped
