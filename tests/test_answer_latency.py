"""What answering a probe took (issue 64's groundwork): each call's latency is kept with its cache
entry (a cached answer keeps the latency of its first sending), and each response row carries its
calls' tokens and latency."""

from __future__ import annotations

import asyncio

from conftest import llm_config

from pipeline.artifacts import StageDir
from pipeline.llm.cache import DiskCallCache
from pipeline.llm.client import LLMClient
from pipeline.engine.runner import Runner
from stages import registry


def test_a_calls_latency_is_kept_with_its_cache_entry_and_a_cached_answer_keeps_it(fake_llm, tmp_path):
    fake_llm.latency_s = 0.2
    cfg = llm_config(fake_llm)

    async def twice() -> tuple:
        client = LLMClient(cfg, cache=DiskCallCache(tmp_path / "cache"))
        try:
            first = await client.chat([{"role": "user", "content": "hello"}])
            fake_llm.latency_s = 0.0
            second = await client.chat([{"role": "user", "content": "hello"}])
            return first, second
        finally:
            await client.aclose()

    first, second = asyncio.run(twice())
    assert not first.cached and first.latency_s >= 0.2
    assert second.cached and second.latency_s == round(first.latency_s, 4)


def test_each_response_row_carries_its_calls_tokens_and_latency(run_cfg, fake_llm):
    fake_llm.latency_s = 0.05
    cfg = run_cfg("corpus.limit=1", "methods=[rsum,full_history]", "judge_memory.enabled=false",
                  "judge_pairwise.enabled=false", "judge_answers.enabled=false")
    Runner(cfg, registry(cfg)).run()
    for method in ("rsum", "full_history"):
        rows = StageDir(cfg.run_dir, f"respond_{method}").read_table("responses").to_pylist()
        assert rows and all(r["error"] is None for r in rows)
        assert all(r["prompt_tokens"] > 0 and r["completion_tokens"] > 0 and r["latency_s"] >= 0.05 for r in rows)
