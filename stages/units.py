"""Memory construction (SeCom Sec. 2.1): cut a conversation into turn, session or segment units.

A turn-level unit is one interaction (a request and the reply to it, i.e. two consecutive
utterances), as in SeCom; a session-level unit is a whole session; a segment-level unit is a
topical segment from the `segment` stage. Every utterance lands in exactly one unit of each
granularity.
"""

from __future__ import annotations

from pipeline.stage import Rows
from stages.methods.secom import Span, make_units


def unit_id(granularity: str, session_idx: int, turn_start: int) -> str:
    return f"{granularity}:{session_idx}:{turn_start}"


def _spans(granularity: str, turns: Rows, segments: Rows) -> list[Span]:
    """Spans of positions in `turns` (one session) for one granularity."""
    n = len(turns)
    if granularity == "session":
        return [(0, n - 1)]
    if granularity == "turn":
        return [(i, min(i + 1, n - 1)) for i in range(0, n, 2)]
    if granularity == "segment":
        position = {t["turn_idx"]: i for i, t in enumerate(turns)}
        ordered = sorted(segments, key=lambda s: s["segment_idx"])
        return [(position[s["turn_start"]], position[s["turn_end"]]) for s in ordered]
    raise ValueError(f"unknown granularity {granularity!r}")


def build_units(episode_id: str, sessions: dict[int, Rows], segments: Rows, granularity: str) -> Rows:
    units: Rows = []
    for session_idx, turns in sessions.items():
        if not turns:
            continue
        own = [s for s in segments if s["session_idx"] == session_idx]
        for unit in make_units(turns, _spans(granularity, turns, own)):
            unit.update(episode_id=episode_id, granularity=granularity,
                        unit_id=unit_id(granularity, unit["session_idx"], unit["turn_start"]))
            units.append(unit)
    return units
