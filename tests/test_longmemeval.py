"""LongMemEval: the loader (one episode per question, has_answer turns as evidence, abstention flagged,
asked at question_date, strict errors), its yes/no judge as evaluate_qa.py runs it (a prompt per
question type with that type's elements only, the bare question, "yes" in the reply or a wrong answer),
and the pipeline on the fixture, judged by the fake server, reported per question type."""

from __future__ import annotations

import asyncio
import copy
import json
import re
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import run_shipped_config_offline
from pipeline.testing.fake_chat import FakeChat

from pipeline.artifacts import StageDir
from pipeline.corpus import load_corpus
from pipeline.corpus.longmemeval import parse_date
from pipeline.errors import InputError
from pipeline.engine.runner import Runner
from pipeline.engine.stage import StageContext
from stages import registry
from stages.judging import longmemeval as lme
from stages.judging.judge_answers import JudgeAnswersSettings, JudgeAnswersStage
from stages.probes import qa_probes

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "corpora" / "longmemeval" / "longmemeval_mini.json"
RECORDS = json.loads(FIXTURE.read_text())
TYPES = {"single-session-user", "single-session-assistant", "single-session-preference", "multi-session",
         "temporal-reasoning", "knowledge-update"}


def _write(tmp_path: Path, records: list) -> Path:
    p = tmp_path / "lme.json"
    p.write_text(json.dumps(records))
    return p


# --- the loader -------------------------------------------------------------------------------------

def test_each_question_is_an_episode_of_its_haystack_sessions_dated_by_haystack_dates():
    corpus = load_corpus("longmemeval", FIXTURE)
    assert [e["episode_id"] for e in corpus.episodes] == [f"longmemeval-{r['question_id']}" for r in RECORDS]
    assert all(e["speakers"] == ["user", "assistant"] and e["dataset"] == "longmemeval" for e in corpus.episodes)
    tr = [t for t in corpus.turns if t["episode_id"] == "longmemeval-tr_0003"]
    assert [(t["session_idx"], t["turn_idx"], t["speaker"]) for t in tr] == \
        [(s, i, sp) for s in (1, 2, 3) for i, sp in enumerate(["user", "assistant"])]
    assert sorted({t["session_time"] for t in tr}) == [datetime(2023, 4, 3, 8, 15), datetime(2023, 4, 6, 19, 45),
                                                        datetime(2023, 4, 10, 17, 30)]
    # A turn's source id is its haystack session id and its number in the session.
    assert [t["source_turn_id"] for t in tr][:2] == ["answer_tr_0003_1:1", "answer_tr_0003_1:2"]
    assert {e["episode_id"]: e["n_sessions"] for e in corpus.episodes}["longmemeval-tr_0003"] == 3


def test_the_question_is_asked_at_question_date_with_its_type_and_user_side_has_answer_turns_as_evidence():
    qa = {q["qa_id"]: q for q in load_corpus("longmemeval", FIXTURE).qa}
    assert {q["category"] for q in qa.values()} == TYPES
    tr = qa["tr_0003"]
    assert tr["asked_at"] == datetime(2023, 4, 30, 12, 0) and tr["abstention"] is False
    assert tr["evidence"] == ["answer_tr_0003_1:1", "answer_tr_0003_2:1"]
    assert tr["evidence_sessions"] == ["answer_tr_0003_1", "answer_tr_0003_2"]
    # An assistant turn holds that answer: no user-side evidence, as LongMemEval's retrieval metric counts it.
    assert qa["ssa_0002"]["evidence"] is None and qa["ssa_0002"]["evidence_sessions"] == ["answer_ssa_0002"]
    abstain = qa["ms_0006_abs"]
    assert abstain["abstention"] is True and abstain["category"] == "multi-session"
    assert abstain["evidence"] is None and abstain["answer"].startswith("The information provided is not enough")
    assert sum(q["abstention"] for q in qa.values()) == 1


