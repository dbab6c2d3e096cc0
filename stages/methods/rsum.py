"""RSum (seed 002, Sections 3-4): recursively summarised memory. The memory starts empty; at the end
of each session the LLM rewrites it from the previous memory and that session (one call per
session; the memory after every session is kept). The memory prompt carries the elements of RSum's
own (reference code: llama/prompt.txt, chatgpt/data_loader.py MSCDataset) in our words: the key
personality information of both speakers, the traits the session shows, weighed for relevance and
importance, one coherent memory of at most `max_sentences` (20) sentences that serves as the
reference for replying. A response uses the latest memory before the
probe's session and the current session's context. Theanine's "RSum-LLM" variant first selects
the parts of the memory relevant to the current dialogue (`select_relevant`).

Settings that tell the two papers' RSum apart: `temperature` (RSum Section 4: 0; Theanine Section 3.3:
0.75 for every baseline, i.e. null here, which defers to the role's `llm.temperature`),
`select_relevant` (Theanine Section 3.2 step ii) and `response_style` ("rsum": RSum's own response
frame, the elements of its released prompt and no length, shared with gold memory and the context
baselines in configs/rsum_msc.yaml; "paper": the memory baselines' frame with no length asked for;
"short": the memory baselines' short-reply wording). A session whose update fails keeps the memory
before it in force: its row carries that memory with the error. `one_shot` shows one worked
dialogue in both the memory and the response prompt, as RSum Section 6 does; the dialogue is our own
invented one, not a labelled MSC dialogue from the valid set."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pydantic import Field

from pipeline.llm.types import Messages
from pipeline.retrieval import count_tokens
from pipeline.failures import FAILURE_FIELDS, attempt
from stages.methods.shared import memory_response
from stages.methods.base import (SNAPSHOT_FIELDS, Answer, EpisodeInput, Method, MethodContext, MethodSettings,
                                 ProbeInput, after_session)
from stages.methods.shared.session_memories import session_time, when
from stages.dialogue import format_unit

SUMMARY = pa.schema([
    *SNAPSHOT_FIELDS,  # the memory after session snapshot_session
    # when this session's update failed: the previous memory, carried (null if there was none) with `error`
    pa.field("memory", pa.string()),
    pa.field("tokens", pa.int32()),
    *FAILURE_FIELDS,
])

# Our own invented worked dialogue for `one_shot` (RSum Section 6 samples a labelled MSC dialogue
# from the valid set instead): the memory before it, the session, and the memory after it. The
# memory prompt shows before + session -> after; the response prompt shows before + the session's
# first turns -> its last turn.
EXAMPLE_MEMORY = "Alex works night shifts at a bakery. Sam is learning to play the cello."
EXAMPLE_SESSION = [
    {"speaker": "Alex", "text": "I finally switched to day shifts!"},
    {"speaker": "Sam", "text": "Great, now you can come to my recital."},
    {"speaker": "Alex", "text": "I'd love to. When is it?"},
    {"speaker": "Sam", "text": "Next Friday evening at the community hall. I'm playing the Bach suite I've been "
                               "practising since spring, so I'm nervous, but it helps to know a friend is there."},
]
EXAMPLE_NEW_MEMORY = ("Alex works at a bakery and has just moved from night to day shifts. Sam is learning the "
                      "cello and plays a Bach suite at a recital next Friday evening at the community hall; Alex "
                      "plans to come.")


def memory_example() -> str:
    return (f"Memory so far: {EXAMPLE_MEMORY}\nLatest session:\n{format_unit(EXAMPLE_SESSION)}\n"
            f"New memory: {EXAMPLE_NEW_MEMORY}")


def response_example() -> str:
    *before, request, reply = EXAMPLE_SESSION
    return (f"Memory: {EXAMPLE_MEMORY}\nCurrent session so far:\n{format_unit(before)}\n"
            f"Latest message: {request['text']}\n{reply['speaker']}'s next utterance: {reply['text']}")


class RSumSettings(MethodSettings):
    max_words: int | None = Field(default=None, ge=10)  # a word limit (ours); RSum's prompt limits sentences
    max_sentences: int | None = Field(default=20, ge=1)  # RSum's prompt: at most 20 sentences; None = no limit
    one_shot: bool = False  # one worked dialogue (ours) in the memory and the response prompt
    select_relevant: bool = False  # Theanine's RSum-LLM: pick the memory relevant to the dialogue first
    temperature: float | None = Field(default=0.0, ge=0)  # RSum: 0; None = the role's llm.temperature
    # short: the memory baselines' "a short, natural reply"; paper: that frame, no length asked for
    # (Theanine credits RSum-LLM's 77-word answers for its specificity wins); rsum: RSum's own frame
    # (its released response prompt's elements, no length; memory_response.rsum_messages)
    response_style: memory_response.ResponseStyle = "short"


def update_messages(previous: str, turns: list[dict], session_idx: int, settings: RSumSettings) -> Messages:
    """RSum's memory update (Sec. 3 Memory Management; its prompt's elements in our words): the memory
    holds what matters about each speaker's personality; the update takes the traits the latest
    session reveals, weighs how relevant and important each is, and keeps the memory one coherent
    whole of at most `max_sentences` sentences (RSum's 20), a reference for replying consistently."""
    limit = f" Keep it under {settings.max_words} words." if settings.max_words else ""
    example = f"\n\nExample:\n{memory_example()}" if settings.one_shot else ""
    system = ("You keep the memory of a long conversation between two people. The memory holds the key facts "
              "about the personality of each of them (what they are like, what they do, like and plan, what "
              "has happened to them), so that whoever carries the conversation on can refer to it and answer "
              "both of them in keeping with who they are. Given the memory so far and the latest session, "
              "write the new memory in three steps:\n"
              "1. Go through the latest session and pick out the personality traits and other key facts it "
              "reveals about each speaker.\n"
              "2. Weigh how relevant and how important each piece is: keep what matters most about them and "
              "leave out passing details.\n"
              "3. Fold it into the memory so far, keeping what still holds and changing what no longer does, "
              "so that the memory reads as one coherent account."
              + limit + example)
    length = (f"in {settings.max_sentences} sentences at most" if settings.max_sentences
              else "as plain sentences")
    user = (f"Memory so far:\n{previous or '(empty: this is the first session)'}\n\n"
            f"Latest session ({when(session_idx, session_time(turns))}):\n{format_unit(turns)}\n\n"
            f"Write the new memory {length}.")
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def select_messages(memory: str, dialogue: str) -> Messages:
    return [{"role": "system", "content": "From a memory of past conversations, copy only the sentences that "
                                          "matter for the conversation going on now; nothing else."},
            {"role": "user", "content": f"Memory:\n{memory}\n\nConversation now:\n{dialogue}\n\nRelevant sentences:"}]


class RSum(Method[RSumSettings]):
    name = "rsum"
    memory = {"summary": SUMMARY}
    memory_kind = "snapshots"
    whole_memory_in_context = True  # every response reads the whole running summary

    def params(self, settings: RSumSettings) -> dict[str, Any]:
        return {} if settings.temperature is None else {"temperature": settings.temperature}

    async def build(self, ctx: MethodContext[RSumSettings], episode: EpisodeInput) -> dict[str, list[dict]]:
        eid = episode.episode["episode_id"]
        rows, memory = [], ""
        for s, turns in episode.sessions.items():
            key = after_session(eid, s)
            # Each memory is built from the previous memory and this session only.
            result, failed = await attempt(ctx.llm.chat(update_messages(memory, turns, s, ctx.settings),
                                                        **self.params(ctx.settings)))
            if result is None:  # the previous memory stays in force: the next session's probes read it
                rows.append({**key, "memory": memory or None, "tokens": count_tokens(memory) if memory else None,
                             **failed})
                continue
            memory = result.text.strip()
            rows.append({**key, "memory": memory, "tokens": count_tokens(memory), **failed})
        return {"summary": rows}

    async def answer(self, ctx: MethodContext[RSumSettings], probe: ProbeInput, memory: dict[str, list[dict]]) -> Answer:
        llm, settings = ctx.llm, ctx.settings
        visible = [r for r in memory.get("summary", []) if r["memory"] is not None]
        latest = max(visible, key=lambda r: r["snapshot_session"], default=None)
        text = latest["memory"] if latest else ""
        details: dict[str, Any] = {"memory_after_session": latest["snapshot_session"] if latest else None}
        if text and settings.select_relevant:
            dialogue = format_unit(probe.current) if probe.current else probe.request
            text = (await llm.chat(select_messages(text, dialogue), **self.params(settings))).text.strip()
            details["selected"] = text
        used = [f"summary:{latest['snapshot_session']}"] if latest else []
        return await memory_response.answer_from_memory(
            llm, probe, text, used, details=details, style=settings.response_style,
            example=response_example() if settings.one_shot else None, **self.params(settings))

    def memory_view(self, episode: EpisodeInput, memory: dict[str, list[dict]], settings: RSumSettings) -> str | None:
        visible = [r for r in memory.get("summary", []) if r["memory"] is not None]
        return max(visible, key=lambda r: r["snapshot_session"])["memory"] if visible else None

    def build_stats(self, produced: dict[str, list[dict]]) -> dict[str, Any]:
        rows = produced.get("summary", [])
        if not rows:
            return {}
        return {"memory_calls": len(rows), "failed_sessions": sum(r["error"] is not None for r in rows),
                # the failed ones that carried an earlier memory forward (the rest had none yet)
                "carried_sessions": sum(r["error"] is not None and r["memory"] is not None for r in rows),
                "memory_calls_per_episode": {rows[0]["episode_id"]: len(rows)}}
