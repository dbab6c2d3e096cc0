"""Samples of one prompt (`LLMClient.chat_samples`), as one request with `n`.

k samples of one prompt go as one request with `n` (OpenAI's, billed for the prompt once) where the
role allows it (`sample_with_n`) and the endpoint serves it; each choice is cached under its own
sample's key, exactly where a single request for that sample would be, so a later call for <= k
samples (or any one of them) is served from the cache. An endpoint that refuses `n`, or answers
fewer choices than asked (llama-cpp-python's server ignores `n`), gets the rest as one request per
sample, from then on for that (endpoint, model).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any, Callable, Sequence

from pydantic import BaseModel

from pipeline.config import LLMConfig
from pipeline.llm.accounting import split_tokens
from pipeline.llm.cache import Reply, chat_cache_key, lookup_many, store_many
from pipeline.llm.params import sampling_params
from pipeline.llm.ratelimit import estimate_tokens
from pipeline.llm.sender import Sender
from pipeline.llm.structured import StructuredCalls, request_format, with_schema_in_prompt
from pipeline.llm.transport import RequestRejected
from pipeline.llm.types import LLMError, LLMResult, Messages, gather_samples

# Per loop: (endpoint, model) -> done once the sample deciding its structured mode came back.
_SAMPLING_SCOUTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str], asyncio.Future]] = \
    weakref.WeakKeyDictionary()

Missing = list[tuple[int, dict[str, Any], str]]  # (sample index, its sampling parameters, its cache key)


class Samples:
    """One client's samples through `n`: the choices an `n` request brought are left with the
    client's `sender`, where each sample's own call (`structured.chat`) takes its one."""

    def __init__(self, cfg: LLMConfig, sender: Sender, structured: StructuredCalls) -> None:
        self.cfg = cfg
        self.sender = sender
        self.cache = sender.cache
        self.transport = sender.transport
        self.accounts = sender.accounts
        self.refused = sender.refused
        self.structured = structured
        self.endpoint = sender.endpoint
        self._prefetching: dict[str, asyncio.Future] = {}  # cache key -> its `n` request's completion
        self._stale = sender.stale  # misses another call's store may have overtaken

    async def ask(self, messages: Messages, samples: int | Sequence[int], schema: type[BaseModel] | None,
                  validate: Callable[[Any], None] | None, params: dict[str, Any]) -> list[LLMResult | LLMError]:
        """See `LLMClient.chat_samples`."""
        indexes = list(range(samples)) if isinstance(samples, int) else list(samples)
        results: list[LLMResult | LLMError] = []
        if len(indexes) > 1 and self._asks_n():
            model, _ = sampling_params(self.cfg, indexes[0], params)
            if schema is not None and self.structured.known_mode(model) is None:
                deciding = _SAMPLING_SCOUTS.setdefault(asyncio.get_running_loop(), {})
                scout = deciding.get((self.endpoint, model))
                if scout is not None:
                    await asyncio.shield(scout)  # another prompt's first sample is finding the mode
                else:
                    # This prompt's first sample alone decides the structured mode (auto mode's
                    # scout); its other samples, and every other prompt's, then go with `n` in it.
                    scout = deciding[self.endpoint, model] = asyncio.get_running_loop().create_future()
                    try:
                        results = await self._each(messages, indexes[:1], schema, validate, params)
                    finally:
                        scout.set_result(None)
                        deciding.pop((self.endpoint, model), None)
                    indexes = indexes[1:]
            failed = await self._prefetch(model, messages, indexes, schema, params)
            if failed is not None:
                for _ in indexes:
                    self.accounts.count_call(None)
                return results + [failed] * len(indexes)
        return results + await self._each(messages, indexes, schema, validate, params)

    async def _each(self, messages: Messages, indexes: list[int], schema: type[BaseModel] | None,
                    validate: Callable[[Any], None] | None, params: dict[str, Any]) -> list[LLMResult | LLMError]:
        return await gather_samples(self.structured, messages, indexes, schema=schema, validate=validate, **params)

    def _asks_n(self) -> bool:
        """Whether this role sends a prompt's samples as one request with `n`: the config allows it,
        not through the Batch API (one answer per line there), and the endpoint has not refused or
        ignored `n` for the model."""
        if not self.cfg.sample_with_n or self.cfg.batch:
            return False
        return "n" not in self.refused.known(self.cfg.model)

    async def _prefetch(self, model: str, messages: Messages, indexes: list[int], schema: type[BaseModel] | None,
                        params: dict[str, Any]) -> LLMError | None:
        """Ask for the samples in `indexes` that are not cached in one request with `n`, leaving each
        choice where `chat(..., sample=i)` finds it (the cache and `take`). Returns the error
        when that request failed for good (each sample then fails with it rather than being sent
        again into the same failure); a refusal of `n` or fewer choices than asked leaves the rest to
        one request each."""
        mode = self.structured.known_mode(model) if schema is not None else None
        if schema is not None and mode is None:
            return None  # the first sample could not decide the mode: each goes alone
        conversation = messages if schema is None or mode == "json_schema" else with_schema_in_prompt(messages, schema)
        response_format = request_format(schema, mode) if schema is not None and mode else None
        while True:
            dropped = await self.refused.of(model)
            if "n" in dropped:
                return None
            keyed = []
            for i in indexes:
                _, sampling = sampling_params(self.cfg, i, params)
                sampling = {k: v for k, v in sampling.items() if k not in dropped}
                keyed.append((i, sampling, chat_cache_key(self.endpoint, model, conversation, sampling,
                                                          response_format, i)))
            hits = await self._stale.lookup(lookup_many(self.cache, [k for *_, k in keyed])) \
                if self.cache is not None else [None] * len(keyed)
            # Samples another call of the same prompt is asking for right now: wait for its answer.
            theirs = {id(f): f for *_, key in keyed if (f := self._prefetching.get(key)) is not None}
            # (Stored by another call since this lookup read: each sample's own call finds it.)
            missing = [(i, sampling, key) for (i, sampling, key), hit in zip(keyed, hits)
                       if hit is None and not self.sender.preloaded(key) and key not in self._prefetching
                       and key not in self._stale]
            try:
                if len(missing) >= 2:  # else nothing shares a request
                    await self._ask_n_once(model, conversation, missing, response_format)
                if theirs:
                    await asyncio.gather(*(asyncio.shield(f) for f in theirs.values()))
                return None
            except RequestRejected as e:
                if e.param == "seed" and "seed" not in dropped:
                    await self.refused.drop(model, "seed", e.reason)
                    continue
                if e.param == "n":
                    await self.refused.drop(model, "n", e.reason)
                return None  # asked one by one, where each meets (and handles) the refusal itself
            except LLMError as e:
                return e

    async def _ask_n_once(self, model: str, messages: Messages, missing: Missing,
                          response_format: dict[str, Any] | None) -> None:
        """`_ask_n`, its samples marked as being asked (an identical prompt sampled at the same time
        waits for them rather than pay twice)."""
        done = asyncio.get_running_loop().create_future()
        done.add_done_callback(lambda f: f.cancelled() or f.exception())
        keys = [key for *_, key in missing]
        self._prefetching.update(dict.fromkeys(keys, done))
        try:
            await self._ask_n(model, messages, missing, response_format)
        except BaseException as e:
            done.set_exception(e) if not isinstance(e, asyncio.CancelledError) else done.cancel()
            raise
        else:
            done.set_result(None)
        finally:
            for key in keys:
                self._prefetching.pop(key, None)

    async def _ask_n(self, model: str, messages: Messages, missing: Missing,
                     response_format: dict[str, Any] | None) -> None:
        """One request for len(missing) samples: the first missing sample's parameters with `n`."""
        _, sampling, _ = missing[0]
        n = len(missing)
        body: dict[str, Any] = {"model": model, "messages": messages, **sampling, "n": n}
        if response_format is not None:
            body["response_format"] = response_format
        max_tokens = int(sampling.get("max_tokens") or 0)
        held = await self.accounts.reserve(model, estimate_tokens(messages, 0) * 4 // 3 + 8, max_tokens * n)
        sent = time.monotonic()
        try:
            answer = await self.transport.chat(body, estimate_tokens(messages, max_tokens * n))
        except BaseException:
            await self.accounts.settle(held, model, 0, 0)
            raise
        await self.accounts.settle(held, model, answer.prompt, answer.completion, cached_prompt=answer.cached_prompt)
        got = answer.texts[:n]
        u = self.accounts.usage
        u.requests += 1
        u.sampled_requests += 1
        u.sampled_choices += len(got)
        self.accounts.add_tokens(model, answer.prompt, answer.completion, cached=False,
                                 cached_prompt=answer.cached_prompt)
        # The prompt is billed once: its tokens go with the first choice; completions by length.
        shares = split_tokens(answer.completion, [max(1, len(t)) for t in got])
        replies = [(key, Reply(text, answer.prompt if j == 0 else 0, shares[j], answer.model or model, cached=False,
                               cached_prompt_tokens=answer.cached_prompt if j == 0 else 0,
                               finish_reason=answer.finish_reasons[j] if j < len(answer.finish_reasons) else None,
                               latency_s=time.monotonic() - sent))
                   for j, ((_, _, key), text) in enumerate(zip(missing, got))]
        self.sender.preload(replies)
        if self.cache is not None:
            await store_many(self.cache, [(key, reply.value()) for key, reply in replies])
            self._stale.stored(key for key, _ in replies)
        if len(got) < n:
            # llama-cpp-python's server answers one choice whatever `n` says: the rest go one by one,
            # and so do this model's samples from now on.
            await self.refused.drop(model, "n", f"asked for {n} choices, the endpoint answered {len(got)}")
