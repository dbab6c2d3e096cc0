"""BEAM's reader (`qa_prompt: beam`, stages/methods/shared/beam_reader.py): the elements of the release's
long_term_memory_methods.py, answer_generation.py and prompts.py (mohammadtavakoli78/BEAM at commit
b2a3ee8ba12d68f83143dda191097dc3e028ddd3) in our words: the long-context baseline shows the history as
user / assistant chat turns with no dates, cut from the oldest end in cl100k when it passes the window,
then asks with a note for the bare answer and a `Question:` line; the RAG baseline sends one user message
of rules, the retrieved chunks in rank order as "USER: / ASSISTANT:" pairs, the question and the answer's
requirements; temperature 0 and no max_tokens; the reply kept whole."""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest

from pipeline.testing.fake_chat import FakeChat
from stages.methods.base import ProbeInput
from stages.methods.shared import beam_reader as reader
from stages.methods.shared.response import generate

MAR15, APR2 = datetime(2024, 3, 15), datetime(2024, 4, 2)


def turn(s: int, i: int, speaker: str, text: str, when: datetime) -> dict:
    return {"session_idx": s, "turn_idx": i, "speaker": speaker, "text": text, "session_time": when}


HISTORY = {1: [turn(1, 0, "user", "My deadline is March 15.", MAR15),
               turn(1, 1, "assistant", "Let us plan:\n1. scope\n2. tasks", MAR15),
               turn(1, 2, "user", "I use Trello for tasks.", MAR15),
               turn(1, 3, "assistant", "Trello works well.", MAR15)],
           2: [turn(2, 0, "user", "I moved the deadline to April 2.", APR2),
               turn(2, 1, "assistant", "Noted, April 2 it is.", APR2)]}


def unit(s: int, start: int = 0, end: int | None = None) -> dict:
    turns = HISTORY[s][start:None if end is None else end + 1]
    return {"session_idx": s, "turn_start": turns[0]["turn_idx"], "turn_end": turns[-1]["turn_idx"],
            "session_time": turns[0]["session_time"], "unit_id": f"turn:{s}:{start}",
            "text": "\n".join(f"{t['speaker']}: {t['text']}" for t in turns)}


def probe(request: str) -> ProbeInput:
    return ProbeInput(probe={"probe_id": "qa:q1", "kind": "qa", "category": "knowledge_update", "session_idx": 3,
                             "request": request, "respondent": "assistant"},
                      episode={"dataset": "beam", "speakers": ["user", "assistant"]}, history=HISTORY, current=[])


def test_the_long_context_baseline_shows_the_history_as_chat_turns_without_dates_then_the_question():
    messages = reader.build_messages([unit(1), unit(2)], "When is the deadline?", HISTORY, retrieved=False)
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user", "assistant", "user"]
    assert [m["content"] for m in messages[:-1]] == [t["text"] for s in (1, 2) for t in HISTORY[s]]
    assert not any("2024" in m["content"] or "Session" in m["content"] for m in messages[:-1])
    note, question = messages[-1]["content"].split("\n")
    assert "answer alone" in note and "no explanation" in note
    assert question == "Question: When is the deadline?"


def test_a_unit_outside_the_history_is_read_from_its_speaker_lines_a_reply_over_several_lines_kept_whole():
    messages = reader.build_messages([unit(1, 0, 1)], "Q?", {}, retrieved=False)
    assert messages[:2] == [{"role": "user", "content": "My deadline is March 15."},
                            {"role": "assistant", "content": "Let us plan:\n1. scope\n2. tasks"}]


def test_a_speaker_other_than_user_or_assistant_is_refused_in_the_long_context_frame():
    odd = {1: [turn(1, 0, "Priya", "Hello", MAR15)]}
    with pytest.raises(ValueError, match="'Priya'"):
        reader.build_messages([{"session_idx": 1, "turn_start": 0, "turn_end": 0, "text": "Priya: Hello"}], "Q?",
                              odd, retrieved=False)


