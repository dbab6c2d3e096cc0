"""The gateway a third-party library calls (pipeline/llm/gateway.py): the OpenAI shapes passed
through our client as they are, cached, capped, billed to the method its dummy key names, errors
passed back, loopback only."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from conftest import llm_config
from pipeline.llm import DiskCallCache, LLMClient
from pipeline.llm.gateway import Gateway, GatewayErrors
from pipeline.testing.fake_openai import FakeOpenAI

SCHEMA = {"type": "object", "properties": {"facts": {"type": "array", "items": {"type": "string"}}},
          "required": ["facts"], "additionalProperties": False}


def client(fake: FakeOpenAI, tmp: Path, **cfg: Any) -> LLMClient:
    c = llm_config(fake, cache_dir=str(tmp / "cache"), model="our-model",
                   prices={"our-model": {"input": 1.0, "output": 2.0}}, **cfg)
    return LLMClient(c, cache=DiskCallCache(c.cache_dir))


async def fake_embed(texts: list[str]) -> np.ndarray:
    return np.array([[len(t), 1.0, 0.5] for t in texts], dtype=np.float32)


def library(gw: Gateway, method: str = "mem0") -> openai.OpenAI:
    """What a library holds: a sync SDK client on the gateway with the dummy key, its own retries off."""
    return openai.OpenAI(base_url=gw.base_url, api_key=Gateway.api_key(method), max_retries=0)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_chat_json_schema_n_and_embeddings_pass_through_with_our_model_and_are_cached(fake_llm, tmp_path):
    llm = client(fake_llm, tmp_path)

    async def main() -> tuple[Any, ...]:
        async with Gateway(llm, fake_embed) as gw:
            lib = library(gw)

            def calls(c: openai.OpenAI) -> tuple[Any, ...]:
                structured = c.chat.completions.create(
                    model="gpt-4o-mini", messages=[{"role": "user", "content": "extract"}],
                    response_format={"type": "json_schema", "json_schema": {"name": "f", "schema": SCHEMA}})
                two = c.chat.completions.create(model="gpt-4o-mini", n=2,
                                                messages=[{"role": "user", "content": "say"}], seed=1)
                emb = c.embeddings.create(model="text-embedding-3-small", input=["ab", "abcd"], dimensions=3)
                again = c.chat.completions.create(
                    model="gpt-4o-mini", messages=[{"role": "user", "content": "extract"}],
                    response_format={"type": "json_schema", "json_schema": {"name": "f", "schema": SCHEMA}})
                return structured, two, emb, again

            return await gw.call(calls, lib)

    structured, two, emb, again = run(main())
    assert isinstance(json.loads(structured.choices[0].message.content)["facts"], list)
    assert len(two.choices) == 2
    assert [d.embedding for d in emb.data] == [[2.0, 1.0, 0.5], [4.0, 1.0, 0.5]]
    assert again.choices[0].message.content == structured.choices[0].message.content
    chats = [r["body"] for r in fake_llm.requests if r["path"].endswith("/chat/completions")]
    assert len(chats) == 2  # the repeated request came from the cache
    assert {b["model"] for b in chats} == {"our-model"}  # the library's model name is replaced by the role's
    assert llm.usage.calls == 3 and llm.usage.cached_calls == 1
    assert llm.usage.cost_by_method.get("mem0", 0) > 0  # billed to the method the dummy key names


def test_an_endpoint_error_reaches_the_library_and_is_kept_and_a_warm_rerun_sends_nothing(fake_llm, tmp_path):
    fake_llm.force = ["400"]

    async def main(llm: LLMClient) -> tuple[list[str], Any]:
        async with Gateway(llm, fake_embed) as gw:
            def call(c: openai.OpenAI) -> Any:
                try:
                    return c.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
                except openai.APIStatusError as e:
                    return e.status_code

            with pytest.raises(GatewayErrors, match="HTTP 400"):
                await gw.call(call, library(gw))  # the library swallowed the error: the row still fails
            got = 400 if gw.errors else None
            return gw.errors, got

    errors, status = run(main(client(fake_llm, tmp_path)))
    assert status == 400 and len(errors) == 1
    # the same call again succeeds (the error was not cached); once more it is a cache hit
    sent = fake_llm.count()

    async def twice(llm: LLMClient) -> None:
        async with Gateway(llm, fake_embed) as gw:
            for _ in range(2):
                await gw.call(lambda c: c.chat.completions.create(
                    model="x", messages=[{"role": "user", "content": "hi"}]), library(gw))

    run(twice(client(fake_llm, tmp_path)))
    assert fake_llm.count() == sent + 1
    run(twice(client(fake_llm, tmp_path)))  # a fresh client on the same cache: a warm rerun
    assert fake_llm.count() == sent + 1


def test_library_threads_never_hold_more_than_the_cap_in_flight(tmp_path):
    fake = FakeOpenAI(latency_s=0.1).start()
    try:
        llm = client(fake, tmp_path, max_concurrency=2)

        async def main() -> None:
            async with Gateway(llm, fake_embed) as gw:
                lib = library(gw)
                await asyncio.gather(*(gw.call(lambda i=i: lib.chat.completions.create(
                    model="x", messages=[{"role": "user", "content": f"q{i}"}])) for i in range(8)))

        run(main())
        assert fake.count() == 8 and fake.max_in_flight <= 2
    finally:
        fake.stop()


def test_the_gateway_listens_on_loopback_only_and_refuses_a_mismatched_embedding_size(fake_llm, tmp_path):
    async def main() -> tuple[str, list[str]]:
        async with Gateway(client(fake_llm, tmp_path), fake_embed) as gw:
            host = gw.address[0]
            with pytest.raises(openai.BadRequestError, match="dimensions"):
                await gw.call(lambda c: c.embeddings.create(model="e", input=["x"], dimensions=1536), library(gw))
            return host, gw.errors

    host, errors = run(main())
    assert host == "127.0.0.1" and len(errors) == 1
    from pipeline.llm.gateway import _loopback
    assert _loopback("127.0.0.1") and _loopback("::1") and not _loopback("10.1.2.3") and not _loopback(None)


def test_tool_calls_logprobs_and_the_responses_api_come_back_in_the_libraries_shapes(fake_llm, tmp_path):
    tool = {"type": "function", "function": {"name": "add_memory", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}

    async def main() -> tuple[Any, ...]:
        async with Gateway(client(fake_llm, tmp_path), fake_embed) as gw:
            def calls(c: openai.OpenAI) -> tuple[Any, ...]:
                tooled = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "remember"}],
                                                   tools=[tool], tool_choice="required")
                scored = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "rate"}],
                                                   logprobs=True, top_logprobs=2)
                answered = c.responses.create(model="x", input="summarise", instructions="be brief")
                return tooled, scored, answered

            return await gw.call(calls, library(gw))

    tooled, scored, answered = run(main())
    call = tooled.choices[0].message.tool_calls[0]
    assert call.function.name == "add_memory" and isinstance(json.loads(call.function.arguments)["text"], str)
    assert all(len(t.top_logprobs) == 2 for t in scored.choices[0].logprobs.content)
    assert answered.output_text
    paths = [r["path"] for r in fake_llm.requests]
    assert paths.count("/v1/responses") == 1 and paths.count("/v1/chat/completions") == 2
