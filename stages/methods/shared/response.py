"""The response frame shared by the retrieval and history methods (SeCom Sec. 2.1 and its
baselines, Theanine Sec. 3.2's full / zero history): memory units placed in time order, then the
current session, then the request; `generate` runs it for a probe. A QA probe is asked with our
prompt, as LoCoMo's task_eval asks it (`qa_prompt: locomo_official`), or as LongMemEval's reader
asks it (`qa_prompt: longmemeval`, with Chain-of-Note: `longmemeval_con`), or in SeCom's official
chat frame (`qa_prompt: secom_chat`: no headers; the units in time order as Sec. 2.1 says, or as
ranked as experiment/chat.py shows them: `secom_chat_order`), or in mem0's rag.py frame
(`qa_prompt: mem0_rag`, stages/methods/shared/mem0_rag.py), or as LoCoMo-Plus's reader asks it
(`qa_prompt: locomo_plus`, stages/methods/shared/locomo_plus_reader.py). LoCoMo's protocol shows the units
newest first, as its get_input_context builds the conversation.

Its own module so that editing these prompts re-runs only the respond stages of the methods
that use them, never segmentation, compression or banks.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pipeline.corpus.locomo import CATEGORIES as LOCOMO_CATEGORIES
from pipeline.llm.types import ChatLLM, LLMResult, Messages
from pipeline.retrieval import count_tokens
from stages.methods.base import Answer, ProbeInput
from stages.methods.shared import beam_reader, locomo_plus_reader, mem0_rag, memoryagentbench_reader
from stages.dialogue import build_exchanges, format_unit, in_time_order, unit_turns

# How QA probes are asked: `ours` (one prompt for every category; it invites "not mentioned"),
# `locomo_official` (LoCoMo's task_eval/gpt_utils.py protocol; see `build_locomo_qa_messages`), or
# `longmemeval` / `longmemeval_con` (LongMemEval's reader, without / with Chain-of-Note; see
# `build_longmemeval_messages`).
# `secom_chat`: SeCom's experiment/chat.py frame (see `build_secom_chat_messages`).
# `mem0_rag`: mem0's evaluation/src/rag.py frame for its full-context and RAG rows (stages/methods/shared/mem0_rag.py).
# `locomo_plus`: LoCoMo-Plus's reader, a cognitive item's trigger as the dialogue's last turn
# (stages/methods/shared/locomo_plus_reader.py).
# `memoryagentbench`: MemoryAgentBench's agents (stages/methods/shared/memoryagentbench_reader.py): the
# long-context agent's frame for a whole history, the RAG agent's for retrieved units (rank order).
# `beam`: BEAM's baselines (stages/methods/shared/beam_reader.py): the long-context baseline's chat turns
# for a whole history, the RAG baseline's prompt for retrieved units (rank order).
QAPrompt = Literal["ours", "locomo_official", "longmemeval", "longmemeval_con", "secom_chat", "mem0_rag", "locomo_plus",
                   "memoryagentbench", "beam"]
# The order of the units in the `secom_chat` frame: `time` (session, then first turn: SeCom Sec. 2.1,
# "the retrieved memory units in time order") or `rank` (as retrieval ranked them: experiment/chat.py
# joins the retrieved texts as retrieve.py returns them).
SecomChatOrder = Literal["time", "rank"]

# The length instruction every compared method's response prompt shares, so a comparison between
# methods is not one of reply lengths (CREEM and the memory baselines use it too).
SHORT_REPLY = "a short, natural reply"


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
        f"Write {respondent}'s next utterance only: {SHORT_REPLY}, without a speaker label."
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
            "Reply in a way that is brief, clear and useful.")
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


async def answer_question(llm: ChatLLM, retrieved_units: list[dict], question: str, *, chat: bool = False,
                          **params: Any) -> LLMResult:
    build = build_chat_qa_messages if chat else build_qa_messages
    return await llm.chat(build(retrieved_units, question), **params)


# LoCoMo's QA protocol (snap-research/LoCoMo task_eval/gpt_utils.py), in our words with every element:
# an opening naming the two speakers and saying each conversation starts with its date; each
# conversation under "DATE:" and "CONVERSATION:"; a short-phrase answer in the conversation's own
# words; for temporal questions (category 2) a hint to use the DATE of the conversation; adversarial
# questions (category 5) asked as a choice between "Not mentioned in the conversation" and the
# tempting wrong answer, in a random order (seeded here by the probe id), the letter mapped back to
# the option's text. No other question is told that "not mentioned" is an answer.
NOT_MENTIONED = "Not mentioned in the conversation"  # LoCoMo's option text, which its scorer looks for
# LoCoMo answers each question greedily with at most 32 tokens (run_chatgpt(..., num_tokens_request=32,
# temperature=0)), whatever the generator role samples; sent with the request, so in its cache key.
LOCOMO_SAMPLING: dict[str, Any] = {"temperature": 0.0, "max_tokens": 32}
LOCOMO_OPENING = ("What follows is a conversation between {speakers}, or the parts of it that were kept. "
                  "It spans several days, and each conversation opens with the date it took place.")
LOCOMO_QUESTION = ("Based on the conversation above, answer the question below with a short phrase, using "
                   "the exact words of the conversation wherever you can.\n\nQuestion: {question} Short answer:")
LOCOMO_DATE_HINT = " Give an approximate date, worked out from the DATE above the CONVERSATION."
LOCOMO_CHOICE_QUESTION = ("Based on the conversation above, answer the question below.\n\n"
                          "Question: {question} Choose the correct answer: (a) {a} (b) {b}. Short answer:")
LOCOMO_PLAIN_QUESTION = ("Based on the conversation above, answer the question below.\n\n"
                         "Question: {question} Short answer:")


def _locomo_category(category: Any) -> int | None:
    """LoCoMo's category id from a probe's category (its name, or the id as text)."""
    if category is None:
        return None
    by_name = {name: cid for cid, name in LOCOMO_CATEGORIES.items()}
    text = str(category).strip().lower()
    return by_name.get(text) or (int(text) if text.isdigit() else None)


def cat5_options(probe_id: str, adversarial_answer: str) -> dict[str, str]:
    """The two options of an adversarial question, {"a": ..., "b": ...}: "Not mentioned in the
    conversation" first or second with probability 1/2 each, as LoCoMo draws it, seeded by the probe id
    so every method and every rerun sees the same order."""
    if random.Random(f"locomo-cat5:{probe_id}").random() < 0.5:
        return {"a": NOT_MENTIONED, "b": adversarial_answer}
    return {"a": adversarial_answer, "b": NOT_MENTIONED}


def cat5_answer(prediction: str, options: dict[str, str]) -> str:
    """LoCoMo's get_cat_5_answer: a one-letter reply ("a" / "b") or a three-character one ("(a)" /
    "(b)") becomes its option's text; any other reply is kept as written."""
    text = prediction.strip().lower()
    if len(text) == 1:
        return options["a"] if "a" in text else options["b"]
    if len(text) == 3:
        return options["a"] if "(a)" in text else options["b"]
    return prediction.strip()


