"""What a probe sees of its own session is one rule (stages.probes.probe_view), the same for the
method that answers (respond's probe_input) and the judge that rates the answer."""

from __future__ import annotations

from stages.method_stages.respond import probe_input
from stages.methods.base import visible_memory
from stages.probes import probe_view


def turn(s: int, i: int) -> dict:
    return {"episode_id": "e", "session_idx": s, "turn_idx": i, "speaker": "AB"[i % 2], "text": f"s{s}t{i}",
            "session_time": None, "session_gap_label": None, "source_turn_id": None}


SESSIONS = {1: [turn(1, i) for i in range(3)], 2: [turn(2, i) for i in range(4)]}


def probe(s: int, t: int | None, context: list | None = None) -> dict:
    return {"probe_id": "p", "episode_id": "e", "session_idx": s, "turn_idx": t, "context": context}


def test_a_probe_sees_the_turns_before_its_own_and_a_null_turn_the_whole_session_as_its_memory_does():
    assert [t["text"] for t in probe_view(probe(2, 2), SESSIONS)] == ["s2t0", "s2t1"]
    assert [t["text"] for t in probe_view(probe(2, None), SESSIONS)] == ["s2t0", "s2t1", "s2t2", "s2t3"]
    assert probe_view(probe(3, None), SESSIONS) == []  # a question after the history: no session 3
    # memory follows the same rule: at (2, None) the memory built through all of session 2 is visible
    built = [{"snapshot_session": 2, "snapshot_turn": None, "x": 1}]
    assert visible_memory(built, 2, None, "snapshots") == built and visible_memory(built, 2, 3, "snapshots") == []


def test_teafarms_session_the_corpus_does_not_hold_is_the_context_the_probe_carries():
    seen = probe_view(probe(3, 2, [{"speaker": "A", "text": "hi"}, {"speaker": "B", "text": "yo"}]), SESSIONS)
    assert [(t["turn_idx"], t["speaker"], t["text"]) for t in seen] == [(0, "A", "hi"), (1, "B", "yo")]


def test_the_method_is_shown_exactly_the_probes_view_and_the_sessions_before():
    shown = probe_input(probe(2, None), {"episode_id": "e"}, SESSIONS, {})
    assert shown.current == probe_view(probe(2, None), SESSIONS) and list(shown.history) == [1]