def test_the_probe_carries_the_question_date_and_the_abstention_flag():
    corpus = load_corpus("longmemeval", FIXTURE)
    episode = next(e for e in corpus.episodes if e["episode_id"] == "longmemeval-ms_0006_abs")
    [probe] = qa_probes(episode, [q for q in corpus.qa if q["episode_id"] == episode["episode_id"]])
    assert probe["request"] == "[Current date: 2023/12/01 (Fri) 10:00] How many concerts did I go to with my sister?"
    assert probe["abstention"] is True and probe["respondent"] == "assistant" and probe["session_idx"] == 3


def test_longmemeval_dates_parse_and_iso_too():
    assert parse_date("2023/05/20 (Sat) 02:21") == datetime(2023, 5, 20, 2, 21)
    assert parse_date("2023-05-20T02:21:00") == datetime(2023, 5, 20, 2, 21)
    with pytest.raises(ValueError):
        parse_date("20 May")


@pytest.mark.parametrize("mutate, record, field, words", [
    (lambda r: r[2]["haystack_sessions"][1][0].update(role="narrator"), "longmemeval-tr_0003 (item 2)",
     "haystack_sessions[1][0].role", "not one of"),
    (lambda r: r[0]["haystack_dates"].__setitem__(1, "yesterday"), "longmemeval-ssu_0001 (item 0)",
     "haystack_dates[1]", "unrecognised date"),
    (lambda r: r[3]["haystack_dates"].pop(), "longmemeval-ku_0004 (item 3)", "haystack_dates",
     "1 entries for 2 haystack sessions"),
    (lambda r: r[1].update(question_type="open-domain"), "longmemeval-ssa_0002 (item 1)", "question_type",
     "unknown question type"),
    (lambda r: r[4]["haystack_sessions"][0][0].update(has_answer="yes"), "longmemeval-ssp_0005 (item 4)",
     "haystack_sessions[0][0].has_answer", "expected a boolean"),
    (lambda r: r[5]["haystack_session_ids"].__setitem__(1, "sharegpt_c3_0"), "longmemeval-ms_0006_abs (item 5)",
     "haystack_session_ids[1]", "given twice"),
    (lambda r: r[0].pop("answer"), "longmemeval-ssu_0001 (item 0)", "answer", "missing"),
    (lambda r: r[4].pop("question_id"), "item 4", "question_id", "missing"),
])
def test_a_malformed_record_names_file_record_and_field(tmp_path, mutate, record, field, words):
    records = copy.deepcopy(RECORDS)
    mutate(records)
    path = _write(tmp_path, records)
    with pytest.raises(InputError) as caught:
        load_corpus("longmemeval", path)
    err = caught.value
    assert (err.file, err.record, err.field) == (str(path), record, field), str(err)
    assert words in err.message and str(err).startswith(f"file {path}, record {record}, field '{field}'")


def test_an_empty_haystack_session_is_skipped_and_the_others_keep_their_ids(tmp_path):
    records = copy.deepcopy(RECORDS[2:3])
    records[0]["haystack_sessions"][1] = []
    corpus = load_corpus("longmemeval", _write(tmp_path, records))
    assert corpus.episodes[0]["n_sessions"] == 2
    assert corpus.qa[0]["evidence"] == ["answer_tr_0003_1:1", "answer_tr_0003_2:1"]


# --- the judge ----------------------------------------------------------------------------------------

def test_each_question_type_gets_its_own_prompt_and_abstention_comes_first():
    assert lme.prompt_kind("temporal-reasoning", False) == "temporal"
    assert lme.prompt_kind("knowledge-update", False) == "knowledge_update"
    assert lme.prompt_kind("single-session-preference", False) == "preference"
    for other in ("single-session-user", "single-session-assistant", "multi-session", "single-hop", None):
        assert lme.prompt_kind(other, False) == "standard"
    assert lme.prompt_kind("temporal-reasoning", True) == "abstention"


