"""The report's answer to "why did it fail": the diagnose stage's buckets (write, retrieval, read)
counted per method and category, drawn as one stacked bar per method, and shown beside each
response in the probe browser. Built from hand-made `buckets` rows; no pipeline runs."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any

import polars as pl
import pyarrow as pa
import pytest

from stages import report as report_stage
from stages.judging.diagnose import BUCKETS, DIAGNOSIS
from stages.report import ReportSettings, ReportStage, diagnosis, plots, probe_browser_data, probe_rows, tables

# (method, probe, category, bucket, written, retrieved, written_by): secom traced by provenance,
# rsum by the judge; one adversarial question has no evidence to trace.
ROWS = [
    ("secom", "q1", "single_hop", "correct", 1.0, 1.0, "provenance"),
    ("secom", "q2", "single_hop", "missed_retrieval", 1.0, 0.5, "provenance"),
    ("secom", "q3", "temporal", "misread", 1.0, 1.0, "provenance"),
    ("secom", "q4", "adversarial", "no_evidence", None, None, None),
    ("rsum", "q1", "single_hop", "missed_write", 0.0, 0.0, "judge"),
    ("rsum", "q2", "single_hop", "correct_without_evidence", 0.5, 0.5, "judge"),
    ("rsum", "q3", "temporal", "failed", None, None, "judge"),
    ("rsum", "q4", "adversarial", "no_evidence", None, None, None),
]


def bucket_rows(rows: list[tuple[Any, ...]] = ROWS, dataset: str = "locomo", episode: str = "e1") -> pl.DataFrame:
    """`buckets` rows as the diagnose stage writes them (DIAGNOSIS)."""
    out = [{"episode_id": episode, "dataset": dataset, "probe_id": probe, "kind": "qa", "category": category,
            "method": method, "bucket": bucket, "written_by": by, "evidence_items": None if written is None else 2,
            "evidence_written": written, "evidence_retrieved": retrieved,
            "stated_by": None, "memory_entries": 5 if by == "judge" else None,
            "memory_truncated": (probe == "q1") if by == "judge" else None, "verdict": None,
            "verdict_judge": "strict", "judge_model": "judge-m" if by == "judge" else None,
            "prompt_fingerprint": "fp", "error": "ValueError: no list" if bucket == "failed" else None}
           for method, probe, category, bucket, written, retrieved, by in rows]
    return pl.from_arrow(pa.Table.from_pylist(out, DIAGNOSIS))  # type: ignore[return-value]


def test_each_rows_shares_sum_to_one_and_its_counts_to_its_probes():
    summary = diagnosis.diagnosis_summary(bucket_rows())
    assert summary.height == 8  # per method: all, adversarial, single_hop, temporal
    for r in summary.iter_rows(named=True):
        assert sum(r[b] for b in BUCKETS) == r["probes"]
        assert sum(r[f"{b}_share"] for b in BUCKETS) == pytest.approx(1.0)
    whole = {r["method"]: r for r in diagnosis.whole_run(summary).iter_rows(named=True)}
    assert list(whole) == ["secom", "rsum"]  # the order the rows name them
    secom, rsum = whole["secom"], whole["rsum"]
    assert (secom["probes"], secom["correct"], secom["missed_retrieval"], secom["misread"], secom["no_evidence"]) \
        == (4, 1, 1, 1, 1)
    assert secom["correct_share"] == 0.25 and secom["written_by"] == "provenance"
    # the means leave out the rows no check reached (no_evidence, failed)
    assert secom["evidence_written"] == 1.0 and secom["evidence_retrieved"] == pytest.approx(2.5 / 3)
    assert rsum["evidence_written"] == 0.25 and rsum["failed"] == 1 and rsum["missed_write"] == 1
    assert rsum["written_by"] == "judge" and rsum["judge_model"] == "judge-m" and rsum["memory_truncated"] == 1
    single = summary.filter((pl.col("method") == "rsum") & (pl.col("category") == "single_hop")).row(0, named=True)
    assert (single["probes"], single["missed_write_share"], single["correct_without_evidence_share"]) == (2, 0.5, 0.5)


def test_several_datasets_get_an_all_row_that_pools_them():
    two = pl.concat([bucket_rows(), bucket_rows(ROWS[:2], dataset="longmemeval", episode="e2")])
    summary = diagnosis.diagnosis_summary(two)
    pooled = summary.filter((pl.col("dataset") == "all") & (pl.col("method") == "secom")).row(0, named=True)
    assert pooled["category"] == "all" and pooled["probes"] == 6 and pooled["correct"] == 2
    assert set(summary.filter(pl.col("dataset") == "all")["category"]) == {"all"}  # categories stay per dataset
    assert diagnosis.whole_run(summary)["dataset"].to_list() == ["all", "all"]


def test_the_figure_is_drawn_and_nothing_without_rows(tmp_path):
    whole = diagnosis.whole_run(diagnosis.diagnosis_summary(bucket_rows()))
    assert plots.diagnosis(whole, tmp_path / "diagnosis.png")
    assert (tmp_path / "diagnosis.png").read_bytes()[:4] == b"\x89PNG"
    assert not plots.diagnosis(diagnosis.whole_run(diagnosis.diagnosis_summary(pl.DataFrame())), tmp_path / "no.png")
    assert not (tmp_path / "no.png").exists()


PROBES = pl.DataFrame({
    "episode_id": ["e1", "e1"], "probe_id": ["q1", "q2"], "kind": ["qa", "qa"],
    "session_idx": pl.Series([3, 3], dtype=pl.Int32), "request": ["When did Ann move?", "Where to?"],
    "gold": ["In May", "Paris"], "category": ["single_hop", "single_hop"], "context": [None, None]})
RESPONSES = pl.DataFrame({
    "episode_id": ["e1"] * 4, "probe_id": ["q1", "q1", "q2", "q2"], "method": ["secom", "rsum"] * 2,
    "response": ["May", "June", "Rome", "Paris"], "memory_ids": [[], ["m1"], [], ["m2"]],
    "context_tokens": [12, 3, 5, 4], "details_json": [None] * 4, "error": [None] * 4})
NO_JUDGMENTS = pl.DataFrame()


def test_the_browser_shows_each_responses_bucket_and_its_evidence_shares():
    data = probe_browser_data(PROBES, RESPONSES, NO_JUDGMENTS, NO_JUDGMENTS, limit=10, chars=240,
                              buckets=bucket_rows())
    q1 = {r["method"]: r for r in data[0]["responses"]}
    assert (q1["secom"]["bucket"], q1["secom"]["evidence_written"], q1["secom"]["evidence_retrieved"]) == \
        ("correct", 1.0, 1.0)
    assert (q1["rsum"]["bucket"], q1["rsum"]["evidence_written"]) == ("missed_write", 0.0)
    assert "rsum bucket missed_write" in data[0]["verdicts"]  # the browser filters on it
    q2 = {r["method"]: r["bucket"] for r in data[1]["responses"]}
    assert q2 == {"secom": "missed_retrieval", "rsum": "correct_without_evidence"}
    # without the stage the keys are there, empty, and no bucket is among the verdicts
    plain = probe_browser_data(PROBES, RESPONSES, NO_JUDGMENTS, NO_JUDGMENTS, limit=10, chars=240)
    assert all(r["bucket"] is None for p in plain for r in p["responses"])
    assert not any("bucket" in v for p in plain for v in p["verdicts"])
    rows = probe_rows(PROBES, RESPONSES, NO_JUDGMENTS, NO_JUDGMENTS, 10, 240, bucket_rows())
    assert rows.select("probe_id", "method", "bucket").rows() == [
        ("q1", "rsum", "missed_write"), ("q1", "secom", "correct"), ("q2", "rsum", "correct_without_evidence"),
        ("q2", "secom", "missed_retrieval")]


def _page(tmp_path, scoring: tuple[str, ...]) -> tuple[str, str]:
    stage = ReportStage(scoring=scoring)
    stage.methods = ("secom", "rsum")
    cfg = SimpleNamespace(judge_pairwise=SimpleNamespace(reference=None), paper=None, report=ReportSettings(),
                          roles={}, role=lambda r: SimpleNamespace(model="m"), run_name="r",
                          corpus=SimpleNamespace(sources=list))
    t = {name: tables.empty(schema) for name, schema in tables.SUMMARY_TABLES.items()}
    t["diagnosis"] = tables.diagnosis_summary(bucket_rows())
    browser = probe_browser_data(PROBES, RESPONSES, NO_JUDGMENTS, NO_JUDGMENTS, 10, 240, buckets=bucket_rows())
    stage.write_report(SimpleNamespace(out_dir=tmp_path, cfg=cfg), ReportSettings(), t, [], pl.DataFrame(),
                       pl.DataFrame(), pl.DataFrame(), browser)
    return (tmp_path / report_stage.REPORT_HTML).read_text(), (tmp_path / report_stage.REPORT_MD).read_text()


def test_the_report_has_a_section_with_the_table_and_the_figure_when_the_run_diagnoses(tmp_path):
    html, md = _page(tmp_path, ("probes", "judge_answers", "diagnose"))
    assert f"## {diagnosis.TITLE}" in md and "![each method's questions by bucket](diagnosis.png)" in md
    assert (tmp_path / "diagnosis.png").is_file()
    section = html[html.index(f">{diagnosis.TITLE}</h2>"):]
    section = section[:section.index("<h2")]
    assert "missed_retrieval" in section and "<td>1 (25%)</td>" in section and "diagnosis.png" in section
    blob = re.search(r"<script type='application/json' id='probe-data'>(.*?)</script>", html, re.DOTALL).group(1)
    assert {r["bucket"] for p in json.loads(blob) for r in p["responses"]} == \
        {"correct", "missed_write", "missed_retrieval", "correct_without_evidence"}


def test_a_run_without_the_diagnose_stage_has_no_such_section(tmp_path):
    html, md = _page(tmp_path, ("probes", "judge_answers"))
    assert diagnosis.TITLE not in md and diagnosis.TITLE not in html
