"""The response frame of the memory baselines (RSum, all memories, memory retrieval, their
memory-update variants, gold memory): a memory text, the current session so far, the request.
Its own module, so editing it re-runs only these methods.

`style`: "short" asks for a short reply; "paper" sets no length (RSum's prompt states none, and
Theanine credits RSum-LLM's long answers, 77 words on average, for its specificity wins); "rsum" is
RSum's own response frame (`rsum_messages`), no length either.
`example`: an optional worked example appended to the instructions (RSum's one-shot).

RSum's frame (`rsum_messages`) is the one frame of RSum's four methods (Table 1: predicted memory,
gold memory, all context, part context), as RSum's code answers all four with one prompt
(qingyue2014/Rsum main_chatgpt.py; chatgpt/robot.py gpt_response_results; memoryrecu/gpt_recu.py:11).
The elements of that released prompt, in our words: a model that holds conversations grounded in
the speakers' personalities; a reply in a conversational, fluent tone; consistent with the memory
it is given; one that keeps the conversation going; no emoticons. It sets no length. The four
methods differ only in what the frame carries: a memory (predicted or gold), the earlier sessions
(all context), or neither (part context).

Also CREEM's response frame (App. A.4, `creem_reply_messages`): CREEM answers with it, and so do its
stand-in baselines with `reply_frame: creem` (CREEM Sec. 3.2 gives every method the same response
generator), which is why it lives here and not in creem/."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pipeline.llm.types import ChatLLM, Messages
from pipeline.retrieval import count_tokens
from stages.methods.shared import response
from stages.methods.base import Answer, ProbeInput
from stages.dialogue import format_unit, in_time_order

ResponseStyle = Literal["paper", "short", "rsum"]

RSUM_SYSTEM = ("You are a language model that takes part in conversations shaped by the personalities of the "
               "people in them.")
# RSum's released response prompt, element by element in our words (no length is asked for).
RSUM_RULES = ("Speak in a natural, fluent, conversational tone; stay consistent with what the memory and the "
              "conversation tell you about both speakers; reply so that the conversation keeps going; use no "
              "emoticons or emoji.")


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


def rsum_messages(memory: str | None, past: str | None, current: list[dict], request: str, respondent: str,
                  question: bool, example: str | None = None) -> Messages:
    """RSum's one response frame (see the module's docstring): `memory` (None: no memory block, the
    context baselines), `past` (the earlier sessions as text: all context; None: not shown), the
    current session and the request -> `respondent`'s next utterance, no length asked for."""
    system = RSUM_SYSTEM + (f"\n\nExample:\n{example}" if example else "")
    blocks = []
    if memory is not None:
        blocks.append(f"Memory of both speakers:\n{memory or '(empty)'}")
    if past is not None:
        blocks.append(f"Earlier sessions (oldest first):\n{past or '(none)'}")
    turns = list(current)
    if turns and turns[-1].get("text") == request:
        turns = turns[:-1]
    task = ("Answer the question in a short phrase." if question
            else f"Write {respondent}'s next utterance only, without a speaker label. {RSUM_RULES}")
    blocks.append(f"Current session so far:\n{format_unit(turns) if turns else '(just started)'}")
    blocks.append(f"{'Question' if question else 'Latest message'}:\n{request}\n\n{task}")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(blocks)}]


def memory_messages(memory: str, current: list[dict], request: str, respondent: str, question: bool,
                    style: ResponseStyle = "short", example: str | None = None) -> Messages:
    """The messages asking `respondent` for the next utterance (or a question's answer) from `memory`."""
    if style == "rsum":
        return rsum_messages(memory, None, current, request, respondent, question, example)
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