def test_the_prompts_say_what_each_type_forgives():
    s = lme.SYSTEMS
    assert "off-by-one" in s["temporal"] and "off-by-one" not in s["standard"]
    assert "older information" in s["knowledge_update"] and "updated answer" in s["knowledge_update"]
    assert all(w in s["preference"] for w in ("rubric", "every point", "personal information"))
    assert "cannot be answered" in s["abstention"] and "missing or" in s["abstention"]
    assert "intermediate steps" in s["standard"] and "only part" in s["standard"]
    assert all(v.endswith("Your whole reply is one word: yes or no.") for v in s.values())
    user = lme.build_messages("preference", "Suggest a hobby?", "likes climbing", "Try bouldering")[1]["content"]
    assert "Question: Suggest a hobby?\nRubric: likes climbing\nModel response: Try bouldering\n\n" in user
    assert user.endswith("Does the response count as correct? Give one word, yes or no.")
    abstain = lme.build_messages("abstention", "q", "not said", "r")[1]["content"]
    assert "Explanation: not said" in abstain and "cannot be answered?" in abstain


def test_the_knowledge_update_prompt_has_only_the_official_elements():
    """evaluate_qa.py's knowledge-update prompt: contains the answer -> yes; older information beside
    the updated answer is fine. It has no equivalence or partial-answer clause, unlike the standard one."""
    ku, standard = lme.SYSTEMS["knowledge_update"], lme.SYSTEMS["standard"]
    assert "can be found in the response" in ku and "older information next to an updated answer" in ku
    assert "means the same" in standard and "means the same" not in ku
    assert "only part" in standard and "only part" not in ku and "intermediate" not in ku


def test_no_prompt_repeats_the_sentences_flagged_as_copied_from_evaluate_qa():
    flagged = ["is the model response correct", "answer yes or no only", "if the response contains the correct answer",
               "equivalent to the correct answer, or"]
    texts = [*lme.SYSTEMS.values(), *lme.ASKS.values(), lme.build_messages("standard", "q", "a", "r")[1]["content"]]
    assert not [(f, t) for f in flagged for t in texts if f in t.lower()]


def test_the_verdict_is_yes_when_yes_appears_in_the_reply_and_anything_else_scores_zero_with_the_reply_kept():
    assert lme.parse_verdict("Yes.") is True and lme.parse_verdict("no, it says 18") is False
    assert lme.parse_verdict("The answer is correct: yes") is True
    assert lme.parse_verdict("Yesterday") is True  # evaluate_qa.py's `'yes' in reply.lower()`, kept as is
    assert not any(lme.parse_verdict(reply) for reply in ("Correct.", "", None))
    wrong = asyncio.run(lme.judge(FakeChat(["Correct."]), "standard", "q", "a", "r"))
    assert wrong == (0.0, "standard", "Correct.", "fake")
    assert asyncio.run(lme.judge(FakeChat(["yes"]), "temporal", "q", "a", "r")) == (1.0, "temporal", "yes", "fake")


def test_the_judge_is_shown_the_bare_question_and_a_reply_without_a_verdict_is_a_wrong_answer_not_a_failure():
    corpus = load_corpus("longmemeval", FIXTURE)
    episode = next(e for e in corpus.episodes if e["episode_id"] == "longmemeval-tr_0003")
    qa = [q for q in corpus.qa if q["episode_id"] == episode["episode_id"]]
    probes = qa_probes(episode, qa)
    assert probes[0]["request"].startswith("[Current date: 2023/04/30 (Sun) 12:00] ")
    turns = [t for t in corpus.turns if t["episode_id"] == episode["episode_id"]]
    inputs = {"ingest.episodes": [episode], "ingest.turns": turns, "ingest.qa": qa, "probes.probes": probes,
              "respond_zero_history.responses": [{"probe_id": probes[0]["probe_id"], "response": "18 days",
                                                  "error": None, "details_json": None}]}
    stage = JudgeAnswersStage(("zero_history",))
    llm = FakeChat(["The response matches."])
    llm.cfg = SimpleNamespace(model="judge-model")  # type: ignore[attr-defined]
    settings = JudgeAnswersSettings(score_0_100=False, correctness=["longmemeval"])
    ctx = StageContext(cfg=SimpleNamespace(judge_answers=settings, corpus=SimpleNamespace(answer_key="original")),
                       stage=stage, out_dir=None,  # type: ignore[arg-type]
                       clients={"judge": llm})
    [row] = asyncio.run(stage.process_episode(ctx, episode["episode_id"], inputs))["answer_judgments"]
    user = llm.calls[0]["messages"][1]["content"]
    assert user.startswith(f"Question: {qa[0]['question']}\n") and "Current date" not in user
    assert (row["score"], row["reason"], row["error"], row["skipped"], row["judge_prompt"]) == \
        (0.0, "The response matches.", None, None, "temporal")


