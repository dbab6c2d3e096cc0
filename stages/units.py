"""Memory construction (SeCom Sec. 2.1): cut a conversation into turn, session or segment units.

A turn-level unit is one interaction (a request and the reply to it, i.e. two consecutive
utterances), as in SeCom; a session-level unit is a whole session; a segment-level unit is a
topical segment from the `segment` stage. Every utterance lands in exactly one unit of each
granularity.
"""

from __future__ import annotations

from typing import Any

from pipeline.stage import Rows
from stages.methods.secom import format_unit


def unit_id(granularity: str, session_idx: int, turn_start: int) -> str:
    return f"{granularity}:{session_idx}:{turn_start}"


def _unit(episode_id: str, granularity: str, turns: Rows) -> dict[str, Any]:
    first, last = turns[0], turns[-1]
    return {
        "episode_id": episode_id,
        "unit_id": unit_id(granularity, first["session_idx"], first["turn_idx"]),
        "granularity": granularity,
        "session_idx": first["session_idx"],
        "turn_start": first["turn_idx"],
        "turn_end": last["turn_idx"],
        "session_time": first.get("session_time"),
        "source_turn_ids": [t["source_turn_id"] for t in turns],
        "text": format_unit(turns),
    }


def build_units(episode_id: str, sessions: dict[int, Rows], segments: Rows, granularity: str) -> Rows:
    units: Rows = []
    if granularity == "session":
        units = [_unit(episode_id, "session", turns) for turns in sessions.values()]
    elif granularity == "turn":
        for turns in sessions.values():
            units += [_unit(episode_id, "turn", turns[i : i + 2]) for i in range(0, len(turns), 2)]
    elif granularity == "segment":
        for seg in sorted(segments, key=lambda s: (s["session_idx"], s["segment_idx"])):
            turns = [t for t in sessions.get(seg["session_idx"], []) if seg["turn_start"] <= t["turn_idx"] <= seg["turn_end"]]
            if turns:
                units.append(_unit(episode_id, "segment", turns))
    else:
        raise ValueError(f"unknown granularity {granularity!r}")
    return units