async def answer_rsum_context(llm: ChatLLM, probe: ProbeInput, units: list[dict], past: bool) -> Answer:
    """RSum's All Context (`past`: the earlier sessions, as `units`) or Part Context (the current
    session only) in RSum's frame; records what `response.generate` records of the context."""
    ordered = in_time_order(units)
    result = await llm.chat(rsum_messages(None, response.format_memory(ordered) if past else None, probe.current,
                                          probe.request, probe.probe["respondent"], probe.probe["kind"] == "qa"))
    details = {"reply_frame": "rsum", "context_spans": response.turn_spans(ordered),
               "context_turn_pairs": response.context_turn_pairs(ordered, probe.history)}
    return Answer(text=response.one_turn(result.text, probe.episode.get("speakers") or []),
                  used_ids=[u["unit_id"] for u in ordered], context_tokens=response.context_tokens(ordered),
                  context_turns=response.context_turns(ordered, probe.history), details=details, model=result.model)


# ------------------------------------------------------------------------------- CREEM's frame
# CREEM App. A.4's response frame, here rather than in creem/ because CREEM's stand-in baselines
# answer with it too (`reply_frame: creem` of all_memories and ld_agent): CREEM Sec. 3.2 gives every
# method the same response generator, so Table 3 compares memories, not prompts or lengths. Every
# element of A.4, in our words: a response generator that takes the memory into account and
# continues the conversation with a fitting response to its last utterance; three rules (not long,
# no speaker's name, let the memory show); then the memory, the conversation, whose response.

def creem_length(words: int | None) -> str:
    """How long a reply may be: the memory baselines' "a short, natural reply", or a word cap."""
    return response.SHORT_REPLY if words is None else f"a reply of at most {words} words"


def creem_reply_messages(respondent: str, about: str | None, memory: Sequence[str], dialogue: str, request: str,
                         words: int | None, question: bool) -> Messages:
    """A.4: the memory about `about` (None: a memory of both speakers, as the stand-ins keep, each
    line saying whom it concerns where it can), the whole current session (`dialogue`, its last line
    the one to answer) -> `respondent`'s next utterance (plain text). A QA probe asks `request`
    after the session instead."""
    task = ("answer the question that follows the conversation, in a short phrase" if question
            else "continue the conversation with a fitting response to its last utterance")
    system = (f"You generate responses in a conversation, speaking as {respondent}. Take the memory you are given "
              f"into account and {task}. While writing:\n"
              f"- do not make it long: write {creem_length(words)};\n"
              "- do not write out the name of any speaker;\n"
              "- let the memory show in what you say.")
    mem = "\n".join(f"- {m}" for m in memory) or "- (nothing remembered)"
    header = f"Memory of {about}" if about else "Memory of both speakers"
    user = (f"{header}:\n{mem}\n\nConversation:\n{dialogue or '(just started)'}\n\n"
            + (f"Question: {request}\n\nAnswer of {respondent}:" if question
               else f"Response of {respondent} (the words only, no speaker label):"))
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def creem_turns(probe: ProbeInput) -> tuple[list[dict], bool]:
    """The current session with the request as its last line, and whether the request had to be
    added (a question asked after the session, or a probe with its own context): it is then the
    other speaker's last utterance."""
    turns = list(probe.current)
    asked = not turns or turns[-1]["text"] != probe.request
    if asked:
        respondent = probe.probe["respondent"]
        other = next((s for s in probe.episode.get("speakers") or [] if s != respondent), respondent)
        turns.append({"speaker": other, "text": probe.request, "turn_idx": turns[-1]["turn_idx"] + 1 if turns else 0})
    return turns, asked


async def answer_creem_frame(llm: ChatLLM, probe: ProbeInput, memory: Sequence[str], used_ids: list[str],
                             about: str | None = None, words: int | None = None, context_turns: int = 0,
                             details: dict | None = None, **params: Any) -> Answer:
    """A response in CREEM's frame from memory lines, with the whole current session (a QA probe:
    the session as it stands, then the question)."""
    question = probe.probe["kind"] == "qa"
    turns, _ = creem_turns(probe)
    dialogue = format_unit(probe.current if question else turns)
    result = await llm.chat(creem_reply_messages(probe.probe["respondent"], about, memory, dialogue, probe.request,
                                                 words, question), **params)
    text = "\n".join(memory)
    return Answer(text=response.one_turn(result.text, probe.episode.get("speakers") or []), used_ids=used_ids,
                  context_tokens=count_tokens(text) if text else 0, context_turns=context_turns,
                  model=result.model, details={**(details or {}), "reply_frame": "creem"})
