"""Calibrating the answer judges (issue 63): answers whose verdict is known by construction (the gold,
the gold in a longer answer, a checked paraphrase; a shifted date, a swapped name, a changed number, a
vague answer, "not mentioned", the gold negated), each judge's false accepts and false rejects per kind
with Wilson intervals, `mempipe judges calibrate` offline against the fake server."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from statsmodels.stats.proportion import proportion_confint

from pipeline.errors import ConfigError
from stages import load_config, registry
from stages.cli import main
from stages.judging import answers, calibration
from stages.judging.calibration import (RULE, SKIP_NO_DATE, SKIP_NO_NAME, SKIP_NO_NEGATION, SKIP_NO_NUMBER,
                                        SKIP_RUBRIC, SKIP_UNANSWERABLE, construct, keeps_content, paraphrase_verdict,
                                        summarize)

ROOT = Path(__file__).resolve().parent.parent
LOCOMO = ROOT / "tests/fixtures/corpora/locomo/locomo_mini.json"
LONGMEMEVAL = ROOT / "tests/fixtures/corpora/longmemeval/longmemeval_mini.json"


def qa(answer: str | None, qa_id: str = "q1", category: str = "single-hop", abstention: bool = False) -> dict:
    return {"episode_id": "e1", "qa_id": qa_id, "question": "Q?", "answer": answer, "category": category,
            "abstention": abstention}


# ---- constructions --------------------------------------------------------------------------------

def test_a_date_moves_by_a_day_a_month_or_a_year_in_the_golds_own_format():
    moved = {g: construct(qa(g), "shifted_date", seed=0).answer for g in
             ("8 May 2023", "May 8, 2023", "June 2023", "2022", "2023-05-08", "The week before 9 June 2023",
              "the 3rd of May")}
    assert moved["8 May 2023"] in ("7 May 2023", "9 May 2023")
    assert moved["May 8, 2023"] in ("May 7, 2023", "May 9, 2023")
    assert moved["June 2023"] in ("May 2023", "July 2023")
    assert moved["2022"] in ("2021", "2023")
    assert moved["2023-05-08"] in ("2023-05-07", "2023-05-09")
    assert moved["The week before 9 June 2023"] in ("The week before 8 June 2023", "The week before 10 June 2023")
    assert moved["the 3rd of May"] in ("the 2nd of May", "the 4th of May")
    assert calibration.shift_date("31 December 2023", random.Random(1))[0] in ("30 December 2023", "1 January 2024")
    assert construct(qa("sourdough bread"), "shifted_date", seed=0).skipped == SKIP_NO_DATE


def test_a_name_is_swapped_for_another_of_the_same_conversation_else_one_of_a_fixed_list():
    swapped = construct(qa("Lou"), "swapped_entity", seed=0, pool=["Kim", "Lou"])
    assert swapped.answer == "Kim" and swapped.change == "Lou -> Kim"
    lone = construct(qa("Lou went to Paris"), "swapped_entity", seed=3, pool=["Lou", "Paris"])
    assert lone.answer is not None and lone.answer != "Lou went to Paris"
    assert any(n in lone.answer for n in calibration.FIXED_NAMES)  # nobody else in the conversation
    assert construct(qa("sourdough bread"), "swapped_entity", seed=0, pool=["Kim"]).skipped == SKIP_NO_NAME
    # a capitalised word that opens the answer is a name only where the conversation uses it as one
    assert construct(qa("Likely yes"), "swapped_entity", seed=0, pool=["Kim"]).skipped == SKIP_NO_NAME


def test_every_number_outside_the_dates_changes_by_the_same_two_or_three():
    changed = construct(qa("7 days. 8 days is also acceptable."), "changed_number", seed=0)
    a, b = map(int, re.findall(r"\d+", changed.answer))
    assert a - 7 == b - 8 and abs(a - 7) in (2, 3)  # never off by one, which LongMemEval's judge forgives
    assert construct(qa("3"), "changed_number", seed=0).answer in ("1", "5", "6")
    assert construct(qa("three loaves"), "changed_number", seed=1).answer.split()[0] in ("one", "five", "six")
    assert construct(qa("8 May 2023"), "changed_number", seed=0).skipped == SKIP_NO_NUMBER


def test_negation_flips_a_yes_or_an_auxiliary_and_skips_a_bare_answer():
    assert construct(qa("Likely yes"), "negation", seed=0).answer == "Likely no"
    assert construct(qa("She was at the party"), "negation", seed=0).answer == "She was not at the party"
    assert construct(qa("Caroline didn't go"), "negation", seed=0).answer == "Caroline did go"
    assert construct(qa("Lou"), "negation", seed=0).skipped == SKIP_NO_NEGATION
    assert construct(qa("8 May 2023"), "negation", seed=0).skipped == SKIP_NO_NEGATION  # "May" is no verb


def test_unanswerable_abstention_and_rubric_questions_skip_every_kind_and_constructions_are_seeded():
    for kind in calibration.KINDS:
        assert construct(qa(None, category="adversarial"), kind, seed=0).skipped == SKIP_UNANSWERABLE
        assert construct(qa("Not enough information", abstention=True), kind, seed=0).skipped == SKIP_UNANSWERABLE
        assert construct(qa("Outdoor things", category="single-session-preference"), kind, 0).skipped == SKIP_RUBRIC
    item = qa("Sourdough bread on 8 May 2023")
    assert construct(item, "gold", 0).answer == "Sourdough bread on 8 May 2023"
    assert "Sourdough bread on 8 May 2023" in construct(item, "gold_in_longer", 0).answer
    assert construct(item, "vague", 0).answer in calibration.VAGUE
    assert construct(item, "not_mentioned", 0).answer in calibration.NOT_MENTIONED
    assert [construct(item, k, 5) for k in calibration.KINDS] == [construct(item, k, 5) for k in calibration.KINDS]
    assert calibration.draw([qa("a", f"q{i}") for i in range(30)], 5, 1) == \
        calibration.draw([qa("a", f"q{i}") for i in reversed(range(30))], 5, 1)


def test_a_paraphrase_is_kept_only_when_the_check_and_the_rule_both_agree():
    gold = "Dev baked 3 loaves on 8 May 2023"
    good = "On May 8, 2023, Dev made three loaves"
    assert keeps_content(gold, good) == (True, [])
    assert keeps_content(gold, "Dev baked some loaves in May 2023") == (False, ["3", "8"])
    assert paraphrase_verdict(gold, good, True)[:2] == (True, True)
    rule_ok, kept, why = paraphrase_verdict(gold, good, False)  # the paraphraser's check says no
    assert rule_ok and not kept and "check" in why
    rule_ok, kept, why = paraphrase_verdict(gold, "Priya baked 3 loaves on 8 May 2023", True)  # the rule says no
    assert not rule_ok and not kept and f"{RULE} misses dev" in why


# ---- rates ----------------------------------------------------------------------------------------

def _rows(judge: str, verdict: bool, kinds=calibration.KINDS, n: int = 10) -> list[dict]:
    return [{"judge": judge, "judge_kind": "strict", "judge_model": "m", "kind": k,
             "expected": calibration.expected_of(k), "skipped": None, "error": None, "accepted": verdict}
            for k in kinds for _ in range(n)]


def test_a_judge_that_accepts_everything_makes_only_false_accepts_and_is_flagged_one_that_rejects_only_false_rejects():
    rows = _rows("yes_man", True) + _rows("naysayer", False)
    rows += [{**rows[0], "kind": "shifted_date", "expected": "reject", "accepted": None, "skipped": SKIP_NO_DATE}]
    table = {(r["judge"], r["kind"]): r for r in summarize(rows, max_false_accept=0.2)}
    low, high = proportion_confint(10, 10, method="wilson")
    for kind in calibration.REJECT_KINDS:
        yes, no = table[("yes_man", kind)], table[("naysayer", kind)]
        assert yes["false_accept_rate"] == 1.0 and yes["flagged"] and yes["false_reject_rate"] is None
        assert (yes["false_accept_low"], yes["false_accept_high"]) == pytest.approx((low, high))
        assert no["false_accept_rate"] == 0.0 and not no["flagged"]
    for kind in calibration.ACCEPT_KINDS:
        yes, no = table[("yes_man", kind)], table[("naysayer", kind)]
        assert yes["false_reject_rate"] == 0.0 and yes["false_accept_rate"] is None and not yes["flagged"]
        assert no["false_reject_rate"] == 1.0 and no["n"] == 10
    assert table[("yes_man", "shifted_date")]["skipped"] == 1 and table[("yes_man", "shifted_date")]["n"] == 10


# ---- the stage and the command --------------------------------------------------------------------

def responder(body: dict) -> str | None:
    """Paraphrases that keep the gold (but drop its digits, which the rule catches), a paraphraser
    that always says "the same"; `yes_man` (strict) accepts everything, `naysayer` (lenient) nothing;
    LongMemEval's judge always says yes."""
    system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
    if calibration.PARAPHRASE_SYSTEM in system:
        gold = re.search(r"Answer: (.*)", user).group(1)
        return json.dumps({"paraphrase": f"In other words, {re.sub(r'[0-9]+', 'some', gold)}"})
    if calibration.SAME_SYSTEM in system:
        return json.dumps({"same": True})
    if answers.SYSTEMS["strict"] in system:
        return json.dumps({"reason": "r", "correct": True})
    if answers.SYSTEMS["lenient"] in system:
        return json.dumps({"reason": "r", "correct": False})
    if "yes or no" in system:
        return "yes"
    return None


