"""Session memories shared by Theanine's Phase I and the memory baselines: at the end of each
session, one LLM call writes what is worth remembering as short sentences, each with its time
(the session index, its date when the corpus has one, and the corpus's gap label before the
session, e.g. MSC's / Conversation Chronicles' "2 weeks later") and its origin (session and turns).

Its own module, so that editing this prompt re-runs exactly the methods built on it.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Sequence

import pyarrow as pa
from pydantic import BaseModel, Field

from pipeline.llm.types import ChatLLM, Messages
from stages.methods.base import SNAPSHOT_FIELDS, after_session
from stages.dialogue import format_unit

# One row per memory, keyed by the end of the session it was summarised from (a `log` memory).
MEMORY_FIELDS = [
    *SNAPSHOT_FIELDS,
    pa.field("memory_id", pa.string(), nullable=False),  # "<session>:<index>"
    pa.field("session_idx", pa.int32(), nullable=False),
    pa.field("memory_idx", pa.int32(), nullable=False),
    pa.field("event", pa.string(), nullable=False),
    pa.field("session_time", pa.string()),  # the session's date when the corpus has one
    pa.field("session_gap", pa.string()),  # the corpus's label of the gap since the previous session
    pa.field("turn_start", pa.int32()),  # the origin dialogue: turns of its session
    pa.field("turn_end", pa.int32()),
    pa.field("source_turn_ids", pa.list_(pa.string())),
]


class SessionMemories(BaseModel):
    memories: list[str] = Field(description="short facts about the speakers from this session, one per item")


def session_time(turns: Sequence[dict]) -> str | None:
    value = turns[0].get("session_time") if turns else None
    if value is None:
        return None
    return value.strftime("%Y-%m-%d") if isinstance(value, datetime) else str(value)


def session_gap(turns: Sequence[dict]) -> str | None:
    """The ingest's `session_gap_label` of a session (e.g. "2 weeks later"), None when it has none."""
    value = turns[0].get("session_gap_label") if turns else None
    return (value.strip() or None) if isinstance(value, str) else None


_GAP_WORD = re.compile(r"^(?P<span>.+?)\s+(?:later|after)\.?$", re.IGNORECASE)


def gap_phrase(label: str, session_idx: int) -> str:
    """A gap label as time since the previous session: ("2 weeks later", 3) -> "2 weeks after
    session 2"; ("A few hours after", 2) -> "a few hours after session 1"."""
    m = _GAP_WORD.match(label.strip())
    if not m:  # a label without "later" / "after": keep it whole
        return f"{label.strip()} since session {session_idx - 1}"
    span = m.group("span")
    span = re.sub(r"^1 (\w+)s$", r"1 \1", span)  # CC writes "1 weeks after"
    span = span[0].lower() + span[1:] if span[:1].isupper() and not span[1:2].isupper() else span
    return f"{span} after session {session_idx - 1}"


def when(session_idx: int, time: str | None = None, gap: str | None = None) -> str:
    """A memory's time: "session 3", "session 3 (2024-03-09)", "session 3 (2 weeks after session 2)"."""
    notes = [n for n in (time, gap_phrase(gap, session_idx) if gap and session_idx > 1 else None) if n]
    return f"session {session_idx}" + (f" ({'; '.join(notes)})" if notes else "")


def memory_when(memory: dict) -> str:
    """`when` of a MEMORY_FIELDS row (rows written before `session_gap` existed render without it)."""
    return when(memory["session_idx"], memory.get("session_time"), memory.get("session_gap"))


# Theanine's summary prompt (official dialogue-summarization.txt) keeps only what the speakers' own
# words support and shows one worked example; ours does both, with an example of our own invention.
SUMMARY_SYSTEM = ("You keep a long-term memory of conversations between two people. From one conversation "
                  "session, write down what is worth remembering later: events, plans, changes, feelings and "
                  "facts about each speaker. Each memory is one short sentence that names the speaker. Write "
                  "only what the speakers say, or what plainly follows from their words; never guess at what "
                  "they leave unsaid.\n\n"
                  "Example (made up):\n"
                  "Maya: I finally sold my old bike. The new one arrives on Friday.\n"
                  "Tom: Lucky you. I can't ride at all this month, my wrist is still in a cast.\n"
                  "Maya: Oh no, I hope it heals before my lake trip in June.\n"
                  '{"memories": ["Maya sold her old bike and expects her new one on Friday.", '
                  '"Tom cannot ride this month because his wrist is in a cast.", '
                  '"Maya has a lake trip planned for June."]}\n'
                  'Not: "Maya is a keen cyclist" or "Tom broke his wrist cycling": neither of them says so.')


def summarize_messages(turns: Sequence[dict], session_idx: int, time: str | None, max_memories: int) -> Messages:
    user = (f"Conversation ({when(session_idx, time)}):\n{format_unit(turns)}\n\n"
            f"List at most {max_memories} memories. Reply in JSON: "
            '{"memories": ["...", "..."]}.')
    return [{"role": "system", "content": SUMMARY_SYSTEM}, {"role": "user", "content": user}]


async def summarize_session(llm: ChatLLM, turns: list[dict], session_idx: int, max_memories: int) -> list[str]:
    """The memories of one session (at most `max_memories`, blanks dropped)."""
    result = await llm.chat(summarize_messages(turns, session_idx, session_time(turns), max_memories),
                            schema=SessionMemories)
    return [m.strip() for m in result.parsed.memories if m.strip()][:max_memories]


def memory_rows(episode_id: str, session_idx: int, turns: list[dict], events: list[str]) -> list[dict[str, Any]]:
    """Rows of MEMORY_FIELDS for one session's memories."""
    return [{**after_session(episode_id, session_idx), "memory_id": f"{session_idx}:{i}", "session_idx": session_idx,
             "memory_idx": i, "event": ev, "session_time": session_time(turns), "session_gap": session_gap(turns),
             "turn_start": turns[0]["turn_idx"], "turn_end": turns[-1]["turn_idx"],
             "source_turn_ids": [t["source_turn_id"] for t in turns if t.get("source_turn_id")]}
            for i, ev in enumerate(events)]


def memory_lines(memories: Sequence[dict]) -> str:
    """Memories in time order, one per line with its time (date and gap when known)."""
    rows = sorted(memories, key=lambda m: (m["session_idx"], m["memory_idx"]))
    return "\n".join(f"[{memory_when(m)}] {m['event']}" for m in rows)
