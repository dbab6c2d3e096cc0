"""The response frame of the memory baselines (RSum, all memories, memory retrieval, their
memory-update variants, gold memory): a memory text, the current session so far, the request.
Its own module, so editing it re-runs only these methods.

`style`: "short" asks for a short reply; "paper" sets no length (RSum's prompt states none, and
Theanine credits RSum-LLM's long answers, 77 words on average, for its specificity wins).
`example`: an optional worked example appended to the instructions (RSum's one-shot)."""

from __future__ import annotations

from typing import Any, Literal

from pipeline.llm.types import ChatLLM, Messages
from pipeline.retrieval import count_tokens
from stages.methods import response
from stages.methods.base import Answer, ProbeInput
from stages.methods.dialogue import format_unit

ResponseStyle = Literal["paper", "short"]


def closing_block(current: list[dict], request: str, respondent: str, question: bool,
                  style: ResponseStyle = "short") -> str:
    """How every memory-based response prompt ends: the current session before the request, the
    request (or question), and what to write."""
    turns = list(current)
    if turns and turns[-1].get("text") == request:
        turns = turns[:-1]
    reply = f": {response.SHORT_REPLY}," if style == "short" else ","  # paper: no length asked for
    task = ("Answer the question in a short phrase." if question
            else f"Write {respondent}'s next utterance only{reply} without a speaker label.")
    return (f"Current session so far:\n{format_unit(turns) if turns else '(just started)'}\n\n"
            f"{'Question' if question else 'Latest message'}:\n{request}\n\n{task}")


def memory_messages(memory: str, current: list[dict], request: str, respondent: str, question: bool,
                    style: ResponseStyle = "short", example: str | None = None) -> Messages:
    """The messages asking `respondent` for the next utterance (or a question's answer) from `memory`."""
    system = (f"You are {respondent}, talking with someone you have had earlier conversations with. Your memory "
              "of those conversations is below; use it where it helps you reply consistently and personally.")
    if example:
        system += f"\n\nExample:\n{example}"
    user = f"Memory:\n{memory or '(empty)'}\n\n" + closing_block(current, request, respondent, question, style)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


async def answer_from_memory(llm: ChatLLM, probe: ProbeInput, memory: str, used_ids: list[str],
                             context_turns: int = 0, details: dict | None = None, style: ResponseStyle = "short",
                             example: str | None = None, **params: Any) -> Answer:
    """The response from a memory text; records the ids used and the memory's tokens."""
    question = probe.probe["kind"] == "qa"
    result = await llm.chat(memory_messages(memory, probe.current, probe.request, probe.probe["respondent"], question,
                                            style, example), **params)
    return Answer(text=response.one_turn(result.text, probe.episode.get("speakers") or []), used_ids=used_ids,
                  context_tokens=count_tokens(memory) if memory else 0, context_turns=context_turns,
                  model=result.model, details=details)
