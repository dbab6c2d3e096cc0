"""LLMClient against the fake OpenAI server: cache, retries, faults, structured outputs, pacing."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from conftest import TEST_KEY_ENV, LateSecondReads, llm_config
from pipeline.testing.fake_openai import FakeOpenAI
from pipeline.config import LLMConfig
from pipeline.errors import ConfigError
from pipeline.llm import (DiskCallCache, LLMClient, LLMError, LLMResult, LocalRateLimiter, Usage, cache_stats,
                          export_cache, import_cache, resolve_api_key)
from pipeline.llm.cache import chat_cache_key
from pipeline.llm.client import MalformedResponse, parse_retry_after
from pipeline.llm.answers import read_embeddings
from pipeline.llm.structured import response_format_for, strict_json_schema
from pipeline.llm.ratelimit import PacingSchedule, estimate_tokens

SECRET = "sk-test-SECRET-7f3a9c1e5b2d4680"


def msgs(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You are terse."}, {"role": "user", "content": text}]


def client_for(server: FakeOpenAI, cache: bool = True, limiter: LocalRateLimiter | None = None,
               retry_samples: int = 0, **overrides: Any) -> LLMClient:
    cfg = llm_config(server, **overrides)
    return LLMClient(cfg, cache=DiskCallCache(cfg.cache_dir) if cache else None,
                     limiter=limiter if limiter is not None else LocalRateLimiter(cfg.rpm, cfg.tpm),
                     retry_samples=retry_samples)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))  # nothing in these tests may hang


class Kind(str, Enum):
    fact = "fact"
    event = "event"


class Memory(BaseModel):
    text: str = Field(description="the memory")
    kind: Kind
    confidence: float = 0.5
    turns: list[int]


class Extraction(BaseModel):
    memories: list[Memory]
    speaker: Literal["user", "agent"]
    note: str | None = None
    main: Memory = Field(description="the most important one")


class Answer(BaseModel):
    answer: str
    n: int


# ------------------------------------------------------------------ cache


def test_cached_rerun_sends_nothing_and_still_reports_tokens(fake_llm: FakeOpenAI) -> None:
    prompts = [f"question {i}" for i in range(10)]

    async def go(client: LLMClient) -> list[LLMResult]:
        try:
            return list(await asyncio.gather(*(client.chat(msgs(p)) for p in prompts)))
        finally:
            await client.aclose()

    cold = client_for(fake_llm)
    first = run(go(cold))
    assert fake_llm.count() == 10 and not any(r.cached for r in first)
    assert cold.usage.calls == 10 and cold.usage.cached_calls == 0 and cold.usage.prompt_tokens > 0

    warm = client_for(fake_llm)  # a new process would see the same: the cache is on disk
    second = run(go(warm))
    assert fake_llm.count() == 10  # zero new requests
    assert [r.text for r in second] == [r.text for r in first]
    assert all(r.cached for r in second)
    assert warm.usage.cached_calls == 10 and warm.usage.calls == 10
    assert (warm.usage.prompt_tokens, warm.usage.completion_tokens) == \
        (cold.usage.prompt_tokens, cold.usage.completion_tokens)


def test_identical_requests_in_flight_are_sent_once(fake_llm: FakeOpenAI) -> None:
    """Two rows with one prompt, asked at once: one request, one answer for both (the twin counts as
    a cached call); without a cache every call is its own request."""
    fake_llm.latency_s = 0.2

    async def go(client: LLMClient) -> list[LLMResult]:
        try:
            return list(await asyncio.gather(*(client.chat(msgs(p)) for p in ["same", "same", "same", "other"])))
        finally:
            await client.aclose()

    client = client_for(fake_llm)
    results = run(go(client))
    assert fake_llm.count() == 2
    assert results[0].text == results[1].text == results[2].text != results[3].text
    assert sorted(r.cached for r in results[:3]) == [False, True, True] and not results[3].cached
    assert client.usage.calls == 4 and client.usage.cached_calls == 2

    uncached = client_for(fake_llm, cache=False)
    run(go(uncached))
    assert fake_llm.count() == 2 + 4


def test_each_loop_client_reuses_the_process_tls_context_and_platform(fake_llm: FakeOpenAI) -> None:
    """Stages run one event loop per shard; each loop's HTTP client reuses the TLS context and the
    platform headers found once per process instead of rebuilding them (bench/throughput.py)."""
    client = client_for(fake_llm, cache=False)

    async def ask(text: str) -> tuple[Any, LLMResult]:
        try:
            result = await client.chat(msgs(text))
            return (await client.transport._state()).clients, result
        finally:
            await client.aclose()

    first, a = run(ask("one"))
    second, b = run(ask("two"))
    assert not set(map(id, first)) & set(map(id, second)) and a.text != b.text and fake_llm.count() == 2
    every = first + second
    assert len({id(c._client._transport._pool._ssl_context) for c in every}) == 1
    assert every[0]._platform is not None and all(c._platform is every[0]._platform for c in every)


def test_requests_in_flight_are_spread_over_pools_of_at_most_32(fake_llm: FakeOpenAI, monkeypatch) -> None:
    """httpcore scans its whole pool on every event: 256 requests in one pool cost ~7 ms of CPU a
    call, in pools of 32 ~4 ms; every pool is used in turn."""
    from pipeline.llm import transport as transport_module

    used: list[int] = []
    take = transport_module._LoopState.next_client
    monkeypatch.setattr(transport_module._LoopState, "next_client", lambda st: used.append(id(c := take(st))) or c)
    client = client_for(fake_llm, cache=False, max_concurrency=80)

    async def go() -> list[Any]:
        try:
            await asyncio.gather(*(client.chat(msgs(f"q{i}")) for i in range(6)))
            return (await client.transport._state()).clients
        finally:
            await client.aclose()

    pools = run(go())
    assert len(pools) == 3 and len(set(map(id, pools))) == 3 and fake_llm.count() == 6
    assert sorted(used) == sorted([id(p) for p in pools] * 2)  # each pool took two of the six


def test_a_twin_whose_cache_read_is_older_than_the_first_reply_is_not_sent(fake_llm: FakeOpenAI, tmp_path) -> None:
    """One row's cache read started before the other row's reply was stored, and answers after
    that request stopped being in flight: it reads again rather than pay twice."""
    cfg = llm_config(fake_llm, cache_dir=str(tmp_path))
    client = LLMClient(cfg, cache=LateSecondReads(cfg.cache_dir), limiter=LocalRateLimiter(cfg.rpm, cfg.tpm))

    async def go() -> list[LLMResult]:
        first = asyncio.ensure_future(client.chat(msgs("same")))
        await asyncio.sleep(0)  # the first row's read goes first and answers at once
        try:
            return list(await asyncio.gather(first, client.chat(msgs("same"))))
        finally:
            await client.aclose()

    results = run(go())
    assert fake_llm.count() == 1 and results[0].text == results[1].text
    assert sorted(r.cached for r in results) == [False, True]


def test_a_twin_of_a_failed_request_is_sent_on_its_own(fake_llm: FakeOpenAI) -> None:
    fake_llm.latency_s = 0.2
    fake_llm.force = ["500"]  # the first request fails for good (no retries); its twin then asks itself
    client = client_for(fake_llm, max_retries=0)

    async def go() -> list[Any]:
        try:
            return list(await asyncio.gather(client.chat(msgs("same")), client.chat(msgs("same")),
                                             return_exceptions=True))
        finally:
            await client.aclose()

    outcomes = run(go())
    assert sorted(type(o).__name__ for o in outcomes) == ["LLMError", "LLMResult"]
    assert not [o for o in outcomes if isinstance(o, LLMResult)][0].cached
    assert fake_llm.count() == 2


def test_cache_key_covers_what_determines_the_answer() -> None:
    rf = response_format_for(Answer)
    base = dict(endpoint="http://h/v1", model="m", messages=msgs("x"),
                params={"temperature": 0.0, "max_tokens": 10, "seed": 0}, response_format=None, sample=0)
    k0 = chat_cache_key(**base)
    assert chat_cache_key(**base) == k0
    variants = [
        {"model": "m2"}, {"endpoint": "http://other/v1"}, {"messages": msgs("y")},
        {"params": {"temperature": 0.7, "max_tokens": 10, "seed": 0}},
        {"params": {"temperature": 0.0, "max_tokens": 11, "seed": 0}},
        {"params": {"temperature": 0.0, "max_tokens": 10, "seed": 1}},
        {"response_format": rf}, {"sample": 1},
    ]
    keys = {chat_cache_key(**{**base, **v}) for v in variants}
    assert len(keys) == len(variants) and k0 not in keys
    # dict order does not matter: canonical JSON
    assert chat_cache_key(**{**base, "params": {"seed": 0, "max_tokens": 10, "temperature": 0.0}}) == k0


def test_cache_hits_ignore_api_key_but_not_endpoint_or_sampling(fake_llm: FakeOpenAI) -> None:
    cfg = llm_config(fake_llm)

    async def ask(client: LLMClient, **kw: Any) -> LLMResult:
        try:
            return await client.chat(msgs("same question"), **kw)
        finally:
            await client.aclose()

    def new(api_key: str, **overrides: Any) -> LLMClient:
        c = llm_config(fake_llm, **overrides)
        return LLMClient(c, cache=DiskCallCache(cfg.cache_dir), api_key=api_key)

    r1 = run(ask(new("key-one-aaaaaaaa")))
    r2 = run(ask(new("key-two-bbbbbbbb")))
    assert fake_llm.count() == 1 and r2.cached and r2.text == r1.text
    assert {r["auth"] for r in fake_llm.requests} == {"Bearer key-one-aaaaaaaa"}

    run(ask(new("k", base_url=fake_llm.base_url + "/")))  # same endpoint spelled with a slash
    assert fake_llm.count() == 1
    run(ask(new("k", base_url=fake_llm.base_url.replace("127.0.0.1", "localhost"))))
    assert fake_llm.count() == 2
    run(ask(new("k", model="other-model")))
    assert fake_llm.count() == 3
    run(ask(new("k"), temperature=0.5))
    assert fake_llm.count() == 4
    run(ask(new("k"), temperature=0))  # int 0 and the configured 0.0 are the same setting
    assert fake_llm.count() == 4
    run(ask(new("k"), schema=Answer))
    assert fake_llm.count() == 5
    r_s1 = run(ask(new("k"), sample=1))
    assert fake_llm.count() == 6 and r_s1.text != r1.text


def test_samples_get_their_own_seed_and_params_override_config(fake_llm: FakeOpenAI) -> None:
    client = client_for(fake_llm, seed=10, temperature=0.2, max_tokens=50)

    async def go() -> None:
        await client.chat(msgs("q"))
        await client.chat(msgs("q"), sample=3, temperature=0.9, max_tokens=7, stop=["\n"])
        await client.aclose()

    run(go())
    b0, b1 = (r["body"] for r in fake_llm.requests)
    assert (b0["seed"], b0["temperature"], b0["max_tokens"]) == (10, 0.2, 50)
    assert (b1["seed"], b1["temperature"], b1["max_tokens"], b1["stop"]) == (13, 0.9, 7, ["\n"])
    assert "top_p" not in b0  # unset params are not sent


# ------------------------------------------------------------------ structured outputs


def test_structured_output_is_parsed_with_a_strict_schema(fake_llm: FakeOpenAI) -> None:
    client = client_for(fake_llm)
    result = run(client.chat(msgs("extract"), schema=Extraction))
    assert isinstance(result.parsed, Extraction)
    assert result.parsed.memories and result.parsed.main.kind in Kind
    rf = fake_llm.requests[0]["body"]["response_format"]
    assert rf["type"] == "json_schema" and rf["json_schema"]["strict"] is True
    assert rf["json_schema"]["name"] == "Extraction"
    memory = rf["json_schema"]["schema"]["$defs"]["Memory"]
    assert memory["additionalProperties"] is False
    assert memory["required"] == ["text", "kind", "confidence", "turns"]
    # cached replay gives the same parsed object
    again = run(client_for(fake_llm).chat(msgs("extract"), schema=Extraction))
    assert again.cached and again.parsed == result.parsed


def test_strict_schema_keeps_properties_named_like_keywords() -> None:
    class Odd(BaseModel):
        default: int = 3
        items: list[str] = []

    s = strict_json_schema(Odd.model_json_schema())
    assert set(s["properties"]) == {"default", "items"} and s["required"] == ["default", "items"]
    assert "default" not in s["properties"]["default"]


def test_structured_output_tolerates_code_fences(fake_llm: FakeOpenAI) -> None:
    fake_llm.responder = lambda body: 'Sure:\n```json\n{"answer": "yes", "n": 2}\n```'
    result = run(client_for(fake_llm).chat(msgs("q"), schema=Answer))
    assert result.parsed == Answer(answer="yes", n=2)


def test_invalid_answer_is_reasked_with_the_error(fake_llm: FakeOpenAI) -> None:
    def responder(body: dict[str, Any]) -> str:
        # First ask: a wrong type; a re-ask (conversation grew) gets a valid answer.
        return '{"answer": "x", "n": "many"}' if len(body["messages"]) == 2 else '{"answer": "x", "n": 4}'

    fake_llm.responder = responder
    client = client_for(fake_llm)
    result = run(client.chat(msgs("q"), schema=Answer))
    assert result.parsed == Answer(answer="x", n=4)
    assert fake_llm.count() == 2 and client.usage.reasks == 1 and client.usage.calls == 1
    reask = fake_llm.requests[1]["body"]["messages"]
    assert reask[2] == {"role": "assistant", "content": '{"answer": "x", "n": "many"}'}
    assert "n:" in reask[3]["content"] and "integer" in reask[3]["content"]
    # tokens of both attempts are paid, stored and replayed
    assert result.prompt_tokens == client.usage.prompt_tokens > 0
    replay = run(client_for(fake_llm).chat(msgs("q"), schema=Answer))
    assert replay.cached and replay.prompt_tokens == result.prompt_tokens


def test_validator_failure_exhausts_reasks_then_llmerror_with_raw(fake_llm: FakeOpenAI) -> None:
    def validate(a: Answer) -> None:
        if a.n < 100:
            raise ValueError(f"n must be at least 100, got {a.n}")

    client = client_for(fake_llm, structured_retries=2)
    with pytest.raises(LLMError) as ei:
        run(client.chat(msgs("q"), schema=Answer, validate=validate))
    assert fake_llm.count() == 3  # first ask + 2 re-asks
    assert "n must be at least 100" in ei.value.reason
    assert ei.value.raw is not None and json.loads(ei.value.raw)["n"] < 100
    assert client.usage.failed_calls == 1 and client.usage.calls == 0
    assert "n must be at least 100" in fake_llm.requests[2]["body"]["messages"][-1]["content"]
    # Every raw answer was cached, invalid ones too: a rerun replays the conversation for free.
    again = client_for(fake_llm)
    with pytest.raises(LLMError) as ei2:
        run(again.chat(msgs("q"), schema=Answer, validate=validate))
    assert fake_llm.count() == 3 and ei2.value.reason == ei.value.reason and ei2.value.raw == ei.value.raw
    # Retry mode (--retry-failed) asks again with a new sample index, so a new seed.
    retry = client_for(fake_llm, retry_samples=1)
    with pytest.raises(LLMError):
        run(retry.chat(msgs("q"), schema=Answer, validate=validate))
    assert fake_llm.count() == 6
    assert {r["body"]["seed"] for r in fake_llm.requests[3:]} == {fake_llm.requests[0]["body"]["seed"] + 1}


def test_stricter_validator_rejects_a_cached_answer(fake_llm: FakeOpenAI) -> None:
    run(client_for(fake_llm).chat(msgs("q"), schema=Answer))
    fake_llm.responder = lambda body: '{"answer": "new", "n": 500}'

    def validate(a: Answer) -> None:
        if a.n < 100:
            raise ValueError("too small")

    r = run(client_for(fake_llm).chat(msgs("q"), schema=Answer, validate=validate))
    assert not r.cached and r.parsed.n == 500 and fake_llm.count() == 2


# ------------------------------------------------------------------ transport faults


def test_faults_every_call_answered_or_failed_with_reason(fake_llm: FakeOpenAI) -> None:
    fake_llm.faults = {"429": 0.04, "500": 0.04, "timeout": 0.03, "malformed": 0.04}
    fake_llm.retry_after_s = 0.1
    client = client_for(fake_llm, cache=False, timeout_s=0.5, max_retries=3, max_concurrency=16)

    async def one(i: int) -> LLMResult | LLMError:
        try:
            if i % 4:
                return await client.chat(msgs(f"structured {i}"), schema=Answer)
            return await client.chat(msgs(f"plain {i}"))
        except LLMError as e:
            return e

    async def go() -> list[LLMResult | LLMError]:
        out = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(100))), 45)
        await client.aclose()
        return out

    t0 = time.monotonic()
    results = run(go())
    assert time.monotonic() - t0 < 45
    assert len(results) == 100
    failed = [r for r in results if isinstance(r, LLMError)]
    answered = [r for r in results if isinstance(r, LLMResult)]
    assert all(f.reason for f in failed)
    assert all(r.parsed is not None for i, r in enumerate(results) if i % 4 and isinstance(r, LLMResult))
    # every kind of fault happened, and retries recovered nearly everything
    assert {"429", "500", "timeout", "malformed"} <= set(fake_llm.outcomes)
    assert fake_llm.total > 100 and client.usage.retries > 0
    # each malformed structured answer was re-asked, unless it was the last allowed attempt
    malformed = sum(1 for r in fake_llm.requests if r["outcome"] == "malformed" and "response_format" in r["body"])
    invalid = sum(1 for f in failed if "invalid structured output" in f.reason)
    assert client.usage.reasks + invalid == malformed
    assert len(answered) >= 95
    assert client.usage.calls == len(answered) and client.usage.failed_calls == len(failed)


def test_server_errors_are_retried_then_reported(fake_llm: FakeOpenAI) -> None:
    fake_llm.faults = {"500": 1.0}
    client = client_for(fake_llm, max_retries=2)
    with pytest.raises(LLMError) as ei:
        run(client.chat(msgs("q")))
    assert fake_llm.count() == 3 and "500" in ei.value.reason and "3 attempts" in ei.value.reason
    assert client.usage.retries == 2 and client.usage.failed_calls == 1


@pytest.mark.parametrize("fault", ["html", "badjson", "nochoices"])
def test_a_broken_200_body_is_retried_like_a_server_error(fake_llm: FakeOpenAI, fault: str) -> None:
    fake_llm.force = [fault, fault]  # two broken bodies, then a good one
    client = client_for(fake_llm, max_retries=2)
    result = run(client.chat(msgs("q")))
    assert result.text.startswith("fake reply") and fake_llm.count() == 3 and client.usage.retries == 2
    fake_llm.faults = {fault: 1.0}
    with pytest.raises(LLMError) as ei:
        run(client.chat(msgs("another")))
    assert "malformed response" in ei.value.reason and "3 attempts" in ei.value.reason
    assert client.usage.failed_calls == 1


def test_a_broken_embeddings_body_is_retried(fake_llm: FakeOpenAI) -> None:
    fake_llm.force = ["html", "nochoices"]
    client = client_for(fake_llm, max_retries=2)
    vectors = run(client.embed(["a", "b"], "fake-embed"))
    # Vectors come as base64 float32, so they equal the server's to float32 precision.
    assert vectors[0] == pytest.approx(fake_llm.vector("a"), abs=1e-6)
    assert vectors[1] == pytest.approx(fake_llm.vector("b"), abs=1e-6) and fake_llm.count("/v1/embeddings") == 3


def test_an_embeddings_answer_is_read_in_base64_or_as_numbers_in_input_order() -> None:
    import base64
    import struct

    packed = base64.b64encode(struct.pack("<2f", 0.5, -0.25)).decode()
    answer = {"data": [{"index": 1, "embedding": [1, 2]}, {"index": 0, "embedding": packed}],
              "usage": {"prompt_tokens": 7}}
    assert read_embeddings(answer, 2) == ([[0.5, -0.25], [1.0, 2.0]], 7)
    with pytest.raises(MalformedResponse):
        read_embeddings(answer, 3)
    with pytest.raises(MalformedResponse):
        read_embeddings({"data": [{"index": 0, "embedding": "not base64!"}]}, 1)


def test_client_errors_are_not_retried(fake_llm: FakeOpenAI) -> None:
    fake_llm.faults = {"400": 1.0}
    client = client_for(fake_llm, max_retries=5)
    with pytest.raises(LLMError) as ei:
        run(client.chat(msgs("q")))
    assert fake_llm.count() == 1 and "HTTP 400" in ei.value.reason and client.usage.retries == 0


def test_retry_after_is_honoured_and_pauses_everyone_sharing_the_limiter(fake_llm: FakeOpenAI) -> None:
    fake_llm.retry_after_s = 1
    fake_llm.force = ["429"]  # whichever request arrives first
    # b's slot is 500 ms after a's: reserved before the 429, inside its 1 s pause, and late enough
    # that a's first request (which pays the HTTP client's one-time set-up) is out before it
    limiter = LocalRateLimiter(rpm=120)
    a = client_for(fake_llm, limiter=limiter, backoff_max_s=0.01)
    b = client_for(fake_llm, limiter=limiter, backoff_max_s=0.01)

    async def go() -> None:
        await asyncio.gather(a.chat(msgs("first")), b.chat(msgs("second")))

    run(go())
    first, *rest = sorted(fake_llm.requests, key=lambda r: r["t"])
    retry, = (r for r in rest if r["body"] == first["body"])
    other, = (r for r in rest if r["body"] != first["body"])
    assert first["outcome"] == "429" and retry["outcome"] is None
    assert retry["t"] - first["t"] >= 0.95  # the server's Retry-After, not the 10 ms backoff
    assert other["t"] - first["t"] >= 0.95  # b's slot fell in the pause: it waited too
    assert a.usage.retries + b.usage.retries == 1


def test_retry_after_parsing() -> None:
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # in the past
    assert parse_retry_after({"retry-after": "soon"}) is None and parse_retry_after({}) is None


def test_concurrency_is_bounded_per_client(fake_llm: FakeOpenAI) -> None:
    fake_llm.latency_s = 0.2
    client = client_for(fake_llm, cache=False, max_concurrency=3)

    async def go() -> None:
        await asyncio.gather(*(client.chat(msgs(f"q{i}")) for i in range(12)))
        await client.aclose()

    t0 = time.monotonic()
    run(go())
    assert fake_llm.max_in_flight == 3
    assert time.monotonic() - t0 >= 0.75  # 4 rounds of 0.2 s


def test_client_works_across_event_loops(fake_llm: FakeOpenAI) -> None:
    client = client_for(fake_llm, cache=False)
    assert run(client.chat(msgs("a"))).text
    assert run(client.chat(msgs("b"))).text  # a second asyncio.run: a fresh HTTP pool
    assert fake_llm.count() == 2


# ------------------------------------------------------------------ secrets, usage, config


def test_api_key_never_leaves_the_environment(fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(TEST_KEY_ENV, SECRET)
    caplog.set_level(logging.DEBUG, logger="pipeline")
    cfg = llm_config(fake_llm, prices={"fake-model": {"input": 1.0, "output": 2.0}}, max_retries=1)
    client = LLMClient(cfg, cache=DiskCallCache(cfg.cache_dir))
    fake_llm.force = [None, "malformed", None, None, "500", "500", "400"]

    async def go() -> list[str]:
        errors = []
        await client.chat(msgs("plain"))
        await client.chat(msgs("structured"), schema=Answer)
        await client.embed(["one", "two"], "fake-embed")
        for text in ("fails", "bad request"):
            try:
                await client.chat(msgs(text))
            except LLMError as e:
                errors.append(f"{e} {e.reason} {e.raw} {e!r}")
        await client.aclose()
        return errors

    errors = run(go())
    assert len(errors) == 2
    assert {r["auth"] for r in fake_llm.requests} == {f"Bearer {SECRET}"}  # it is sent...
    export = tmp_path / "export.parquet"
    export_cache(cfg.cache_dir, export)
    blobs = [p.read_bytes() for p in Path(cfg.cache_dir).rglob("*") if p.is_file()] + [export.read_bytes()]
    assert blobs and all(SECRET.encode() not in b for b in blobs)  # ...and stored nowhere
    texts = [repr(client), str(client.usage), json.dumps(client.usage.to_dict()), caplog.text, *errors]
    assert all(SECRET not in t for t in texts)
    with pytest.raises(TypeError):
        import pickle
        pickle.dumps(client)


def test_usage_counts_cost_and_round_trips(fake_llm: FakeOpenAI) -> None:
    prices = {"fake-model": {"input": 1.0, "output": 2.0}}
    cold = client_for(fake_llm, prices=prices)
    run(cold.chat(msgs("how much")))
    u = cold.usage
    assert u.cost_usd == pytest.approx((u.prompt_tokens * 1.0 + u.completion_tokens * 2.0) / 1e6)
    assert u.cost_usd > 0 and u.cached_cost_usd == 0
    warm = client_for(fake_llm, prices=prices)
    run(warm.chat(msgs("how much")))
    assert warm.usage.cached_cost_usd == pytest.approx(u.cost_usd) == pytest.approx(warm.usage.cost_usd)
    total = Usage().merge(cold.usage).merge(warm.usage)
    assert total.calls == 2 and total.cached_calls == 1
    assert Usage.from_dict({**total.to_dict(), "unknown": 1}) == total


def test_resolve_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TEST_KEY_ENV, SECRET)
    assert resolve_api_key(LLMConfig(provider="openai", api_key_env=TEST_KEY_ENV)) == SECRET
    assert resolve_api_key(LLMConfig(provider="local", api_key_env=TEST_KEY_ENV)) == "not-needed"
    monkeypatch.delenv(TEST_KEY_ENV)
    assert resolve_api_key(LLMConfig(provider="openai", api_key_env=TEST_KEY_ENV,
                                     base_url="http://127.0.0.1:1/v1")) == "not-needed"
    with pytest.raises(ConfigError, match=r"llm\.api_key_env.*MEMPIPE_TEST_LLM_KEY"):
        resolve_api_key(LLMConfig(provider="openai", api_key_env=TEST_KEY_ENV))
    with pytest.raises(ConfigError, match=r"judge\.api_key_env"):
        LLMClient(LLMConfig(provider="openai", api_key_env=TEST_KEY_ENV), section="judge")


# ------------------------------------------------------------------ embeddings, export


def test_embeddings_are_cached_per_text(fake_llm: FakeOpenAI) -> None:
    async def go() -> tuple[list[list[float]], list[list[float]]]:
        c = client_for(fake_llm)
        first = await c.embed(["alpha", "beta", "alpha"], "fake-embed")
        second = await client_for(fake_llm).embed(["beta", "gamma"], "fake-embed")
        return first, second

    first, second = run(go())
    assert first[0] == first[2] == pytest.approx(fake_llm.vector("alpha"), abs=1e-6)
    assert second[0] == first[1] and len(second[1]) == 16
    sent = [r["body"]["input"] for r in fake_llm.requests]
    assert sent == [["alpha", "beta"], ["gamma"]]  # duplicates once; cached text not re-sent


def test_export_import_replays_offline_with_zero_requests(fake_llm: FakeOpenAI, tmp_path: Path) -> None:
    async def work(client: LLMClient) -> list[Any]:
        out: list[Any] = [(await client.chat(msgs(f"q{i}"))).text for i in range(3)]
        out.append((await client.chat(msgs("s"), schema=Answer)).parsed)
        out.append(await client.embed(["e1", "e2"], "fake-embed"))
        await client.aclose()
        return out

    original = run(work(client_for(fake_llm)))
    sent = fake_llm.total
    parquet = tmp_path / "calls.parquet"
    # 4 chat answers, 2 vectors, and the structured mode the endpoint took (json_schema, confirmed)
    assert export_cache(fake_llm.cache_dir, parquet) == 7  # type: ignore[attr-defined]
    elsewhere = tmp_path / "imported"
    assert import_cache(parquet, elsewhere) == 7
    replay_client = LLMClient(llm_config(fake_llm, cache_dir=str(elsewhere)), cache=DiskCallCache(elsewhere))
    assert run(work(replay_client)) == original
    assert fake_llm.total == sent and replay_client.usage.cached_calls == 6
    stats = cache_stats(elsewhere)
    assert stats["entries"] == 7 and stats["size_bytes"] > 0
    assert stats["per_model"] == {"fake-model": 5, "fake-embed": 2}
    assert stats["per_kind"] == {"chat": 4, "embed": 2, "structured_mode": 1}


# ------------------------------------------------------------------ pacing


def test_pacing_schedule_spaces_requests_and_tokens() -> None:
    s = PacingSchedule(rpm=60)
    assert [s.reserve(1, now=0.0) for _ in range(4)] == [0.0, 1.0, 2.0, 3.0]
    assert s.reserve(1, now=10.0) == 0.0  # idle time does not bank a burst
    assert s.reserve(1, now=10.0) == 1.0

    t = PacingSchedule(tpm=600, token_burst_s=1.0)  # 10 tokens / s
    assert t.reserve(20, now=0.0) == 0.0
    assert t.reserve(20, now=0.0) == pytest.approx(1.0)  # 2 s of tokens booked, 1 s tolerated
    assert t.reserve(5, now=0.0) == pytest.approx(3.0)

    p = PacingSchedule()
    p.pause(2.0, now=5.0)
    assert p.paused_for(now=6.0) == pytest.approx(1.0) and p.paused_for(now=7.5) == 0.0
    assert p.reserve(1, now=5.5) == pytest.approx(1.5) and p.reserve(1, now=8.0) == 0.0
    assert estimate_tokens(msgs("x" * 40), 100) == (len("You are terse.") + 40) // 4 + 100


def test_local_limiter_holds_rpm_in_any_window(fake_llm: FakeOpenAI) -> None:
    client = client_for(fake_llm, cache=False, rpm=1200, max_concurrency=8)  # one per 50 ms

    async def go() -> None:
        await client.chat(msgs("warm-up"))  # the HTTP client's one-time set-up delays only its first send
        fake_llm.reset()
        await asyncio.gather(*(client.chat(msgs(f"r{i}")) for i in range(20)))
        await client.aclose()

    run(go())
    ts = sorted(fake_llm.timestamps)
    assert ts[-1] - ts[0] >= 19 * 0.05 * 0.95
    # 0.5 s holds 10 slots (+1 at the edge, +1 for a send a loaded machine woke late); unpaced, all 20 at once
    assert max(sum(1 for u in ts if t <= u < t + 0.5) for t in ts) <= 12


# ------------------------------------------------------------------ structured modes


def test_auto_mode_steps_down_to_json_object_when_json_schema_is_rejected(fake_llm: FakeOpenAI) -> None:
    fake_llm.reject_formats = {"json_schema"}
    client = client_for(fake_llm)
    r = run(client.chat(msgs("q"), schema=Answer))
    assert isinstance(r.parsed, Answer)
    kinds = [(req["body"].get("response_format") or {}).get("type") for req in fake_llm.requests]
    assert kinds == ["json_schema", "json_object"]
    assert "JSON schema" in fake_llm.requests[1]["body"]["messages"][-1]["content"]
    assert client.usage.structured_modes == {"json_object": 1} and client.usage.failed_calls == 0
    # The mode is remembered: this client and a new one on the same cache go straight to json_object.
    run(client.chat(msgs("other"), schema=Answer))
    run(client_for(fake_llm).chat(msgs("third"), schema=Answer))
    assert [(req["body"].get("response_format") or {}).get("type") for req in fake_llm.requests[2:]] == [
        "json_object", "json_object"]


def test_auto_mode_reaches_prompt_mode_and_parses_json_out_of_prose(fake_llm: FakeOpenAI) -> None:
    fake_llm.reject_formats = {"json_schema", "json_object"}
    client = client_for(fake_llm)
    r = run(client.chat(msgs("q"), schema=Answer))
    assert isinstance(r.parsed, Answer) and not r.text.lstrip().startswith("{")
    assert "response_format" not in fake_llm.requests[-1]["body"] and client.usage.structured_modes == {"prompt": 1}


def test_a_fixed_mode_never_steps_down(fake_llm: FakeOpenAI) -> None:
    fake_llm.reject_formats = {"json_schema"}
    client = client_for(fake_llm, structured_mode="json_schema")
    with pytest.raises(LLMError) as ei:
        run(client.chat(msgs("q"), schema=Answer))
    assert ei.value.status == 400 and fake_llm.count() == 1
    ok = run(client_for(fake_llm, structured_mode="json_object").chat(msgs("q"), schema=Answer))
    assert isinstance(ok.parsed, Answer) and fake_llm.requests[-1]["body"]["response_format"] == {"type": "json_object"}


def test_first_json_object_is_taken_from_text() -> None:
    from pipeline.llm.structured import extract_json

    assert extract_json('Sure: {"a": 1} and also {"b": 2}') == {"a": 1}
    assert extract_json('noise {not json} then {"a": [1, {"b": 2}]} tail }') == {"a": [1, {"b": 2}]}
    with pytest.raises(ValueError):
        extract_json("no json here")
