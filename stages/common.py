"""Small helpers shared by stages: grouping turns, failure rows."""

from __future__ import annotations

from collections import defaultdict
from pipeline.stage import Rows


def sessions_of(turns: Rows) -> dict[int, Rows]:
    """Turns grouped by session, each session in turn order, sessions in order."""
    by_session: dict[int, Rows] = defaultdict(list)
    for t in turns:
        by_session[t["session_idx"]].append(t)
    return {s: sorted(ts, key=lambda t: t["turn_idx"]) for s, ts in sorted(by_session.items())}


def failure_reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or f"{type(exc).__name__}: {exc}"
    return reason[:2000]
