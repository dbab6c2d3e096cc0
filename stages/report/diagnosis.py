"""Why answers fail: the `diagnose` stage's buckets (write, retrieval, read) counted per method and
category, the section that shows them, and each (probe, method)'s bucket for the probe browser
(issue 64, part 3). Buckets are defined in stages/judging/diagnose.py and docs/judges-and-metrics.md."""

from __future__ import annotations

from typing import Any

import polars as pl
import pyarrow as pa

from stages.judging.diagnose import BUCKETS, DiagnoseStage
from stages.report import render
from stages.report.frames import ALL, empty, from_table

STAGE = DiagnoseStage.name  # the report shows the section when the run has this stage
TITLE = "Why answers fail: write, retrieval, read"

# Per method, dataset and category (`all`: every category; a dataset `all` row pools the datasets
# when the run holds several): how its answers to questions split over the buckets.
DIAGNOSIS_SUMMARY = pa.schema([
    pa.field("dataset", pa.string()),
    pa.field("method", pa.string()),
    pa.field("category", pa.string()),
    pa.field("probes", pa.int64()),  # (probe, method) rows diagnosed; every one falls in one bucket
    *(f for b in BUCKETS for f in (pa.field(b, pa.int64()), pa.field(f"{b}_share", pa.float64()))),
    # means over the rows whose evidence was checked (not no_evidence, not failed before the check)
    pa.field("evidence_written", pa.float64()),
    pa.field("evidence_retrieved", pa.float64()),
    pa.field("written_by", pa.string()),  # provenance | judge (both, comma-joined, if a method changed)
    pa.field("memory_truncated", pa.int64()),  # rows whose judge saw the memory cut (max_memory_tokens)
    pa.field("verdict_judge", pa.string()),  # whose correct / wrong verdict decided right and wrong
    pa.field("judge_model", pa.string()),  # of the written check (judge rows only)
    pa.field("prompt_fingerprint", pa.string()),
])

INTRO = ("Each question with evidence turns, per method, traced to where it was lost (the `diagnose` stage). "
         "*Written*: every evidence turn is stated in the method's memory at question time (by provenance where "
         "the memory is the conversation's own turns, else by one judge call that names the memory entries "
         "stating each turn); *retrieved*: those entries (or turns) entered the answer's context; *answered*: "
         "the verdict of the named judge. `correct`: written, retrieved and right; `correct_without_evidence`: "
         "right though the evidence was not both written and retrieved (a guess, or an answer from the current "
         "session); `missed_write`: wrong, some evidence never written; `missed_retrieval`: wrong, written but "
         "not all of it retrieved; `misread`: wrong although written and retrieved; `no_evidence`: a question "
         "with no evidence turn to trace (LoCoMo's adversarial category, LongMemEval's abstention); `failed`: no "
         "response, no verdict or a failed check. Each cell: count (share of the probes); `written` / "
         "`retrieved`: the mean share of evidence turns written / retrieved. A judge shown a cut memory "
         "(`memory_truncated`) may call a fact missing that an older entry held. In `diagnosis` (per "
         "(probe, method): the stage's `buckets`).")


def _joined(values: list[Any]) -> str | None:
    """The distinct non-null values, comma-joined in order of appearance (None when there are none)."""
    seen = [str(v) for v in dict.fromkeys(values) if v is not None]
    return ", ".join(seen) or None


def _mean(values: list[Any]) -> float | None:
    checked = [float(v) for v in values if v is not None]
    return sum(checked) / len(checked) if checked else None


def _row(dataset: str, method: str, category: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    counts = {b: sum(r["bucket"] == b for r in rows) for b in BUCKETS}
    return {"dataset": dataset, "method": method, "category": category, "probes": n,
            **{k: v for b in BUCKETS for k, v in ((b, counts[b]), (f"{b}_share", counts[b] / n))},
            "evidence_written": _mean([r.get("evidence_written") for r in rows]),
            "evidence_retrieved": _mean([r.get("evidence_retrieved") for r in rows]),
            "written_by": _joined([r.get("written_by") for r in rows]),
            "memory_truncated": sum(bool(r.get("memory_truncated")) for r in rows),
            "verdict_judge": _joined([r.get("verdict_judge") for r in rows]),
            "judge_model": _joined([r.get("judge_model") for r in rows]),
            "prompt_fingerprint": _joined([r.get("prompt_fingerprint") for r in rows])}


def diagnosis_summary(buckets: pl.DataFrame) -> pl.DataFrame:
    """DIAGNOSIS_SUMMARY from the `diagnose` stage's `buckets` rows: per method (in the order the rows
    name them), dataset and category, with an `all` category row per method and dataset first, and an
    `all` dataset row per method when the rows hold several datasets. Shares are over the probes, so a
    row's shares sum to 1 and its counts to its probes."""
    if buckets.is_empty():
        return empty(DIAGNOSIS_SUMMARY)
    rows = buckets.to_dicts()
    datasets = sorted({str(r["dataset"]) for r in rows})
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        for dataset in datasets:
            part = [r for r in mine if str(r["dataset"]) == dataset]
            if not part:
                continue
            groups[(dataset, method, ALL)] = part
            for category in sorted({str(r["category"]) for r in part if r.get("category") is not None}):
                groups[(dataset, method, category)] = [r for r in part if str(r.get("category")) == category]
        if len(datasets) > 1:  # categories differ between datasets: only the whole run is pooled
            groups[(ALL, method, ALL)] = mine
    out = [_row(*key, part) for key, part in groups.items()]
    return from_table(pa.Table.from_pylist(out, DIAGNOSIS_SUMMARY))


def whole_run(summary: pl.DataFrame) -> pl.DataFrame:
    """One row per method standing for the whole run: the `all` category of the pooled dataset (or of
    the run's only one)."""
    if summary.is_empty():
        return summary
    rows = summary.filter(pl.col("category") == ALL)
    pooled = rows.filter(pl.col("dataset") == ALL)
    return pooled if pooled.height else rows.unique("method", keep="first", maintain_order=True)


def view(summary: pl.DataFrame) -> pl.DataFrame:
    """The table as the report shows it: each bucket's cell "count (share%)"."""
    if summary.is_empty():
        return summary
    shown = []
    for r in summary.iter_rows(named=True):
        shown.append({"method": r["method"], "dataset": r["dataset"], "category": r["category"], "probes": r["probes"],
                      **{b: f"{r[b]} ({r[f'{b}_share'] * 100:.0f}%)" for b in BUCKETS},
                      "written": r["evidence_written"], "retrieved": r["evidence_retrieved"],
                      "written_by": r["written_by"], "memory_truncated": r["memory_truncated"],
                      "verdict_judge": r["verdict_judge"], "judge_model": r["judge_model"]})
    return pl.DataFrame(shown, schema_overrides={"written": pl.Float64, "retrieved": pl.Float64,
                                                 "written_by": pl.String, "verdict_judge": pl.String,
                                                 "judge_model": pl.String})


def section(summary: pl.DataFrame, figures: list[tuple[str, str]]) -> render.Section:
    """The report's section: the explanation, the table (`view`) and the figure."""
    return render.Section(TITLE, INTRO, [("", view(summary))], figures)


def by_response(buckets: pl.DataFrame) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(episode, probe, method) -> its bucket and shares of evidence written and retrieved, for the
    probe browser."""
    if buckets.is_empty():
        return {}
    return {(r["episode_id"], r["probe_id"], r["method"]): {
        "bucket": r["bucket"], "evidence_written": r.get("evidence_written"),
        "evidence_retrieved": r.get("evidence_retrieved")} for r in buckets.iter_rows(named=True)}