# --- the pipeline on the fixture, judged by the fake server ----------------------------------------

ABSTAINS = "I can't tell: that was not mentioned in our conversations."
KIND_OF_SYSTEM = {text: kind for kind, text in lme.SYSTEMS.items()}


def _responder(body: dict) -> str | None:
    """A judge that reads the prompt: the abstention prompt says yes to a declined answer; the others
    say yes only when the reference appears in the response. Every method declines."""
    messages = body["messages"]
    kind = KIND_OF_SYSTEM.get(messages[0]["content"]) if messages[0]["role"] == "system" else None
    if kind is None:
        return None if "response_format" in body else ABSTAINS
    user = messages[1]["content"]
    reference = re.search(r"\n(?:Correct answer|Rubric|Explanation): (.*)\n", user)[1]
    response = user.split("Model response: ", 1)[1]
    if kind == "abstention":
        return "Yes" if "not mentioned" in response else "No"
    return "yes" if reference.lower() in response.lower() else "no"


@pytest.mark.heavy(seconds=4)
def test_the_pipeline_judges_each_type_with_its_prompt_and_reports_accuracy_per_type(run_cfg, fake_llm):
    cfg = run_cfg("corpus.format=longmemeval", f"corpus.path={FIXTURE}", "corpus.limit=null",
                  "methods=[zero_history,turn]", "compress.method=none", "compress.granularities=[turn,session]",
                  "banks.granularities=[turn,session]", "score.retrievers=[bm25]", "score.answer_retrieval=true", "probes.next_response=false",
                  "probes.max_qa_per_episode=null", "judge_answers.score_0_100=false",
                  "judge_answers.correctness=[longmemeval]", "judge_pairwise.enabled=false",
                  "judge_memory.enabled=false", "response_metrics.bertscore=false")
    fake_llm.responder = _responder
    out = Runner(cfg, registry(cfg)).run()
    assert set(out.values()) == {"ran"}
    run = cfg.run_dir
    for stage in out:
        assert StageDir(run, stage).manifest().errors == 0, stage  # no failed row anywhere

    # No segment units and no gold boundaries: the segmenter is never called.
    assert StageDir(run, "segment").manifest().tables["segments"] == 0

    rows = StageDir(run, "judge_answers").read_table("answer_judgments").to_pylist()
    assert len(rows) == len(RECORDS) * 2 and {r["judge"] for r in rows} == {"longmemeval"}
    by_qa = {(r["probe_id"], r["method"]): r for r in rows}
    expected = {"ssu_0001": "standard", "ssa_0002": "standard", "tr_0003": "temporal",
                "ku_0004": "knowledge_update", "ssp_0005": "preference", "ms_0006_abs": "abstention"}
    for qid, kind in expected.items():
        for method in ("zero_history", "turn"):
            row = by_qa[(f"qa:{qid}", method)]
            assert row["judge_prompt"] == kind and row["error"] is None and row["skipped"] is None
            # Every method declines: right only for the abstention question.
            assert row["score"] == (1.0 if kind == "abstention" else 0.0), (qid, method, row)
            assert row["abstention"] is (kind == "abstention")
    # The server saw each question under the prompt of its type, with the question date.
    judged = [r["body"]["messages"] for r in fake_llm.requests
              if r["path"] == "/v1/chat/completions" and r["body"]["messages"][0]["content"] in KIND_OF_SYSTEM]
    seen = {(KIND_OF_SYSTEM[m[0]["content"]], m[1]["content"].split("\n")[0]) for m in judged}
    temporal = "Question: How many days passed between my dentist appointment and my haircut?"  # no date line
    assert ("temporal", temporal) in seen
    assert {k for k, _ in seen} == set(expected.values())

    summary = StageDir(run, "report").read_table("answer_summary").to_pylist()
    per_type = {(r["category"], r["method"]): r for r in summary if r["dataset"] == "longmemeval"}
    for category in TYPES | {"abstention"}:
        for method in ("zero_history", "turn"):
            r = per_type[(category, method)]
            assert r["judged"] == 1 and r["failed"] == 0
            # The one multi-session question is the abstention question.
            assert r["score"] == (1.0 if category in ("abstention", "multi-session") else 0.0), (category, method)
    overall = per_type[(None, "zero_history")]
    assert overall["judged"] == len(RECORDS) and overall["correct"] == 1

    # Evidence recall runs on the user-side has_answer turns (the abstention question and the
    # single-session-assistant one have none to score).
    scores = StageDir(run, "score").read_table("retrieval_scores").to_pylist()
    assert {r["qa_id"] for r in scores} == set(expected) - {"ms_0006_abs", "ssa_0002"}
    assert all(0.0 <= r["recall"] <= 1.0 for r in scores)
    # What each method's answer read, against the same evidence: the rounds `turn` put in its context
    # (its memory_ids); zero_history reads nothing, so it has no row.
    answered = StageDir(run, "score").read_table("answer_retrieval_scores").to_pylist()
    assert {(r["method"], r["qa_id"]) for r in answered} == {("turn", q) for q in set(expected) - {"ms_0006_abs", "ssa_0002"}}
    assert {r["k"] for r in answered} == set(cfg.score.retrieval_k)
    assert all(0.0 <= r["session_recall_any"] <= 1.0 and 0 < r["context_units"] <= 10 for r in answered)


