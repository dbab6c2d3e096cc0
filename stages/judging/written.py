"""The judge behind `diagnose`'s *written* check for memories a method writes itself (summaries,
facts, events): shown a question, its reference answer, the conversation turns that are its
evidence and the method's memory as numbered entries, it names, for each evidence turn, the entries
that state what that turn contributes to the answer. A summary says what it summarised, not that the
fact survived; only a reader of the entries can tell. Ours: no paper defines this check."""

from __future__ import annotations

from collections.abc import Sequence
from pydantic import BaseModel, Field, create_model

from pipeline.llm.types import LLMResult, Messages
from stages.judging.calls import JudgeCall
from stages.methods.base import MemoryItem

SYSTEM = (
    "You check what a conversational agent's memory kept. You are given a question about a past "
    "conversation, its reference answer, the turns of the conversation the answer comes from (numbered "
    "evidence turns), and the agent's memory (numbered entries). For each evidence turn, list the numbers "
    "of the memory entries that state the information that turn contributes to the answer, so that a "
    "reader of those entries alone could recover it. Wording may differ; an entry that only mentions the "
    "topic, or states something different or outdated, does not count. An evidence turn no entry states "
    "gets an empty list. Reply with JSON only: one list of entry numbers per evidence turn, in order."
)
PROMPTS = {"system.written": SYSTEM}


def stated_by_schema(evidence_items: int, entries: int) -> type[BaseModel]:
    """One list of entry numbers per evidence turn, in order (numbers out of 1..entries are dropped
    when read, not refused: a small model's slip there costs no re-ask)."""
    return create_model("StatedBy", stated_by=(list[list[int]], Field(
        min_length=evidence_items, max_length=evidence_items,
        description=f"for each of the {evidence_items} evidence turns, the numbers of the memory entries "
                    f"(1..{entries}) that state it")))


def written_messages(question: str, reference: str | None, evidence: Sequence[str],
                     entries: Sequence[MemoryItem]) -> Messages:
    lines = [f"Question: {question}", f"Reference answer: {reference if reference is not None else '(none)'}",
             "", "Evidence turns:", *(f"E{i}. {text}" for i, text in enumerate(evidence, 1)),
             "", "Memory entries:", *(f"{i}. {item.text}" for i, item in enumerate(entries, 1))]
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n".join(lines)}]


def written_call(question: str, reference: str | None, evidence: Sequence[str],
                 entries: Sequence[MemoryItem]) -> JudgeCall:
    """The judge's call: its judgment is (per evidence turn, the ids of the entries that state it;
    judge model). Numbers outside 1..len(entries) are dropped, each id kept once."""

    def read(result: LLMResult) -> tuple[list[list[str]], str]:
        lists = list(result.parsed.stated_by)
        stated = [list(dict.fromkeys(entries[n - 1].id for n in numbers if 1 <= n <= len(entries)))
                  for numbers in lists]
        return stated, result.model

    return JudgeCall(written_messages(question, reference, evidence, entries),
                     stated_by_schema(len(evidence), len(entries)), read)
