"""Batch API mode (`llm.batch`) against the fake server: one batch for independent calls, answers
equal to direct calls, cached reruns, failed and expired items resubmitted, half price, a stage."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from conftest import TEST_KEY_ENV, llm_config
from pipeline.testing.fake_openai import FakeOpenAI
from pipeline.artifacts import StageDir
from pipeline.llm import DiskCallCache, LLMClient, LLMError, LLMResult
from pipeline.llm.cache import chat_cache_key
from pipeline.llm.params import sampling_params
from pipeline.llm.prices import BATCH_DISCOUNT
from pipeline.engine.runner import Runner
from stages import registry

SECRET = "sk-test-SECRET-batch-5e8d1c"


class Answer(BaseModel):
    answer: str
    n: int


def msgs(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You are terse."}, {"role": "user", "content": text}]


def client_for(server: FakeOpenAI, cache_dir: Any = None, batch: bool = True, **overrides: Any) -> LLMClient:
    if batch:
        overrides = {"batch": True, "batch_poll_s": 0.01, **overrides}
    cfg = llm_config(server, **({"cache_dir": str(cache_dir)} if cache_dir else {}), **overrides)
    return LLMClient(cfg, cache=DiskCallCache(cfg.cache_dir))


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))  # nothing here may hang


async def ask_all(client: LLMClient, prompts: list[str], structured: bool = True) -> list[Any]:
    """Half plain, half structured (when asked), all at once; an LLMError is returned, not raised."""
    async def one(i: int, p: str) -> Any:
        try:
            if structured and i % 2:
                return await client.chat(msgs(p), schema=Answer)
            return await client.chat(msgs(p))
        except LLMError as e:
            return e

    try:
        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))
    finally:
        await client.aclose()


def same(a: LLMResult, b: LLMResult) -> bool:
    return (a.text, a.parsed, a.prompt_tokens, a.completion_tokens, a.model) == \
        (b.text, b.parsed, b.prompt_tokens, b.completion_tokens, b.model)


def requests_made(server: FakeOpenAI) -> int:
    return sum(server.by_path.values())


def key_of(client: LLMClient, text: str) -> str:
    """The custom_id (the cache key) of a plain call's request."""
    model, sampling = sampling_params(client.cfg, 0, {})
    return chat_cache_key(client.endpoint, model, msgs(text), sampling, None, 0)


PROMPTS = [f"question {i}" for i in range(20)]


def test_independent_calls_go_out_as_one_batch_and_answer_as_direct_calls(fake_llm: FakeOpenAI, tmp_path) -> None:
    client = client_for(fake_llm, max_concurrency=2)  # the semaphore does not cap a batch
    batched = run(ask_all(client, PROMPTS))
    assert all(isinstance(r, LLMResult) and not r.cached for r in batched)
    assert fake_llm.count() == 0  # no direct chat request
    assert fake_llm.count("/v1/batches") == 1 and fake_llm.count("/v1/files") == 1
    assert fake_llm.count_like("/v1/batches/") >= fake_llm.batch_polls
    assert client.usage.batch_calls == 20 and client.usage.calls == 20 and client.usage.retries == 0
    assert client.usage.structured_modes == {"json_schema": 10}
    assert fake_llm.files_made == 2 and fake_llm.files == {}  # input and output read, then deleted
    assert fake_llm.count_like("/v1/files/") == 3  # the output's content, then two deletes
    assert all(isinstance(r.parsed, Answer) for r in batched[1::2])

    direct = run(ask_all(client_for(fake_llm, tmp_path / "direct-cache", batch=False), PROMPTS))
    assert fake_llm.count() == 20
    assert all(same(a, b) for a, b in zip(batched, direct))