def format_locomo_context(units: Sequence[dict]) -> str:
    """Memory units newest first (each one's turns in order), each under "DATE: <session time>" and
    "CONVERSATION:": task_eval's get_input_context prepends each later session before the earlier ones."""
    blocks = []
    for u in reversed(in_time_order(units)):
        when = u.get("session_time")
        date = when if when not in (None, "") else f"unknown (session {u['session_idx']})"
        blocks.append(f"DATE: {date}\nCONVERSATION:\n{u['text']}")
    return "\n\n".join(blocks)


def build_locomo_qa_messages(units: list[dict], question: str, category: Any, speakers: Sequence[str],
                             options: dict[str, str] | None = None) -> Messages:
    """One user message as LoCoMo asks a QA: the opening, the conversation, then the question in
    its category's form. options: the two choices of an adversarial question (`cat5_options`); without
    them an adversarial question is asked plainly, still without inviting "not mentioned"."""
    cid = _locomo_category(category)
    if cid == 5 and options is not None:
        ask = LOCOMO_CHOICE_QUESTION.format(question=question, a=options["a"], b=options["b"])
    elif cid == 5:
        ask = LOCOMO_PLAIN_QUESTION.format(question=question)
    else:
        ask = LOCOMO_QUESTION.format(question=question + (LOCOMO_DATE_HINT if cid == 2 else ""))
    names = " and ".join(s for s in speakers if s) or "two speakers"
    context = format_locomo_context(units) or "(no conversation shown)"
    opening = LOCOMO_OPENING.format(speakers=names)
    return [{"role": "user", "content": f"{opening}\n\n{context}\n\n{ask}"}]


