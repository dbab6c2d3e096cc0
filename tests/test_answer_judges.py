"""The answer judges and their summaries on hand-worked cases: MemoChat's GPT4Score judge (history,
question, response; explanation, then [[rating]]), the history it is shown (the probe's evidence, else
the whole past, the same for every method; Long-MT-Bench+ as released has no evidence), adversarial
questions judged or skipped in every mode, the TeaFarm judge told the false premise, LoCoMo's official
QA protocol (the category-5 choice in a seeded order, mapped back; the date hint; greedy, 32 tokens),
and accuracy with Wilson intervals, bootstrap
intervals of GPT4Score means and the exact McNemar test against the reference method."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from types import SimpleNamespace

from pathlib import Path

import polars as pl
import pytest
from pipeline.testing.fake_chat import FakeChat
from pydantic import ValidationError

from pipeline.corpus import load_corpus

from pipeline.llm.types import LLMError
from pipeline.engine.stage import StageContext
from stages.judging import answers
from stages.judging.judge_answers import SKIP_UNANSWERABLE, JudgeAnswersSettings, JudgeAnswersStage, related_history
from stages.methods.shared import response
from stages.methods.base import MethodContext, ProbeInput
from stages.methods.baselines.history import FullHistory, FullHistorySettings, ZeroHistory, ZeroHistorySettings
from stages.methods.secom.retrieval import RetrievalSettings
from stages.probes import qa_probes
from stages.report.tables import answer_summary, teafarm_summary


def run(coro):
    return asyncio.run(coro)


# --- GPT4Score as MemoChat's judge -------------------------------------------------------------

def test_memochat_judge_is_shown_history_question_and_response_and_asked_to_explain_then_rate():
    msgs = answers.build_memochat_messages("[Session 1]\nAnn: I adopted a dog named Rex.", "What is Ann's dog called?",
                                           "Rex.")
    system, user = msgs[0]["content"], msgs[1]["content"]
    assert "neutral judge" in system and "faithful" in system and "related conversation history" in system
    assert "explanation" in system and "1 to 100" in system and "[[rating]]" in system
    assert system.index("explanation") < system.index("[[rating]]")  # explain first, then rate
    assert "Related conversation history:\n```\n[Session 1]\nAnn: I adopted a dog named Rex.\n```" in user
    assert "User question:\n```\nWhat is Ann's dog called?\n```" in user and "Bot response:\n```\nRex.\n```" in user
    assert "Reference" not in user  # MemoChat's judge has no reference answer


def test_the_judges_keep_their_references_elements_in_our_words():
    """MemoChat's judge opening (flagged as copied) says "neutral, favouring no one" in its own words;
    the lenient judge carries the generous LoCoMo judge's elements (a longer answer on the reference's
    topic, a date written another way or relative to the conversation) without its sentences."""
    system = answers.MEMOCHAT_SYSTEM.lower()
    flagged = ["impartial judge", "is faithful to the content of", "by strictly following this format",
               "begin your evaluation by providing"]
    assert not [f for f in flagged if f in system] and system.startswith("you are a neutral judge, favouring no one.")
    lenient = answers.SYSTEMS["lenient"]
    assert not [f for f in ("touches on the same topic", "be generous with your grading", "time period as the gold")
                if f in lenient.lower()]
    assert "generously" in lenient and "much longer than the reference answer" in lenient
    assert "says nothing against it" in lenient and "same day, month or period" in lenient
    assert "written another way or relative to the conversation" in lenient
    assert "vague, partial or hedged answers are incorrect" in answers.SYSTEMS["strict"]  # strict stays strict


def test_memochat_reply_parses_into_explanation_and_rating():
    parsed = answers.parse_memochat("The response names the dog as in the history, Rex. Rating: [[73]]")
    assert parsed == answers.MemoChatRating(explanation="The response names the dog as in the history, Rex. Rating:",
                                            rating=73)
    assert answers.parse_memochat("x [[ 5 ]] then [[100]]").rating == 5  # the first, as MemoChat's re.search
    with pytest.raises(ValueError):
        answers.parse_memochat("A fine answer, 73/100.")
    with pytest.raises(ValidationError):
        answers.parse_memochat("Off the scale [[0]]")  # MemoChat's scale is 1-100


def test_memochat_judge_returns_rating_and_explanation_and_a_bad_reply_becomes_a_failure_with_raw():
    llm = FakeChat(["Faithful to the history. [[88]]"])
    assert run(answers.judge_memochat(llm, "h", "q", "r")) == (88.0, "Faithful to the history.", "fake")
    assert llm.calls[0]["schema"] is None  # free text: the rating is read from [[...]]
    with pytest.raises(LLMError) as failed:
        run(answers.judge_memochat(FakeChat(["no rating here"]), "h", "q", "r"))
    assert failed.value.raw == "no rating here"


def test_reference_judges_ask_for_the_reason_before_the_verdict():
    assert list(answers.ExplainedScore.model_fields) == ["reason", "score"]
    assert list(answers.ExplainedCorrectness.model_fields) == ["reason", "correct"]
    user = answers.build_messages("gpt4score", "Where?", "Paris", "In Paris")[1]["content"]
    assert user.index('"reason"') < user.index('"score"')
    assert '"reason"' not in answers.build_messages("strict", "Where?", "Paris", "x", explain=False)[1]["content"]


def test_an_unanswerable_question_is_judged_against_not_mentioned():
    user = answers.build_messages("strict", "What colour is Dev's bicycle?", None, "Red")[1]["content"]
    assert "Reference answer: Not mentioned in the conversation" in user


def test_the_teafarm_judge_is_told_the_false_premise_when_the_probe_has_one():
    told = answers.build_messages("teafarm", "How was Japan?", "B has never been to Japan", "It was great",
                                  false_premise="that B has been to Japan")[1]["content"]
    assert "The question wrongly assumes: that B has been to Japan\nCorrect answer: B has never been to Japan" in told
    assert "wrongly assumes" not in answers.build_messages("teafarm", "q", "a", "r")[1]["content"]


# --- the history MemoChat's judge sees -------------------------------------------------------------

T0 = dt.datetime(2023, 5, 8, 13, 56)
TURNS = [
    {"session_idx": s, "turn_idx": i, "speaker": "Priya" if i % 2 == 0 else "Dev", "text": f"s{s} t{i}",
     "session_time": T0 if s == 1 else None, "source_turn_id": f"D{s}:{i + 1}"}
    for s in (1, 2) for i in range(4)
]


def test_memochat_history_is_the_probes_evidence_turns_else_the_whole_past_never_a_methods_context():
    probe = {"session_idx": 3, "turn_idx": None, "evidence": ["D1:2; D2:4", "D1:4"]}
    text, source = related_history(probe, TURNS)
    assert source == "evidence"
    assert text == f"[Session 1, {T0}]\nDev: s1 t1\n...\nDev: s1 t3\n\n[Session 2]\nDev: s2 t3"

    # No evidence, or evidence the corpus does not hold: every turn before the probe.
    whole = f"[Session 1, {T0}]\n" + "\n".join(
        f"{'Priya' if i % 2 == 0 else 'Dev'}: s1 t{i}" for i in range(4)) + "\n\n[Session 2]\n" + "\n".join(
        f"{'Priya' if i % 2 == 0 else 'Dev'}: s2 t{i}" for i in range(4))
    assert related_history({**probe, "evidence": []}, TURNS) == (whole, "full_past")
    assert related_history({**probe, "evidence": ["D9:9"]}, TURNS) == (whole, "full_past")
    # A next-response probe in session 2, turn 2: only the turns before it.
    text, _ = related_history({"session_idx": 2, "turn_idx": 2, "evidence": None}, TURNS)
    assert text.endswith("[Session 2]\nPriya: s2 t0\nDev: s2 t1") and "s2 t2" not in text


# --- the stage: adversarial questions, skipped rows, MemoChat rows -------------------------------------

PROBES = [
    {"probe_id": "qa:q1", "kind": "qa", "category": "single-hop", "session_idx": 3, "turn_idx": None,
     "request": "What did Dev bake?", "gold": "sourdough", "evidence": ["D2:2"]},
    {"probe_id": "qa:q2", "kind": "qa", "category": "adversarial", "session_idx": 3, "turn_idx": None,
     "request": "What colour is Dev's bicycle?", "gold": None, "evidence": ["D1:1"]},
]


def _judge_stage_rows(settings: JudgeAnswersSettings, llm: FakeChat, probes: list[dict] = PROBES,
                      contexts: dict[str, list] | None = None, turns: list[dict] = TURNS) -> list[dict]:
    """judge_answers over `probes` answered by each method of `contexts` (method -> the context spans its
    responses record; full_history with none by default)."""
    contexts = contexts or {"full_history": []}
    inputs = {"ingest.episodes": [{"episode_id": "e1", "dataset": "locomo"}], "ingest.turns": turns,
              "probes.probes": probes}
    for method, spans in contexts.items():
        inputs[f"respond_{method}.responses"] = [
            {"probe_id": p["probe_id"], "response": "sourdough" if p["probe_id"] == "qa:q1" else "red",
             "error": None, "details_json": json.dumps({"context_spans": spans})} for p in probes]
    stage = JudgeAnswersStage(tuple(contexts))
    llm.cfg = SimpleNamespace(model="judge-model")  # type: ignore[attr-defined]
    ctx = StageContext(cfg=SimpleNamespace(judge_answers=settings, corpus=SimpleNamespace(answer_key="original")),
                       stage=stage, out_dir=None,  # type: ignore[arg-type]
                       clients={"judge": llm})
    return run(stage.process_episode(ctx, "e1", inputs))["answer_judgments"]


def test_adversarial_questions_are_judged_against_not_mentioned_or_skipped_with_the_reason():
    judged = _judge_stage_rows(JudgeAnswersSettings(correctness=["strict"], score_0_100=False),
                               FakeChat([{"reason": "ok", "correct": True}, {"reason": "invents", "correct": False}]))
    by_probe = {r["probe_id"]: r for r in judged}
    assert by_probe["qa:q1"]["reference_source"] == "gold" and by_probe["qa:q1"]["score"] == 1.0
    assert by_probe["qa:q2"]["reference_source"] == "not_mentioned" and by_probe["qa:q2"]["score"] == 0.0

    llm = FakeChat([{"reason": "ok", "correct": True}])
    skipped = _judge_stage_rows(JudgeAnswersSettings(correctness=["strict"], score_0_100=False, unanswerable="skip"),
                                llm)
    by_probe = {r["probe_id"]: r for r in skipped}
    assert len(llm.calls) == 1 and by_probe["qa:q2"]["skipped"] == SKIP_UNANSWERABLE
    assert by_probe["qa:q2"]["score"] is None and by_probe["qa:q2"]["error"] is None


def test_memochat_mode_judges_every_question_on_its_evidence_without_a_reference():
    llm = FakeChat(["Matches the evidence. [[90]]", "The history says nothing of a bicycle. [[12]]"])
    rows = _judge_stage_rows(JudgeAnswersSettings(gpt4score_mode="memochat", correctness=[]), llm)
    by_probe = {r["probe_id"]: r for r in rows}
    assert by_probe["qa:q1"]["score"] == 90.0 and by_probe["qa:q2"]["score"] == 12.0
    assert {r["history_source"] for r in rows} == {"evidence"} and {r["reference_source"] for r in rows} == {None}
    assert all(c["params"]["max_tokens"] == 512 for c in llm.calls)
    shown = [c["messages"][1]["content"] for c in llm.calls]
    assert any("Dev: s2 t1" in m and "What did Dev bake?" in m and "sourdough" in m for m in shown)
    assert by_probe["qa:q1"]["reason"] == "Matches the evidence."


def test_memochat_mode_skips_adversarial_questions_with_the_reason_when_unanswerable_is_skip():
    """BLEU / ROUGE / BERTScore cannot score an answer without a reference; with `unanswerable: skip`
    GPT4Score averages the same questions."""
    llm = FakeChat(["Matches the evidence. [[90]]"])
    rows = _judge_stage_rows(JudgeAnswersSettings(gpt4score_mode="memochat", correctness=[], unanswerable="skip"), llm)
    by_probe = {r["probe_id"]: r for r in rows}
    assert len(llm.calls) == 1 and "What did Dev bake?" in llm.calls[0]["messages"][1]["content"]
    assert by_probe["qa:q1"]["score"] == 90.0 and by_probe["qa:q1"]["skipped"] is None
    skipped = by_probe["qa:q2"]
    assert (skipped["skipped"], skipped["score"], skipped["error"], skipped["judge"]) == \
        (SKIP_UNANSWERABLE, None, None, "gpt4score")
    # A question without a reference that is not unanswerable is still judged: MemoChat needs none.
    llm = FakeChat(["ok [[70]]", "ok [[60]]"])
    other = [PROBES[0], {**PROBES[1], "category": "single-hop"}]
    rows = _judge_stage_rows(JudgeAnswersSettings(gpt4score_mode="memochat", correctness=[], unanswerable="skip"),
                             llm, other)
    assert [r["score"] for r in rows] == [70.0, 60.0] and len(llm.calls) == 2


def test_every_method_is_judged_on_the_same_history_whatever_its_context_held():
    """Without evidence the corpus holds, the judge sees the whole past for each method, never the
    turns the method retrieved (which would rate faithfulness to a wrong retrieval as high)."""
    probe = {**PROBES[0], "evidence": None}
    llm = FakeChat(responder=lambda messages, schema: "Fine. [[50]]")
    rows = _judge_stage_rows(JudgeAnswersSettings(gpt4score_mode="memochat", correctness=[]), llm, [probe],
                             {"turn": [[2, 0, 1]], "session": [[1, 0, 3]]})
    assert [(r["method"], r["history_source"]) for r in rows] == [("turn", "full_past"), ("session", "full_past")]
    histories = [c["messages"][1]["content"].split("User question:")[0] for c in llm.calls]
    assert histories[0] == histories[1]
    assert all(f"s{s} t{i}" in histories[0] for s in (1, 2) for i in range(4))


RELEASE = Path(__file__).resolve().parent / "fixtures" / "corpora" / "longmtbench" / "longmt_hf_release.jsonl"


def test_long_mt_bench_plus_as_released_has_no_evidence_so_memochat_shows_exactly_the_whole_past():
    corpus = load_corpus("longmtbench", RELEASE)
    episode = next(e for e in corpus.episodes if e["episode_id"] == "longmtbench-0")
    turns = [t for t in corpus.turns if t["episode_id"] == episode["episode_id"]]
    probes = qa_probes(episode, [q for q in corpus.qa if q["episode_id"] == episode["episode_id"]])
    assert len(probes) == 2 and all(p["evidence"] is None for p in probes)
    llm = FakeChat(responder=lambda messages, schema: "Faithful. [[80]]")
    rows = _judge_stage_rows(JudgeAnswersSettings(gpt4score_mode="memochat", correctness=[]), llm, probes,
                             turns=turns)
    assert [(r["history_source"], r["score"]) for r in rows] == [("full_past", 80.0)] * 2
    expected = ("[Session 1]\n"
                "user: Name three houseplants that cope with low light.\n"
                "assistant: Snake plant, ZZ plant and pothos.\n"
                "user: Which of them is safest around cats?\n"
                "assistant: None is fully safe; the ZZ plant is the mildest irritant.\n"
                "user: Write a two-line care note for the snake plant.\n"
                "assistant: Water it once the soil is dry.\nKeep it out of cold drafts.\n\n"
                "[Session 2]\n"
                "user: Convert 20 degrees Celsius to Fahrenheit.\n"
                "assistant: 20 C is 68 F.\n"
                "user: And 30 degrees?\n"
                "assistant: 30 C is 86 F.")
    for call in llm.calls:
        assert call["messages"][1]["content"].startswith(f"Related conversation history:\n```\n{expected}\n```")


# --- LoCoMo's official QA protocol ----------------------------------------------------------------

UNITS = [{"session_idx": 1, "turn_start": 0, "turn_end": 1, "session_time": "1:56 pm on 8 May, 2023",
          "text": "Priya: I bought a red bicycle.\nDev: Nice!", "unit_id": "session:1:0"}]


def test_category_5_options_follow_a_seeded_order_and_the_letter_maps_back_to_its_text():
    # random.Random("locomo-cat5:qa:locomo-conv-26-q4").random() = 0.932 >= 0.5: the wrong answer first;
    # for ...-q5 it is 0.175 < 0.5: "Not mentioned in the conversation" first.
    q4 = response.cat5_options("qa:locomo-conv-26-q4", "red")
    q5 = response.cat5_options("qa:locomo-conv-26-q5", "red")
    assert q4 == {"a": "red", "b": "Not mentioned in the conversation"}
    assert q5 == {"a": "Not mentioned in the conversation", "b": "red"}
    assert response.cat5_answer("b", q4) == "Not mentioned in the conversation"
    assert response.cat5_answer(" (B)\n", q4) == "Not mentioned in the conversation"
    assert response.cat5_answer("A", q4) == "red"
    assert response.cat5_answer("(a) red", q4) == "(a) red"  # anything longer is kept, as LoCoMo does


def test_locomo_protocol_invites_not_mentioned_only_as_a_category_5_option_and_hints_the_date_for_category_2():
    speakers = ["Priya", "Dev"]
    single = response.build_locomo_qa_messages(UNITS, "What did Priya buy?", "single-hop", speakers)
    temporal = response.build_locomo_qa_messages(UNITS, "When did Priya buy it?", "temporal", speakers)
    choice = response.build_locomo_qa_messages(UNITS, "What colour is Dev's bicycle?", "adversarial", speakers,
                                               {"a": "red", "b": "Not mentioned in the conversation"})
    assert len(single) == 1 and single[0]["role"] == "user"
    text = single[0]["content"]
    assert "Priya and Dev" in text and "DATE: 1:56 pm on 8 May, 2023\nCONVERSATION:\nPriya: I bought" in text
    assert text.endswith("Question: What did Priya buy? Short answer:") and "short phrase" in text
    assert "not mentioned" not in text.lower() and "approximate date" not in text
    assert "When did Priya buy it? Give an approximate date, worked out from the DATE above the CONVERSATION." in \
        temporal[0]["content"]
    assert "(a) red (b) Not mentioned in the conversation" in choice[0]["content"]
    plain = response.build_locomo_qa_messages([], "q", "adversarial", speakers)[0]["content"]
    assert "not mentioned" not in plain.lower()


def _probe(category: str, probe_id: str, **extra) -> ProbeInput:
    return ProbeInput(probe={"probe_id": probe_id, "kind": "qa", "category": category, "request": "What colour?",
                             "respondent": "Dev", **extra},
                      episode={"dataset": "locomo", "speakers": ["Priya", "Dev"]}, history={}, current=[])


def test_under_locomo_protocol_a_category_5_reply_is_mapped_to_its_option_and_recorded():
    llm = FakeChat(["b"])
    ans = run(response.generate(llm, _probe("adversarial", "qa:locomo-conv-26-q4", adversarial_answer="red"), UNITS,
                                "locomo_official"))
    assert ans.text == "Not mentioned in the conversation"
    details = {k: v for k, v in ans.details.items() if k != "context_turn_pairs"}  # SeCom's # Turns record
    assert details == {"context_spans": [[1, 0, 1]], "qa_prompt": "locomo_official", "raw_answer": "b",
                           "options": {"a": "red", "b": "Not mentioned in the conversation"},
                           "sampling": {"temperature": 0.0, "max_tokens": 32}}
    assert llm.calls[0]["params"] == {"temperature": 0.0, "max_tokens": 32}  # LoCoMo's, not the role's
    # Without LoCoMo's adversarial answer the two options cannot be built: asked plainly, recorded.
    plain = run(response.generate(FakeChat(["red"]), _probe("adversarial", "qa:x"), UNITS, "locomo_official"))
    assert plain.text == "red" and plain.details["options"] is None
    # Our prompt stays the default.
    ours = FakeChat(["Paris"])
    run(response.generate(ours, _probe("single-hop", "qa:y"), UNITS))
    assert "not mentioned" in ours.calls[0]["messages"][0]["content"] and ours.calls[0]["params"] == {}


def test_the_qa_prompt_is_a_setting_of_the_retrieval_and_history_methods():
    for settings in (RetrievalSettings, FullHistorySettings, ZeroHistorySettings):
        assert settings().qa_prompt == "ours" and settings(qa_prompt="locomo_official").qa_prompt == "locomo_official"
        with pytest.raises(ValidationError):
            settings(qa_prompt="official")
    assert ZeroHistory.Settings is ZeroHistorySettings and FullHistory.Settings is FullHistorySettings
    llm = FakeChat(["a"])
    ctx = MethodContext(settings=ZeroHistorySettings(qa_prompt="locomo_official"), llm=llm)
    run(ZeroHistory().answer(ctx, _probe("temporal", "qa:z"), {}))
    assert "approximate date" in llm.calls[0]["messages"][0]["content"]


# --- summaries: accuracy, Wilson, McNemar, bootstrap, failed, skipped, pooled ---------------------------

def _rows(dataset: str, method: str, judge: str, scores: list, start: int = 0) -> list[dict]:
    """One row per question q{start+i}: a float score, "fail" (no response) or "skip"."""
    out = []
    for i, s in enumerate(scores):
        out.append({"dataset": dataset, "episode_id": "e1", "probe_id": f"q{start + i}", "kind": "qa",
                    "category": "single-hop", "method": method, "judge": judge,
                    "score": s if isinstance(s, float) else None,
                    "error": "no response from b" if s == "fail" else None,
                    "skipped": "no reference answer" if s == "skip" else None,
                    "history_source": None, "judge_model": "j", "prompt_fingerprint": "p"})
    return out


# Ten questions: the reference `a` right on q0-q7; `b` right on q0-q3 and q8; q9 failed for b.
A = [1.0] * 8 + [0.0, 0.0]
B = [1.0] * 4 + [0.0] * 4 + [1.0, "fail"]


def test_strict_accuracy_has_a_wilson_interval_and_an_exact_mcnemar_test_against_the_reference():
    # Every question from one episode: the cluster interval does not exist, the iid ones stay.
    judgments = pl.DataFrame(_rows("locomo", "a", "strict", A) + _rows("locomo", "b", "strict", B)
                             + _rows("locomo", "b", "strict", ["skip"], start=10))
    got = {(r["dataset"], r["category"], r["method"]): r for r in answer_summary(judgments, "a").iter_rows(named=True)}
    a, b = got[("locomo", None, "a")], got[("locomo", None, "b")]
    assert (a["items"], a["skipped"], a["failed"], a["judged"], a["correct"], a["score"]) == (10, 0, 0, 10, 8, 0.8)
    # Wilson 95% for 8/10 (z = 1.95996): centre 0.71674, half-width 0.22658.
    assert a["iid_low"] == pytest.approx(0.49016, abs=1e-4) and a["iid_high"] == pytest.approx(0.94332, abs=1e-4)
    assert (a["episodes"], a["ci_low"], a["ci_high"]) == (1, None, None)
    # b's failed response (q9) is scored wrong, as the export's empty answer is: in judged, counted in failed.
    assert (b["items"], b["skipped"], b["failed"], b["judged"], b["correct"]) == (11, 1, 1, 10, 5)
    # Wilson 95% for 5/10: centre 0.5, half-width 0.26341.
    assert b["iid_low"] == pytest.approx(0.23659, abs=1e-4) and b["iid_high"] == pytest.approx(0.76341, abs=1e-4)
    assert b["skip_reasons"] == "no reference answer"
    # Paired on the 10 questions (q9 wrong for both): a only on q4-q7 (4), b only on q8 (1).
    # Exact McNemar: 2 * P(X <= 1 | n = 5, p = 1/2) = 2 * 6/32 = 0.375.
    assert (b["reference"], b["paired"], b["only_reference"], b["only_other"]) == ("a", 10, 4, 1)
    assert b["mcnemar_p"] == pytest.approx(0.375)
    assert b["p_value"] == 1.0  # the paired cluster test: one episode cannot show a difference
    assert a["p_value"] is None and a["mcnemar_p"] is None and a["paired"] == 10
    # No reference given: no test.
    no_test = answer_summary(judgments).filter(pl.col("method") == "b")
    assert no_test["p_value"].to_list() == no_test["mcnemar_p"].to_list() == [None] * 3


def test_gpt4score_means_get_a_bootstrap_interval_and_datasets_are_pooled_in_an_all_row():
    judgments = pl.DataFrame(_rows("locomo", "a", "gpt4score", [60.0, 80.0, 100.0])
                             + _rows("lmb", "a", "gpt4score", [40.0, "fail"]))
    got = {(r["dataset"], r["category"]): r for r in answer_summary(judgments, "a").iter_rows(named=True)}
    loc, pooled = got[("locomo", None)], got[("all", None)]
    assert loc["score"] == 80.0 and loc["correct"] is None and loc["p_value"] is None
    assert 60.0 <= loc["iid_low"] < 80.0 < loc["iid_high"] <= 100.0 and loc["ci_low"] is None  # one episode
    assert (pooled["items"], pooled["failed"], pooled["judged"], pooled["score"]) == (5, 1, 4, 70.0)
    assert list(got)[-1] == ("all", None)  # the pooled row comes last
    same = answer_summary(pl.DataFrame(_rows("x", "a", "gpt4score", [50.0, 50.0])))
    assert same.row(0, named=True)["iid_low"] == same.row(0, named=True)["iid_high"] == 50.0


def test_teafarm_correctness_gets_a_wilson_interval_and_a_mcnemar_test_per_dataset_and_pooled():
    judgments = pl.DataFrame(_rows("msc", "a", "teafarm", A) + _rows("msc", "b", "teafarm", B))
    got = {(r["dataset"], r["method"]): r for r in teafarm_summary(judgments, "a").iter_rows(named=True)}
    b = got[("msc", "b")]
    assert (b["correct"], b["total"], b["failed"]) == (5, 10, 1)  # the failed response scored wrong, in total
    assert b["iid_low"] == pytest.approx(0.23659, abs=1e-4) and b["iid_high"] == pytest.approx(0.76341, abs=1e-4)
    assert (b["episodes"], b["ci_low"], b["ci_high"]) == (1, None, None)
    assert (b["only_reference"], b["only_other"], b["mcnemar_p"], b["p_value"]) == (4, 1, pytest.approx(0.375), 1.0)
    assert got[("all", "b")]["mcnemar_p"] == pytest.approx(0.375) and got[("all", "a")]["mcnemar_p"] is None


def test_a_locomo_adversarial_question_reaches_its_probe_with_the_wrong_option_to_offer():
    episode = {"episode_id": "e", "n_sessions": 2, "speakers": ["A", "B"]}
    qa = [{"qa_id": "e-q0", "question": "What colour is B's bike?", "answer": None, "evidence": ["D2:1"],
           "category": "adversarial", "adversarial_answer": "red"},
          {"qa_id": "e-q1", "question": "Where does A live?", "answer": "Rome", "evidence": [],
           "category": "single-hop", "adversarial_answer": None}]
    adversarial, plain = qa_probes(episode, qa)
    assert (adversarial["adversarial_answer"], adversarial["gold"]) == ("red", None)
    assert (plain["adversarial_answer"], plain["gold"]) == (None, "Rome")