# --- LongMemEval_M: configs/longmemeval_m.yaml on a haystack of many sessions ------------------------

M_SESSIONS = 60  # sessions a question (LongMemEval_M has ~500; the layout is the same)


def _many_sessions(records: list[dict], n: int) -> list[dict]:
    """The fixture's records, each haystack padded to `n` sessions with the other records' sessions,
    their `has_answer` marks dropped, dated before any question and given ids of their own."""
    pool = [[{k: v for k, v in turn.items() if k != "has_answer"} for turn in s]
            for r in records for s in r["haystack_sessions"]]
    out = []
    for r in records:
        r = copy.deepcopy(r)
        extra = n - len(r["haystack_sessions"])
        start = datetime(2023, 1, 1, 9, 0)
        r["haystack_sessions"] = [copy.deepcopy(pool[i % len(pool)]) for i in range(extra)] + r["haystack_sessions"]
        r["haystack_session_ids"] = [f"filler_{r['question_id']}_{i}" for i in range(extra)] + r["haystack_session_ids"]
        r["haystack_dates"] = [(start + timedelta(hours=6 * i)).strftime("%Y/%m/%d (%a) %H:%M")
                               for i in range(extra)] + r["haystack_dates"]
        out.append(r)
    return out


@pytest.mark.heavy(seconds=6)
def test_the_longmemeval_m_config_runs_offline_on_a_haystack_of_many_sessions(tmp_path, fake_llm, models_cache,
                                                                              monkeypatch):
    path = tmp_path / "longmemeval_m_cleaned.json"
    path.write_text(json.dumps(_many_sessions(RECORDS, M_SESSIONS)))
    cfg = run_shipped_config_offline("longmemeval_m", [f"corpus.path={path}"], tmp_path, fake_llm, models_cache,
                                     monkeypatch, _responder)
    assert cfg.corpus.limit == 5  # the default slice: the first five questions
    episodes = StageDir(cfg.run_dir, "ingest").read_table("episodes").to_pylist()
    turns = StageDir(cfg.run_dir, "ingest").read_table("turns").to_pylist()
    assert len(episodes) == 5 and len({(t["episode_id"], t["session_idx"]) for t in turns}) == 5 * M_SESSIONS
    judged = StageDir(cfg.run_dir, "judge_answers").read_table("answer_judgments").to_pylist()
    assert {r["method"] for r in judged} == set(cfg.methods) and len(judged) == 5 * len(cfg.methods)
    # Each retrieval method's answers are scored on what they read; the padding holds no evidence.
    answered = StageDir(cfg.run_dir, "score").read_table("answer_retrieval_scores").to_pylist()
    assert {r["method"] for r in answered} >= {"turn", "session"}
    assert all(r["context_units"] <= (10 if r["method"] == "turn" else 5) for r in answered
               if r["method"] in ("turn", "session"))
