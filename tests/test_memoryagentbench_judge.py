"""MemoryAgentBench's judges (`correctness: [memoryagentbench]`, stages/judging/memoryagentbench.py): its
LongMemEval subset judged yes / no by LongMemEval's prompt for the question's type, as
longmem_qa_evaluate.py; its InfBench summaries judged by HELMET's three calls (fluency, key-point recall,
sentence precision) read as summarization_evaluate.py's parse_json reads them and combined into a
fluency-scaled F1; every other task left to the match scorers (rows with `skipped`). The reading cases
follow parse_json's regular expressions and the F1 cases its arithmetic (HUST-AI-HYZ/MemoryAgentBench,
llm_based_eval/summarization_evaluate.py at 455306d)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import polars as pl
import pyarrow as pa
import pytest
from judge_kit import judge_episode
from pipeline.testing.fake_chat import FakeChat

from pipeline.llm.types import LLMError
from stages.judging import longmemeval
from stages.judging import memoryagentbench as mab
from stages.judging.judge_answers import ANSWER_JUDGMENTS
from stages.judging.panel import PanelJudge
from stages.report.scorers import scorer
from stages.report.tables import answer_summary

LME = "Accurate_Retrieval/longmemeval_s*"
SUM = "Long_Range_Understanding/infbench_sum_eng_shots2"
EVENT = "Accurate_Retrieval/eventqa_full"


# --- the prompts ------------------------------------------------------------------------------------

def test_the_fluency_prompt_scores_0_or_1_and_shows_the_stripped_text_alone() -> None:
    system, user = mab.build_messages("fluency", "  Anna leaves the farm.  ", ["kp"], "EXPERT")
    s = system["content"]
    for words in ("repeats itself", "even in other words", "incomplete", "gibberish", "- 0:", "- 1:",
                  "last sentence is cut off", "grammatical", '{"fluency": 1}'):
        assert words in s, words
    assert 'Text: "Anna leaves the farm."' in user["content"]
    assert "kp" not in user["content"] and "EXPERT" not in user["content"]


def test_the_recall_prompt_numbers_the_key_points_and_asks_for_the_supported_ones_after_reasoning() -> None:
    system, user = mab.build_messages("recall", "A summary.", ["Anna grows up.", "Anna trains."], "EXPERT")
    s = system["content"]
    for words in ("plot and the characters", "mostly supports", "most of those facts", "number of key points present",
                  "step by step first", '"supported_key_points"', '"recall"'):
        assert words in s, words
    assert "Key points:\n1. Anna grows up.\n2. Anna trains." in user["content"]
    assert 'Summary: "A summary."' in user["content"] and "EXPERT" not in user["content"]


def test_the_precision_prompt_checks_each_sentence_against_the_expert_summary() -> None:
    system, user = mab.build_messages("precision", "Mine. ", ["kp"], "Theirs.")
    s = system["content"]
    for words in ("sentence by sentence", "main facts agree", "dates, names or places", "contradicted",
                  "analysis of or commentary", "step by step first", '"precision"', '"sentence_count"'):
        assert words in s, words
    assert 'Expert summary: "Theirs."' in user["content"] and 'Model\'s summary: "Mine."' in user["content"]
    assert "kp" not in user["content"]


def test_the_longmemeval_subset_reuses_longmemeval_s_prompts_per_type_and_abstention() -> None:
    assert mab.question_type(["temporal-reasoning"]) == "temporal-reasoning"
    assert mab.question_type(None) is None and mab.question_type(["a", "b"]) is None
    assert longmemeval.prompt_kind(mab.question_type(["knowledge-update"]), False) == "knowledge_update"
    assert longmemeval.prompt_kind(mab.question_type(["multi-session"]), True) == "abstention"
    assert mab.PROMPTS.keys().isdisjoint(longmemeval.PROMPTS)


@pytest.mark.parametrize(("dataset", "category", "task"), [
    ("memoryagentbench", LME, mab.LONGMEMEVAL_TASK), ("memoryagentbench", SUM, mab.SUMMARY_TASK),
    ("memoryagentbench", EVENT, None), ("memoryagentbench", "Long_Range_Understanding/infbench_qa_eng", None),
    ("longmemeval", LME, None), ("memoryagentbench", None, None),
])
def test_only_the_longmemeval_and_infbench_summary_tasks_are_judged(dataset, category, task) -> None:
    assert mab.judged_task(dataset, category) == task


# --- reading the replies ----------------------------------------------------------------------------

@pytest.mark.parametrize(("reply", "parsed"), [
    ('Reasoning... {"fluency": 1}', {"fluency": 1}),
    ('first {"recall": 1} then {"supported_key_points": [1, 3], "recall": 2}',
     {"supported_key_points": [1, 3], "recall": 2}),
    # the last span is not JSON: the last ```json block is read instead
    ('```json\n{"precision": 2, "sentence_count": 5}\n```\nso {precision: 2}', {"precision": 2, "sentence_count": 5}),
    ("no braces at all, ```json\n{}\n``` aside", {}),
    ("{not json} and no fence", None),
    ("plain text", None),
    (None, None),
    # nested braces: the shortest span from the first brace is not JSON, and there is no fence
    ('{"scores": {"recall": 2}}', None),
])
def test_a_reply_is_read_as_parse_json_reads_it(reply, parsed) -> None:
    assert mab.parse_json(reply) == parsed


def test_a_reply_without_the_score_it_asks_for_is_unreadable() -> None:
    assert mab.read_scores("precision", '{"precision": 3, "sentence_count": 6}') == {"precision": 3.0,
                                                                                    "sentence_count": 6.0}
    assert mab.read_scores("precision", '{"precision": 3}') is None
    assert mab.read_scores("recall", '{"recall": "2"}') is None
    assert mab.read_scores("fluency", "fluent, I'd say 1") is None


# --- the F1 -----------------------------------------------------------------------------------------

def test_recall_precision_and_fluency_make_the_f1_as_the_script_combines_them() -> None:
    s = mab.summary_f1(fluency=1, recall_found=2, keypoints=4, precision_found=3, sentence_count=4)
    assert (s.recall, s.precision) == (0.5, 0.75) and s.f1 == pytest.approx(2 * 0.5 * 0.75 / 1.25)
    assert mab.summary_f1(0, 2, 4, 3, 4).f1 == 0.0  # not fluent: 0 whatever it covers
    assert mab.summary_f1(1, 0, 4, 0, 4).f1 == 0.0  # recall and precision both 0
    no_points = mab.summary_f1(1, 3, 0, 2, 4)
    assert no_points.recall == 0.0 and no_points.f1 == 0.0  # no key points: recall 0, so F1 0
    assert mab.summary_f1(1, 2, 4, 5, 0).precision == 0.0  # no sentence counted: precision 0


# --- judge_answers over MemoryAgentBench probes -----------------------------------------------------

KINDS = ({text: part for part, text in mab.SYSTEMS.items()}
         | {text: f"lme.{k}" for k, text in longmemeval.SYSTEMS.items()})
REPLIES = {"fluency": 'It reads well. {"fluency": 1}',
           "recall": 'Points 1 and 2 are there. {"supported_key_points": [1, 2], "recall": 2}',
           "precision": 'Three of four hold. {"precision": 3, "sentence_count": 4}'}


def _responder(messages, schema):
    kind = KINDS[messages[0]["content"]]
    if kind.startswith("lme."):
        return "Yes." if "sourdough" in messages[1]["content"] else "no"
    if "UNREADABLE" in messages[1]["content"] and kind == "precision":
        return "Most sentences hold."
    if "CALL FAILS" in messages[1]["content"] and kind == "recall":
        return LLMError("server error", None)
    return REPLIES[kind]


def _probe(qa_id: str, category: str, gold: str, **extra) -> dict:
    return {"probe_id": f"qa:{qa_id}", "kind": "qa", "category": category, "session_idx": 9, "turn_idx": None,
            "request": f"[Current date: 2023/05/30 (Tue) 23:40] Question {qa_id}?", "gold": gold, "qa_id": qa_id,
            "evidence": None, **extra}


PROBES = [
    _probe("t1", LME, "18 days", abstention=False),
    _probe("a1", LME, "The user never said which bakery.", abstention=True),
    _probe("s1", SUM, "Anna grows up on a farm and becomes a nurse."),
    _probe("s2", SUM, "Anna grows up on a farm and becomes a nurse."),
    _probe("s3", SUM, "Anna grows up on a farm and becomes a nurse."),
    _probe("e1", EVENT, "Mr. Hale"),
]
NOTES = {"t1": ["temporal-reasoning"], "a1": ["single-session-user"], "s1": ["kp one", "kp two", "kp three", "kp four"],
         "s2": ["kp one", "kp two"], "s3": ["kp one", "kp two"], "e1": None}
ANSWERS = {"qa:t1": "It took 18 days; sourdough aside.", "qa:a1": "You bought bread at the corner bakery.",
           "qa:s1": "Anna grows up.", "qa:s2": "UNREADABLE summary.", "qa:s3": "CALL FAILS summary.",
           "qa:e1": "Mr. Hale"}


def _judge(llm: FakeChat, dataset: str = "memoryagentbench", runs: int = 1) -> list[dict]:
    return judge_episode(llm, "memoryagentbench", dataset, PROBES, ANSWERS, NOTES, model="gpt-4o", runs=runs,
                         temperature=0)


def test_longmemeval_questions_are_judged_yes_no_by_their_types_prompt_on_the_bare_question() -> None:
    llm = FakeChat(responder=_responder)
    rows = {r["probe_id"]: r for r in _judge(llm)}
    assert (rows["qa:t1"]["score"], rows["qa:t1"]["judge_prompt"], rows["qa:t1"]["reason"]) == (1.0, "temporal", "Yes.")
    assert (rows["qa:a1"]["score"], rows["qa:a1"]["judge_prompt"]) == (0.0, "abstention")
    asked = [c for c in llm.calls if KINDS[c["messages"][0]["content"]].startswith("lme.")]
    assert len(asked) == 2 and all("[Current date" not in c["messages"][1]["content"] for c in asked)
    assert "Question t1?" in asked[0]["messages"][1]["content"] and "18 days" in asked[0]["messages"][1]["content"]
    assert all(c["params"] == {"max_tokens": 10, "temperature": 0} for c in asked)  # the run's judge settings


def test_a_summary_is_judged_by_three_calls_at_the_official_sampling_and_scored_by_their_f1() -> None:
    llm = FakeChat(responder=_responder)
    rows = {r["probe_id"]: r for r in _judge(llm)}
    s1 = rows["qa:s1"]
    # recall 2 of 4 key points, precision 3 of 4 sentences, fluent: F1 = 2 * 0.5 * 0.75 / 1.25 = 0.6
    assert s1["score"] == pytest.approx(0.6) and s1["judge_prompt"] == "summary" and s1["skipped"] is None
    parts = json.loads(s1["reason"])
    assert {k: parts[k] for k in ("fluency", "recall_found", "recall_total", "precision_found", "precision_total",
                                  "recall", "precision")} == {
        "fluency": 1.0, "recall_found": 2.0, "recall_total": 4, "precision_found": 3.0, "precision_total": 4.0,
        "recall": 0.5, "precision": 0.75}
    assert parts["replies"] == REPLIES and s1["error"] is None and s1["accepted"] is True
    mine = [c for c in llm.calls if "Anna grows up." in c["messages"][1]["content"]]
    assert sorted(KINDS[c["messages"][0]["content"]] for c in mine) == ["fluency", "precision", "recall"]
    assert all(c["params"] == dict(mab.SUMMARY_SAMPLING) for c in mine)
    recall_call = next(c for c in mine if KINDS[c["messages"][0]["content"]] == "recall")
    assert "1. kp one\n2. kp two\n3. kp three\n4. kp four" in recall_call["messages"][1]["content"]
    precision_call = next(c for c in mine if KINDS[c["messages"][0]["content"]] == "precision")
    assert "Anna grows up on a farm and becomes a nurse." in precision_call["messages"][1]["content"]


def test_an_unreadable_reply_leaves_the_summary_unscored_but_a_failed_call_fails_the_row() -> None:
    rows = {r["probe_id"]: r for r in _judge(FakeChat(responder=_responder))}
    unreadable = rows["qa:s2"]
    assert unreadable["score"] is None and unreadable["skipped"] == mab.SKIP_UNREADABLE
    assert unreadable["error"] is None
    kept = json.loads(unreadable["reason"])
    assert kept["unreadable"] == ["precision"] and kept["replies"]["precision"] == "Most sentences hold."
    failed = rows["qa:s3"]
    assert failed["score"] is None and failed["error"] is not None and failed["skipped"] is None


def test_other_tasks_and_other_datasets_are_skipped_without_a_call() -> None:
    llm = FakeChat(responder=_responder)
    rows = {r["probe_id"]: r for r in _judge(llm)}
    assert rows["qa:e1"]["skipped"] == mab.SKIP_OTHER_TASK and rows["qa:e1"]["score"] is None
    assert not [c for c in llm.calls if "Mr. Hale" in c["messages"][1]["content"]]
    elsewhere = FakeChat(responder=_responder)
    assert {r["skipped"] for r in _judge(elsewhere, dataset="locomo")} == {mab.SKIP_OTHER_DATASET}
    assert not elsewhere.calls


def test_each_task_scores_its_own_mean_in_answer_summary() -> None:
    rows = _judge(FakeChat(responder=_responder))
    summary = answer_summary(pl.from_arrow(pa.Table.from_pylist(rows, ANSWER_JUDGMENTS)))
    by = {r["category"]: r for r in summary.filter(pl.col("dataset") == "memoryagentbench").to_dicts()}
    lme, summ, event = by[LME], by[SUM], by[EVENT]
    assert (lme["judged"], lme["correct"], lme["score"]) == (2, 1, 0.5)
    # s1 scored 0.6; s2 unreadable (skipped, left out as the script leaves it out); s3's call failed
    assert (summ["items"], summ["judged"], summ["skipped"], summ["failed"]) == (3, 1, 1, 1)
    assert summ["score"] == pytest.approx(0.6) and summ["correct"] is None
    assert (event["judged"], event["skipped"], event["score"]) == (0, 1, None)
    assert mab.SKIP_UNREADABLE in summ["skip_reasons"]


def test_several_runs_average_each_summarys_f1() -> None:
    rows = _judge(FakeChat(responder=_responder), runs=2)
    s1 = [r for r in rows if r["probe_id"] == "qa:s1"]
    assert [r["run"] for r in s1] == [0, 1] and all(r["score"] == pytest.approx(0.6) for r in s1)
    summary = answer_summary(pl.from_arrow(pa.Table.from_pylist(rows, ANSWER_JUDGMENTS)))
    row = summary.filter((pl.col("category") == SUM) & (pl.col("dataset") == "memoryagentbench")).to_dicts()[0]
    assert row["runs"] == 2 and row["score"] == pytest.approx(0.6)


def test_the_judge_is_a_panel_prompt_and_the_report_names_each_tasks_scorer() -> None:
    assert PanelJudge(name="mab", prompt="memoryagentbench").prompt == "memoryagentbench"
    cfg = SimpleNamespace(judge_answers=SimpleNamespace(runs=1))

    def named(category: str | None) -> str | None:
        return scorer(cfg, SimpleNamespace(table="answer_summary", column="score",
                                           where={"judge": "memoryagentbench", "category": category}))

    assert "longmem_qa_evaluate.py" in (named(LME) or "") and "yes/no" in (named(LME) or "")
    assert "summarization_evaluate.py" in (named(SUM) or "") and "F1" in (named(SUM) or "")
    assert "MemoryAgentBench's scorer" in (named(None) or "")
