"""Embeddings (`LLMClient.embed`): vectors in input order, each text cached on its own; the texts
not cached go in requests of up to `EMBED_BATCH` texts, all at once, each a duplicate sent once."""

from __future__ import annotations

import asyncio

from pipeline.llm.accounting import Accounting, split_tokens
from pipeline.llm.cache import CallCache, embed_cache_key, lookup_many, store_many
from pipeline.llm.transport import Transport
from pipeline.llm.types import LLMError

EMBED_BATCH = 128


class Embedder:
    """One client's embedding calls."""

    def __init__(self, transport: Transport, accounts: Accounting, cache: CallCache | None) -> None:
        self.transport = transport
        self.accounts = accounts
        self.cache = cache
        self.endpoint = transport.endpoint

    async def embed(self, texts: list[str], model: str) -> list[list[float]]:
        """Embedding vectors in input order; each text is cached on its own."""
        keys = [embed_cache_key(self.endpoint, model, t) for t in texts]
        out: list[list[float] | None] = [None] * len(texts)
        if self.cache is not None:
            await self._from_cache(self.cache, model, keys, out)
        key_of = dict(zip(texts, keys))
        todo: dict[str, list[int]] = {}  # text -> positions, so duplicates are sent once
        for i, t in enumerate(texts):
            if out[i] is None:
                todo.setdefault(t, []).append(i)
        pending = list(todo)
        # The batches go at once, each taking a `max_concurrency` slot (and the limiter's pace) in send.
        results = await asyncio.gather(*(self._one_batch(model, pending[i:i + EMBED_BATCH], todo, key_of, out)
                                         for i in range(0, len(pending), EMBED_BATCH)), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        return out  # type: ignore[return-value]

    async def _from_cache(self, cache: CallCache, model: str, keys: list[str], out: list[list[float] | None]) -> None:
        """Fill `out` with the cached vectors, counted once for the lot."""
        hits = await lookup_many(cache, keys)
        found = tokens_found = 0
        for i, hit in enumerate(hits):
            if hit is not None:
                out[i] = hit["embedding"]
                found += 1
                tokens_found += int(hit.get("prompt_tokens", 0))
        if found:
            self.accounts.count_texts(found, cached=True)
            self.accounts.add_tokens(model, tokens_found, 0, cached=True)

    async def _one_batch(self, model: str, batch: list[str], todo: dict[str, list[int]], key_of: dict[str, str],
                         out: list[list[float] | None]) -> None:
        """One request for `batch`: its vectors into `out` at each text's positions, and the cache."""
        est = sum(len(t) for t in batch) // 4 + len(batch)
        held = await self.accounts.reserve(model, est, 0)
        try:
            vectors, total = await self.transport.embeddings(model, batch, est)
        except LLMError:
            await self.accounts.settle(held, model, 0, 0)
            self.accounts.count_failed_texts(len(batch))
            raise
        # The slot just freed wakes a waiting batch: let it go out before this one's bookkeeping.
        await asyncio.sleep(0)
        await self.accounts.settle(held, model, total, 0)
        shares = split_tokens(total, [len(t) for t in batch])
        for text, vec in zip(batch, vectors):
            for i in todo[text]:
                out[i] = vec
        self.accounts.count_texts(len(batch), cached=False)
        self.accounts.add_tokens(model, total, 0, cached=False)
        if self.cache is not None:
            # The batch's vectors in one write: one by one, each waited for its own round trip.
            await store_many(self.cache, [
                (key_of[text], {"embedding": vec, "prompt_tokens": tokens, "model": model})
                for text, vec, tokens in zip(batch, vectors, shares)])
