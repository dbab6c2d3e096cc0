"""BEAM's judge (`correctness: [beam]`, stages/judging/beam.py): one call per rubric nugget scored
1 / 0.5 / 0, read as compute_metrics.py reads it (int() on nine abilities, float() on event ordering),
the question's score their mean; an event-ordering answer scored by the normalised Kendall's tau-b of its
lines, aligned to the rubric by an LLM equivalence check, against the rubric's order.

The expected readings, means, alignments and order scores below come from running the official pure
functions once (parse_json_response with its json_repair fallback, evaluate_abstention,
evaluate_event_ordering, align_with_llm, event_ordering_score of src/evaluation/compute_metrics.py in
mohammadtavakoli78/BEAM at b2a3ee8ba12d68f83143dda191097dc3e028ddd3, json_repair 0.44.1, scipy 1.17) with a
scripted model, in a scratch directory outside the repository."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import polars as pl
import pyarrow as pa
import pytest
from judge_kit import judge_episode
from pipeline.testing.fake_chat import FakeChat

from pipeline.llm.types import LLMError
from stages.judging import beam
from stages.judging.judge_answers import ANSWER_JUDGMENTS
from stages.judging.panel import PanelJudge
from stages.report.answers import answer_summary
from stages.report.scorers import scorer


# --- the prompts ------------------------------------------------------------------------------------

def test_the_nugget_prompt_shows_the_criterion_and_response_and_leaves_the_question_slot_as_the_official_does() -> None:
    (message,) = beam.nugget_messages("Mentions the 3 pm meeting", "We meet at 15:00 {sharp}.")
    assert message["role"] == "user"
    text = message["content"]
    assert "The criterion to check: Mentions the 3 pm meeting" in text
    assert "The response being graded: We meet at 15:00 {sharp}." in text
    assert "The user's question: <question>" in text  # the official never fills its placeholder
    assert "The user's question: When do we meet?" in beam.nugget_messages("c", "r", "When do we meet?")[0]["content"]
    for words in ("positive requirement", "negative constraint", '"avoid"', "scores 0.0, and nothing else",
                  "Paraphrases and synonyms", "letter case, punctuation or spacing", "values agree",
                  "compare them, not the strings", "Tone, politeness, length and embellishment", "hedging",
                  "Check the format only", "1.0, fully met", "0.5, partly met", "0.0, not met", "dodges",
                  "every element present is 1.0, some of them present is 0.5, none present is 0.0",
                  "Explain whether the criterion was met", '{"score": <1.0, 0.5 or 0.0>, "reason":',
                  "nothing before or after it"):
        assert words in text, words


def test_the_equivalence_check_asks_yes_or_no_on_the_rubric_item_then_the_answer_line() -> None:
    system, user = beam.equivalence_messages("Moved to Lisbon", "The move to Lisbon")
    assert system["role"] == "system" and user["role"] == "user"
    for words in ("same event or fact", "YES", "NO", "one word only", "no explanation"):
        assert words in system["content"], words
    assert user["content"] == "Snippet 1: Moved to Lisbon\n\nSnippet 2: The move to Lisbon"
    assert beam.is_equivalent("YES") and beam.is_equivalent("Yes.") and not beam.is_equivalent("NO")
    assert not beam.is_equivalent(None)


# --- reading a nugget's reply -----------------------------------------------------------------------

@pytest.mark.parametrize(("reply", "nine", "ordering"), [
    ('{"score": 1.0, "reason": "ok"}', 1.0, 1.0),
    ('{"score": 0.5, "reason": "partly"}', 0.0, 0.5),  # int(0.5): a partial nugget counts 0
    ('```json\n{"score": 0.5, "reason": "x"}\n```', 0.0, 0.5),
    ('Here is my verdict: {"score": 1, "reason": "fine"} done', 1.0, 1.0),
    ('{"score": "1", "reason": "x"}', 1.0, 1.0),
    ('{"score": "0.5", "reason": "x"}', None, 0.5),  # int("0.5") refuses
    ('Verdict: {"score": 1.0, "reason": "uses {x}"}', 1.0, 1.0),  # mended: json_repair
    ('{"score": 0.5, "reason": "cut off', 0.0, 0.5),  # mended
    ("{'score': 1.0, 'reason': 'single quotes'}", 1.0, 1.0),  # mended
    ('{score: 0.5, reason: "unquoted"}', 0.0, 0.5),  # mended
    ('{"score": 0.5, "reason": "x",}', 0.0, 0.5),  # mended
    ("The response complies.", None, None),
    ("Score: 1.0", None, None),
    ('[{"score": 1.0}]', None, None),  # JSON, but not an object
    ('{"reason": "no score"}', None, None),
    ('{"score": 1.0, "reason": "a"} {"score": 0.0, "reason": "b"}', 1.0, 1.0),  # the first span
    ('{"score": true, "reason": "x"}', 1.0, 1.0),
    ('{"score": null, "reason": "x"}', None, None),
    ('  {"score": 0.0, "reason": "missing"}  \n', 0.0, 0.0),
    (None, None, None),
])
def test_a_nugget_reply_is_read_as_compute_metrics_reads_it(reply, nine, ordering) -> None:
    assert beam.read_nugget(reply, "information_extraction") == nine
    assert beam.read_nugget(reply, "event_ordering") == ordering


def test_a_questions_score_is_its_nuggets_mean_with_partial_nuggets_truncated_outside_event_ordering() -> None:
    replies = ['{"score": 1.0, "reason": "a"}', '{"score": 0.5, "reason": "b"}', '{"score": 0.0, "reason": "c"}']
    # evaluate_abstention: (1 + 0 + 0) / 3; two halves: 0
    assert beam.nugget_mean([beam.read_nugget(r, "abstention") or 0.0 for r in replies]) == pytest.approx(1 / 3)
    assert beam.nugget_mean([beam.read_nugget(replies[1], "abstention") or 0.0] * 2) == 0.0
    # evaluate_event_ordering's own nugget mean reads float(): 1, 0.5, 0.5, 0 -> 0.5
    assert beam.nugget_mean([1.0, 0.5, 0.5, 0.0]) == 0.5


# --- alignment and tau-b ----------------------------------------------------------------------------

REF = ["A", "B", "C", "D"]


def _aligned(reference: list[str], items: list[str], same: set[tuple[str, str]]) -> tuple[list[str], int]:
    """align_with_llm with a scripted check: the same event when the pair is listed or the texts are equal."""
    asked: list[tuple[int, int]] = []

    async def check(i: int, j: int) -> bool:
        asked.append((i, j))
        return (reference[i], items[j]) in same or reference[i] == items[j]

    matches = asyncio.run(beam.align(reference, items, check))
    return beam.aligned_items(reference, items, matches), len(asked)


@pytest.mark.parametrize(("name", "reference", "items", "same", "canon", "calls", "expected"), [
    ("same", REF, ["A", "B", "C", "D"], set(), ["A", "B", "C", "D"], 4, (1.0, 1.0, 1.0, 1.0, 1.0)),
    ("reversed", REF, ["D", "C", "B", "A"], set(), ["D", "C", "B", "A"], 10, (1.0, 1.0, 1.0, 0.0, 0.0)),
    ("one swap", REF, ["B", "A", "C", "D"], set(), ["B", "A", "C", "D"], 5,
     (1.0, 1.0, 1.0, 0.833333333333, 0.833333333333)),
    ("paraphrased", REF, ["a1", "b1", "d1", "c1"], {("A", "a1"), ("B", "b1"), ("C", "c1"), ("D", "d1")},
     ["A", "B", "D", "C"], 5, (1.0, 1.0, 1.0, 0.833333333333, 0.833333333333)),
    ("missing and extra", REF, ["A", "X", "C"], set(), ["A", "X", "C"], 6,
     (0.666666666667, 0.5, 0.571428571429, 0.552704627669, 0.315831215811)),
    ("blank lines", REF, ["B", "", "A", "", "D"], set(), ["B", "", "A", "", "D"], 10, (0.6, 0.75, 0.666666666667, 0.6, 0.4)),
    ("none aligned", REF, ["X", "Y"], set(), ["X", "Y"], 8, (0.0, 0.0, 0.0, 0.14365167745, 0.0)),
    ("duplicate line", REF, ["A", "A", "B"], set(), ["A", "A", "B"], 5,
     (1.0, 0.5, 0.666666666667, 0.956435464588, 0.637623643058)),
    ("one rubric item and an extra line", ["A"], ["A", "Z"], set(), ["A", "Z"], 1, (0.5, 1.0, 0.666666666667, 1.0,
                                                                                     0.666666666667)),
    ("first match wins", ["A", "B", "C"], ["s1", "s2"], {("A", "s1"), ("B", "s1"), ("B", "s2")}, ["A", "B"], 2,
     (1.0, 0.666666666667, 0.8, 1.0, 0.8)),
])
def test_the_order_score_is_event_ordering_scores_normalised_tau_b(name, reference, items, same, canon, calls,
                                                                   expected) -> None:
    aligned, asked = _aligned(reference, items, same)
    assert (aligned, asked) == (canon, calls), name
    s = beam.order_scores(reference, aligned)
    assert (s.precision, s.recall, s.f1, s.tau_norm, s.final_score) == pytest.approx(expected, abs=1e-9), name
    assert s.tau_b == pytest.approx(2 * expected[3] - 1, abs=1e-9)


def test_tau_b_is_undefined_with_one_item_on_each_side() -> None:
    aligned, _ = _aligned(["A"], ["A"], set())
    s = beam.order_scores(["A"], aligned)
    assert (s.precision, s.recall, s.f1) == (1.0, 1.0, 1.0)
    assert (s.tau_b, s.tau_norm, s.final_score) == (None, None, None)  # the official's NaN


def test_the_answers_items_are_its_lines_blank_ones_included() -> None:
    assert beam.answer_items("B\nA\n\nD") == ["B", "A", "", "D"]


# --- judge_answers over BEAM probes -----------------------------------------------------------------

NUGGET_REPLIES = {"A": '{"score": 1.0, "reason": "a"}', "B": '{"score": 0.5, "reason": "b"}',
                  "C": '{"score": 0.5, "reason": "c"}', "D": '{"score": 0.0, "reason": "d"}',
                  "E": '{"score": 1.0, "reason": "e"}', "F": '{"score": 1.0, "reason": "f"}',
                  "Names Lisbon": '{"score": 1.0, "reason": "named"}',
                  "Gives the year 2021": 'It does. {"score": 0.5, "reason": "close"}',
                  "No apology": '{"score": 0.0, "reason": "apologises"}',
                  "Vague nugget": "I cannot tell."}


def _criterion(text: str) -> str:
    return text.split("The criterion to check: ", 1)[1].split("\n", 1)[0]


def _responder(messages, schema):
    if messages[0]["content"] == beam.EQUIVALENCE_SYSTEM:
        first, second = messages[1]["content"].removeprefix("Snippet 1: ").split("\n\nSnippet 2: ")
        if "FAIL" in second:
            return LLMError("server error", None)
        return "YES" if first == second else "NO"
    return NUGGET_REPLIES[_criterion(messages[0]["content"])]


def _probe(qa_id: str, category: str, gold: str | None = "ideal answer") -> dict:
    return {"probe_id": f"qa:{qa_id}", "kind": "qa", "category": category, "session_idx": 9, "turn_idx": None,
            "request": f"Question {qa_id}?", "gold": gold, "qa_id": qa_id, "evidence": None}


PROBES = [_probe("ie", "information_extraction"), _probe("eo", "event_ordering"),
          _probe("vague", "preference_following"), _probe("norubric", "summarization"),
          _probe("odd", "small_talk"), _probe("fails", "event_ordering")]
RUBRICS = {"ie": ["Names Lisbon", "Gives the year 2021", "No apology"], "eo": ["A", "B", "C", "D"],
           "vague": ["Names Lisbon", "Vague nugget"], "norubric": [], "odd": ["Names Lisbon"], "fails": ["E", "F"]}
ANSWERS = {"qa:ie": "Lisbon, in 2020. Sorry!", "qa:eo": "B\nA\n\nD", "qa:vague": "Lisbon.",
           "qa:norubric": "A summary.", "qa:odd": "Hi.", "qa:fails": "E\nFAIL"}


def _judge(llm: FakeChat, dataset: str = "beam", runs: int = 1) -> list[dict]:
    return judge_episode(llm, "beam", dataset, PROBES, ANSWERS, RUBRICS, model="gpt-4.1-mini", runs=runs,
                         temperature=0.7)


def test_a_question_is_judged_by_one_call_per_nugget_and_scored_by_their_mean() -> None:
    llm = FakeChat(responder=_responder)
    row = {r["probe_id"]: r for r in _judge(llm)}["qa:ie"]
    # 1.0, 0.5 read as 0, 0.0: (1 + 0 + 0) / 3
    assert row["score"] == pytest.approx(1 / 3) and row["judge_prompt"] == beam.RUBRIC and row["skipped"] is None
    assert row["reference_source"] == "rubric" and row["error"] is None and row["accepted"] is False
    kept = json.loads(row["reason"])
    assert [(n["criterion"], n["value"], n["stated"]) for n in kept["nuggets"]] == [
        ("Names Lisbon", 1.0, 1.0), ("Gives the year 2021", 0.0, 0.5), ("No apology", 0.0, 0.0)]
    assert kept["nuggets"][1]["reply"] == NUGGET_REPLIES["Gives the year 2021"]
    mine = [c for c in llm.calls if "Lisbon, in 2020. Sorry!" in c["messages"][0]["content"]]
    assert len(mine) == 3 and all(len(c["messages"]) == 1 for c in mine)
    assert all(c["params"] == beam.BEAM_SAMPLING for c in mine)  # fixed: gpt-4.1-mini at temperature 0
    assert all("<question>" in c["messages"][0]["content"] for c in mine)


def test_an_event_ordering_answer_is_scored_by_normalised_tau_b_with_its_alignment_and_nuggets_kept() -> None:
    llm = FakeChat(responder=_responder)
    row = {r["probe_id"]: r for r in _judge(llm)}["qa:eo"]
    # evaluate_event_ordering on "B\nA\n\nD" against A-D: tau_norm 0.6, F1 0.75, final 0.45, nugget mean 0.5
    assert row["score"] == pytest.approx(0.6) and row["judge_prompt"] == beam.ORDER and row["skipped"] is None
    kept = json.loads(row["reason"])
    assert kept["order"]["f1"] == pytest.approx(0.75) and kept["order"]["final_score"] == pytest.approx(0.45)
    assert kept["order"]["tau_b"] == pytest.approx(0.2) and kept["nugget_mean"] == 0.5
    assert [(a["item"], a["matched"], len(a["replies"])) for a in kept["alignment"]] == [
        ("B", 1, 2), ("A", 0, 1), ("", None, 2), ("D", 3, 2)]
    equivalence = [c for c in llm.calls if c["messages"][0]["content"] == beam.EQUIVALENCE_SYSTEM
                   and c["messages"][1]["content"].split("\n\nSnippet 2: ")[1] in ("B", "A", "", "D")]
    nuggets = [c for c in llm.calls if "B\nA\n\nD" in c["messages"][0]["content"]]
    # the official asks 7 equivalence calls and 4 nugget calls (and a fact extraction it discards)
    assert (len(equivalence), len(nuggets)) == (7, 4)
    assert all(c["params"] == beam.BEAM_SAMPLING for c in equivalence)


def test_unreadable_replies_no_rubric_and_unknown_abilities_are_skipped_and_a_failed_call_fails_the_row() -> None:
    llm = FakeChat(responder=_responder)
    rows = {r["probe_id"]: r for r in _judge(llm)}
    vague = rows["qa:vague"]
    assert vague["score"] is None and vague["skipped"] == beam.SKIP_UNREADABLE and vague["error"] is None
    assert json.loads(vague["reason"])["unreadable"] == [1]
    assert rows["qa:norubric"]["skipped"] == beam.SKIP_NO_RUBRIC
    assert rows["qa:odd"]["skipped"] == beam.SKIP_OTHER_ABILITY
    assert not [c for c in llm.calls if "A summary." in c["messages"][-1]["content"]
                or "Hi." in c["messages"][-1]["content"]]
    failed = rows["qa:fails"]
    assert failed["score"] is None and failed["error"] is not None and failed["skipped"] is None


def test_other_datasets_are_skipped_without_a_call() -> None:
    llm = FakeChat(responder=_responder)
    assert {r["skipped"] for r in _judge(llm, dataset="locomo")} == {beam.SKIP_OTHER_DATASET}
    assert not llm.calls


def test_several_runs_each_judge_the_event_ordering_answer() -> None:
    llm = FakeChat(responder=_responder)
    eo = [r for r in _judge(llm, runs=2) if r["probe_id"] == "qa:eo"]
    assert [r["run"] for r in eo] == [0, 1] and all(r["score"] == pytest.approx(0.6) for r in eo)


def test_each_ability_is_averaged_in_answer_summary() -> None:
    rows = _judge(FakeChat(responder=_responder))
    summary = answer_summary(pl.from_arrow(pa.Table.from_pylist(rows, ANSWER_JUDGMENTS)))
    by = {r["category"]: r for r in summary.filter(pl.col("dataset") == "beam").to_dicts()}
    assert by["information_extraction"]["score"] == pytest.approx(1 / 3)
    assert by["event_ordering"]["score"] == pytest.approx(0.6) and by["event_ordering"]["failed"] == 1
    assert (by["preference_following"]["judged"], by["preference_following"]["skipped"]) == (0, 1)


def test_the_judge_is_a_panel_prompt_and_the_report_names_each_abilitys_scorer() -> None:
    assert PanelJudge(name="beam", prompt="beam").prompt == "beam"
    cfg = SimpleNamespace(judge_answers=SimpleNamespace(runs=1))

    def named(category: str | None) -> str:
        return scorer(cfg, SimpleNamespace(table="answer_summary", column="score",
                                           where={"judge": "beam", "category": category})) or ""

    assert "tau-b" in named("event_ordering") and "tau_norm" in named("event_ordering")
    assert "nugget" in named("summarization") and "int()" in named("summarization")
    assert "BEAM's scorer" in named(None)
