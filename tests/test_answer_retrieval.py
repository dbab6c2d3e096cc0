"""LongMemEval's retrieval measures of what each answer read (stages/scoring/answer_retrieval.py). The
expected values come from LongMemEval's own evaluation, xiaowu0162/LongMemEval
src/retrieval/eval_utils.py at commit 9e0b455f4ef0e2ab8f2e582289761153549043fc: evaluate_retrieval
(rounds keyed on their user turn, sessions) and evaluate_retrieval_turn2session (rounds read as sessions)
run on the same rankings."""

from __future__ import annotations

import json
import math

import pytest

from stages.scoring.answer_retrieval import ANSWER_RETRIEVAL_SCORES, answer_retrieval_rows, context_units

# Three rounds in the answer's context, in its order: s1's, s2's, s3's; the evidence is s2's and s3's user turn.
ROUNDS = {"turn:0:0": ["s1:1", "s1:2"], "turn:1:0": ["s2:1", "s2:2"], "turn:2:0": ["s3:1", "s3:2"]}
ROUND_QUESTION = {"qa_id": "q_rounds", "evidence": ["s2:1", "s3:1"], "evidence_sessions": ["s2", "s3"]}
SESSIONS = {"session:1": ["s2:1", "s2:2"], "session:2": ["s3:1", "s3:2"]}
SESSION_QUESTION = {"qa_id": "q_sessions", "evidence": ["s3:1"], "evidence_sessions": ["s3"]}


def _rows(memory_ids, question, sources, ks, **response):
    r = {"probe_id": "p", "error": None, "response": "an answer", "memory_ids": memory_ids, **response}
    return {row["k"]: row for row in answer_retrieval_rows("e", "longmemeval", "turn", [r], {"p": question},
                                                            sources, {}, ks)}


@pytest.mark.parametrize("k,expected", [(1, (0.0, 0.0, 0.0)), (3, (1.0, 1.0, 0.8154648767857288)),
                                        (10, (1.0, 1.0, 0.8154648767857288))])
def test_rounds_in_the_context_score_as_eval_utils_evaluate_retrieval_at_turn_level(k, expected):
    # eval_utils.evaluate_retrieval([0, 2, 4], ['s2_1', 's3_1'], ['s1_1', 's1_3', 's2_1', 's2_3', 's3_1'], k)
    row = _rows(list(ROUNDS), ROUND_QUESTION, ROUNDS, [k])[k]
    assert (row["recall_any"], row["recall_all"]) == expected[:2]
    assert row["ndcg_any"] == pytest.approx(expected[2])
    assert row["context_units"] == 3


@pytest.mark.parametrize("k,expected", [(1, (0.0, 0.0, 0.0)), (2, (1.0, 0.0, 0.5))])
def test_rounds_read_as_sessions_score_as_eval_utils_turn2session(k, expected):
    # eval_utils.evaluate_retrieval_turn2session on the ranking above. (At a k past the context's
    # sessions its ideal DCG counts a gold session once per corpus round, ours once: ours reads the
    # sessions the context holds, each once.)
    row = _rows(list(ROUNDS), ROUND_QUESTION, ROUNDS, [k])[k]
    assert (row["session_recall_any"], row["session_recall_all"]) == expected[:2]
    assert row["session_ndcg_any"] == pytest.approx(expected[2])


@pytest.mark.parametrize("k,expected", [(1, (0.0, 0.0, 0.0)), (2, (1.0, 1.0, 1.0)), (5, (1.0, 1.0, 1.0))])
def test_sessions_in_the_context_score_as_eval_utils_evaluate_retrieval_at_session_level(k, expected):
    # eval_utils.evaluate_retrieval([1, 2], ['s3'], ['s1', 's2', 's3', 's4'], k)
    row = _rows(list(SESSIONS), SESSION_QUESTION, SESSIONS, [k])[k]
    assert (row["session_recall_any"], row["session_recall_all"], row["session_ndcg_any"]) == expected


def test_an_answer_that_shows_turns_is_read_from_its_recorded_spans():
    turn_ids = {(0, 0): "s1:1", (0, 1): "s1:2", (1, 0): "s2:1", (1, 1): "s2:2"}
    details = json.dumps({"context_spans": [[0, 0, 1], [1, 0, 1]]})
    assert context_units([], details, {}, turn_ids) == [["s1:1", "s1:2"], ["s2:1", "s2:2"]]
    assert context_units(["full"], None, {}, turn_ids) is None
    r = {"probe_id": "p", "error": None, "response": "x", "memory_ids": [], "details_json": details}
    [row] = answer_retrieval_rows("e", "longmemeval", "full_history", [r],
                                  {"p": {"qa_id": "q", "evidence": ["s2:1"], "evidence_sessions": ["s2"]}},
                                  {}, turn_ids, [5])
    assert row["recall_all"] == 1.0 and row["session_recall_all"] == 1.0
    assert row["ndcg_any"] == pytest.approx(1 / math.log2(2))  # the gold round second: 1 / log2(2)


def test_an_abstention_question_has_no_gold_and_a_failed_answer_no_row():
    row = _rows(list(ROUNDS), {"qa_id": "q_abs", "evidence": [], "evidence_sessions": []}, ROUNDS, [3])[3]
    assert all(math.isnan(row[n]) for n in ("recall_any", "ndcg_any", "session_recall_all"))
    assert _rows(list(ROUNDS), ROUND_QUESTION, ROUNDS, [3], error="TimeoutError: x", response=None) == {}
    assert set(row) == set(ANSWER_RETRIEVAL_SCORES.names)
