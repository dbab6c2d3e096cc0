"""The audited LoCoMo answer key (`corpus.answer_key: audited`): dial481/locomo-audit's corrections of the
score-corrupting classes replace the gold, WRONG_CITATION and every other item keep theirs, a correction
that is commentary is dropped and counted, the audit's ids map to ours, the original gold stays beside
the audited one, and the audit is fetched at a pinned commit, checked file by file.

Fixtures: tests/fixtures/locomo_audit/locomo_mini.json (two LoCoMo-shaped conversations with the real
sample ids conv-26 and conv-30) and locomo-audit/errors_conv_<N>.json in the audit's own format."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.artifacts import StageDir
from pipeline.config import resolve_paths
from pipeline.corpus import iter_episodes, load_corpus, sources
from pipeline.corpus.fetch import DataFetchError, fetch
from pipeline.corpus.locomo_audit import (
    SAMPLE_IDS,
    SCORE_CLASSES,
    STATS_KEY,
    Correction,
    answer_key_stats,
    audited_rows,
    classify,
    evidence,
    gold,
    our_qa_id,
    read_corrections,
)
from pipeline.corpus.reader import iter_records
from pipeline.errors import InputError, PipelineError
from pipeline.engine.fingerprint import compute_fingerprint
from pipeline.reproduction import deviations
from pipeline.engine.runner import Runner
from sheets import PAPER_CONFIGS, sheet_config
from stages import load_config, registry
from stages.ingest import IngestStage
from test_data_fetch import run_cli, sha

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "locomo_audit"
CORPUS = FIX / "locomo_mini.json"
AUDIT = FIX / "locomo-audit"


def audited(corpus: Path = CORPUS, audit: Path = AUDIT) -> dict[str, dict]:
    """The fixture corpus's qa rows under the audited key, by qa_id."""
    corrections = read_corrections(audit)
    return {q["qa_id"]: q for rows in iter_episodes("locomo", corpus) for q in audited_rows(rows, corrections)[0].qa}


def config(tmp_path: Path, *sets: str):
    cfg = load_config(None, [f"artifacts_dir={tmp_path / 'artifacts'}", "corpus.format=locomo", f"corpus.path={CORPUS}",
                             f"corpus.audit_path={AUDIT}", "stages=[ingest]", "methods=[]", "teabag.enabled=false",
                             "ray.executor=inline", "ray.episodes_per_shard=1", *sets])
    return resolve_paths(cfg)


# -- what changes ----------------------------------------------------------------------------------------

def test_the_audited_key_changes_exactly_the_score_corrupting_items_that_carry_an_answer():
    original = {q["qa_id"]: q for q in load_corpus("locomo", CORPUS).qa}
    qa = audited()
    changed = {i for i, q in qa.items() if q["answer"] != original[i]["answer"]}
    assert changed == {"locomo-conv-26-q2", "locomo-conv-26-q3", "locomo-conv-30-q0"}
    assert qa["locomo-conv-26-q2"]["answer"] == "Counseling or mental health"  # HALLUCINATION
    assert qa["locomo-conv-26-q3"]["answer"] == "The Saturday before 25 May 2023"  # TEMPORAL_ERROR
    assert qa["locomo-conv-30-q0"]["answer"] == "an online clothing store and a dance studio"  # INCOMPLETE
    assert {i: q["answer_key_class"] for i, q in qa.items() if q["answer_key_class"]} == {
        "locomo-conv-26-q2": "HALLUCINATION", "locomo-conv-26-q3": "TEMPORAL_ERROR", "locomo-conv-30-q0": "INCOMPLETE"}
    # the audit's evidence where it names turns of the conversation (D9:9 names none); none given: ours kept
    assert qa["locomo-conv-26-q2"]["evidence"] == ["D1:3", "D1:4"]
    assert qa["locomo-conv-26-q3"]["evidence"] == ["D2:1"]
    assert qa["locomo-conv-30-q0"]["evidence"] == ["D1:1"]
    # the dataset's own gold stays beside it, and every row says which key it follows
    for i, q in qa.items():
        assert q["gold_original"] == original[i]["answer"] and q["evidence_original"] == original[i]["evidence"]
        assert q["answer_key"] == "audited" and original[i]["answer_key"] == "original"
        assert original[i]["answer_key_class"] is None


