"""The response frame shared by the retrieval and history methods (SeCom Sec. 2.1 and its
baselines, Theanine Sec. 3.2's full / zero history): memory units placed in time order, then the
current session, then the request; `generate` runs it for a probe.

Its own module so that editing these prompts re-runs only the respond stages of the methods
that use them, never segmentation, compression or banks.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pipeline.llm.types import ChatLLM, LLMResult, Messages
from pipeline.retrieval import count_tokens
from stages.methods.base import Answer, ProbeInput
from stages.methods.dialogue import format_unit, in_time_order

def format_memory(units: Sequence[dict]) -> str:
    """Retrieved units in time order, each under a header naming its session (and date if known)."""
    blocks = []
    for u in in_time_order(units):
        when = u.get("session_time")
        header = f"[Session {u['session_idx']}" + (f", {when}" if when not in (None, "") else "") + "]"
        blocks.append(f"{header}\n{u['text']}")
    return "\n\n".join(blocks)


def build_response_messages(
    retrieved_units: list[dict], current_turns: list[dict], request: str, respondent: str
) -> Messages:
    """Messages for the respondent's next utterance, given retrieved memory and the live session.

    retrieved_units: dicts with session_idx, text, optional session_time and turn_start.
    current_turns: the current session so far. request: the latest message, to be answered; if it is
    also the text of the last current turn it is shown once.
    """
    turns = list(current_turns)
    if turns and turns[-1].get("text") == request:
        turns = turns[:-1]
    memory = format_memory(retrieved_units) or "(no memories retrieved)"
    system = (
        f"You are {respondent}, talking with someone you have had earlier conversations with. Relevant "
        "excerpts of those earlier conversations are provided as memory. Use them when they help you "
        "reply consistently and personally; ignore them when they do not apply."
    )
    user = (
        f"Memory from earlier sessions (oldest first):\n{memory}\n\n"
        f"Current session so far:\n{format_unit(turns) if turns else '(just started)'}\n\n"
        f"Latest message:\n{request}\n\n"
        f"Write {respondent}'s next utterance only: a short, natural reply, without a speaker label."
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


async def respond(
    llm: ChatLLM, retrieved_units: list[dict], current_turns: list[dict], request: str, respondent: str,
    **params: Any,
) -> LLMResult:
    """SeCom's retrieval-augmented response (the same for turn, segment and session memory)."""
    return await llm.chat(build_response_messages(retrieved_units, current_turns, request, respondent), **params)


def build_qa_messages(retrieved_units: list[dict], question: str) -> Messages:
    """Messages for a QA probe answered from retrieved memory units (in time order)."""
    memory = format_memory(retrieved_units) or "(no memories retrieved)"
    system = (
        "You answer questions about past conversations using only the excerpts provided. Answer "
        "concisely, with a short phrase where possible. Use the session dates to resolve relative "
        "times. If the excerpts do not contain the answer, say that it is not mentioned."
    )
    user = f"Conversation excerpts (oldest first):\n{memory}\n\nQuestion: {question}\nAnswer:"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def build_chat_qa_messages(retrieved_units: list[dict], request: str) -> Messages:
    """A user request after the history, answered as a chat assistant (Long-MT-Bench+: its
    references are full answers, not short phrases)."""
    memory = format_memory(retrieved_units) or "(no memories retrieved)"
    system = ("You are a helpful assistant continuing a long conversation with a user. Relevant parts of "
              "your earlier conversations are provided; use them where the request refers back to them.")
    user = (f"Earlier conversation (oldest first):\n{memory}\n\nUser request: {request}\n\n"
            "Give a concise, coherent and helpful response.")
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


async def answer_question(llm: ChatLLM, retrieved_units: list[dict], question: str, *, chat: bool = False,
                          **params: Any) -> LLMResult:
    build = build_chat_qa_messages if chat else build_qa_messages
    return await llm.chat(build(retrieved_units, question), **params)


_BRACKET_TAG = r"\[[^\]\n]{1,40}\]:"


def one_turn(text: str, speakers: Sequence[str]) -> str:
    """The reply as one turn: a leading speaker tag ("Name:" or "[name]:") is stripped, and the text
    is cut where the model starts writing another turn (a line opening with a speaker tag)."""
    names = "|".join(re.escape(s) for s in sorted({*speakers, "User", "Assistant", "user", "assistant"},
                                                    key=len, reverse=True) if s)
    tag = rf"(?:{_BRACKET_TAG}|(?:{names}):)" if names else _BRACKET_TAG
    out = text.strip()
    while True:  # "A: B: hello" happens with small models
        stripped = re.sub(rf"^\s*{tag}\s*", "", out, count=1)
        if stripped == out:
            break
        out = stripped
    cut = re.search(rf"\n\s*{tag}", out)
    return (out[: cut.start()] if cut else out).strip()


def context_tokens(units: list[dict]) -> int:
    """Tokens (cl100k) of the memory that entered the context: the paper's "# Tokens"."""
    return sum(count_tokens(u["text"]) for u in units)


def context_turns(units: list[dict]) -> int:
    """Dataset turns of the memory that entered the context: the paper's "# Turns" (distinct source
    turn ids where units carry them, else utterances)."""
    ids = {t for u in units for t in (u.get("source_turn_ids") or [])}
    return len(ids) if ids else sum(int(u["turn_end"]) - int(u["turn_start"]) + 1 for u in units)


# Datasets whose questions are user requests with full reference answers, not short-fact QA.
CHAT_QA_DATASETS = frozenset({"longmtbench"})


async def generate(llm: ChatLLM, probe: ProbeInput, units: list[dict]) -> Answer:
    """The shared response frame over memory units in time order (QA or next response), cut to
    one turn; records the turns and tokens of memory that entered the context."""
    ordered = in_time_order(units)
    if probe.probe["kind"] == "qa":
        chat = probe.episode.get("dataset") in CHAT_QA_DATASETS
        result = await answer_question(llm, ordered, probe.request, chat=chat)
    else:
        result = await respond(llm, ordered, probe.current, probe.request, probe.probe["respondent"])
    return Answer(text=one_turn(result.text, probe.episode.get("speakers") or []),
                  used_ids=[u["unit_id"] for u in ordered], context_tokens=context_tokens(ordered),
                  context_turns=context_turns(ordered), model=result.model)
