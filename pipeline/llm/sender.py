"""One exact chat request (`Sender.request`): a choice an `n` request already brought, the cache,
an identical request in flight, or sent (its worst case held in the run's budget) and then cached,
whatever the model said. Structured calls and samples (pipeline.llm.structured, .samples) build
on it; it knows nothing of them.

The cache sits below validation, so every HTTP request is cached with its raw answer; only
transport failures stay uncached. Two identical requests in flight at once share one answer. A
sampling parameter the endpoint refuses (seed) is dropped, and the request sent without.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any, Iterable

from pipeline.config import LLMConfig
from pipeline.llm.accounting import Accounting
from pipeline.llm.batch import queue_for
from pipeline.llm.cache import CallCache, Reply, StaleMisses, chat_cache_key
from pipeline.llm.params import RefusedParams
from pipeline.llm.ratelimit import estimate_tokens
from pipeline.llm.transport import RequestRejected, Transport
from pipeline.llm.types import Messages


class Sender:
    """One client's exact requests: its cache, transport, accounts and refused parameters."""

    def __init__(self, cfg: LLMConfig, cache: CallCache | None, transport: Transport, accounts: Accounting,
                 refused: RefusedParams) -> None:
        self.cfg = cfg
        self.endpoint = transport.endpoint
        self.cache = cache
        self.transport = transport
        self.accounts = accounts
        self.usage = accounts.usage
        self.refused = refused
        self.stale = StaleMisses()  # the misses a twin's store may have overtaken
        self.rejected_params: dict[str, str] = {}  # parameter -> the refusal, for ones nothing drops (n)
        # Cache key -> a sample's reply that came as one choice of an `n` request, already
        # accounted, until its own request takes it (works with the cache off too).
        self._preloaded: dict[str, Reply] = {}
        # Cache key -> the reply of that exact request, while it is being sent (per loop).
        self._in_flight: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Future]] = \
            weakref.WeakKeyDictionary()

    def preload(self, replies: Iterable[tuple[str, Reply]]) -> None:
        """Replies an `n` request brought, by cache key: each request for one of them takes it once."""
        self._preloaded.update(replies)

    def preloaded(self, key: str) -> bool:
        return key in self._preloaded

    async def request(self, model: str, messages: Messages, sampling: dict[str, Any],
                       response_format: dict[str, Any] | None, sample: int) -> Reply:
        """One exact request: from the cache, or sent and then cached (whatever the model said).
        A sampling parameter the endpoint refuses (seed) is dropped, and the request sent without."""
        while True:
            dropped = await self.refused.of(model)
            if any(p in sampling for p in dropped):
                sampling = {k: v for k, v in sampling.items() if k not in dropped}
            try:
                return await self._request_once(model, messages, sampling, response_format, sample)
            except RequestRejected as e:
                if e.param == "seed" and "seed" in sampling:
                    await self.refused.drop(model, "seed", e.reason)
                    continue
                if e.param not in ("response_format", "seed"):
                    # a parameter nothing drops: say so once, and fail the call.
                    self.rejected_params.setdefault(e.param, e.reason)
                raise

    async def _request_once(self, model: str, messages: Messages, sampling: dict[str, Any],
                            response_format: dict[str, Any] | None, sample: int) -> Reply:
        """One exact request as given: from the cache, or sent and then cached."""
        key = chat_cache_key(self.endpoint, model, messages, sampling, response_format, sample)
        preloaded = self._preloaded.pop(key, None)
        if preloaded is not None:
            return preloaded  # a choice of this call's `n` request: sent and accounted there
        if self.cache is not None:
            hit = await self.stale.lookup(self.cache.get(key))
            if hit is None and key in self.stale:  # its twin stored it after this read
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
            self.stale.stored([key])
        return reply
