"""The answer frame of mem0's LoCoMo evaluation for its full-context and RAG rows (mem0ai/mem0
evaluation/src/rag.py; `qa_prompt: mem0_rag`), in our words with every element:

- a system message: answer from the context given; for a question about time, take the dates of the
  conversation as the reference; give the shortest answer that will do, in the conversation's own
  words where possible, without naming the person it is about;
- one user message laid out as `# Question:` (the question), `# Context:` (the context) and
  `# Short answer:`;
- the context as one line per utterance, `timestamp | speaker: text`, the timestamp being its
  session's date as LoCoMo writes it ("1:56 pm on 8 May, 2023");
- retrieved chunks in the order given (rank order, most similar first, as rag.py joins its top k)
  separated by a line `<->`; units that continue one another in the conversation (the whole history
  of full context: rag.py's chunk_size -1 is one chunk) are one chunk;
- temperature 0, no length cap asked for; the reply kept as the model wrote it, stripped (rag.py
  stores `content.strip()`), never cut to one turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pipeline.llm.types import Messages
from stages.dialogue import unit_turns

MEM0_RAG_SAMPLING: dict[str, Any] = {"temperature": 0.0}
MEM0_RAG_SYSTEM = ("Answer the question from the context you are given. When it asks about time, take the dates "
                   "in the conversation as your reference point. Make the answer as short as it can be, reuse "
                   "the conversation's own wording wherever you can, and leave out who the answer is about.")
CHUNK_SEPARATOR = "\n<->\n"  # between two retrieved chunks, as rag.py joins its top k


def locomo_date(when: Any) -> str:
    """A session date as locomo10.json writes it ("1:56 pm on 8 May, 2023"); text is kept as it is."""
    if not isinstance(when, datetime):
        return "" if when in (None, "") else str(when)
    hour = when.hour % 12 or 12
    return f"{hour}:{when:%M} {'am' if when.hour < 12 else 'pm'} on {when.day} {when:%B}, {when.year}"


def unit_lines(unit: dict, history: dict[int, list[dict]] | None) -> str:
    """A unit as `timestamp | speaker: text` lines: its turns from the history, else its text's lines."""
    date = locomo_date(unit.get("session_time"))
    turns = unit_turns(unit, history)
    if turns:
        return "\n".join(f"{locomo_date(t.get('session_time')) or date} | {t['speaker']}: {t['text']}" for t in turns)
    return "\n".join(f"{date} | {line}" for line in str(unit["text"]).splitlines() if line.strip())


def _positions(history: dict[int, list[dict]] | None) -> dict[tuple[int, int], int]:
    """(session, turn_idx) -> the turn's place in the whole past, oldest first."""
    order = [(s, int(t["turn_idx"])) for s in sorted(history or {}) for t in (history or {})[s]]
    return {key: i for i, key in enumerate(order)}


def chunks(units: Sequence[dict], history: dict[int, list[dict]] | None) -> list[str]:
    """The context's chunks: units in the order given, a unit that starts right after the previous
    one ends (by place in the past) joined to its chunk."""
    where = _positions(history)
    out: list[str] = []
    last_end: int | None = None
    for u in units:
        start = where.get((int(u["session_idx"]), int(u.get("turn_start") or 0)))
        end = where.get((int(u["session_idx"]), int(u.get("turn_end") or 0)))
        text = unit_lines(u, history)
        if out and start is not None and last_end is not None and start == last_end + 1:
            out[-1] += "\n" + text
        else:
            out.append(text)
        last_end = end
    return out


def context(units: Sequence[dict], history: dict[int, list[dict]] | None) -> str:
    return CHUNK_SEPARATOR.join(c for c in chunks(units, history) if c)


def build_messages(units: Sequence[dict], question: str, history: dict[int, list[dict]] | None) -> Messages:
    """rag.py's two messages: the system instruction, then Question / Context / Short answer."""
    user = f"# Question:\n{question}\n\n# Context:\n{context(units, history)}\n\n# Short answer:"
    return [{"role": "system", "content": MEM0_RAG_SYSTEM}, {"role": "user", "content": user}]