# LongMemEval's reader (xiaowu0162/LongMemEval src/generation/run_generation.py), in our words with
# every element: one user message; the history as chat sessions between the assistant and a user,
# sorted by date (stable), each numbered, under its date, its turns as JSON ({"role", "content"}, the
# reader's recommended format; a unit whose turns are not known is shown as its text); then the
# current date (the question's `question_date`) and the question; no answer length asked for (the
# reader allows 500 tokens) and no word on declining. A retrieved round is a session block of its own
# with its session's date, as there. `longmemeval_con` adds Chain-of-Note: one call per session
# writes reading notes of what in it helps answer the question ("empty" when nothing does), and the
# answer reads each session's notes in its place. Greedy, 500 tokens per call, as there.
LONGMEMEVAL_SAMPLING: dict[str, Any] = {"temperature": 0.0, "max_tokens": 500}
LONGMEMEVAL_INTRO = ("What follows are earlier chat sessions between a user and you, the assistant, oldest first, "
                     "each with the date it took place. Answer the user's question from whichever of them bear on it.")
LONGMEMEVAL_NOTES_INTRO = ("What follows are reading notes taken from earlier chat sessions between a user and you, "
                           "the assistant, oldest first, each with the date of its session. Answer the user's question "
                           "from whichever of them bear on it.")
LONGMEMEVAL_NOTE_TASK = ("What follows is one earlier chat session between a user and you, the assistant, with its "
                         "date, then a question the user asks now. Take reading notes: write down everything the "
                         "session says about the user that helps answer the question. If it holds nothing of the "
                         "kind, write only: empty.")
_DATED_REQUEST = re.compile(r"^\[Current date: ([^\]]*)\] (.*)$", re.DOTALL)  # stages.probes.dated_question


def split_dated(request: str) -> tuple[str | None, str]:
    """(the current date, the bare question) of a QA request; the date is None when not given."""
    m = _DATED_REQUEST.match(request)
    return (m[1], m[2]) if m else (None, request)


def longmemeval_date(when: Any) -> str:
    """A session date as LongMemEval's release writes it ("2023/05/20 (Sat) 02:21")."""
    if isinstance(when, datetime):
        return f"{when:%Y/%m/%d (%a) %H:%M}"
    return "unknown" if when in (None, "") else str(when)


def longmemeval_content(turns: Sequence[dict]) -> str:
    """Turns as the reader's JSON list of {"role", "content"} (json.dumps' defaults, as there)."""
    return json.dumps([{"role": t["speaker"], "content": t["text"]} for t in turns])


def by_date(units: Sequence[dict]) -> list[dict]:
    """Units sorted by their session's date, stable (undated ones last), then in time order."""
    def key(u: dict) -> tuple:
        when = u.get("session_time")
        dated = isinstance(when, datetime)
        return (not dated, when if dated else datetime.min, int(u["session_idx"]), int(u.get("turn_start") or 0))
    return sorted(units, key=key)


def longmemeval_blocks(units: Sequence[dict], history: dict[int, list[dict]] | None) -> list[tuple[str, str]]:
    """(date, content) of each unit, by date: its turns as JSON, else its text."""
    blocks = []
    for u in by_date(units):
        turns = unit_turns(u, history)
        blocks.append((longmemeval_date(u.get("session_time")), longmemeval_content(turns) if turns else u["text"]))
    return blocks


