"""The full-history baseline shows every past session with its date, as the retrieval methods do."""

from __future__ import annotations

import asyncio
from datetime import datetime

from pipeline.testing.fake_chat import FakeChat
from stages.methods.base import MethodContext, ProbeInput
from stages.methods.baselines.history import FullHistory, FullHistorySettings


def turn(s: int, i: int, speaker: str, text: str, when: datetime) -> dict:
    return {"episode_id": "e", "session_idx": s, "turn_idx": i, "speaker": speaker, "text": text,
            "session_time": when, "source_turn_id": f"D{s}:{i + 1}"}


def test_full_history_dates_each_past_session_for_temporal_questions():
    day1, day2 = datetime(2023, 5, 8, 13, 56), datetime(2023, 6, 1, 9, 0)
    history = {1: [turn(1, 0, "Ann", "I adopted a cat.", day1)], 2: [turn(2, 0, "Bo", "How is the cat?", day2)]}
    probe = ProbeInput(probe={"probe_id": "qa:e-q0", "kind": "qa", "request": "When did Ann adopt a cat?",
                              "session_idx": 3, "category": "temporal", "respondent": "Bo"},
                       episode={"episode_id": "e", "dataset": "locomo", "speakers": ["Ann", "Bo"]},
                       history=history, current=[])
    llm = FakeChat(["In May 2023."])
    answer = asyncio.run(FullHistory().answer(MethodContext(settings=FullHistorySettings(), llm=llm), probe, {}))
    prompt = llm.calls[0]["messages"][-1]["content"]
    assert "[Session 1, 2023-05-08 13:56:00]" in prompt and "[Session 2, 2023-06-01 09:00:00]" in prompt
    assert answer.text == "In May 2023." and answer.context_turns == 2