def test_wrong_citation_and_every_item_the_audit_does_not_name_keep_gold_and_evidence():
    original = {q["qa_id"]: q for q in load_corpus("locomo", CORPUS).qa}
    qa = audited()
    for i in ("locomo-conv-26-q0", "locomo-conv-26-q1", "locomo-conv-26-q5", "locomo-conv-30-q1"):
        assert (qa[i]["answer"], qa[i]["evidence"], qa[i]["answer_key_class"]) == \
            (original[i]["answer"], original[i]["evidence"], None), i
    # WRONG_CITATION: the answer is right, only the citation is not; its correct_evidence is not taken
    assert qa["locomo-conv-26-q1"]["answer"] == "2022" and qa["locomo-conv-26-q1"]["evidence"] == ["D1:2"]
    # category 5 stays as LoCoMo gives it
    assert qa["locomo-conv-26-q5"]["answer"] is None and qa["locomo-conv-26-q5"]["adversarial_answer"] == "blue"


def test_a_correction_that_is_commentary_is_dropped_and_counted_and_one_about_the_question_leaves_the_gold():
    qa = audited()
    assert qa["locomo-conv-26-q4"]["answer"] == "self-acceptance"  # "This is Caroline's statement, not Melanie's."
    assert qa["locomo-conv-26-q6"]["answer"] == "a bowl"  # "a bowl (but ... not June as the question says)"
    corrections = read_corrections(AUDIT)
    stats = answer_key_stats(corrections.values())[STATS_KEY]
    assert {k: stats[k] for k in ("changed", "dropped_commentary", "unchanged", "wrong_citation_kept")} == {
        "changed": 3, "dropped_commentary": 1, "unchanged": 1, "wrong_citation_kept": 1}
    by_class = stats["by_class"]
    assert by_class["ATTRIBUTION_ERROR"]["dropped_commentary"] == 1 and by_class["AMBIGUOUS"]["unchanged"] == 1
    assert by_class["WRONG_CITATION"] == {"changed": 0, "dropped_commentary": 0, "unchanged": 0, "wrong_citation_kept": 1}
    assert sum(by_class[c]["changed"] for c in SCORE_CLASSES) == 3


def _c(answer: str, gold: str = "Jon", error_class: str = "HALLUCINATION") -> Correction:
    return Correction("locomo-conv-26-q0", "locomo_0_qa0", error_class, "q?", gold, answer, (), "f", "item 0")


@pytest.mark.parametrize("answer", [
    "The question should ask about JAMES, not John. James spent time with his sister.",
    "Unclear - D2:1 says 'adopted' while D11:4 says 'breeder'. The evidence is contradictory.",
    "Cannot be determined from transcript; the answer is about Dave, not Calvin",
    "Deborah (not Jolene) recently played a card game about cats.",
    "Tim did not have an injury. It was John's injury.",
    "",
])
def test_explanations_are_commentary(answer):
    assert classify(_c(answer)).outcome == "commentary"