def _sets(tmp_path: Path, fake_llm, models_cache, corpus: Path, *more: str) -> list[str]:
    sets = [f"artifacts_dir={tmp_path / 'artifacts'}", "llm.provider=openai", f"llm.base_url={fake_llm.base_url}",
            "llm.api_key_env=MEMPIPE_TEST_KEY", f"llm.cache_dir={tmp_path / 'llm-cache'}", "llm.rpm=null",
            "llm.tpm=null", "llm.backoff_base_s=0.01", "ray.executor=inline", f"corpus.path={corpus}",
            "embedding.provider=local", "embedding.model=all-MiniLM-L6-v2", f"embedding.cache_dir={models_cache}",
            *more]
    return [a for s in sets for a in ("--set", s)]


def _printed(out: str, table: str) -> Path:
    return Path(re.search(rf"^{table}: (.+)$", out, re.M).group(1))


def test_the_command_calibrates_every_judge_offline_on_locomo_and_a_warm_rerun_sends_nothing(
        tmp_path, fake_llm, models_cache, monkeypatch, capsys):
    monkeypatch.setenv("MEMPIPE_TEST_KEY", "sk-test-secret-value-123")
    fake_llm.responder = responder
    args = ["judges", "calibrate", "-c", str(ROOT / "configs/locomo_judge_panel.yaml"),
            *_sets(tmp_path, fake_llm, models_cache, LOCOMO, "methods=[full_history]", "roles={}",
                   "judge_answers.runs=2", "judge_answers.panel=[{name: yes_man, prompt: strict}, "
                   "{name: naysayer, prompt: lenient}, {name: f1, prompt: f1}]")]
    assert main(args) == 0
    out = capsys.readouterr().out
    summary = pq.read_table(_printed(out, "calibration")).to_pylist()
    items = pq.read_table(_printed(out, "calibration_items")).to_pylist()
    by = {(r["judge"], r["kind"]): r for r in summary}
    assert {j for j, _ in by} == {"yes_man", "naysayer", "f1"} and {k for _, k in by} == set(calibration.KINDS)
    for kind in calibration.REJECT_KINDS:
        if by[("yes_man", kind)]["n"]:
            assert by[("yes_man", kind)]["false_accept_rate"] == 1.0 and by[("yes_man", kind)]["flagged"]
    for kind in ("gold", "gold_in_longer"):
        assert by[("naysayer", kind)]["false_reject_rate"] == 1.0 and by[("naysayer", kind)]["n"] == 5
    assert by[("yes_man", "vague")]["n"] == 5 and by[("yes_man", "not_mentioned")]["n"] == 5
    # the adversarial question (no gold) is skipped by every kind, and counted
    assert all(by[("f1", k)]["skipped"] >= 1 for k in calibration.KINDS)
    assert by[("f1", "gold")]["false_reject_rate"] == 0.0  # F1 of the gold against itself
    # the paraphrases kept their words but lost their digits: the rule, named, refused those
    para = [r for r in items if r["kind"] == "paraphrase" and r["judge"] == "yes_man" and r["answer"]]
    assert para and all(r["rule"] == RULE and r["verified"] for r in para)
    assert {r["rule_ok"] for r in para} == {True, False}
    assert all((r["skipped"] is None) == r["rule_ok"] for r in para)
    assert {r["runs"] for r in items if r["judge"] == "yes_man" and r["accepted"] is not None} == {2}
    sent = fake_llm.count()
    assert main(args) == 0
    assert fake_llm.count() == sent  # warm: nothing sent again
    # The same calibration as a stage of `mempipe run`: done already, and read where verdicts are read.
    capsys.readouterr()
    assert main(["run", *args[2:], "--set", "judges.calibration.enabled=true"]) == 0
    assert re.search(r"^judge_calibration +skipped$", capsys.readouterr().out, re.M)  # the command's, reused
    html = (tmp_path / "artifacts" / "locomo-judge-panel" / "report" / "report.html").read_text()
    assert "judge false accepts (vague)" in html and "yes_man 100% (flagged)" in html
    assert "Calibration: each judge on answers whose verdict is known" in html