def build_longmemeval_messages(blocks: Sequence[tuple[str, str]], question: str, current_date: str | None,
                               notes: bool = False) -> Messages:
    """One user message as LongMemEval's reader asks: the dated sessions (or their notes), the current
    date, the question."""
    shown = "\n\n".join(f"Session {i} (date: {date})\n{'Notes' if notes else 'Turns'}:\n{content}"
                        for i, (date, content) in enumerate(blocks, start=1)) or "(no earlier sessions)"
    intro = LONGMEMEVAL_NOTES_INTRO if notes else LONGMEMEVAL_INTRO
    user = f"{intro}\n\n{shown}\n\nToday's date: {current_date or 'not given'}\nQuestion: {question}\nAnswer:"
    return [{"role": "user", "content": user}]


def build_longmemeval_note_messages(date: str, content: str, question: str, current_date: str | None) -> Messages:
    """Chain-of-Note's first step for one session: its reading notes for the question."""
    user = (f"{LONGMEMEVAL_NOTE_TASK}\n\nSession (date: {date})\nTurns:\n{content}\n\n"
            f"Date of the question: {current_date or 'not given'}\nQuestion: {question}\nNotes:")
    return [{"role": "user", "content": user}]


async def answer_longmemeval(llm: ChatLLM, units: Sequence[dict], request: str,
                             history: dict[int, list[dict]] | None, notes: bool) -> tuple[LLMResult, list[str] | None]:
    """LongMemEval's reader over the units (with Chain-of-Note when `notes`): (the answer, the notes)."""
    current_date, question = split_dated(request)
    blocks = longmemeval_blocks(units, history)
    written = None
    if notes:
        results = await asyncio.gather(*(llm.chat(build_longmemeval_note_messages(date, content, question, current_date),
                                                  **LONGMEMEVAL_SAMPLING) for date, content in blocks))
        written = [r.text.strip() for r in results]
        blocks = [(date, note) for (date, _), note in zip(blocks, written)]
    result = await llm.chat(build_longmemeval_messages(blocks, question, current_date, notes), **LONGMEMEVAL_SAMPLING)
    return result, written


# SeCom's answer frame (microsoft/SeCom experiment/chat.py, the one answer prompt of the official
# code; the paper shows none), in our words with every element: the model is a dialogue agent; it is
# shown evidence that bears on the user's input and the recent dialogue between the user and itself;
# it is to read, retain and understand that material, then give one reply that is brief, coherent
# and helpful. One user message, no system message: the frame, the retrieved units (each unit's text
# as it is, units separated by a blank line, no headers) in time order (Sec. 2.1) or in the order
# retrieval ranked them (the official code; `secom_chat_order`), then the question after "Question:".
# The official code shows no dates, so none are added.
SECOM_CHAT_FRAME = ("You are a capable conversational agent. What follows is evidence that bears on the user's "
                    "input, along with recent dialogue between the user and you. Go through the material "
                    "carefully, keep it in memory and make sense of it; then write a single reply that is "
                    "brief, hangs together and is of real help.")
# Where the official post-processing (chat.py get_answer) cuts a reply that goes on to a new question.
SECOM_CHAT_CUTS = ("\nQuestion:", "\nQ:")


def build_secom_chat_messages(units: Sequence[dict], question: str) -> Messages:
    """The `secom_chat` request: one user message with the frame, the units in the order given (time
    or rank order, `secom_chat_order`) joined by blank lines, and the question."""
    context = "\n\n".join(u["text"] for u in units)
    parts = [SECOM_CHAT_FRAME, *([context] if context else []), f"Question: {question}"]
    return [{"role": "user", "content": "\n\n".join(parts)}]


def cut_secom_chat(text: str) -> str:
    """A reply cut where it starts a new question, as the official post-processing does."""
    for marker in SECOM_CHAT_CUTS:
        text = text.split(marker)[0]
    return text


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


