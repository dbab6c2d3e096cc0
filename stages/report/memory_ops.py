"""What each memory operation did to the facts: the `memory_ops` stage's rows counted per method (and
dataset), with HaluMem's operation scores where the corpus has gold memory points. The rows and their
judges are defined in stages/judging/memory_ops.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import polars as pl
import pyarrow as pa

from stages.judging import halumem
from stages.judging.memory_ops import MemoryOpsStage
from stages.report import render
from stages.report.frames import empty, from_table

STAGE = MemoryOpsStage.name  # the report shows the section when the run has this stage
TITLE = "What memory operations do to the facts"

MEMORY_OPS_SUMMARY = pa.schema([
    pa.field("dataset", pa.string()),
    pa.field("method", pa.string()),
    # written entries judged for support (HaluMem's accuracy judge): score 0 = hallucinated at write
    pa.field("entries_judged", pa.int64()),
    pa.field("hallucinated", pa.int64()),
    pa.field("hallucinated_share", pa.float64()),
    pa.field("partly_supported", pa.int64()),  # score 1
    # questions with evidence checked for a fact stated after its session and gone at the question
    pa.field("questions_checked", pa.int64()),
    pa.field("dropped", pa.int64()),
    pa.field("dropped_share", pa.float64()),
    pa.field("never_written", pa.int64()),
    # HaluMem's operation scores (evaluation.py's "(all)" values; null without gold memory points)
    pa.field("recall", pa.float64()),
    pa.field("weighted_recall", pa.float64()),
    pa.field("target_precision", pa.float64()),
    pa.field("extraction_f1", pa.float64()),
    pa.field("interference_accuracy", pa.float64()),
    pa.field("update_correct", pa.float64()),
    pa.field("update_hallucination", pa.float64()),
    pa.field("update_omission", pa.float64()),
    pa.field("failed", pa.int64()),  # rows whose judgment failed (counted in no share above)
    pa.field("judge_model", pa.string()),
])

INTRO = ("Per method that writes its own memory (the `memory_ops` stage). *Hallucinated*: a written entry that no "
         "turn supports (HaluMem's accuracy judge, score 0, against the dialogue it was written from, with the "
         "corpus's gold memory points where it has them); *partly supported*: score 1. *Dropped*: a question whose "
         "evidence the memory stated right after the evidence session and no longer states at the question (the "
         "error trace's written check at both points; *never written*: it never stated it). HaluMem's scores, on a "
         "corpus with gold memory points: *recall* (points fully kept), *weighted recall* (by importance), *target "
         "precision* (accuracy of the entries whose fields the gold points have), their F1, *interference accuracy* "
         "(distractor points correctly not kept), and the share of update points updated correctly, hallucinated or "
         "omitted; each over every judged item, an unreadable reply counted as not passing (HaluMem's \"(all)\"). "
         "Sampled per episode (memory_ops.max_points_per_episode, .max_entries_per_episode; questions: diagnose's "
         "sample). Rows in the stage's `operations`.")


def _ok(rows: Sequence[Mapping[str, object]]) -> list[Mapping[str, object]]:
    return [r for r in rows if r.get("error") is None]


def _score(value: object) -> int | None:
    return None if value is None else int(float(str(value)))


def _float(value: object) -> float | None:
    return None if value is None else float(str(value))


def halumem_scores(rows: Sequence[Mapping[str, object]]) -> dict[str, float | None]:
    """HaluMem's "(all)" operation scores from one method's integrity / accuracy / update rows (gold ones)."""
    integrity = [halumem.IntegrityRecord(_score(r["score"]), float(str(r.get("importance") or 0.0)),
                                         str(r.get("memory_type") or ""), r.get("memory_source") == "interference")
                 for r in rows if r["op"] == "integrity"]
    accuracy = [halumem.AccuracyRecord(_score(r["score"]), bool(r.get("included")))
                for r in rows if r["op"] == "accuracy" and r.get("gold_points")]
    updates = [halumem.UpdateRecord(None if r.get("label") is None else str(r["label"]), str(r.get("memory_type") or ""))
               for r in rows if r["op"] == "update"]
    if not (integrity or updates):
        return {}
    scores = halumem.aggregate(integrity, accuracy, updates, [])

    def part(section: str, key: str) -> float | None:
        got = scores.get(section)
        return _float(got.get(key)) if isinstance(got, dict) else None

    f1 = scores.get("memory_extraction_f1")
    return {"recall": part("memory_integrity", "recall(all)"),
            "weighted_recall": part("memory_integrity", "weighted_recall(all)"),
            "target_precision": part("memory_accuracy", "target_accuracy(all)"),
            "extraction_f1": f1 if isinstance(f1, float) else None,
            "interference_accuracy": part("memory_accuracy", "interference_accuracy(all)"),
            "update_correct": part("memory_update", "correct_update_memory_ratio(all)"),
            "update_hallucination": part("memory_update", "hallucination_update_memory_ratio(all)"),
            "update_omission": part("memory_update", "omission_update_memory_ratio(all)")}


def _row(dataset: str, method: str, rows: list[dict[str, object]]) -> dict[str, object]:
    ok = _ok(rows)
    entries = [r for r in ok if r["op"] == "accuracy"]
    questions = [r for r in ok if r["op"] == "dropped"]
    hallucinated = sum(r["score"] == 0 for r in entries)
    dropped = sum(r["label"] == "dropped" for r in questions)
    return {"dataset": dataset, "method": method, "entries_judged": len(entries), "hallucinated": hallucinated,
            "hallucinated_share": hallucinated / len(entries) if entries else None,
            "partly_supported": sum(r["score"] == 1 for r in entries),
            "questions_checked": len(questions), "dropped": dropped,
            "dropped_share": dropped / len(questions) if questions else None,
            "never_written": sum(r["label"] == "never_written" for r in questions),
            **halumem_scores(ok), "failed": len(rows) - len(ok),
            "judge_model": ", ".join(str(m) for m in dict.fromkeys(r.get("judge_model") for r in ok) if m) or None}


def memory_ops_summary(operations: pl.DataFrame) -> pl.DataFrame:
    """MEMORY_OPS_SUMMARY from the `memory_ops` stage's `operations` rows: per dataset and method (in the
    order the rows name them)."""
    if operations.is_empty():
        return empty(MEMORY_OPS_SUMMARY)
    rows = operations.to_dicts()
    out = [_row(dataset, method, [r for r in rows if r["dataset"] == dataset and r["method"] == method])
           for method in dict.fromkeys(str(r["method"]) for r in rows)
           for dataset in sorted({str(r["dataset"]) for r in rows if r["method"] == method})]
    return from_table(pa.Table.from_pylist(out, MEMORY_OPS_SUMMARY))


def section(summary: pl.DataFrame) -> render.Section:
    """The report's section: the explanation and the table (HaluMem's columns only where a corpus has them)."""
    shown = summary
    if not summary.is_empty() and summary["recall"].is_null().all() and summary["update_correct"].is_null().all():
        shown = summary.drop(["recall", "weighted_recall", "target_precision", "extraction_f1", "interference_accuracy",
                              "update_correct", "update_hallucination", "update_omission"])
    return render.Section(TITLE, INTRO, [("", shown)], [])
