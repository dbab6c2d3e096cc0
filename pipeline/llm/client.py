"""`LLMClient`: the one chat / embedding client (cached, rate-limited, retried, accounted).

The client is the facade; each job has its own module:
- pipeline.llm.transport: sending one request (the SDK, retries, the breaker, reading answers, the key);
- pipeline.llm.structured: structured calls, their re-asks and the structured mode of an endpoint;
- pipeline.llm.samples: a prompt's samples as one request with `n` (`chat_samples`);
- pipeline.llm.embed: embeddings; pipeline.llm.accounting: cost, budget and counts;
- pipeline.llm.passthrough: a third-party library's request as it is (`raw`, for the gateway);
- pipeline.llm.params: sampling parameters, and those the endpoint refused (a rejected `seed` is
  dropped from the (endpoint, model)'s requests from then on).

What stays here is the exact request below them all: the cache sits below validation, so every HTTP
request is cached with its raw answer (see pipeline.llm.structured); only transport failures stay
uncached. Two identical requests in flight at once share one answer. Prompt tokens the endpoint
served from its prompt cache (`usage.prompt_tokens_details.cached_tokens`) are recorded and billed
at the model's `cached_input` price.

The API key comes from the environment only. It is held by the transport and the SDK client, and
never enters cache keys, cache values, usage, reprs, exception messages or logs.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any, Callable, Sequence

from pydantic import BaseModel

from pipeline.config import LLMConfig
from pipeline.errors import ConfigError
from pipeline.llm.accounting import Accounting
from pipeline.llm.answers import MalformedResponse
from pipeline.llm.batch import queue_for
from pipeline.llm.cache import CallCache, Reply, StaleMisses, chat_cache_key
from pipeline.llm.embed import EMBED_BATCH, Embedder
from pipeline.llm.identity import endpoint_identity
from pipeline.llm.params import RefusedParams, sampling_params
from pipeline.llm.passthrough import PassThrough
from pipeline.llm.prices import prices_for
from pipeline.llm.ratelimit import RateLimiter, estimate_tokens
from pipeline.llm.samples import Samples
from pipeline.llm.slots import EndpointSlots
from pipeline.llm.structured import REASK, StructuredCalls
from pipeline.llm.transport import (PLACEHOLDER_KEY, RequestRejected, Transport, parse_retry_after,
                                    resolve_api_key)
from pipeline.llm.types import LLMError, LLMResult, Messages
from pipeline.llm.usage import Usage

# Names other modules import from here, defined in the modules above.
__all__ = ["EMBED_BATCH", "LLMClient", "MalformedResponse", "PLACEHOLDER_KEY", "REASK", "parse_retry_after",
           "resolve_api_key"]


class LLMClient:
    """Implements `ChatLLM` over any OpenAI-compatible endpoint."""

    def __init__(self, cfg: LLMConfig, *, cache: CallCache | None = None, limiter: RateLimiter | None = None,
                 api_key: str | None = None, section: str = "llm", retry_samples: int = 0,
                 tally: Any | None = None, slots: EndpointSlots | None = None) -> None:
        if cfg.provider == "local" and not cfg.base_url:
            raise ConfigError(f"{section}.base_url: not set; start the local server before creating the client")
        self.cfg = cfg
        self.cache = cache
        self.limiter = limiter
        # The endpoint's `max_concurrency` slots: the run's shared pool (make_client), or per event loop.
        self.slots = slots if slots is not None else EndpointSlots.for_role(cfg)
        self.usage = Usage()
        self.endpoint = endpoint_identity(cfg)
        self.retry_samples = retry_samples
        self.prices = prices_for(cfg)  # the default table with the config's prices over it
        self.tally = tally  # the run ledger's StageTally (progress, budget); None outside a run
        self.rejected_params: dict[str, str] = {}  # parameter -> the refusal, for ones nothing drops (n)
        # The role's clients on one loop share HTTP clients (`section`: the role).
        self.transport = Transport(cfg, api_key if api_key is not None else resolve_api_key(cfg, section),
                                   section=section, endpoint=self.endpoint, slots=self.slots, limiter=limiter,
                                   usage=self.usage, tally=tally)
        self.accounts = Accounting(self.prices, self.usage, tally)
        self._refused = RefusedParams(self.endpoint, cache, self.usage)
        self._structured = StructuredCalls(cfg, self.endpoint, cache, self.usage, tally, self._request, retry_samples)
        self._stale = StaleMisses()  # the misses a twin's store may have overtaken
        self._samples = Samples(self, cfg, cache, self.transport, self.accounts, self._refused, self._structured,
                                self._stale)
        self._embedder = Embedder(self.transport, self.accounts, cache)
        self._raw = PassThrough(self.endpoint, cfg.model, self.transport, self.accounts, self.usage, cache)
        # Cache key -> the reply of that exact request, while it is being sent (per loop).
        self._in_flight: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Future]] = \
            weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return (f"LLMClient(model={self.cfg.model!r}, endpoint={self.endpoint!r}, "
                f"cache={self.cache!r}, limiter={self.limiter!r})")

    def __reduce__(self) -> Any:
        # Pickling would ship the key; Ray tasks rebuild a client with shared.make_client(cfg, handles).
        raise TypeError("LLMClient is not picklable; pass (cfg, handles) and call make_client in the task")

    async def aclose(self) -> None:
        """Count this client's calls into the run's ledger. The loop's HTTP client stays for the
        other clients on it; asyncio.run's end (or the worker's exit) closes it."""
        if self.tally is not None:
            self.tally.flush()

    # ------------------------------------------------------------ ChatLLM

    async def chat(self, messages: Messages, *, schema: type[BaseModel] | None = None,
                   validate: Callable[[Any], None] | None = None, sample: int = 0, **params: Any) -> LLMResult:
        try:
            if schema is None:
                model, sampling = sampling_params(self.cfg, sample, params)
                reply = await self._request(model, messages, sampling, None, sample)
                result = LLMResult(text=reply.text, prompt_tokens=reply.prompt_tokens,
                                   completion_tokens=reply.completion_tokens, model=reply.model, cached=reply.cached,
                                   finish_reason=reply.finish_reason, latency_s=reply.latency_s)
            else:
                result = await self._structured.call(messages, schema, validate, sample, params)
        except LLMError:
            self.accounts.count_call(None)
            raise
        self.accounts.count_call(result)
        return result

    async def chat_samples(self, messages: Messages, samples: int | Sequence[int], *,
                           schema: type[BaseModel] | None = None, validate: Callable[[Any], None] | None = None,
                           **params: Any) -> list[LLMResult | LLMError]:
        """Several samples of one prompt (`samples`: how many, from index 0, or their indexes), each
        exactly what `chat(messages, sample=i)` answers, in order; a sample that failed is its
        LLMError. The samples not yet cached go out as one request with `n` (pipeline.llm.samples);
        each is then parsed, validated and re-asked on its own."""
        return await self._samples.ask(messages, samples, schema, validate, params)

    async def embed(self, texts: list[str], model: str) -> list[list[float]]:
        """Embedding vectors in input order; each text is cached on its own."""
        return await self._embedder.embed(texts, model)

    async def raw(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """A third-party library's request (`path`: /chat/completions, /embeddings or /responses) as
        it is, its model replaced by this role's; the endpoint's JSON answer. Cached, capped, budgeted,
        retried and accounted as every call (pipeline.llm.passthrough)."""
        return await self._raw.send(path, body)

    # ------------------------------------------------------------ one exact request

    async def _request(self, model: str, messages: Messages, sampling: dict[str, Any],
                       response_format: dict[str, Any] | None, sample: int) -> Reply:
        """One exact request: from the cache, or sent and then cached (whatever the model said).
        A sampling parameter the endpoint refuses (seed) is dropped, and the request sent without."""
        while True:
            dropped = await self._refused.of(model)
            if any(p in sampling for p in dropped):
                sampling = {k: v for k, v in sampling.items() if k not in dropped}
            try:
                return await self._request_once(model, messages, sampling, response_format, sample)
            except RequestRejected as e:
                if e.param == "seed" and "seed" in sampling:
                    await self._refused.drop(model, "seed", e.reason)
                    continue
                if e.param not in ("response_format", "seed"):
                    # a parameter nothing drops: say so once, and fail the call.
                    self.rejected_params.setdefault(e.param, e.reason)
                raise

    async def _request_once(self, model: str, messages: Messages, sampling: dict[str, Any],
                            response_format: dict[str, Any] | None, sample: int) -> Reply:
        """One exact request as given: from the cache, or sent and then cached."""
        key = chat_cache_key(self.endpoint, model, messages, sampling, response_format, sample)
        preloaded = self._samples.take(key)
        if preloaded is not None:
            return preloaded  # a choice of this call's `n` request: sent and accounted there
        if self.cache is not None:
            hit = await self._stale.lookup(self.cache.get(key))
            if hit is None and key in self._stale:  # its twin stored it after this read
                hit = await self.cache.get(key)
            if hit is not None:
                reply = Reply.from_cache(hit, model)
                self.accounts.add_tokens(model, reply.prompt_tokens, reply.completion_tokens, cached=True,
                                         cached_prompt=reply.cached_prompt_tokens)
                return reply
            # The same request already on its way (two rows with one prompt): share its answer
            # rather than pay twice and cache whichever came last.
            twin = await self._twin(key)
            if twin is not None:
                self.accounts.add_tokens(model, twin.prompt_tokens, twin.completion_tokens, cached=True,
                                         cached_prompt=twin.cached_prompt_tokens)
                return twin
        # Before the claim: a refused call leaves no twin waiting on it.
        # 3 characters a token: a worst case for the prompt as max_tokens is for the answer.
        held = await self.accounts.reserve(model, estimate_tokens(messages, 0) * 4 // 3 + 8,
                                           int(sampling.get("max_tokens") or 0), self.cfg.batch)
        pending = self._claim(key) if self.cache is not None else None
        try:
            reply = await self._fetch(model, messages, sampling, response_format, key)
        except BaseException as e:
            await self.accounts.settle(held, model, 0, 0, self.cfg.batch)
            if pending is not None:
                pending.cancel() if isinstance(e, asyncio.CancelledError) else pending.set_exception(e)
            raise
        finally:
            if pending is not None:
                self._in_flight[asyncio.get_running_loop()].pop(key, None)
        await self.accounts.settle(held, model, reply.prompt_tokens, reply.completion_tokens, self.cfg.batch,
                                   reply.cached_prompt_tokens)
        if pending is not None:
            pending.set_result(reply)
        return reply

    async def _twin(self, key: str) -> Reply | None:
        """The reply of an identical request in flight on this loop, marked as not sent; None when
        there is none (or it failed: the caller then sends its own)."""
        pending = self._in_flight.get(asyncio.get_running_loop(), {}).get(key)
        if pending is None:
            return None
        try:
            reply = await asyncio.shield(pending)
        except BaseException:
            if pending.done():  # that request failed or was cancelled: this one is sent on its own
                return None
            raise  # this call itself was cancelled
        return Reply(reply.text, reply.prompt_tokens, reply.completion_tokens, reply.model, cached=True,
                     cached_prompt_tokens=reply.cached_prompt_tokens, finish_reason=reply.finish_reason,
                     latency_s=reply.latency_s)

    def _claim(self, key: str) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        pending: asyncio.Future = loop.create_future()
        # A failure nobody else awaited must not be reported as "exception never retrieved".
        pending.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._in_flight.setdefault(loop, {})[key] = pending
        return pending

    async def _fetch(self, model: str, messages: Messages, sampling: dict[str, Any],
                     response_format: dict[str, Any] | None, key: str) -> Reply:
        """Send the request (with retries) and cache its reply."""
        body: dict[str, Any] = {"model": model, "messages": messages, **sampling}
        if response_format is not None:
            body["response_format"] = response_format
        sent = time.monotonic()
        if self.cfg.batch:
            # Waits in this loop's Batch API queue, holding no `max_concurrency` slot; the custom_id
            # is the cache key, and the reply is cached below exactly as a direct call's.
            answer = await queue_for(self.transport).submit(body, key)
            self.usage.batch_calls += 1
        else:
            answer = await self.transport.chat(body, estimate_tokens(messages, sampling.get("max_tokens")))
        text, pt, ct, cpt, resp_model = answer.texts[0], answer.prompt, answer.completion, answer.cached_prompt, \
            answer.model
        self.usage.requests += 1
        self.accounts.add_tokens(model, pt, ct, cached=False, batch=self.cfg.batch, cached_prompt=cpt)
        reply = Reply(text, pt, ct, resp_model or model, cached=False, cached_prompt_tokens=cpt,
                      finish_reason=answer.finish_reasons[0] if answer.finish_reasons else None,
                      latency_s=time.monotonic() - sent)
        if self.cache is not None:
            await self.cache.set(key, reply.value())
            self._stale.stored([key])
        return reply
