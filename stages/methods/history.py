"""Baselines without retrieval: the whole past in the context (full_history) or nothing
(zero_history), in SeCom's response frame (Theanine Sec. 3.2 and SeCom list both)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from pipeline.llm.types import ChatLLM
from pipeline.retrieval import within_tokens
from stages.methods.base import Answer, Method, MethodSettings, ProbeInput
from stages.methods.dialogue import format_unit, unit_id
from stages.methods.response import QAPrompt, generate


class ZeroHistorySettings(MethodSettings):
    # How QA probes are asked: ours, or LoCoMo's task_eval protocol (stages/methods/response.py)
    qa_prompt: QAPrompt = "ours"


class FullHistorySettings(ZeroHistorySettings):
    # Keep the most recent sessions that fit this many tokens; null = every past session.
    token_budget: int | None = Field(default=None, ge=1)


def recent_within(units: list[dict], budget: int | None) -> list[dict]:
    """The most recent units whose tokens fit `budget` together (all of them when None)."""
    n = len(within_tokens([u["text"] for u in units], budget))
    return units[len(units) - n:]


class FullHistory(Method):
    name = "full_history"
    Settings = FullHistorySettings

    async def answer(self, llm: ChatLLM, probe: ProbeInput, memory: dict[str, Any], settings: Any) -> Answer:
        # The session's date goes with it: LoCoMo's temporal questions are answered from it.
        units = [{"session_idx": s, "session_time": turns[0].get("session_time"),
                  "turn_start": turns[0]["turn_idx"], "turn_end": turns[-1]["turn_idx"],
                  "text": format_unit(turns), "unit_id": unit_id("session", s, turns[0]["turn_idx"]),
                  "source_turn_ids": [t["source_turn_id"] for t in turns if t.get("source_turn_id")]}
                 for s, turns in probe.history.items() if turns]
        return await generate(llm, probe, recent_within(units, settings.token_budget), settings.qa_prompt)


class ZeroHistory(Method):
    name = "zero_history"
    Settings = ZeroHistorySettings

    async def answer(self, llm: ChatLLM, probe: ProbeInput, memory: dict[str, Any], settings: Any) -> Answer:
        return await generate(llm, probe, [], settings.qa_prompt)


class AllContext(FullHistory):
    """RSum's "All Context" baseline: full_history under the RSum paper's name."""

    name = "all_context"


class PartContext(ZeroHistory):
    """RSum's "Part Context" baseline (the current session only): zero_history under its name."""

    name = "part_context"
