"""The one interface every response method implements.

A method sees a probe, the conversation before it and whatever memory tables its stages built,
and returns an answer. Retrieval-augmented SeCom and its baselines are here; Theanine, RSum,
LD-Agent and CREEM plug in the same way (add to METHODS).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np

from pipeline.llm.types import ChatLLM, LLMResult
from pipeline.retrieval import Retriever, count_tokens
from pipeline.stage import Rows
from stages.methods import secom


@dataclass
class ProbeContext:
    probe: dict[str, Any]
    history: dict[int, Rows]  # sessions before the probe's session, turn rows in order
    current: Rows  # the probe's session up to (not including) the turn to produce
    memory_units: Rows = field(default_factory=list)  # banks rows of this episode
    embed: Callable[[list[str]], np.ndarray] | None = None


@dataclass
class MethodAnswer:
    result: LLMResult
    retrieved_unit_ids: list[str]
    context_tokens: int


class ResponseMethod(Protocol):
    name: str

    async def answer(self, llm: ChatLLM, ctx: ProbeContext, cfg: Any) -> MethodAnswer: ...


def _generate(llm: ChatLLM, ctx: ProbeContext, units: Rows) -> Any:
    probe = ctx.probe
    if probe["kind"] == "qa":
        return secom.answer_question(llm, units, probe["request"])
    return secom.respond(llm, units, ctx.current, probe["request"], probe["respondent"])


def _context_tokens(units: Rows, current: Rows) -> int:
    return sum(count_tokens(u["text"]) for u in units) + sum(count_tokens(t["text"]) for t in current)


def unit_retriever(pool: Rows, *, use_compression: bool) -> Retriever:
    """A retriever over memory units. The key is the compressed text (SeCom's denoising) or the
    original, dense search uses the matching stored vector, and budgets count the original text,
    which is what enters the context."""
    vec_col = "vector" if use_compression else "text_vector"
    has_vectors = bool(pool) and all(u.get(vec_col) is not None for u in pool)
    return Retriever(
        ids=[u["unit_id"] for u in pool],
        texts=[(u.get("compressed_text") if use_compression else None) or u["text"] for u in pool],
        vectors=np.asarray([u[vec_col] for u in pool], dtype=np.float32) if has_vectors else None,
        token_counts=[count_tokens(u["text"]) for u in pool],
    )


@dataclass
class RetrievalMethod:
    """Retrieve top-k units of one granularity with the current request, answer from them."""

    name: str
    granularity: str

    def rank(self, ctx: ProbeContext, cfg: Any) -> Rows:
        pool = [
            u for u in ctx.memory_units
            if u["granularity"] == self.granularity and u["session_idx"] < ctx.probe["session_idx"]
        ]
        qvec = ctx.embed([ctx.probe["request"]])[0] if (ctx.embed and cfg.retriever != "bm25" and pool) else None
        hits = unit_retriever(pool, use_compression=cfg.use_compression).search(
            ctx.probe["request"], cfg.top_k, method=cfg.retriever, qvec=qvec,
            budget=cfg.token_budget, hybrid_weight=cfg.hybrid_weight,
        )
        by_id = {u["unit_id"]: u for u in pool}
        return [by_id[unit_id] for unit_id, _ in hits]

    async def answer(self, llm: ChatLLM, ctx: ProbeContext, cfg: Any) -> MethodAnswer:
        units = self.rank(ctx, cfg)
        in_time_order = sorted(units, key=lambda u: (u["session_idx"], u["turn_start"]))
        result = await _generate(llm, ctx, in_time_order)
        return MethodAnswer(result, [u["unit_id"] for u in in_time_order], _context_tokens(in_time_order, ctx.current))


@dataclass
class HistoryMethod:
    """Baselines without retrieval: the whole past (full_history) or nothing (zero_history)."""

    name: str
    full: bool

    async def answer(self, llm: ChatLLM, ctx: ProbeContext, cfg: Any) -> MethodAnswer:
        units: Rows = []
        if self.full:
            for s, turns in ctx.history.items():
                units.append({"session_idx": s, "turn_start": 0, "text": secom.format_unit(turns), "unit_id": f"session:{s}:0"})
            if cfg.token_budget is not None:  # keep the most recent sessions that fit
                kept, used = [], 0
                for u in reversed(units):
                    used += count_tokens(u["text"])
                    if used > cfg.token_budget:
                        break
                    kept.append(u)
                units = kept[::-1]
        result = await _generate(llm, ctx, units)
        return MethodAnswer(result, [u["unit_id"] for u in units], _context_tokens(units, ctx.current))


METHODS: dict[str, ResponseMethod] = {
    m.name: m
    for m in [
        RetrievalMethod("secom", "segment"),
        RetrievalMethod("turn", "turn"),
        RetrievalMethod("session", "session"),
        HistoryMethod("full_history", True),
        HistoryMethod("zero_history", False),
    ]
}