@pytest.mark.parametrize("answer,gold,outcome,new", [
    ("five months", "six months", "changed", "five months"),
    ("9 days (July 11 to July 20)", "19 days", "changed", "9 days (July 11 to July 20)"),
    ("Adventures, magic, and great characters (the specific subject 'dragons' is not stated in the transcript text).",
     "dragons", "changed", "Adventures, magic, and great characters"),
    ("art and self-expression (but this is Caroline's bowl, not Melanie's)", "art and self-expression", "unchanged", None),
    ("aerial yoga (answer is correct, but question says 2023 when it should say 2022)", "aerial yoga", "unchanged", None),
    ("The CS:GO tournament was organized on May 7, 2022 (not May 8 as stated in the question)",
     "A tournament for CS:GO", "unchanged", None),
    ("2022", "2022", "unchanged", None),
])
def test_answers_are_taken_and_a_bracketed_remark_cut(answer, gold, outcome, new):
    verdict = classify(_c(answer, gold))
    assert (verdict.outcome, verdict.answer) == (outcome, new)


def test_wrong_citation_is_never_changed_whatever_its_correction_says():
    assert classify(_c("Rome", "Jon", "WRONG_CITATION")).outcome == "citation"


# -- ids -------------------------------------------------------------------------------------------------

def test_audit_ids_map_to_the_conversations_position_and_the_questions_index():
    assert our_qa_id("locomo_0_qa2", "f", "item 0") == "locomo-conv-26-q2"
    assert our_qa_id("locomo_9_qa151", "f", "item 0") == "locomo-conv-50-q151"
    assert len(SAMPLE_IDS) == 10 and SAMPLE_IDS[3] == "conv-42"
    # conversation N is the Nth record of the corpus file, as the audit counts them (from 0)
    records = list(iter_records(CORPUS))
    assert [r.data["sample_id"] for r in records] == list(SAMPLE_IDS[:2])
    # and question i is the ith of its qa list, from 0 (the audit's locomo_0_qa2 is our q2, same question)
    c = read_corrections(AUDIT)["locomo-conv-26-q2"]
    assert c.audit_id == "locomo_0_qa2" and records[0].data["qa"][2]["question"] == c.question
    for bad in ("locomo_10_qa1", "conv-26_qa1", "locomo_0_q1"):
        with pytest.raises(InputError, match="question_id"):
            our_qa_id(bad, "f", "item 0")


def test_an_item_whose_question_or_gold_differs_from_the_corpus_fails_naming_the_audit_item(tmp_path):
    audit = tmp_path / "locomo-audit"
    shutil.copytree(AUDIT, audit)
    items = json.loads((audit / "errors_conv_0.json").read_text())
    items[1]["question"] = "What fields would Melanie pursue?"
    (audit / "errors_conv_0.json").write_text(json.dumps(items))
    with pytest.raises(InputError) as e:
        audited(audit=audit)
    assert "errors_conv_0.json" in str(e.value) and "item 1" in str(e.value) and "'question'" in str(e.value)
    assert "locomo-conv-26-q2" in str(e.value)

    items = json.loads((AUDIT / "errors_conv_0.json").read_text())
    items[2]["golden_answer"] = "The monday before 25 May 2023"
    (audit / "errors_conv_0.json").write_text(json.dumps(items))
    with pytest.raises(InputError, match=r"item 2, field 'golden_answer'"):
        audited(audit=audit)

    items = json.loads((AUDIT / "errors_conv_1.json").read_text())
    items[0]["question_id"] = "locomo_1_qa7"  # conv-30 has two questions
    (audit / "errors_conv_0.json").write_text((AUDIT / "errors_conv_0.json").read_text())
    (audit / "errors_conv_1.json").write_text(json.dumps(items))
    with pytest.raises(InputError, match=r"errors_conv_1\.json, record item 0, field 'question_id'.*locomo-conv-30-q7"):
        audited(audit=audit)


@pytest.mark.parametrize("edit,field", [
    (lambda i: i.update(error_type="TYPO"), "error_type"),
    (lambda i: i.pop("correct_answer"), "correct_answer"),
    (lambda i: i.update(correct_evidence="D1:3"), "correct_evidence"),
    (lambda i: i.update(question_id="locomo_1_qa2"), "question_id"),  # a question of another conversation
])
def test_a_malformed_audit_item_names_file_item_and_field(tmp_path, edit, field):
    audit = tmp_path / "locomo-audit"
    shutil.copytree(AUDIT, audit)
    items = json.loads((audit / "errors_conv_0.json").read_text())
    edit(items[3])
    (audit / "errors_conv_0.json").write_text(json.dumps(items))
    with pytest.raises(InputError, match=rf"errors_conv_0\.json, record item 3, field '{field}'"):
        read_corrections(audit)


