"""A third-party library's request, passed through our client as it is (`LLMClient.raw`): the body
goes in, the endpoint's JSON comes out, with everything our own calls get on the way: the call
cache (keyed on the endpoint, the path and the canonical body), the endpoint's concurrency slots,
the budget, retries and the breaker, and the usage and cost of the role and the billed method.

Only the model is ours: the body's `model` (whatever name the library was configured with) is
replaced by the role's, so a library runs against the embedded model, the fake server or any
endpoint the config names, unchanged."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from pipeline.llm.accounting import Accounting
from pipeline.llm.cache import CallCache, make_key
from pipeline.llm.ratelimit import estimate_tokens
from pipeline.llm.answers import MalformedResponse
from pipeline.llm.transport import Transport, prompt_text
from pipeline.llm.types import LLMResult
from pipeline.llm.usage import Usage

# Paths a library may call (relative to the base URL's /v1), and what a usable answer holds.
PATHS = {"/chat/completions": "choices", "/embeddings": "data", "/responses": "output"}


@dataclass(frozen=True)
class Spent:
    prompt: int
    completion: int
    cached_prompt: int


def spent(path: str, answer: dict[str, Any]) -> Spent:
    """Tokens an answer reports: chat and embeddings as prompt / completion tokens, the Responses
    API as input / output tokens."""
    usage = answer.get("usage") or {}
    if path == "/responses":
        details = usage.get("input_tokens_details") or {}
        return Spent(int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0),
                     int(details.get("cached_tokens") or 0))
    details = usage.get("prompt_tokens_details") or {}
    return Spent(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                 int(details.get("cached_tokens") or 0))


def raw_cache_key(endpoint: str, path: str, body: dict[str, Any]) -> str:
    return make_key({"kind": "raw", "endpoint": endpoint, "path": path, "body": body})


def _post(path: str, body: dict[str, Any]) -> Callable[[Any], Awaitable[Any]]:
    async def call(client: Any) -> Any:
        return await client.post(path, cast_to=object, body=body)  # the JSON as sent, no SDK types

    return call


def _read(path: str) -> Callable[[Any], dict[str, Any]]:
    def read(answer: Any) -> dict[str, Any]:
        if not isinstance(answer, dict) or not isinstance(answer.get(PATHS[path]), list):
            raise MalformedResponse(f"no {PATHS[path]!r} in the answer to {path}")
        return answer

    return read


def _text_of(path: str, answer: dict[str, Any]) -> tuple[str, str | None]:
    """The first answer's text and finish reason, for the usage counts (truncated calls)."""
    if path == "/chat/completions" and answer["choices"]:
        choice = answer["choices"][0]
        return str((choice.get("message") or {}).get("content") or ""), choice.get("finish_reason")
    return "", None


class PassThrough:
    """`LLMClient.raw`'s work; one per client."""

    def __init__(self, endpoint: str, model: str, transport: Transport, accounts: Accounting, usage: Usage,
                 cache: CallCache | None) -> None:
        self.endpoint, self.model = endpoint, model
        self.transport, self.accounts, self.usage, self.cache = transport, accounts, usage, cache

    async def send(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if path not in PATHS:
            raise ValueError(f"not a path a library may call through the gateway: {path} (known: {sorted(PATHS)})")
        body = {**body, "model": self.model}
        key = raw_cache_key(self.endpoint, path, body)
        if self.cache is not None:
            hit = await self.cache.get(key)
            if hit is not None:
                answer = hit["answer"]
                self._count(path, answer, cached=True, latency=hit.get("latency_s"))
                return answer
        messages = body.get("messages") or body.get("input") or ""
        est = estimate_tokens(messages if isinstance(messages, list) else [{"content": str(messages)}],
                              body.get("max_tokens") or body.get("max_output_tokens"))
        held = await self.accounts.reserve(self.model, est * 4 // 3 + 8,
                                           int(body.get("max_tokens") or body.get("max_output_tokens") or 0))
        sent = time.monotonic()
        try:
            answer = await self.transport.send(_post(path, body), est, _read(path),
                                               affinity=(lambda: prompt_text(body)) if path == "/chat/completions" else None)
        except BaseException:
            await self.accounts.settle(held, self.model, 0, 0)
            self.accounts.count_call(None)
            raise
        latency = time.monotonic() - sent
        tokens = spent(path, answer)
        await self.accounts.settle(held, self.model, tokens.prompt, tokens.completion, False, tokens.cached_prompt)
        self.usage.requests += 1
        self._count(path, answer, cached=False, latency=latency)
        if self.cache is not None:
            await self.cache.set(key, {"answer": answer, "latency_s": latency})
        return answer

    def _count(self, path: str, answer: dict[str, Any], cached: bool, latency: float | None) -> None:
        tokens = spent(path, answer)
        self.accounts.add_tokens(self.model, tokens.prompt, tokens.completion, cached=cached,
                                 cached_prompt=tokens.cached_prompt)
        text, finish = _text_of(path, answer)
        self.accounts.count_call(LLMResult(text=text, prompt_tokens=tokens.prompt, completion_tokens=tokens.completion,
                                           model=self.model, cached=cached, finish_reason=finish, latency_s=latency))
