"""LoCoMo-Plus's reader (`qa_prompt: locomo_plus`, stages/methods/shared/locomo_plus_reader.py): the elements
of the release's task_eval/utils.py and data/unified_input.py (xjtuleeyf/Locomo-Plus at commit
059f4e3d38f7f1f96765e8e2cb7de3097551bffb) in our words: one user message; an opening naming the two people
and the dated sessions; the instruction by category; a LoCoMo question's dialogue oldest first under DATE /
CONVERSATION lines, `Speaker said, "text"`, then `Question:`; a cognitive item's stitched dialogue with no
dates and its trigger as the last lines; temperature 0.3, 1,024 tokens; the reply kept whole, stripped."""

from __future__ import annotations

import asyncio
from datetime import datetime

from pipeline.testing.fake_chat import FakeChat
from stages.methods.base import ProbeInput
from stages.methods.shared import locomo_plus_reader as reader
from stages.methods.shared.response import generate

MAY8, JUN1 = datetime(2023, 5, 8, 13, 56), datetime(2023, 6, 1, 9, 5)
CUE = datetime(2023, 6, 20, 10, 0)
SPEAKERS = ["Priya", "Dev"]


def turn(s: int, i: int, speaker: str, text: str, when: datetime) -> dict:
    return {"session_idx": s, "turn_idx": i, "speaker": speaker, "text": text, "session_time": when}


HISTORY = {1: [turn(1, 0, "Priya", "I bought a red bicycle. [shares a photo of a bike]", MAY8),
               turn(1, 1, "Dev", "Nice!", MAY8)],
           2: [turn(2, 0, "Dev", "I ride to work now.", JUN1), turn(2, 1, "Priya", "Good for you.", JUN1)],
           3: [turn(3, 0, "Priya", "I have decided to stop eating sugar.", CUE),
               turn(3, 1, "Dev", "That takes resolve.", CUE)]}


def unit(s: int) -> dict:
    turns = HISTORY[s]
    return {"session_idx": s, "turn_start": 0, "turn_end": len(turns) - 1, "session_time": turns[0]["session_time"],
            "text": "\n".join(f"{t['speaker']}: {t['text']}" for t in turns), "unit_id": f"session:{s}:0"}


def probe(category: str, request: str) -> ProbeInput:
    return ProbeInput(probe={"probe_id": "qa:q1", "kind": "qa", "category": category, "session_idx": 4,
                             "request": request, "respondent": "Dev"},
                      episode={"dataset": "locomo_plus", "speakers": SPEAKERS}, history=HISTORY, current=[])


def test_a_locomo_question_shows_the_dated_dialogue_oldest_first_then_the_question():
    [msg] = reader.build_messages([unit(2), unit(1)], "What did Priya buy?", "single-hop", SPEAKERS, HISTORY)
    text = msg["content"]
    assert msg["role"] == "user"
    opening, instruction, body = text.split("\n\n", 2)
    assert "Priya and Dev" in opening and "several days" in opening and "date" in opening
    assert "answer the question" in instruction.lower() and "conversation above" in instruction
    assert body == ('DATE: 1:56 pm on 8 May, 2023\nCONVERSATION:\n'
                    'Priya said, "I bought a red bicycle." and shared a photo of a bike.\nDev said, "Nice!"\n\n'
                    'DATE: 9:05 am on 1 June, 2023\nCONVERSATION:\n'
                    'Dev said, "I ride to work now."\nPriya said, "Good for you."\n\n'
                    'Question: What did Priya buy?')
    # the release asks every LoCoMo category alike: no length, no date hint, no options
    assert "short phrase" not in text and "(a)" not in text


def test_a_cognitive_item_is_a_memory_aware_dialogue_ending_with_its_trigger_and_no_dates():
    trigger = "Priya: Want to share a slice of cake with me?"
    [msg] = reader.build_messages([unit(1), unit(3)], trigger, "cognitive", SPEAKERS, HISTORY)
    text = msg["content"]
    instruction = text.split("\n\n")[1].lower()
    assert all(w in instruction for w in ("memory", "earlier conversation", "remember", "context", "naturally"))
    assert "DATE:" not in text and "Question:" not in text
    assert text.endswith('Priya said, "I have decided to stop eating sugar."\nDev said, "That takes resolve."\n'
                         'Priya said, "Want to share a slice of cake with me?"')


def test_generate_sends_the_releases_sampling_drops_the_trigger_date_and_keeps_the_reply_whole():
    chat = FakeChat(["  I remember you gave up sugar, so maybe fruit instead?\nDev: more  "])
    request = "[Current date: 2023/07/10 (Mon) 10:00] Priya: Want to share a slice of cake with me?"
    answer = asyncio.run(generate(chat, probe("cognitive", request), [unit(3)], qa_prompt="locomo_plus"))
    [call] = chat.calls
    assert call["params"] == {"temperature": 0.3, "max_tokens": 1024}
    content = call["messages"][0]["content"]
    assert "Current date" not in content and content.endswith('Priya said, "Want to share a slice of cake with me?"')
    assert answer.text == "I remember you gave up sugar, so maybe fruit instead?\nDev: more"  # not cut to one turn
    assert answer.details["qa_prompt"] == "locomo_plus" and answer.details["sampling"]["temperature"] == 0.3


def test_an_empty_completion_is_kept_as_the_release_keeps_it():
    answer = asyncio.run(generate(FakeChat(["   "]), probe("single-hop", "What did Priya buy?"), [unit(1)],
                                  qa_prompt="locomo_plus"))
    assert answer.text == "(empty)"
