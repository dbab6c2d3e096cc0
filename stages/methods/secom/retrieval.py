"""SeCom's retrieval-augmented response (Sec. 2.1) and its turn- and session-level baselines.

The three methods share the machinery and differ in the memory unit they retrieve: `secom`
retrieves topical segments, `turn` interactions, `session` whole sessions, all from the memory
banks (`banks` stage), only from sessions before the probe's.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from pipeline.llm.types import ChatLLM
from pipeline.retrieval import count_tokens
from stages import units as unit_module
from stages.methods import response
from stages.methods.base import Answer, Method, MethodSettings, ProbeInput
from stages.units import in_time_order, unit_retriever

BANK = "banks.memory_units"


class RetrievalSettings(MethodSettings):
    top_k: int = Field(default=3, ge=1)
    retriever: Literal["bm25", "dense", "hybrid"] = "bm25"
    hybrid_weight: float = Field(default=0.5, ge=0, le=1)
    token_budget: int | None = Field(default=None, ge=1)  # tokens of retrieved memory per response
    use_compression: bool = True  # compressed text as retrieval key (SeCom denoising)


def context_tokens(units: list[dict], current: list[dict]) -> int:
    """Tokens of what enters the context: memory units plus the current session."""
    return sum(count_tokens(u["text"]) for u in units) + sum(count_tokens(t["text"]) for t in current)


async def generate(llm: ChatLLM, probe: ProbeInput, units: list[dict]) -> Answer:
    """The shared response frame over memory units in time order (QA or next response)."""
    ordered = in_time_order(units)
    if probe.probe["kind"] == "qa":
        result = await response.answer_question(llm, ordered, probe.request)
    else:
        result = await response.respond(llm, ordered, probe.current, probe.request, probe.probe["respondent"])
    return Answer(text=result.text.strip(), used_ids=[u["unit_id"] for u in ordered],
                  context_tokens=context_tokens(ordered, probe.current), model=result.model)


class RetrievalMethod(Method):
    """Retrieve the top-k units of one granularity with the request, answer from them."""

    Settings = RetrievalSettings
    needs = ("banks",)
    uses_embedder = True
    code = (response, unit_module)
    granularity: ClassVar[str]

    def rank(self, probe: ProbeInput, settings: RetrievalSettings) -> list[dict]:
        pool = [u for u in probe.upstream.get(BANK, [])
                if u["granularity"] == self.granularity and u["session_idx"] < probe.probe["session_idx"]]
        dense = settings.retriever != "bm25" and probe.embed is not None and pool
        qvec = probe.embed([probe.request])[0] if dense else None  # type: ignore[misc]
        hits = unit_retriever(pool, use_compression=settings.use_compression).search(
            probe.request, settings.top_k, method=settings.retriever, qvec=qvec,
            budget=settings.token_budget, hybrid_weight=settings.hybrid_weight,
        )
        by_id = {u["unit_id"]: u for u in pool}
        return [by_id[unit_id] for unit_id, _ in hits]

    async def answer(self, llm: ChatLLM, probe: ProbeInput, memory: dict[str, Any], settings: Any) -> Answer:
        return await generate(llm, probe, self.rank(probe, settings))


class SeCom(RetrievalMethod):
    name = "secom"
    granularity = "segment"


class TurnLevel(RetrievalMethod):
    name = "turn"
    granularity = "turn"


class SessionLevel(RetrievalMethod):
    name = "session"
    granularity = "session"