# -- in the pipeline -------------------------------------------------------------------------------------

def test_ingest_with_the_audited_key_writes_both_golds_and_counts_in_its_manifest(tmp_path):
    cfg = config(tmp_path, "corpus.answer_key=audited")
    Runner(cfg, registry(cfg)).run(only=["ingest"])
    sd = StageDir(cfg.run_dir, "ingest")
    qa = {q["qa_id"]: q for q in sd.read_table("qa").to_pylist()}
    assert qa["locomo-conv-26-q2"]["answer"] == "Counseling or mental health"
    assert qa["locomo-conv-26-q2"]["gold_original"] == "Psychology, counseling certification"
    assert qa["locomo-conv-26-q2"]["answer_key_class"] == "HALLUCINATION"
    assert gold(qa["locomo-conv-26-q2"], "original") == "Psychology, counseling certification"
    assert gold(qa["locomo-conv-26-q2"], "audited") == "Counseling or mental health"
    assert evidence(qa["locomo-conv-26-q2"], "original") == ["D1:3"]
    # counted over both parts (one episode a part)
    stats = sd.manifest().stats[STATS_KEY]
    assert (stats["changed"], stats["dropped_commentary"], stats["unchanged"], stats["wrong_citation_kept"]) == (3, 1, 1, 1)
    assert stats["by_class"]["INCOMPLETE"]["changed"] == 1


def test_gold_under_either_key_and_the_audited_gold_of_an_original_run_is_refused():
    row = load_corpus("locomo", CORPUS).qa[2]
    assert gold(row, "original") == "Psychology, counseling certification"
    with pytest.raises(ValueError, match="corpus.answer_key: audited"):
        gold(row, "audited")
    # a table written before the answer-key columns: its answer is the original gold
    assert gold({"qa_id": "x", "answer": "Rome"}, "original") == "Rome"


def test_the_ingest_fingerprint_changes_with_the_answer_key_and_the_audit_files(tmp_path):
    stage = IngestStage()
    fp = {key: compute_fingerprint(stage, config(tmp_path, f"corpus.answer_key={key}"), {})
          for key in ("original", "audited")}
    assert fp["original"] != fp["audited"]
    audit = tmp_path / "locomo-audit"
    shutil.copytree(AUDIT, audit)
    copied = config(tmp_path, "corpus.answer_key=audited", f"corpus.audit_path={audit}")
    before = compute_fingerprint(stage, copied, {})
    (audit / "errors_conv_9.json").write_text("[ ]\n")  # an edited audit file re-runs ingest
    assert compute_fingerprint(stage, copied, {}) != before


def test_a_missing_audit_file_is_an_error_naming_the_fetch_command(tmp_path):
    audit = tmp_path / "data" / "locomo-audit"
    shutil.copytree(AUDIT, audit)
    (audit / "errors_conv_4.json").unlink()
    cfg = config(tmp_path, "corpus.answer_key=audited", f"corpus.audit_path={audit}")
    with pytest.raises(PipelineError) as e:
        IngestStage().check_inputs(cfg)
    assert "errors_conv_4.json" in str(e.value) and f"mempipe data fetch locomo-audit --dir {tmp_path / 'data'}" in str(e.value)
    with pytest.raises(InputError, match="mempipe data fetch locomo-audit"):
        read_corrections(audit)
    # the original key reads no audit
    IngestStage().check_inputs(config(tmp_path, f"corpus.audit_path={audit}"))


