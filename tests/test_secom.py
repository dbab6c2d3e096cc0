"""SeCom algorithms with a scripted chat model: segmentation, reflection, response prompts."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from pipeline.testing.fake_chat import FakeChat
from pipeline.llm.types import LLMError
from stages.methods.shared.response import answer_question, build_qa_messages, build_response_messages, respond
from stages.methods.secom.reflection import ReflectionOutput, learn_guidance
from stages.methods.secom.segmentation import (
    Numbered,
    SegmentationGuidance,
    SpansAnswer,
    build_exchanges,
    build_segmentation_messages,
    check_spans,
    fixed_chunks,
    normalise_starts,
    segment_session,
    starts_answer_model,
    window_bounds,
)
from stages.methods.secom.units import format_unit, make_units
from stages.metrics.segmentation import lengths_to_boundaries, spans_to_boundaries, window_diff


def run(coro):
    return asyncio.run(coro)


def session(n: int, tag: str = "s", gold_lengths: list[int] | None = None) -> list[dict]:
    gold = lengths_to_boundaries(gold_lengths) if gold_lengths else [None] * n
    return [{"episode_id": "e1", "session_idx": 1, "turn_idx": i, "speaker": "A" if i % 2 == 0 else "B",
             "text": f"{tag} utterance {i}", "gold_topic_boundary": gold[i]} for i in range(n)]


def segs(*spans: tuple[int, int]) -> dict:
    """A spans answer; numbers are 1-based units, as the model sees them."""
    return {"segments": [{"start": a, "end": b, "summary": f"part {a}"} for a, b in spans]}


def n_units_in(messages) -> int:
    # messages[1] is the original request; later messages are re-asks
    return int(re.search(r"numbered 1 to (\d+)\)", messages[1]["content"]).group(1))


# ---------------------------------------------------------------- exchanges


def speakers(*names: str) -> list[dict]:
    return [{"speaker": n, "text": f"{n}{i}", "turn_idx": i} for i, n in enumerate(names)]


def test_exchanges_of_alternating_speakers_pair_each_question_with_its_answer() -> None:
    assert build_exchanges(speakers("A", "B", "A", "B", "A", "B")) == [(0, 1), (2, 3), (4, 5)]
    assert build_exchanges(speakers("A", "B", "A")) == [(0, 1), (2, 2)]  # a lone trailing turn
    assert build_exchanges([]) == []


def test_exchanges_of_non_alternating_speakers_start_at_each_turn_of_the_first_speaker() -> None:
    assert build_exchanges(speakers("A", "A", "B", "B", "A", "B")) == [(0, 0), (1, 3), (4, 5)]
    assert build_exchanges(speakers("B", "A", "A", "B", "C", "B")) == [(0, 2), (3, 4), (5, 5)]


def test_a_segmentation_never_splits_an_exchange() -> None:
    turns = speakers("A", "B", "B", "A", "B", "A", "B")  # exchanges (0-2), (3-4), (5-6)
    res = run(segment_session(FakeChat([segs((1, 1), (2, 3))]), turns))
    assert res.segments == [(0, 2), (3, 6)] and res.summaries == ["part 1", "part 2"]
    llm = FakeChat([segs((1, 3))])  # the prompt numbers exchanges, with speaker-tagged lines
    run(segment_session(llm, turns))
    text = llm.calls[0]["messages"][-1]["content"]
    assert "Exchange 1:\n[A]: A0\n[B]: B1\n[B]: B2" in text and "Exchange 3:\n[A]: A5\n[B]: B6" in text
    assert "numbered 1 to 3" in text
    # however the fallback chunks, every chunk is whole exchanges
    res = run(segment_session(FakeChat([LLMError("down")]), turns, fallback_size=2))
    assert res.fallback and res.segments == [(0, 4), (5, 6)]


# ---------------------------------------------------------------- validation


def test_check_spans_accepts_a_tiling() -> None:
    check_spans([(1, 3), (4, 4), (5, 10)], 10)


@pytest.mark.parametrize(
    "spans, n, message",
    [
        ([(1, 5), (5, 10)], 10, "overlaps"),
        ([(1, 4), (6, 10)], 10, "in no segment"),
        ([(1, 4), (5, 11)], 10, "out of range"),
        ([(0, 4), (5, 10)], 10, "out of range"),
        ([(5, 10), (1, 4)], 10, "out of order"),
        ([(1, 4), (6, 5), (7, 10)], 10, "empty"),
        ([(1, 4), (5, 8)], 10, "must end at exchange 10"),
        ([], 10, "no segments"),
    ],
)
def test_check_spans_rejects(spans, n, message) -> None:
    with pytest.raises(ValueError, match=message):
        check_spans(spans, n)


@pytest.mark.parametrize("starts, n, spans, changed", [
    ([1, 3], 4, [(0, 1), (2, 3)], False),
    ([3], 4, [(0, 1), (2, 3)], True),  # the first exchange is implied
    ([4, 2, 2, 9, -1, 0], 4, [(0, 0), (1, 2), (3, 3)], True),  # out of range dropped, sorted, deduplicated
    ([], 3, [(0, 2)], True),
    ([1, 2, 3], 3, [(0, 0), (1, 1), (2, 2)], False),
])
def test_start_indexes_normalise_any_integer_list_into_a_valid_segmentation(starts, n, spans, changed) -> None:
    got, was_changed = normalise_starts(starts, n)
    assert got == spans and was_changed == changed
    check_spans([(a + 1, b + 1) for a, b in got], n)


def test_starts_format_schema_allows_only_numbers_in_range_and_any_answer_is_valid() -> None:
    schema = starts_answer_model(4).model_json_schema()
    assert schema["properties"]["starts"]["items"]["enum"] == [1, 2, 3, 4]
    llm = FakeChat([{"starts": [7, 2]}])
    res = run(segment_session(llm, session(8), answer_format="starts"))
    assert res.segments == [(0, 1), (2, 7)] and res.normalised and not res.fallback
    assert llm.calls[0]["schema"] is starts_answer_model(4) and len(llm.calls) == 1


def test_fixed_chunks_and_window_bounds() -> None:
    assert fixed_chunks(10, 4) == [(0, 3), (4, 7), (8, 9)]
    assert fixed_chunks(0, 4) == []
    assert window_bounds(130, 60) == [(0, 43), (44, 86), (87, 129)]
    assert window_bounds(60, 60) == [(0, 59)]
    assert window_bounds(0, 60) == []


def test_format_unit_and_make_units() -> None:
    assert format_unit(session(2)) == "A: s utterance 0\nB: s utterance 1"
    turns = session(5)
    for t in turns:
        t["turn_idx"] += 10
        t["source_turn_id"] = f"D1:{t['turn_idx']}"
    turns[3]["source_turn_id"] = None
    units = make_units(turns, [(0, 1), (2, 4)], "segment")
    assert [(u["turn_start"], u["turn_end"]) for u in units] == [(10, 11), (12, 14)]
    assert units[1]["text"] == format_unit(turns[2:]) and units[1]["source_turn_ids"] == ["D1:12", "D1:14"]
    assert units[0]["episode_id"] == "e1" and units[0]["session_idx"] == 1


# ---------------------------------------------------------------- segmentation


def test_segment_session_valid_answer_one_call() -> None:
    llm = FakeChat([segs((1, 2), (3, 3))])
    res = run(segment_session(llm, session(6), params={"temperature": 0.7, "seed": 42}))
    assert res.segments == [(0, 3), (4, 5)] and not res.fallback and res.reason is None
    assert len(llm.calls) == 1 and llm.calls[0]["schema"] is SpansAnswer
    assert llm.calls[0]["params"] == {"temperature": 0.7, "seed": 42}
    prompt = llm.calls[0]["messages"][-1]["content"]
    assert "Exchange 1:\n[A]: s utterance 0\n[B]: s utterance 1" in prompt and "Exchange 3:" in prompt


def test_segment_session_reasks_with_the_error_then_succeeds() -> None:
    llm = FakeChat([segs((1, 2), (2, 3)), segs((1, 2), (3, 3))])
    res = run(segment_session(llm, session(6)))
    assert res.segments == [(0, 3), (4, 5)] and not res.fallback
    call = llm.calls[0]
    assert call["attempts"] == 2 and "overlaps" in call["errors"][0]


def test_segment_session_falls_back_to_chunks_of_three_exchanges_and_records_why() -> None:
    bad = segs((1, 1), (3, 4))  # leaves exchange 2 uncovered
    llm = FakeChat([bad, bad, bad], max_attempts=3)
    res = run(segment_session(llm, session(10)))
    assert res.fallback and res.segments == [(0, 5), (6, 9)]  # 3 exchanges, then 2
    assert "in no segment" in res.reason and json.loads(res.raw) == bad
    # transport-level failure: same fallback path
    llm = FakeChat([LLMError("timeout after retries")])
    res = run(segment_session(llm, session(5), unit="turn", fallback_size=4))
    assert res.fallback and res.reason == "timeout after retries" and res.raw is None
    assert res.segments == [(0, 3), (4, 4)]
    # unparseable text also ends in the fallback
    res = run(segment_session(FakeChat(["not json", "{}"]), session(4), unit="turn", fallback_size=2))
    assert res.fallback and res.segments == [(0, 1), (2, 3)] and res.raw == "{}"


def test_trivial_sessions_need_no_call() -> None:
    llm = FakeChat([])
    assert run(segment_session(llm, session(2))).segments == [(0, 1)]  # one exchange
    assert run(segment_session(llm, [])).segments == []
    assert llm.calls == []


def test_long_session_is_segmented_in_windows_and_concatenated() -> None:
    def halves(messages, schema):
        n = n_units_in(messages)
        return segs((1, n // 2), (n // 2 + 1, n))

    llm = FakeChat(responder=halves)
    res = run(segment_session(llm, session(130), unit="turn", max_units_per_call=60))
    assert len(llm.calls) == 3
    assert sorted(n_units_in(c["messages"]) for c in llm.calls) == [43, 43, 44]
    # window 0..43 (44 turns), 44..86 (43), 87..129 (43), each split in half locally
    assert res.segments == [(0, 21), (22, 43), (44, 64), (65, 86), (87, 107), (108, 129)]
    assert not res.fallback


def test_one_failed_window_falls_back_alone() -> None:
    def answer(messages, schema):
        n = n_units_in(messages)
        if "s utterance 0\n" in messages[1]["content"]:
            return segs((1, n))
        return segs((1, n + 1))  # out of range: invalid every time

    res = run(segment_session(FakeChat(responder=answer), session(20), unit="turn", max_units_per_call=10,
                              fallback_size=5))
    assert res.fallback and res.reason.startswith("window 2/2:") and "out of range" in res.reason
    assert res.segments == [(0, 9), (10, 14), (15, 19)]


def test_guidance_goes_into_the_prompt_and_round_trips() -> None:
    g = SegmentationGuidance(
        rubric="1. Start a new segment when the subject changes.",
        examples=[{"conversation": "Exchange 1:\n[A]: hi\n\nExchange 2:\n[A]: bye", "segments": [[1, 1], [2, 2]],
                   "prediction": [[1, 2]], "reflection": "Farewells start a new segment here."}],
        history=[{"round": 1, "mean_wd": 0.25}],
    )
    again = SegmentationGuidance.from_dict(json.loads(json.dumps(g.to_dict())))
    assert again == g
    text = build_segmentation_messages(Numbered.of(session(3)), again)[-1]["content"]
    assert "Start a new segment when the subject changes." in text
    assert '"start": 1, "end": 1' in text and '"start": 2, "end": 2' in text
    assert "Farewells start a new segment here." in text
    # App. A.1: each example shows the model's own prediction beside the ground truth.
    assert 'wrong answer: {"segments": [{"start": 1, "end": 2' in text
    assert text.index("Correct answer") < text.index("wrong answer") < text.index("Farewells")
    starts = build_segmentation_messages(Numbered.of(session(3)), again, "starts")[-1]["content"]
    assert '{"starts": [1, 2]}' in starts and 'wrong answer: {"starts": [1]}' in starts
    plain = build_segmentation_messages(Numbered.of(session(3)))[-1]["content"]
    assert "rubric" not in plain.lower() and "Example" not in plain


# ---------------------------------------------------------------- reflection learning


def test_learn_guidance_reflects_on_the_hardest_sessions_in_mini_batches() -> None:
    # Gold segmentations of growing difficulty for a model that never splits.
    golds = {"easy": [8], "mild": [4, 4], "hard": [2, 2, 2, 2], "harder": [1, 2, 1, 2, 1, 1], "mid": [3, 5]}
    sessions = [session(8, tag, lengths) for tag, lengths in golds.items()]
    # WindowDiff as Table 4 scores it (SuperDialseg's convention), as `score` does.
    wd_one_segment = {tag: window_diff(lengths_to_boundaries(lengths), [True] + [False] * 7, convention="superdialseg")
                      for tag, lengths in golds.items()}
    expected_hard = sorted((t for t in golds if wd_one_segment[t] > 0), key=lambda t: -wd_one_segment[t])[:3]

    reflections: list[str] = []
    seg_prompts: list[str] = []

    def responder(messages, schema):
        text = messages[-1]["content"]
        if schema is SpansAnswer:
            seg_prompts.append(text)
            return segs((1, n_units_in(messages)))  # never splits
        assert schema is ReflectionOutput
        reflections.append(text)
        k = len(reflections)
        return {"rubric": [f"criterion from reflection {k}"], "representative": 0,
                "reflection": f"missed the topic shift ({k})"}

    llm = FakeChat(responder=responder)
    g = run(learn_guidance(llm, sessions, rounds=2, mini_batches=2, hard_k=3, unit="turn"))

    # each round: hard sessions in 2 mini-batches [h0, h1], [h2] (the fake never improves)
    assert len(reflections) == 4
    def tags_in(text):  # sessions shown in a reflection prompt, in prompt order
        return sorted((t for t in golds if f"{t} utterance 0" in text), key=lambda t: text.index(f"{t} utterance 0"))
    assert [tags_in(r) for r in reflections[:2]] == [expected_hard[:2], expected_hard[2:]]
    # each reflection sees gold vs prediction and builds on the rubric from the previous batch
    assert "Human segmentation:" in reflections[0] and "(no rubric yet)" in reflections[0]
    assert "criterion from reflection 1" in reflections[1]
    # round 2 segments with the learned rubric and examples
    assert all("criterion from reflection 2" in p for p in seg_prompts[5:10])
    assert g.rubric == "1. criterion from reflection 4"
    assert [h["round"] for h in g.history] == [1, 2]
    mean_wd = sum(wd_one_segment.values()) / len(golds)
    assert g.history[0]["mean_wd"] == pytest.approx(mean_wd)
    assert g.history[0]["hard_wd"] == [wd_one_segment[t] for t in expected_hard]
    # one worked example per mini-batch, with the gold segmentation (1-based turn numbers here)
    assert len(g.examples) == 2
    ex = g.examples[-1]
    gold_spans = [(a - 1, b - 1) for a, b in ex["segments"]]
    assert spans_to_boundaries(gold_spans, 8) == lengths_to_boundaries(golds[expected_hard[2]])
    assert ex["prediction"] == [[1, 8]] and ex["reflection"] == "missed the topic shift (4)"
    json.dumps(g.to_dict())  # storable as an artifact


@pytest.mark.parametrize(("convention", "hardest"), [("superdialseg", "a"), ("slots", "b")])
def test_hard_examples_are_ranked_by_windowdiff_in_the_scoring_convention(convention: str, hardest: str) -> None:
    """A model that never splits: gold 1+2+5 has WD .429 (SuperDialseg) / .286 (slots), gold 2+6 has
    .286 / .333, so the single hardest example depends on the convention results are scored in."""
    sessions = [session(8, "a", [1, 2, 5]), session(8, "b", [2, 6])]
    shown: list[str] = []

    def responder(messages, schema):
        if schema is SpansAnswer:
            return segs((1, n_units_in(messages)))
        shown.append(messages[-1]["content"])
        return {"rubric": ["c"], "representative": 0, "reflection": "r"}

    g = run(learn_guidance(FakeChat(responder=responder), sessions, hard_k=1, unit="turn", convention=convention))
    assert len(shown) == 1 and f"{hardest} utterance 0" in shown[0]
    other = "b" if hardest == "a" else "a"
    assert f"{other} utterance 0" not in shown[0]
    assert g.examples[0]["prediction"] == [[1, 8]]


def test_learn_guidance_shows_exchanges_with_gold_in_exchange_numbers() -> None:
    annotated = [session(8, "x", [4, 4])]  # turn 4 starts segment 2 = exchange 3
    seen: list[str] = []

    def responder(messages, schema):
        if schema is SpansAnswer:
            return segs((1, 4))
        seen.append(messages[-1]["content"])
        return {"rubric": ["c"], "representative": 0, "reflection": "r"}

    g = run(learn_guidance(FakeChat(responder=responder), annotated))
    assert "Human segmentation: 1-2, 3-4" in seen[0] and "Exchange 4:" in seen[0]
    assert g.examples[0]["segments"] == [[1, 2], [3, 4]]


def test_learn_guidance_stops_when_nothing_is_wrong_and_survives_failed_reflection() -> None:
    perfect = [session(6, "p", [2, 4])]
    llm = FakeChat([segs((1, 1), (2, 3))])
    g = run(learn_guidance(llm, perfect, rounds=3))
    assert len(llm.calls) == 1 and g.history == [
        {"round": 1, "mean_wd": 0.0, "n_hard": 0, "hard_wd": [], "fallbacks": 0, "reflection_failures": 0}]

    start = SegmentationGuidance(rubric="1. keep it", history=[{"round": 1, "mean_wd": 0.5}])
    llm = FakeChat([segs((1, 3)), {"rubric": [], "representative": 0, "reflection": ""},
                    {"rubric": ["a"] * 11, "representative": 0, "reflection": ""}])
    g = run(learn_guidance(llm, perfect, rounds=1, initial=start))
    assert g.rubric == "1. keep it" and g.examples == []
    assert g.history[-1]["round"] == 2 and g.history[-1]["reflection_failures"] == 1
    assert "at most 10" in llm.calls[1]["errors"][-1]
    assert start.history == [{"round": 1, "mean_wd": 0.5}]  # the initial guidance is not mutated


# ---------------------------------------------------------------- response


UNITS = [
    {"session_idx": 3, "turn_start": 4, "text": "A: third late", "session_time": "2023-03-01"},
    {"session_idx": 1, "turn_start": 0, "text": "A: first", "session_time": None},
    {"session_idx": 3, "turn_start": 0, "text": "B: third early", "session_time": "2023-03-01"},
    {"session_idx": 2, "text": "B: second"},
]


def test_response_messages_put_memory_in_time_order_then_current_session() -> None:
    current = [{"speaker": "A", "text": "Hi again"}, {"speaker": "B", "text": "How was the trip?"}]
    msgs = build_response_messages(UNITS, current, "How was the trip?", "A")
    user = msgs[-1]["content"]
    order = [user.index(s) for s in ["A: first", "B: second", "B: third early", "A: third late", "A: Hi again"]]
    assert order == sorted(order)
    assert "[Session 3, 2023-03-01]" in user and "[Session 1]\n" in user
    assert user.count("How was the trip?") == 1  # the request is not repeated
    assert "A's next utterance" in user and msgs[0]["role"] == "system"

    llm = FakeChat(["It was lovely."])
    res = run(respond(llm, UNITS, current, "How was the trip?", "A", temperature=0.0))
    assert res.text == "It was lovely." and llm.calls[0]["params"] == {"temperature": 0.0}
    assert llm.calls[0]["messages"] == msgs


@pytest.mark.parametrize("raw, expected", [
    ("Sure, it was great!", "Sure, it was great!"),
    ("A: Sure, it was great!", "Sure, it was great!"),  # a leading tag of the respondent
    ("[bot]: A: It was great.", "It was great."),
    ("It was great.\nB: Glad to hear!\nA: Thanks.", "It was great."),  # runs on into invented turns
    ("It was great.\n[user]: cool", "It was great."),
    ("Line one\nline two: with a colon", "Line one\nline two: with a colon"),  # not a speaker tag
])
def test_a_response_is_cut_to_one_turn(raw: str, expected: str) -> None:
    from stages.methods.shared.response import one_turn

    assert one_turn(raw, ["A", "B"]) == expected


def test_qa_messages() -> None:
    msgs = build_qa_messages(UNITS, "Where did A go?")
    user = msgs[-1]["content"]
    assert user.index("A: first") < user.index("A: third late") and "Question: Where did A go?" in user
    assert "concise" in msgs[0]["content"]
    assert run(answer_question(FakeChat(["Paris"]), UNITS, "Where did A go?")).text == "Paris"
    assert "(no memories retrieved)" in build_qa_messages([], "q")[-1]["content"]