def test_a_rerun_is_answered_from_the_cache_and_sends_nothing(fake_llm: FakeOpenAI) -> None:
    first = run(ask_all(client_for(fake_llm), PROMPTS))
    sent = requests_made(fake_llm)
    again_client = client_for(fake_llm)
    again = run(ask_all(again_client, PROMPTS))
    assert requests_made(fake_llm) == sent  # no batch, no file, no chat request
    assert all(r.cached for r in again) and all(same(a, b) for a, b in zip(first, again))
    assert again_client.usage.batch_calls == 0 and again_client.usage.cached_calls == 20
    # The same cache serves a client out of batch mode too: the cached value is the same.
    direct = client_for(fake_llm, batch=False)
    assert all(r.cached for r in run(ask_all(direct, PROMPTS)))
    assert requests_made(fake_llm) == sent


@pytest.mark.parametrize("where", ["error_file", "output"])
def test_failed_items_go_into_the_next_batch_and_one_that_always_fails_ends_as_an_error(
        fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    monkeypatch.setenv(TEST_KEY_ENV, SECRET)
    client = client_for(fake_llm, max_retries=5)
    doomed = key_of(client, "question 4")
    fake_llm.batch_fail_ids = {doomed}
    fake_llm.batch_fail_fraction = 0.3
    fake_llm.batch_fail_in = where
    fake_llm.batch_fail_message = f"item broke (key {SECRET})"  # a server echoing the key
    results = run(ask_all(client, PROMPTS))
    assert len(set(fake_llm.batch_failed) - {doomed}) > 0  # some items failed, then passed
    assert fake_llm.count("/v1/batches") >= 2
    error = results[4]
    assert isinstance(error, LLMError)
    assert error.reason.startswith("batch item failed: HTTP 500: item broke")
    assert "gave up after 6 batches" in error.reason and SECRET not in str(error) and "***" in error.reason
    assert all(isinstance(r, LLMResult) for i, r in enumerate(results) if i != 4)
    assert fake_llm.batch_failed.count(doomed) == 6  # the first batch and max_retries more
    # The rows that answered are those a direct call gives.
    direct = run(ask_all(client_for(fake_llm, fake_llm.cache_dir.parent / "direct", batch=False), PROMPTS))
    assert all(same(a, b) for i, (a, b) in enumerate(zip(results, direct)) if i != 4)
    assert client.usage.failed_calls == 1 and client.usage.retries == len(fake_llm.batch_failed) - 1


def test_an_expired_batch_resubmits_what_it_left_unanswered(fake_llm: FakeOpenAI) -> None:
    fake_llm.batch_expire_next = 7
    client = client_for(fake_llm)
    results = run(ask_all(client, PROMPTS[:12], structured=False))
    assert all(isinstance(r, LLMResult) for r in results)
    assert fake_llm.count("/v1/batches") == 2
    first, second = fake_llm.batches["batch_fake_1"], fake_llm.batches["batch_fake_2"]
    assert first["status"] == "expired" and first["request_counts"]["completed"] == 7
    assert second["status"] == "completed" and second["request_counts"]["total"] == 5
    assert client.usage.batch_calls == 12 and client.usage.retries == 5


def test_a_request_expired_in_every_batch_fails_with_the_reason(fake_llm: FakeOpenAI) -> None:
    client = client_for(fake_llm, max_retries=1)

    async def go() -> Any:
        fake_llm.batch_expire_next = 0
        first = asyncio.ensure_future(ask_all(client, ["late"], structured=False))
        while fake_llm.count("/v1/batches") < 1:
            await asyncio.sleep(0.01)
        fake_llm.batch_expire_next = 0  # the resubmission expires too
        return await first

    (error,) = run(go())
    assert isinstance(error, LLMError)
    assert error.reason == "batch expired before this request was answered (gave up after 2 batches)"


def test_files_and_batches_calls_are_retried_like_chat_calls(fake_llm: FakeOpenAI) -> None:
    fake_llm.force = ["500", "429", None, "500"]  # the upload twice, then the batch's creation once
    client = client_for(fake_llm)
    results = run(ask_all(client, PROMPTS[:4]))
    assert all(isinstance(r, LLMResult) for r in results)
    assert fake_llm.count("/v1/files") == 3 and fake_llm.count("/v1/batches") == 2
    assert client.usage.retries == 3 and fake_llm.batches["batch_fake_1"]["status"] == "completed"


def test_when_a_batch_cannot_be_sent_every_request_in_it_fails_with_the_reason(
        fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TEST_KEY_ENV, SECRET)
    fake_llm.force = ["500", "500"]
    client = client_for(fake_llm, max_retries=1)
    results = run(ask_all(client, PROMPTS[:3], structured=False))
    assert all(isinstance(r, LLMError) for r in results)
    assert all(r.reason.startswith("batch request failed: HTTP 500: ") and "fake internal error" in r.reason
               and r.reason.endswith("(gave up after 2 attempts)") for r in results)
    assert fake_llm.count("/v1/batches") == 0 and client.usage.failed_calls == 3
    # Nothing failed is cached: the next run sends them again and they are answered.
    again = run(ask_all(client_for(fake_llm), PROMPTS[:3], structured=False))
    assert all(isinstance(r, LLMResult) and not r.cached for r in again)


def test_a_refused_response_format_steps_down_as_in_direct_mode(fake_llm: FakeOpenAI) -> None:
    fake_llm.reject_formats = {"json_schema"}
    client = client_for(fake_llm)
    (result,) = run(ask_all(client, ["x", "structured"]))[1:]
    assert isinstance(result, LLMResult) and isinstance(result.parsed, Answer)
    assert client.usage.structured_modes == {"json_object": 1}
    assert "json_schema" in client.usage.structured_fallbacks["json_object"]
    assert client.usage.retries == 0  # a 400 is not resubmitted


def test_a_batch_call_costs_half_a_direct_call(fake_llm: FakeOpenAI, tmp_path) -> None:
    prices = {"fake-model": {"input": 1.0, "output": 2.0}}
    direct = client_for(fake_llm, tmp_path / "direct", batch=False, prices=prices)
    run(ask_all(direct, ["how much"]))
    batch = client_for(fake_llm, tmp_path / "batch", prices=prices)
    run(ask_all(batch, ["how much"]))
    assert direct.usage.cost_usd > 0 and BATCH_DISCOUNT == 0.5
    assert batch.usage.cost_usd == pytest.approx(direct.usage.cost_usd * 0.5)
    assert batch.usage.batch_calls == 1 and batch.usage.to_dict()["batch_calls"] == 1
    assert "batch_calls" not in direct.usage.to_dict()  # manifests outside batch mode keep their layout
    # A cached replay of the batch's answer is costed at the normal price (the cache value does not
    # say how the answer was made); it is all cached cost, nothing spent.
    replay = client_for(fake_llm, tmp_path / "batch", prices=prices)
    run(ask_all(replay, ["how much"]))
    assert replay.usage.cost_usd == pytest.approx(direct.usage.cost_usd) == pytest.approx(replay.usage.cached_cost_usd)


def test_a_segmentation_stage_in_batch_mode_answers_every_session(run_cfg, fake_llm: FakeOpenAI) -> None:
    sets = ("corpus.limit=1", "stages=[ingest,guidance,segment]", "ray.executor=inline",
            "llm.batch=true", "llm.batch_poll_s=0.01")
    cfg = run_cfg(*sets)
    assert set(Runner(cfg, registry(cfg)).run().values()) == {"ran"}
    sd = StageDir(cfg.run_dir, "segment")
    rows = sd.read_table("segments").to_pylist()
    assert rows and not any(r["fallback"] or r.get("error") for r in rows)
    m = sd.manifest()
    usage = m.llm_usage["segmenter"]
    assert usage.batch_calls == usage.calls == m.stats["sessions"] and usage.failed_calls == 0
    assert fake_llm.count() == 0 and fake_llm.count("/v1/batches") >= 1
    # The rerun of the stage is free: the answers come from the cache.
    sent = requests_made(fake_llm)
    assert Runner(cfg, registry(cfg)).run(force=["segment"])["segment"] == "ran"
    assert requests_made(fake_llm) == sent
    assert sd.read_table("segments").to_pylist() == rows