def context_turns(units: list[dict], history: dict[int, list[dict]] | None = None) -> int:
    """Exchanges of the past that the memory in the context drew from: SeCom's "# Turns", which counts
    a user-agent interaction (one exchange, as `build_exchanges` cuts a session) as one turn, never an
    utterance. An exchange counts once when any of its turns is in a unit. A unit whose session is not
    in `history` (turns by session, as a probe sees them) counts its distinct source turn ids, else its
    utterances."""
    exchanges: dict[int, list[tuple[int, int]]] = {}  # session -> (first, last turn_idx) of each exchange
    seen: set[tuple[int, int]] = set()
    loose_ids: set[str] = set()
    loose = 0
    for u in units:
        s = int(u["session_idx"])
        turns = (history or {}).get(s)
        if turns and u.get("turn_start") is not None and u.get("turn_end") is not None:
            if s not in exchanges:
                exchanges[s] = [(turns[a]["turn_idx"], turns[b]["turn_idx"]) for a, b in build_exchanges(turns)]
            first, last = int(u["turn_start"]), int(u["turn_end"])
            seen |= {(s, k) for k, (a, b) in enumerate(exchanges[s]) if a <= last and b >= first}
        elif u.get("source_turn_ids"):
            loose_ids |= set(u["source_turn_ids"])
        else:
            loose += int(u["turn_end"]) - int(u["turn_start"]) + 1
    return len(seen) + len(loose_ids) + loose