def test_the_command_calibrates_longmemevals_judge_offline(tmp_path, fake_llm, models_cache, monkeypatch, capsys):
    monkeypatch.setenv("MEMPIPE_TEST_KEY", "sk-test-secret-value-123")
    fake_llm.responder = responder
    args = ["judges", "calibrate", "-c", str(ROOT / "configs/longmemeval.yaml"),
            *_sets(tmp_path, fake_llm, models_cache, LONGMEMEVAL, "methods=[zero_history]", "roles={}",
                   "judges.calibration.kinds=[gold, vague, changed_number, paraphrase]")]
    assert main(args) == 0
    out = capsys.readouterr().out
    by = {r["kind"]: r for r in pq.read_table(_printed(out, "calibration")).to_pylist()}
    assert set(by) == {"gold", "vague", "changed_number", "paraphrase"}
    assert by["vague"]["judge"] == "longmemeval" and by["vague"]["false_accept_rate"] == 1.0  # it always says yes
    assert by["gold"]["n"] == 4 and by["gold"]["skipped"] == 2  # the rubric and the _abs question
    assert by["changed_number"]["n"] == 2  # "12" and the temporal count
    sent = fake_llm.count()
    assert main(args) == 0 and fake_llm.count() == sent


def test_the_paraphraser_must_not_be_a_judges_role_and_plan_prices_the_stage(tmp_path, run_cfg):
    from pipeline.plan import make_plan

    cfg = run_cfg("judges.calibration.enabled=true", "judges.calibration.max_items=4", "methods=[zero_history]")
    stage = registry(cfg)["judge_calibration"]
    assert stage.llm_roles(cfg) == ("judge", "paraphraser")
    plan = make_plan(cfg, registry, write=False, until="judge_calibration")
    priced = next(s for s in plan.stages if s.name == "judge_calibration")
    assert priced.runs and priced.total()["calls"] > 0
    assert {r.role for r in priced.roles} == {"judge", "paraphraser"}
    bad = load_config(ROOT / "configs/default.yaml", ["judges.calibration.paraphraser=judge"])
    with pytest.raises(ConfigError, match="paraphraser must be a role of its own"):
        stage.llm_roles(bad)