def test_the_audited_key_is_locomos_only(tmp_path):
    with pytest.raises(PipelineError, match="answer_key: audited corrects LoCoMo"):
        load_config(None, ["corpus.format=msc", "corpus.answer_key=audited"])
    with pytest.raises(PipelineError, match="answer_key"):
        load_config(None, ["corpus.format=locomo", "corpus.answer_key=corrected"])


# -- the published numbers -------------------------------------------------------------------------------

def _locomo_sheets() -> list[str]:
    """The configs whose `paper:` sheet quotes published LoCoMo numbers."""
    return [n for n in PAPER_CONFIGS if (cfg := sheet_config(n)).paper is not None and cfg.corpus.format == "locomo"]


LOCOMO_SHEETS = _locomo_sheets()


def test_every_locomo_sheet_states_its_numbers_used_the_original_key():
    assert {"secom_locomo", "locomo_memory_systems"} <= set(LOCOMO_SHEETS)
    for name in LOCOMO_SHEETS:
        setting = sheet_config(name).paper.protocol["corpus.answer_key"]
        assert setting.value == "original" and "locomo-audit" in setting.source, name
        devs = deviations(sheet_config(name, ["corpus.answer_key=audited"]))
        assert [(d.path, d.paper, d.run) for d in devs] == [("corpus.answer_key", "original", "audited")], name


# -- the fetch -------------------------------------------------------------------------------------------

def test_the_audit_is_registered_at_a_pinned_commit_with_a_sha256_per_file_and_its_licence():
    source = sources.REGISTRY["locomo-audit"]
    assert source.corpus_format is None and "non-commercial" in source.description and "CC BY-NC" in source.description
    assert [f.fname for f in source.files] == [f"locomo-audit/errors_conv_{n}.json" for n in range(10)]
    commits = {re.search(r"/locomo-audit/([0-9a-f]+)/audit/", f.url)[1] for f in source.files}
    assert len(commits) == 1 and len(commits.pop()) == 40  # one full commit id, not a branch
    assert all(f.sha256 and re.fullmatch(r"[0-9a-f]{64}", f.sha256) and f.sha256_source for f in source.files)
    assert len({f.sha256 for f in source.files}) == 10
    assert source.verified


def test_fetch_from_a_mirror_lands_where_the_audited_key_reads(mirror, tmp_path, monkeypatch, capsys):
    real = sources.REGISTRY["locomo-audit"]
    bodies = [(AUDIT / f"errors_conv_{n}.json").read_bytes() for n in range(10)]
    # the fixture files stand in for the audit's: their hashes recorded in place of the real ones
    files = tuple(replace(f, sha256=sha(b), sha256_source="the test") for f, b in zip(real.files, bodies))
    monkeypatch.setitem(sources.REGISTRY, "locomo-audit", replace(real, files=files))
    for f, body in zip(files, bodies):
        mirror.serve(f.url, body)
    data = tmp_path / "data"
    assert run_cli("data", "fetch", "locomo-audit", "--dir", str(data), "--mirror", mirror.url, "--no-progress") == 0
    out = capsys.readouterr().out
    assert f"corpus.answer_key=audited corpus.audit_path={data / 'locomo-audit'}" in out
    assert sum(mirror.requests.values()) == 10 and not (data / ".mempipe-pins.json").exists()
    assert read_corrections(data / "locomo-audit").keys() == read_corrections(AUDIT).keys()


def test_a_file_that_differs_from_the_pinned_audit_is_refused(mirror, tmp_path):
    for f in sources.REGISTRY["locomo-audit"].files:
        mirror.serve(f.url, b"[]\n")  # not the audit's bytes
    with pytest.raises(DataFetchError, match="sha256 mismatch"):
        fetch("locomo-audit", tmp_path, progress=False, base_url_override=mirror.url)
    assert not (tmp_path / "locomo-audit" / "errors_conv_0.json").exists()
