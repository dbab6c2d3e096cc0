"""Golden Responses (Theanine Table 1): what the person really said next, as an opponent in the
head-to-head. No memory and no LLM call: `answer` returns the probe's gold (the corpus's next turn;
for a QA or TeaFarm probe, its reference answer, an oracle ceiling). A probe without gold (LoCoMo's
adversarial questions) becomes a failed row that says why."""

from __future__ import annotations

from typing import Any

from pipeline.llm.types import LLMError
from stages.methods.base import Answer, Method, MethodContext, MethodSettings, ProbeInput

GOLD_MODEL = "gold"  # the `model` of its responses: no model wrote them


class NoGold(LLMError):
    """The probe carries no gold response to return."""


class Golden(Method[MethodSettings]):
    name = "golden"

    async def answer(self, ctx: MethodContext[MethodSettings], probe: ProbeInput, memory: dict[str, Any]) -> Answer:
        gold = probe.probe.get("gold")
        if gold is None:
            raise NoGold(f"golden: probe {probe.probe['probe_id']} has no gold response")
        return Answer(text=gold, model=GOLD_MODEL)