def test_the_rag_baseline_is_one_user_message_rules_chunks_in_rank_order_question_requirements_cue():
    [msg] = reader.build_messages([unit(2), unit(1, 0, 1)], "When is the deadline?", HISTORY, retrieved=True)
    assert msg["role"] == "user"
    text = msg["content"]
    rules, rest = text.split("\n\nCONTEXT:\n", 1)
    context, rest = rest.split("\n\nQUESTION:\n", 1)
    question, requirements = rest.split("\n\n", 1)
    assert "nothing but the information in the context" in rules
    assert "1. Base your answer solely on the context" in rules and "2. Leave your own background knowledge" in rules
    assert context == ("USER: I moved the deadline to April 2.\n\nASSISTANT: Noted, April 2 it is.\n\n"
                       "USER: My deadline is March 15.\n\nASSISTANT: Let us plan:\n1. scope\n2. tasks")
    assert question == "When is the deadline?"
    assert "Direct and brief" in requirements and "no explanation" in requirements
    assert text.endswith("\n\nRESPONSE:") and "2024" not in text


def test_the_rag_context_skips_a_chunk_past_29000_estimated_tokens_and_tries_the_next():
    big = {"session_idx": 9, "turn_start": None, "turn_end": None, "text": "user: " + "x" * 110_000}
    context, skipped = reader.rag_context([unit(2), big, unit(1, 2, 3)], HISTORY)
    assert skipped == 1 and "x" * 10 not in context and context.endswith("ASSISTANT: Trello works well.")


def _msgs(*sizes: int) -> list[dict[str, str]]:
    return [{"role": reader.ROLES[i % 2], "content": str(i) * n} for i, n in enumerate(sizes)]


def test_a_history_within_the_window_less_10000_is_kept_whole():
    count = len  # one token a character, to follow the arithmetic
    messages = _msgs(20_000, 20_000)  # 2 + 2 * (4 + 20,000) = 40,010
    assert reader.cut_history(messages, window=50_010, count=count) == messages


def test_a_longer_history_keeps_its_newest_messages_through_the_one_that_passes_the_window_less_2000_even_count():
    count = len
    messages = _msgs(10, 30_000, 30_000, 30_000, 30_000)  # 2 + 5 * 4 + 120,010 = 120,032 > 100,000 - 10,000
    # counted back from the newest: 30,006, 60,012, 90,018, then 120,024 > 98,000 at messages[1]: 4 kept
    assert reader.cut_history(messages, window=100_000, count=count) == messages[1:]
    # the crossing message makes the number odd: the oldest kept goes, so the history starts on a user turn
    assert reader.cut_history(messages, window=80_000, count=count) == messages[3:]  # 3 reach 90,018 > 78,000


def test_a_history_just_over_the_cut_mark_but_never_past_the_keep_mark_keeps_nothing_as_the_official():
    count = len
    messages = _msgs(45_000, 45_000)  # size 90,010 > 100,000 - 10,000; counted back 90,012, never > 98,000
    assert reader.cut_history(messages, window=100_000, count=count) == []


def test_the_cut_counts_in_cl100k_by_default():
    messages = _msgs(3, 3)
    assert reader.cut_history(messages, window=10_020) == messages  # a few tokens: within the window


def test_generate_asks_the_long_context_frame_for_a_whole_history_at_temperature_0_without_max_tokens():
    chat = FakeChat(["  April 2\n\nassistant: anything else?  "])
    answer = asyncio.run(generate(chat, probe("When is the deadline?"), [unit(2), unit(1)], qa_prompt="beam"))
    [call] = chat.calls
    assert call["params"] == {"temperature": 0.0, "max_tokens": None}
    assert call["messages"][0]["content"] == "My deadline is March 15."  # time order
    assert call["messages"][-1]["content"].endswith("Question: When is the deadline?")
    assert answer.text == "April 2\n\nassistant: anything else?"  # kept whole, stripped: never cut to one turn
    assert answer.details["qa_prompt"] == "beam" and answer.details["frame"] == "long_context"
    assert answer.details["messages_kept"] == 6 and answer.details["messages_dropped"] == 0
    assert answer.details["sampling"] == {"temperature": 0.0, "max_tokens": None}


def test_generate_asks_the_rag_frame_for_retrieved_units_in_rank_order_and_drops_a_date_prefix():
    chat = FakeChat(["April 2"])
    request = "[Current date: 2024/05/01 (Wed) 10:00] When is the deadline?"
    answer = asyncio.run(generate(chat, probe(request), [unit(2), unit(1, 0, 1)], qa_prompt="beam", retrieved=True))
    [call] = chat.calls
    [msg] = call["messages"]
    assert "Current date" not in msg["content"] and "QUESTION:\nWhen is the deadline?" in msg["content"]
    assert msg["content"].index("April 2.") < msg["content"].index("March 15.")  # rank order, not time order
    assert answer.text == "April 2" and answer.details["frame"] == "rag" and answer.details["chunks_shown"] == 2