def context_turn_pairs(units: list[dict], history: dict[int, list[dict]] | None = None) -> int:
    """SeCom Table 6's "# Turns" of LoCoMo as its numbers count it: per session, the utterances of the
    past in the context, halved and rounded down (a pair of consecutive utterances is one turn), summed
    over sessions; the whole past gives the sum over sessions of floor(utterances / 2) (293.4 on
    locomo10 = Table 6's 293, where `context_turns`' first-speaker exchanges give 307.9). A unit whose
    session is not in `history` counts its distinct source turn ids, else its utterances."""
    shown: dict[int | str, set] = {}
    for u in units:
        s = int(u["session_idx"])
        turns = (history or {}).get(s)
        if turns and u.get("turn_start") is not None and u.get("turn_end") is not None:
            first, last = int(u["turn_start"]), int(u["turn_end"])
            shown.setdefault(s, set()).update(t["turn_idx"] for t in turns if first <= int(t["turn_idx"]) <= last)
        elif u.get("source_turn_ids"):
            shown.setdefault(f"ids:{s}", set()).update(u["source_turn_ids"])
        else:
            shown.setdefault(f"span:{s}", set()).update(range(int(u["turn_start"]), int(u["turn_end"]) + 1))
    return sum(len(ids) // 2 for ids in shown.values())


# QA frames whose reply is the raw completion, stripped, as their official code stores it.
RAW_REPLY = frozenset({"longmemeval", "longmemeval_con", "mem0_rag", "locomo_plus", "memoryagentbench", "beam"})
# Datasets whose questions are user requests with full reference answers, not short-fact QA.
CHAT_QA_DATASETS = frozenset({"longmtbench"})


def turn_spans(units: list[dict]) -> list[list[int]]:
    """[session, first turn, last turn] of each unit: which turns of the corpus the context held (the
    judges rebuild that history from them)."""
    return [[int(u["session_idx"]), int(u["turn_start"]), int(u["turn_end"])] for u in units
            if u.get("turn_start") is not None and u.get("turn_end") is not None]


async def generate(llm: ChatLLM, probe: ProbeInput, units: list[dict], qa_prompt: QAPrompt = "ours",
                   secom_chat_order: SecomChatOrder = "time", retrieved: bool = False) -> Answer:
    """The shared response frame over memory units in time order (QA or next response; `secom_chat`
    in `secom_chat_order`; `retrieved`: the units are a retrieval's, in rank order), cut to one turn; records the exchanges (`context_turns`) and tokens of
    memory that entered the context, and in `details` the turn spans of that memory and its utterance
    pairs (`context_turn_pairs`; and, under LoCoMo's protocol, its sampling, the options and the reply
    before mapping; under LongMemEval's reader, its sampling and any notes)."""
    ordered = in_time_order(units)
    details: dict[str, Any] = {"context_spans": turn_spans(ordered),
                               "context_turn_pairs": context_turn_pairs(ordered, probe.history)}
    speakers = probe.episode.get("speakers") or []
    options = None
    if probe.probe["kind"] == "qa":
        chat = probe.episode.get("dataset") in CHAT_QA_DATASETS
        if qa_prompt == "secom_chat":  # both QA benchmarks; in time order (Sec. 2.1) or as ranked
            details["qa_prompt"] = qa_prompt
            details["secom_chat_order"] = secom_chat_order
            shown = ordered if secom_chat_order == "time" else units
            result = await llm.chat(build_secom_chat_messages(shown, probe.request))
        elif qa_prompt == "locomo_official" and not chat:
            category = probe.probe.get("category")
            adversarial = probe.probe.get("adversarial_answer")
            if _locomo_category(category) == 5:
                options = cat5_options(probe.probe["probe_id"], adversarial) if adversarial else None
                details["options"] = options  # null: the probe had no adversarial answer, asked plainly
            details["qa_prompt"] = qa_prompt
            details["sampling"] = dict(LOCOMO_SAMPLING)
            result = await llm.chat(build_locomo_qa_messages(ordered, probe.request, category, speakers, options),
                                    **LOCOMO_SAMPLING)
        elif qa_prompt in ("longmemeval", "longmemeval_con") and not chat:
            details["qa_prompt"] = qa_prompt
            details["sampling"] = dict(LONGMEMEVAL_SAMPLING)
            result, notes = await answer_longmemeval(llm, ordered, probe.request, probe.history,
                                                     notes=qa_prompt == "longmemeval_con")
            if notes is not None:
                details["notes"] = notes  # Chain-of-Note's reading notes, one per session block by date
        elif qa_prompt == "mem0_rag" and not chat:  # the units as given: rank order for retrieval
            details["qa_prompt"] = qa_prompt
            details["sampling"] = dict(mem0_rag.MEM0_RAG_SAMPLING)
            result = await llm.chat(mem0_rag.build_messages(units, probe.request, probe.history),
                                    **mem0_rag.MEM0_RAG_SAMPLING)
        elif qa_prompt == "locomo_plus" and not chat:  # oldest first; a cognitive trigger as the last turn
            details["qa_prompt"] = qa_prompt
            details["sampling"] = dict(locomo_plus_reader.LOCOMO_PLUS_SAMPLING)
            # the release shows no date: a cognitive trigger's "[Current date: ...]" is dropped
            question = split_dated(probe.request)[1]
            result = await llm.chat(locomo_plus_reader.build_messages(ordered, question, probe.probe.get("category"),
                                                                      speakers, probe.history),
                                    **locomo_plus_reader.LOCOMO_PLUS_SAMPLING)
        elif qa_prompt == "memoryagentbench" and not chat:  # the RAG agent's rank order, else the history's
            result, extra = await memoryagentbench_reader.answer(
                llm, units if retrieved else ordered, probe.request, str(probe.probe.get("category") or ""),
                frame="rag" if retrieved else "long_context")
            details.update(extra)
        elif qa_prompt == "beam" and not chat:  # the RAG baseline's rank order, else the history's
            result, extra = await beam_reader.answer(llm, units if retrieved else ordered,
                                                     split_dated(probe.request)[1], probe.history, retrieved)
            details.update(extra)
        else:
            result = await answer_question(llm, ordered, probe.request, chat=chat)
    else:
        result = await respond(llm, ordered, probe.current, probe.request, probe.probe["respondent"])
    raw = cut_secom_chat(result.text) if details.get("qa_prompt") == "secom_chat" else result.text
    # LongMemEval's reader and mem0's rag.py keep the completion as written (stripped): no turn cut.
    text = raw.strip() if details.get("qa_prompt") in RAW_REPLY else one_turn(raw, speakers)
    if details.get("qa_prompt") == "locomo_plus":
        text = locomo_plus_reader.reply_text(text)
    if options is not None:
        details["raw_answer"] = text
        text = cat5_answer(text, options)
    # mem0_rag: the context's tokens as shown ("timestamp | speaker: text" lines), as Table 2 counts them
    tokens = count_tokens(mem0_rag.context(units, probe.history)) if details.get("qa_prompt") == "mem0_rag" \
        else context_tokens(ordered)
    return Answer(text=text, used_ids=[u["unit_id"] for u in ordered], context_tokens=tokens,
                  context_turns=context_turns(ordered, probe.history), details=details, model=result.model)
