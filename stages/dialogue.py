"""How every method (and every judge) sees a conversation: turns grouped by session, "Speaker:
text" lines, memory units in time order. One definition, so an edit here re-fingerprints every
method whose prompts show dialogue."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from pipeline.engine.stage import Rows


def sessions_of(turns: Rows) -> dict[int, Rows]:
    """Turns grouped by session, each session in turn order, sessions in order."""
    by_session: dict[int, Rows] = defaultdict(list)
    for t in turns:
        by_session[t["session_idx"]].append(t)
    return {s: sorted(ts, key=lambda t: t["turn_idx"]) for s, ts in sorted(by_session.items())}


Span = tuple[int, int]  # inclusive positions in a session's list of turns


def build_exchanges(turns: Sequence[dict]) -> list[Span]:
    """Turn spans of the exchanges of a session: a new exchange starts at each turn of the first
    speaker, so whatever follows (answers, or several turns of the other side) joins it."""
    if not turns:
        return []
    first = turns[0]["speaker"]
    starts = [i for i, t in enumerate(turns) if i == 0 or t["speaker"] == first]
    return [(s, e - 1) for s, e in zip(starts, [*starts[1:], len(turns)])]


def format_unit(turns: Sequence[dict]) -> str:
    """Turns as "Speaker: text" lines: the text of a memory unit (a turn, a segment or a session),
    of a dialogue shown in a prompt, of a transcript shown to a judge."""
    return "\n".join(f"{t['speaker']}: {t['text']}" for t in turns)


def last_turns(turns: Sequence[dict], limit: int | None) -> list[dict]:
    """The last `limit` turns (all when None, none when 0)."""
    return list(turns) if limit is None else list(turns[-limit:]) if limit else []


def unit_id(granularity: str, session_idx: int, turn_start: int) -> str:
    return f"{granularity}:{session_idx}:{turn_start}"


def in_time_order(units: Sequence[dict]) -> list[dict]:
    """Units by session, then first turn: the order they enter a context (SeCom Sec. 2.1)."""
    return sorted(units, key=lambda u: (int(u["session_idx"]), int(u.get("turn_start") or 0)))


def unit_turns(unit: dict, history: dict[int, list[dict]] | None) -> list[dict]:
    """The turns a unit spans, from the probe's history (none when its session or span is not there)."""
    turns = (history or {}).get(int(unit["session_idx"])) or []
    lo, hi = unit.get("turn_start"), unit.get("turn_end")
    if lo is None or hi is None:
        return []
    return [t for t in turns if int(lo) <= int(t["turn_idx"]) <= int(hi)]
