"""HaluMem's operation-level scorer (stages/judging/halumem.py): the integrity, accuracy, update and QA judge
calls with their replies read as the release reads them (llms.py's ```json block, int() of the score, the
label string; unreadable: None), the aggregation of evaluation.py's aggregate_eval_results, and the QA judge
as the `halumem` judge of judge_answers.

The expected aggregation below comes from running the release's own aggregate_eval_results (and its
compute_f1) once on the same records (MemTensor/HaluMem eval/evaluation.py at commit
59402b9), copied into a scratch directory outside the repository."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import polars as pl
import pyarrow as pa
import pytest
from judge_kit import judge_episode
from pipeline.testing.fake_chat import FakeChat

from pipeline.llm.types import LLMError, LLMResult
from stages.judging import halumem as hm
from stages.judging.judge_answers import ANSWER_JUDGMENTS
from stages.judging.panel import PanelJudge
from stages.report.answers import answer_summary
from stages.report.scorers import scorer


def _fenced(obj: dict) -> str:
    return "Here is my verdict.\n```json\n" + json.dumps(obj) + "\n```\n"


def _result(text: str) -> LLMResult:
    return LLMResult(text=text, model="gpt-4o")


# --- the aggregation, against the release's own numbers ------------------------------------------------------

PERSONA, EVENT, RELATION = hm.MEMORY_TYPES[1], hm.MEMORY_TYPES[0], hm.MEMORY_TYPES[2]
# (memory_source, importance, score, memory_type), as the release's integrity records carry them
INTEGRITY = [("primary", 0.9, 2, PERSONA), ("primary", 0.5, 1, EVENT), ("secondary", 0.7, 0, RELATION),
             ("primary", 0.6, None, EVENT), ("primary", 1.0, 2, EVENT), ("interference", 0.4, 0, PERSONA),
             ("interference", 0.3, 2, EVENT), ("interference", 0.2, None, PERSONA), ("primary", 0.8, 2, RELATION)]
# (accuracy score, is_included_in_golden_memories as the reply gave it): a JSON true is not "true" there
ACCURACY = [(2, "true"), (1, "True"), (0, "false"), (2, "false"), (None, "false"), (1, "true"), (2, True),
            (None, "true")]
UPDATES = [("Correct", PERSONA), ("Hallucination", EVENT), ("Omission", EVENT), ("Other", RELATION), (None, EVENT),
           ("correct", PERSONA), ("Correct", EVENT)]  # "correct" is no label of the release's: invalid
QA = ["Correct", "Correct", "Hallucination", "Omission", None, "Other", "Correct"]  # "Other" is invalid for QA

# aggregate_eval_results' overall_score on those records (59402b9)
OFFICIAL = {
    "memory_integrity": {
        "recall(all)": 0.5, "recall(valid)": 0.6, "weighted_recall(all)": 0.6555555555555556,
        "weighted_recall(valid)": 0.7564102564102566, "memory_valid_importance_sum": 3.8999999999999995,
        "memory_importance_sum": 4.5, "memory_valid_num": 5, "memory_num": 6},
    "memory_accuracy": {
        "interference_accuracy(all)": 0.3333333333333333, "interference_accuracy(valid)": 0.5,
        "interference_memory_valid_num": 2, "interference_memory_num": 3,
        "target_accuracy(all)": 0.5, "target_accuracy(valid)": 0.6666666666666666, "target_memory_valid_num": 3,
        "target_memory_num": 4, "weighted_accuracy(all)": 0.5, "weighted_accuracy(valid)": 0.6666666666666666,
        "memory_valid_num": 6, "memory_num": 8},
    "memory_extraction_f1": 0.5,
    "memory_update": {
        "correct_update_memory_ratio(all)": 0.2857142857142857, "correct_update_memory_ratio(valid)": 0.4,
        "hallucination_update_memory_ratio(all)": 0.14285714285714285,
        "hallucination_update_memory_ratio(valid)": 0.2,
        "omission_update_memory_ratio(all)": 0.14285714285714285, "omission_update_memory_ratio(valid)": 0.2,
        "other_update_memory_ratio(all)": 0.14285714285714285, "other_update_memory_ratio(valid)": 0.2,
        "update_memory_valid_num": 5, "update_memory_num": 7},
    "question_answering": {
        "correct_qa_ratio(all)": 0.42857142857142855, "correct_qa_ratio(valid)": 0.6,
        "hallucination_qa_ratio(all)": 0.14285714285714285, "hallucination_qa_ratio(valid)": 0.2,
        "omission_qa_ratio(all)": 0.14285714285714285, "omission_qa_ratio(valid)": 0.2,
        "qa_valid_num": 5, "qa_num": 7},
    "memory_type_accuracy": {
        "Event Memory": {"memory_integrity_acc": 0.25, "memory_update_acc": 0.125, "total_num": 8,
                         "memory_acc": 0.375},
        "Persona Memory": {"memory_integrity_acc": 0.2, "memory_update_acc": 0.2, "total_num": 5,
                           "memory_acc": 0.4},
        "Relationship Memory": {"memory_integrity_acc": 0.3333333333333333, "memory_update_acc": 0.0,
                                "total_num": 3, "memory_acc": 0.3333333333333333}},
}


def _records() -> tuple[list[hm.IntegrityRecord], list[hm.AccuracyRecord], list[hm.UpdateRecord], list[hm.QARecord]]:
    integrity = [hm.IntegrityRecord(score, importance, kind, interference=source == hm.INTERFERENCE)
                 for source, importance, score, kind in INTEGRITY]
    accuracy = [hm.AccuracyRecord(score, included in ("true", "True")) for score, included in ACCURACY]
    return (integrity, accuracy, [hm.UpdateRecord(label, kind) for label, kind in UPDATES],
            [hm.QARecord(label) for label in QA])


def test_the_aggregation_gives_the_releases_numbers_on_the_same_records() -> None:
    # exactly, floats included: the sums are taken in the release's order
    assert hm.aggregate(*_records()) == OFFICIAL


def test_unreadable_judgments_count_in_all_and_not_in_valid() -> None:
    integrity, accuracy, updates, qa = _records()
    got = hm.aggregate(integrity, accuracy, updates, qa)
    recall = got["memory_integrity"]
    assert isinstance(recall, dict)
    # 3 recalled of 6 non-interference points, of which 5 have a score
    assert (recall["recall(all)"], recall["recall(valid)"]) == (3 / 6, 3 / 5)
    noise = got["memory_accuracy"]
    assert isinstance(noise, dict)
    # an interference point is right when scored 0: 1 of 3, of the 2 with a score
    assert (noise["interference_accuracy(all)"], noise["interference_accuracy(valid)"]) == (1 / 3, 1 / 2)


def test_an_empty_denominator_gives_none_where_the_release_divides_by_zero() -> None:
    got = hm.aggregate([], [], [], [])
    integrity, accuracy, update, qa = (got[k] for k in ("memory_integrity", "memory_accuracy", "memory_update",
                                                        "question_answering"))
    assert isinstance(integrity, dict) and isinstance(accuracy, dict)
    assert isinstance(update, dict) and isinstance(qa, dict)
    assert integrity["recall(all)"] is None and integrity["weighted_recall(valid)"] is None
    assert integrity["memory_num"] == 0 and accuracy["target_accuracy(all)"] is None
    assert accuracy["interference_accuracy(valid)"] is None and got["memory_extraction_f1"] is None
    assert update["correct_update_memory_ratio(all)"] is None and update["update_memory_num"] == 0
    assert qa["correct_qa_ratio(valid)"] is None and qa["qa_num"] == 0
    types = got["memory_type_accuracy"]
    assert isinstance(types, dict) and set(types) == set(hm.MEMORY_TYPES)
    assert types[EVENT] == {"memory_integrity_acc": None, "memory_update_acc": None, "total_num": 0,
                            "memory_acc": None}
    # every answer unreadable: (all) is 0, (valid) has nothing to divide by
    only_invalid = hm.qa_scores([None, "Unsure"])
    assert only_invalid["correct_qa_ratio(all)"] == 0 and only_invalid["correct_qa_ratio(valid)"] is None


def test_f1_is_target_accuracy_with_recall_and_zero_when_both_are() -> None:
    assert hm.f1(0.5, 0.5) == pytest.approx(0.5) and hm.f1(0.0, 0.0) == 0.0 and hm.f1(None, 0.5) is None


# --- the judge calls and their replies --------------------------------------------------------------------

def test_the_integrity_call_shows_the_extracted_memories_and_the_point_and_reads_its_score() -> None:
    call = hm.integrity_call(["Likes tea", "Lives in Oslo"], "The user lives in Oslo since 2020")
    (message,) = call.messages
    assert message["role"] == "user"
    assert "Likes tea\nLives in Oslo" in message["content"]
    assert "The user lives in Oslo since 2020" in message["content"]
    assert '"score"' in message["content"] and "```json" in message["content"]
    assert call.read(_result(_fenced({"reasoning": "r", "score": "2"}))) == (
        2, _fenced({"reasoning": "r", "score": "2"}), "gpt-4o")
    assert call.read(_result(_fenced({"reasoning": "r", "score": 1})))[0] == 1


@pytest.mark.parametrize(("reply", "score"), [
    ('```json\n{"reasoning": "covered", "score": "2"}\n```', 2),
    ('```json {"score": "0"} ```', 0),
    ('```json\n{"score": 1.0}\n```', 1),  # int(1.0)
    ('```json\n{"score": " 1 "}\n```', 1),  # int() strips
    ('```json\n{"detail": {"a": 1}, "score": "2"}\n```', 2),  # a nested object still reads whole
    ('{"reasoning": "covered", "score": "2"}', None),  # no ```json block: llms.py raises
    ('```\n{"score": "2"}\n```', None),  # a bare fence is no ```json block
    ('```json\n{"score": "2|1|0"}\n```', None),  # the template echoed: int() refuses
    ('```json\n{"score": "2.0"}\n```', None),
    ('```json\n{"reasoning": "no score"}\n```', None),  # int(None)
    ('```json\n{"score": [2]}\n```', None),
    ("```json\n{score: 2}\n```", None),  # not JSON
    ("", None),
])
def test_a_score_is_read_as_the_release_reads_it(reply: str, score: int | None) -> None:
    assert hm.read_score(reply) == score
    assert hm.integrity_call(["m"], "p").read(_result(reply))[0] == score


def test_the_accuracy_call_shows_the_dialogue_gold_and_candidate_and_reads_score_and_inclusion() -> None:
    dialogue = hm.dialogue_text([
        {"timestamp": "2025-01-02 10:00", "role": "user", "content": "I moved to Oslo."},
        {"timestamp": "2025-01-02 10:01", "role": "assistant", "content": "Nice!"},
        {"timestamp": "2025-01-02 10:02", "role": "user", "content": "Yes."}])
    assert dialogue == ("[2025-01-02 10:00]user: I moved to Oslo.\n[2025-01-02 10:01]assistant: Nice!\n\n"
                        "[2025-01-02 10:02]user: Yes.")
    call = hm.accuracy_call(dialogue, ["Lives in Oslo", "Works as a nurse"], "The user lives in Oslo")
    text = call.messages[0]["content"]
    assert dialogue in text and "Lives in Oslo\nWorks as a nurse" in text and "The user lives in Oslo" in text
    assert "Chinese" in text and '"is_included_in_golden_memories"' in text
    reply = _fenced({"accuracy_score": "2", "is_included_in_golden_memories": "true", "reason": "有依据"})
    assert call.read(_result(reply)) == (2, True, reply, "gpt-4o")
    assert call.read(_result(_fenced({"accuracy_score": 1, "is_included_in_golden_memories": "True"})))[:2] == (1, True)
    # a JSON true is not the string the release compares with; a missing field reads "false"
    json_true = _fenced({"accuracy_score": "1", "is_included_in_golden_memories": True})
    assert call.read(_result(json_true))[:2] == (1, False)
    assert call.read(_result(_fenced({"accuracy_score": "0"})))[:2] == (0, False)
    # unreadable: score None and not included, as the release records it
    assert call.read(_result('{"accuracy_score": "2", "is_included_in_golden_memories": "true"}'))[:2] == (None, False)
    assert call.read(_result(_fenced({"accuracy_score": "x", "is_included_in_golden_memories": "true"})))[:2] == (
        None, False)


def test_the_update_call_shows_the_system_memories_the_new_point_and_the_original_and_reads_the_label() -> None:
    call = hm.update_call(["Works at Acme", "Lives in Oslo"], "The user now works at Initech", ["Works at Acme"])
    text = call.messages[0]["content"]
    assert "Works at Acme\nLives in Oslo" in text and "The user now works at Initech" in text
    assert all(label in text for label in hm.UPDATE_LABELS)
    assert call.read(_result(_fenced({"reason": "r", "evaluation_result": "Omission"})))[0] == "Omission"
    assert call.read(_result(_fenced({"reason": "r", "evaluation_result": "Correct "})))[0] == "Correct "  # as given
    assert call.read(_result("Omission"))[0] is None
    assert call.read(_result(_fenced({"evaluation_result": 3})))[0] is None


def test_the_qa_call_shows_question_reference_evidence_and_response_and_reads_the_label() -> None:
    call = hm.qa_call("Where does she live?", "Oslo", ["Lives in Oslo", "Moved in 2020"], "In Bergen")
    text = call.messages[0]["content"]
    assert all(x in text for x in ("Where does she live?", "Oslo", "Lives in Oslo\nMoved in 2020", "In Bergen"))
    assert all(label in text for label in hm.QA_LABELS) and "Other" not in text
    assert call.read(_result(_fenced({"reasoning": "r", "evaluation_result": "Hallucination"}))) == (
        "Hallucination", _fenced({"reasoning": "r", "evaluation_result": "Hallucination"}), "gpt-4o")
    assert call.read(_result("Correct"))[0] is None


def test_what_goes_to_update_and_what_scores_zero_without_a_call() -> None:
    assert hm.goes_to_update("True", ["m"]) and hm.goes_to_update(True, ["m"])
    assert not hm.goes_to_update("True", []) and not hm.goes_to_update("False", ["m"])
    assert hm.nothing_extracted([]) and hm.nothing_extracted([" ", ""]) and not hm.nothing_extracted(["m"])


def test_the_operation_calls_run_once_on_a_model_and_a_refused_reply_is_none_not_an_error() -> None:
    llm = FakeChat(["no json here", _fenced({"score": "1"})])
    assert asyncio.run(hm.integrity_call(["m"], "p").once(llm))[0] is None
    assert asyncio.run(hm.integrity_call(["m"], "p").once(llm))[0] == 1
    assert llm.calls[0]["messages"][0]["content"] == hm.integrity_call(["m"], "p").messages[0]["content"]


# --- judge_answers' halumem judge ---------------------------------------------------------------------------

def _probe(qa_id: str, gold: str | None = "Oslo") -> dict:
    return {"probe_id": f"qa:{qa_id}", "kind": "qa", "category": "Memory Boundary", "session_idx": 3,
            "turn_idx": None, "request": f"[Current date: 2025-01-09]\nQuestion {qa_id}?", "gold": gold,
            "qa_id": qa_id, "evidence": None}


PROBES = [_probe("right"), _probe("made_up"), _probe("missed"), _probe("garbled"), _probe("fails")]
EVIDENCE = {"right": ["Lives in Oslo"], "made_up": ["Lives in Oslo", "Moved in 2020"], "missed": ["Lives in Oslo"],
            "garbled": ["Lives in Oslo"], "fails": ["Lives in Oslo"]}
ANSWERS = {"qa:right": "Oslo.", "qa:made_up": "Bergen, since 2019.", "qa:missed": "I don't remember.",
           "qa:garbled": "Oslo, I think.", "qa:fails": "FAIL"}
VERDICTS = {"Oslo.": "Correct", "Bergen, since 2019.": "Hallucination", "I don't remember.": "Omission"}


def _responder(messages, schema):
    text = messages[0]["content"]
    response = text.split("Memory system's response:\n", 1)[1].split("\n\nANSWER", 1)[0]
    if response == "FAIL":
        return LLMError("server error", None)
    if response not in VERDICTS:
        return "I would call it Correct."  # no ```json block: unreadable
    return _fenced({"reasoning": "compared with the key points", "evaluation_result": VERDICTS[response]})


def _judge(llm: FakeChat, dataset: str = "halumem", runs: int = 1) -> list[dict]:
    return judge_episode(llm, "halumem", dataset, PROBES, ANSWERS, EVIDENCE, model="gpt-4o", runs=runs,
                         temperature=0.7)


def test_the_halumem_judge_scores_correct_one_and_hallucination_and_omission_zero_keeping_the_label() -> None:
    llm = FakeChat(responder=_responder)
    rows = {r["probe_id"]: r for r in _judge(llm)}
    right, made_up, missed = rows["qa:right"], rows["qa:made_up"], rows["qa:missed"]
    assert (right["score"], made_up["score"], missed["score"]) == (1.0, 0.0, 0.0)
    assert (right["accepted"], made_up["accepted"]) == (True, False)
    assert [hm.row_label(r["reason"]) for r in (right, made_up, missed)] == ["Correct", "Hallucination", "Omission"]
    assert json.loads(made_up["reason"])["reply"].startswith("Here is my verdict.")
    assert right["judge_prompt"] == hm.QA_JUDGE_PROMPT and right["reference_source"] == "gold"
    assert right["judge_kind"] == "halumem" and right["skipped"] is None and right["error"] is None
    # the bare question (no date line), the reference, the evidence contents and the response are shown
    shown = next(c for c in llm.calls if "Bergen, since 2019." in c["messages"][0]["content"])
    text = shown["messages"][0]["content"]
    assert "Question made_up?" in text and "[Current date" not in text
    assert "Reference answer:\nOslo" in text and "Lives in Oslo\nMoved in 2020" in text
    assert all(c["params"] == hm.HALUMEM_SAMPLING for c in llm.calls)  # temperature 0, as the release runs


def test_an_unreadable_reply_scores_zero_with_no_label_and_a_failed_call_fails_the_row() -> None:
    rows = {r["probe_id"]: r for r in _judge(FakeChat(responder=_responder))}
    garbled = rows["qa:garbled"]
    assert garbled["score"] == 0.0 and garbled["error"] is None and hm.row_label(garbled["reason"]) is None
    assert json.loads(garbled["reason"])["reply"] == "I would call it Correct."
    failed = rows["qa:fails"]
    assert failed["score"] is None and failed["error"] is not None


def test_the_three_qa_ratios_come_from_the_judge_rows() -> None:
    rows = _judge(FakeChat(responder=_responder))
    got = hm.qa_ratios(rows)
    # labels Correct, Hallucination, Omission, unreadable, failed (the release's invalid): 5 in all, 3 valid
    assert got == hm.qa_scores(["Correct", "Hallucination", "Omission", None, None])
    assert (got["correct_qa_ratio(all)"], got["correct_qa_ratio(valid)"]) == (1 / 5, 1 / 3)
    assert (got["qa_num"], got["qa_valid_num"]) == (5, 3)
    summary = answer_summary(pl.from_arrow(pa.Table.from_pylist(rows, ANSWER_JUDGMENTS)))
    by = summary.filter((pl.col("dataset") == "halumem") & (pl.col("judge") == "halumem")).to_dicts()
    # the answer summary's mean over judged rows is the correct ratio over the rows that did not fail
    assert by and by[0]["score"] == pytest.approx(1 / 4)


def test_other_datasets_are_skipped_without_a_call_and_runs_repeat_the_judgment() -> None:
    llm = FakeChat(responder=_responder)
    assert {r["skipped"] for r in _judge(llm, dataset="locomo")} == {hm.SKIP_OTHER_DATASET}
    assert not llm.calls
    right = [r for r in _judge(FakeChat(responder=_responder), runs=2) if r["probe_id"] == "qa:right"]
    assert [r["run"] for r in right] == [0, 1] and all(r["score"] == 1.0 for r in right)
    assert hm.qa_ratios([{**r, "skipped": hm.SKIP_OTHER_DATASET} for r in right])["qa_num"] == 0


def test_the_judge_is_a_panel_prompt_and_the_report_names_its_scorer() -> None:
    assert PanelJudge(name="halumem", prompt="halumem").prompt == "halumem"
    cfg = SimpleNamespace(judge_answers=SimpleNamespace(runs=1))
    named = scorer(cfg, SimpleNamespace(table="answer_summary", column="score", where={"judge": "halumem"}))
    assert named is not None and "HaluMem's scorer" in named
