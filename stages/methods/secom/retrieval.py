"""SeCom's retrieval-augmented response (Sec. 2.1) and its turn- and session-level baselines.

The three methods share the machinery and differ in the memory unit they retrieve: `secom`
retrieves topical segments, `turn` exchanges, `session` whole sessions, all from the memory
banks (`banks` stage), only from sessions before the probe's. Default top-k per granularity as
the official code: segment 1, turn 3, session 1; `token_budget` with `top_k: null` fills a
context matched in tokens instead (the paper's LoCoMo tables give every method about 3.5K).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Literal

import numpy as np

from pydantic import Field, model_validator

from pipeline.retrieval import BM25Idf, BM25Tokens, Similarity
from stages.methods.shared import response
from stages.methods.base import Answer, EpisodeInput, Method, MethodContext, MethodSettings, ProbeInput
from stages.methods.shared import memoryagentbench_reader
from stages.methods.shared.response import QAPrompt, SecomChatOrder, generate
from stages.methods.secom.units import unit_retriever

BANK = "banks.memory_units"
_INDEXES_KEPT = 256  # (episode bank, session) retrievers kept per method instance


class RetrievalSettings(MethodSettings):
    top_k: int | None = Field(default=1, ge=1)  # units retrieved; null: as many as fit token_budget
    retriever: Literal["bm25", "dense", "hybrid"] = "bm25"
    hybrid_weight: float = Field(default=0.5, ge=0, le=1)
    # Tokens (cl100k) of retrieved memory per response: caps top_k, or with top_k null fills up to it;
    # a unit that would overflow it is skipped and the next ranked units are tried.
    token_budget: int | None = Field(default=None, ge=1)
    use_compression: bool = True  # compressed text as retrieval key (SeCom denoising)
    # The text a unit is found by: all of it, or only the lines of the episode's first speaker (the
    # user side of a round, as LongMemEval's round retrieval keys it); the context shows the whole unit.
    key_side: Literal["both", "user"] = "both"
    # Dense scoring: cosine, dot (inner product), or l2 (minus the squared distance: FAISS IndexFlatL2,
    # the official code's MPNet retriever, over unnormalised multi-qa-mpnet-base-dot-v1 vectors).
    similarity: Similarity = "cosine"
    # BM25 terms and idf: lower-cased words with Lucene's idf, or (whitespace, okapi) as the official
    # code's langchain BM25Retriever builds rank_bm25's BM25Okapi (pipeline/retrieval.py).
    bm25_tokens: BM25Tokens = "words"
    bm25_idf: BM25Idf = "lucene"
    # How QA probes are asked: ours, LoCoMo's task_eval protocol, or SeCom's chat frame
    # (stages/methods/shared/response.py)
    qa_prompt: QAPrompt = "ours"
    # Under `secom_chat`, the retrieved units in time order (Sec. 2.1) or as ranked (experiment/chat.py)
    secom_chat_order: SecomChatOrder = "time"

    @model_validator(mode="after")
    def _sized(self) -> RetrievalSettings:
        if self.top_k is None and self.token_budget is None:
            raise ValueError("top_k and token_budget cannot both be null")
        return self


class TurnSettings(RetrievalSettings):
    top_k: int | None = Field(default=3, ge=1)


def search_query(probe: ProbeInput, qa_prompt: QAPrompt) -> str:
    """What a probe searches the bank with: its request; under MemoryAgentBench's reader, what the
    official BM25 agent searches with (the task's RAG query, or its question part)."""
    if qa_prompt == "memoryagentbench" and probe.probe["kind"] == "qa":
        return memoryagentbench_reader.search_query(probe.request, probe.probe.get("category"))
    return probe.request


class RetrievalMethod(Method[RetrievalSettings]):
    """Retrieve the top-k units of one granularity with the request, answer from them."""

    needs = ("banks",)
    uses_embedder = True
    shows_memory = True  # its bank units, rated like a built memory
    memory_evidence = "every_turn"  # the banks keep every past turn verbatim; retrieval picks units
    granularity: ClassVar[str]

    def stages(self) -> tuple[Any, ...]:
        """SeCom's memory construction (guidance, segment, compress, banks), which every retrieval
        granularity reads through `banks`."""
        from stages.methods.secom.stages import secom_stages  # the stages import this package's units

        return secom_stages()

    async def rank(self, ctx: MethodContext[RetrievalSettings], probe: ProbeInput) -> list[dict]:
        settings = ctx.settings
        pool, retriever = self._index(probe, settings)
        dense = settings.retriever != "bm25" and ctx.embed is not None and pool
        if dense and settings.key_side == "user" and retriever.vectors is None:
            retriever.vectors = np.asarray(await ctx.embed(retriever.texts), dtype=np.float32)  # type: ignore[misc]
        query = search_query(probe, settings.qa_prompt)
        qvec = (await ctx.embed([query]))[0] if dense else None  # type: ignore[misc]
        hits = retriever.search(query, settings.top_k, method=settings.retriever, qvec=qvec,
                                budget=settings.token_budget, hybrid_weight=settings.hybrid_weight)
        by_id = {u["unit_id"]: u for u in pool}
        return [by_id[unit_id] for unit_id, _ in hits]

    def _index(self, probe: ProbeInput, settings: RetrievalSettings) -> tuple[list[dict], Any]:
        """The units before the probe's session and their retriever, built once per episode bank and
        session: every probe of an episode searches the same few pools, and building BM25 and
        counting tokens per probe was most of a response's CPU time."""
        bank = probe.upstream.get(BANK, [])
        before = probe.probe["session_idx"]
        key = (id(bank), before, settings.use_compression, settings.similarity, settings.bm25_tokens, settings.bm25_idf,
               settings.key_side)
        memo = self.__dict__.setdefault("_indexes", {})
        if key not in memo:
            pool = [u for u in bank if u["granularity"] == self.granularity and u["session_idx"] < before]
            retriever = unit_retriever(pool, use_compression=settings.use_compression, similarity=settings.similarity,
                                       bm25_tokens=settings.bm25_tokens, bm25_idf=settings.bm25_idf)
            if settings.key_side == "user":  # keyed on its user lines; embedded at the first dense search
                retriever = replace(retriever, texts=[user_side(u, probe) for u in pool], vectors=None)
            if len(memo) >= _INDEXES_KEPT:
                memo.pop(next(iter(memo)))  # oldest first: episodes are answered one shard at a time
            memo[key] = (bank, pool, retriever)  # holding `bank` keeps its id from being reused
        _, pool, retriever = memo[key]
        return pool, retriever

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_indexes"}  # a memo never travels

    async def answer(self, ctx: MethodContext[RetrievalSettings], probe: ProbeInput, memory: dict[str, Any]) -> Answer:
        llm, settings = ctx.llm, ctx.settings
        return await generate(llm, probe, await self.rank(ctx, probe), settings.qa_prompt, settings.secom_chat_order,
                              retrieved=True)

    def memory_view(self, episode: EpisodeInput, memory: dict[str, Any], settings: RetrievalSettings) -> str | None:
        units = [u for u in episode.upstream.get(BANK, []) if u["granularity"] == self.granularity]
        return response.format_memory(units) or None


def user_side(unit: dict, probe: ProbeInput) -> str:
    """A unit's lines said by the episode's first speaker (LongMemEval's user), or its text when it has none."""
    user = (probe.episode.get("speakers") or [None])[0]
    turns = [t for t in probe.history.get(unit["session_idx"], [])
             if unit["turn_start"] <= t["turn_idx"] <= unit["turn_end"] and t["speaker"] == user]
    return "\n".join(t["text"] for t in turns) or unit["text"]


class SeCom(RetrievalMethod):
    name = "secom"
    granularity = "segment"


class TurnLevel(RetrievalMethod):
    name = "turn"
    granularity = "turn"
    Settings = TurnSettings


class SessionLevel(RetrievalMethod):
    name = "session"
    granularity = "session"
