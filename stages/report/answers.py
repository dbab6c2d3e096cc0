"""The report's summaries of answers judged alone: per dataset, category, method and judge
(answer_summary, with LongMemEval's task average), and TeaFarm's correct / total (teafarm_summary),
each with a paired test against the reference method."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import polars as pl
import pyarrow as pa

from pipeline.corpus.longmemeval import DATASET as LONGMEMEVAL
from stages.metrics.significance import (bootstrap_mean_interval, cluster_bootstrap_interval, mcnemar_exact,
                                         paired_cluster_test, wilson_interval)
from stages.report.frames import as_float, empty, from_table

# Answers judged alone, per dataset ("all": every dataset pooled), category (null: every category;
# "abstention": LongMemEval's abstention questions, also counted in their type; "task_average":
# LongMemEval's mean of the per-type scores), method and judge, with 95% intervals and a paired test
# of each method against the reference method on the questions both have a verdict on.
ANSWER_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("category", pa.string()),  # null: every category
        pa.field("method", pa.string()),
        pa.field("judge", pa.string()),
        pa.field("items", pa.int64()),  # (question, method) rows of this judge
        pa.field("skipped", pa.int64()),  # not judged by design (reasons in skip_reasons)
        # no response from the method or no verdict from the judge
        pa.field("failed", pa.int64()),
        # what score is over: items - skipped - no verdict from the judge; a correct / wrong judge's item
        # whose response failed is in it, scored wrong (0), as the exported empty answer is scored
        pa.field("judged", pa.int64()),
        pa.field("episodes", pa.int64()),  # episodes the judged items come from
        # judged correct; null for gpt4score, task_average and several judge runs (score: the mean share)
        pa.field("correct", pa.int64()),
        # mean 0-100 (gpt4score) or share judged correct; task_average: the mean of the per-type scores
        pa.field("score", pa.float64()),
        # 95% episode-level cluster bootstrap interval of score (whole episodes resampled, seeded); null
        # with one episode; task_average: episodes resampled within their type
        pa.field("ci_low", pa.float64()),
        pa.field("ci_high", pa.float64()),
        # 95% interval with items assumed independent: Wilson for a share, percentile bootstrap for a mean
        pa.field("iid_low", pa.float64()),
        pa.field("iid_high", pa.float64()),
        pa.field("reference", pa.string()),  # the method the test compares against; null: no test asked
        pa.field("paired", pa.int64()),  # questions both this method and the reference have a verdict on
        pa.field("only_reference", pa.int64()),  # of those, correct for the reference only (binary judges)
        pa.field("only_other", pa.int64()),  # correct for this method only (binary judges)
        # paired cluster permutation test against the reference over episodes, on the paired questions;
        # null for the reference itself and when the two agree on every paired question
        pa.field("p_value", pa.float64()),
        pa.field("mcnemar_p", pa.float64()),  # exact McNemar (binary judges), questions assumed independent
        # judge_answers.runs: independent runs of the judge per item (each item's value is its mean over
        # its runs); run_sd: the standard deviation (n - 1) across runs of the score each run alone gives,
        # as the mem0 paper's "+- s.d. of 10 runs"; null for one run
        pa.field("runs", pa.int64()),
        pa.field("run_sd", pa.float64()),
        pa.field("history_sources", pa.string()),  # memochat: what history the judge saw, with counts
        pa.field("skip_reasons", pa.string()),
        pa.field("judge_model", pa.string()),
        pa.field("prompt_fingerprint", pa.string()),
    ]
)

# TeaFarm as Theanine's Table 3: correct / total per method and dataset ("all": every dataset), with a
# 95% episode-level cluster bootstrap interval and a paired cluster test against the reference method
# on the same questions (Wilson and exact McNemar, which assume independent questions, beside them).
TEAFARM_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("method", pa.string()),
        pa.field("correct", pa.int64()),  # null with several judge runs (correctness: the mean share of runs)
        pa.field("total", pa.int64()),  # questions judged, a failed response among them scored wrong
        pa.field("episodes", pa.int64()),  # episodes those questions come from
        pa.field("correctness", pa.float64()),  # correct / total
        pa.field("ci_low", pa.float64()),  # 95% episode-level cluster bootstrap interval; null with one episode
        pa.field("ci_high", pa.float64()),
        pa.field("iid_low", pa.float64()),  # Wilson 95% interval: questions assumed independent
        pa.field("iid_high", pa.float64()),
        pa.field("failed", pa.int64()),  # no response (in total, scored wrong) or no verdict (not in total)
        pa.field("reference", pa.string()),
        pa.field("paired", pa.int64()),
        pa.field("only_reference", pa.int64()),
        pa.field("only_other", pa.int64()),
        pa.field("p_value", pa.float64()),  # paired cluster permutation test; null for the reference itself
        pa.field("mcnemar_p", pa.float64()),  # exact McNemar, questions assumed independent
        pa.field("judge_model", pa.string()),
        pa.field("prompt_fingerprint", pa.string()),
    ]
)


_QUESTION_KEY = ("dataset", "episode_id", "probe_id")
# Judges whose score is not a share judged correct: GPT4Score (0-100), LoCoMo's F1 (a mean F1).
NOT_SHARES = ("gpt4score", "f1")
_JUDGMENT_COLUMNS = {"episode_id": pl.String, "probe_id": pl.String, "category": pl.String, "skipped": pl.String,
                     "history_source": pl.String, "judge_model": pl.String, "prompt_fingerprint": pl.String,
                     "abstention": pl.Boolean, "judge_kind": pl.String}


# judge_answers' error on an item whose method gave no response (the judge was never asked).
NO_RESPONSE = "no response from "
_NO_RESPONSE = pl.col("error").fill_null("").str.starts_with(NO_RESPONSE) & pl.col("skipped").is_null()


def _judgment_columns(judgments: pl.DataFrame) -> pl.DataFrame:
    """Judgments with every column the summaries read (null where an older table lacks one), and a
    failed response scored wrong (0) by a correct / wrong judge, as the official scorers score the
    empty answer the export writes for it; it stays counted in `failed`. A 0-100 judge's failed
    response (gpt4score) has no score: it has no "wrong"."""
    j = judgments.with_columns([pl.lit(None, dtype=t).alias(c) for c, t in _JUDGMENT_COLUMNS.items()
                                if c not in judgments.columns])
    j = j.with_columns(pl.col("judge_kind").fill_null(pl.col("judge")))  # tables before panels: named by prompt
    return j.with_columns(pl.when(_NO_RESPONSE & ~pl.col("judge_kind").is_in(NOT_SHARES)).then(pl.lit(0.0))
                          .otherwise(pl.col("score").cast(pl.Float64)).alias("score"))


# A value the score counts: a verdict, or a failed response scored wrong.
_HAS_VERDICT = (pl.col("skipped").is_null() & pl.col("score").is_not_null()
                & (pl.col("error").is_null() | pl.col("error").fill_null("").str.starts_with(NO_RESPONSE)))
_ITEM_KEY = [*_QUESTION_KEY, "method", "judge"]


def judge_runs(judgments: pl.DataFrame) -> pl.DataFrame:
    """One row per item (question, method, judge) from the rows of the judge's runs
    (`judge_answers.runs`): the score is the mean over the runs with a verdict (for a correct /
    incorrect judge, the share of runs that judged it correct), the other columns those of the first
    run with a verdict; an item no run has a verdict on keeps its first run's row (skipped or failed).
    One run: the table as it is."""
    if judgments.is_empty() or "run" not in judgments.columns or not judgments["run"].max():
        return judgments
    ordered = [(~_HAS_VERDICT).alias("_no_verdict"), "run"]
    others = [c for c in judgments.columns if c not in (*_ITEM_KEY, "score")]
    return judgments.group_by(_ITEM_KEY, maintain_order=True).agg(
        pl.col("score").cast(pl.Float64).filter(_HAS_VERDICT).mean(),
        *[pl.col(c).sort_by(ordered).first() for c in others]).select(judgments.columns)


def _run_spread(rows: pl.DataFrame) -> tuple[int, float | None]:
    """(runs, s.d. across runs of each run's own score over its judged items) of one scope's raw rows."""
    if "run" not in rows.columns or rows.is_empty():
        return 1, None
    per_run = rows.filter(_HAS_VERDICT).group_by("run").agg(pl.col("score").cast(pl.Float64).mean())
    runs = max(rows["run"].n_unique(), 1)
    return runs, (as_float(per_run["score"].std()) if per_run.height > 1 else None)


def _binary(values: Sequence[float]) -> bool:
    """Whether every item's value is a plain 0 / 1 verdict (not a share over several judge runs)."""
    return all(v in (0.0, 1.0) for v in values)


def _with_verdict(rows: pl.DataFrame) -> pl.DataFrame:
    return rows.filter(_HAS_VERDICT)


def _episodes(rows: pl.DataFrame) -> list[tuple[str, str]]:
    """Each row's cluster: its (dataset, episode), so that pooled datasets never merge two episodes."""
    return list(zip(rows["dataset"].to_list(), rows["episode_id"].to_list()))


def _item_values(rows: pl.DataFrame) -> list[float]:
    """Each judged row's value: its score; for a correct / incorrect judge 1.0 / 0.0 (with several
    judge runs, the share of its runs that judged it correct)."""
    return rows["score"].cast(pl.Float64).to_list()


def _question_values(rows: pl.DataFrame) -> dict[tuple, float]:
    """Question -> its value (`_item_values`), over the rows with a verdict."""
    judged = _with_verdict(rows)
    return {tuple(r[k] for k in _QUESTION_KEY): v
            for r, v in zip(judged.select(_QUESTION_KEY).iter_rows(named=True), _item_values(judged))}


def _paired_test(method: str, rows: pl.DataFrame, reference: str | None, reference_rows: pl.DataFrame | None,
                 share: bool) -> dict[str, Any]:
    """The reference, the questions both have a verdict on and, over those, the paired cluster test
    (episodes as clusters) in `p_value`; for a share, the discordant counts and the exact McNemar p
    (questions assumed independent) too."""
    if reference is None or reference_rows is None:
        return {"reference": reference, "paired": None, "only_reference": None, "only_other": None, "p_value": None,
                "mcnemar_p": None}
    mine, theirs = _question_values(rows), _question_values(reference_rows)
    both = sorted(mine.keys() & theirs.keys())  # sorted: the test's random swaps see the same order every run
    itself = method == reference
    out = {"reference": reference, "paired": len(both), "only_reference": None, "only_other": None,
           "p_value": None if itself else paired_cluster_test([theirs[q] for q in both], [mine[q] for q in both],
                                                              [q[:2] for q in both]),
           "mcnemar_p": None}
    if share and _binary([*mine.values(), *theirs.values()]):  # McNemar counts plain verdicts, not shares of runs
        only_ref = sum(theirs[q] > mine[q] for q in both)
        only_other = sum(mine[q] > theirs[q] for q in both)
        out |= {"only_reference": only_ref, "only_other": only_other,
                "mcnemar_p": None if itself else mcnemar_exact(only_ref, only_other)}
    return out


def _dataset_scopes(judgments: pl.DataFrame) -> list[tuple[dict[str, Any], pl.DataFrame]]:
    """(dataset, category) scopes: each dataset, each of its categories, and every dataset pooled."""
    scopes = []
    for (dataset,), part in judgments.group_by(["dataset"], maintain_order=True):
        scopes.append(({"dataset": dataset, "category": None}, part))
        for (category,), sub in part.filter(pl.col("category").is_not_null()).group_by(["category"],
                                                                                       maintain_order=True):
            scopes.append(({"dataset": dataset, "category": category}, sub))
        # LongMemEval reports abstention questions (also counted in their own type) as a row of their own.
        abstaining = part.filter(pl.col("abstention").fill_null(False)) if "abstention" in part.columns else part.clear()
        if abstaining.height:
            scopes.append(({"dataset": dataset, "category": "abstention"}, abstaining))
    scopes.append(({"dataset": "all", "category": None}, judgments))
    return scopes


def _counted(values: list[str | None]) -> str | None:
    seen = sorted(Counter(v for v in values if v is not None).items())
    return ", ".join(f"{k} {n}" for k, n in seen) or None


TASK_AVERAGE = "task_average"


def task_average(values: Sequence[float], types: Sequence[str]) -> float | None:
    """LongMemEval's task-averaged accuracy (its print_qa_metrics.py): the mean over the question
    types of each type's mean value (`values[i]` of a question of type `types[i]`); None for none."""
    by_type: dict[str, list[float]] = {}
    for v, t in zip(values, types):
        by_type.setdefault(t, []).append(v)
    return sum(sum(v) / len(v) for v in by_type.values()) / len(by_type) if by_type else None


def _task_average_row(row: dict[str, Any], sub: pl.DataFrame, share: bool) -> dict[str, Any]:
    """The `task_average` row of one LongMemEval (method, judge) beside its overall `row`: the mean of
    the per-type scores (abstention questions counted in their own type, the "abstention" row not a
    type), with its cluster interval (episodes resampled within their type; a LongMemEval episode is
    one question, so this is also the iid stratified interval) and counts of the typed questions."""
    typed = sub.filter(pl.col("category").is_not_null())
    judged = _with_verdict(typed)
    values, types = _item_values(judged), judged["category"].to_list()
    low, high = cluster_bootstrap_interval(values, _episodes(judged), strata=types)
    iid_low, iid_high = cluster_bootstrap_interval(values, list(range(len(values))), strata=types)
    failed = typed.filter(pl.col("skipped").is_null() & (pl.col("error").is_not_null() | pl.col("score").is_null()))
    return {**row, "category": TASK_AVERAGE, "items": typed.height,
            "skipped": typed.filter(pl.col("skipped").is_not_null()).height, "failed": failed.height,
            "judged": judged.height, "episodes": len(set(_episodes(judged))), "correct": None,
            "score": task_average(values, types), "ci_low": low, "ci_high": high, "iid_low": iid_low,
            "iid_high": iid_high, "reference": None, "paired": None, "only_reference": None, "only_other": None,
            "p_value": None, "mcnemar_p": None}


def answer_summary(judgments: pl.DataFrame, reference: str | None = None) -> pl.DataFrame:
    """Per dataset (and pooled as "all"), category, method and judge: items, skipped, failed, judged,
    episodes, the mean score or share correct over the judged, its 95% episode-level cluster bootstrap
    interval (`ci_*`) and its iid interval (`iid_*`: Wilson for a share, bootstrap for a mean) and, with
    `reference` (the run's first method), the paired cluster test of each method against it
    (`p_value`) and, for the binary judges, the exact McNemar test (`mcnemar_p`). A LongMemEval
    dataset gets a `task_average` row per method and judge (LongMemEval's task-averaged accuracy)."""
    if judgments.is_empty():
        return empty(ANSWER_SUMMARY)
    raw = _judgment_columns(judgments)
    spreads = {(scope["dataset"], scope["category"], method, judge): _run_spread(sub)
               for scope, part in _dataset_scopes(raw)
               for (method, judge), sub in part.group_by(["method", "judge"], maintain_order=True)}
    j = judge_runs(raw)
    rows: list[dict[str, Any]] = []
    for scope, part in _dataset_scopes(j):
        for (judge,), by_judge in part.group_by(["judge"], maintain_order=True):
            methods = {m: sub for (m,), sub in by_judge.group_by(["method"], maintain_order=True)}
            share = by_judge["judge_kind"][0] not in NOT_SHARES
            for method, sub in methods.items():
                judged = _with_verdict(sub)
                skipped = sub.filter(pl.col("skipped").is_not_null()).height
                failed = sub.filter(pl.col("skipped").is_null() & (pl.col("error").is_not_null()
                                                                   | pl.col("score").is_null())).height
                values, episodes = _item_values(judged), _episodes(judged)
                low, high = cluster_bootstrap_interval(values, episodes)
                correct = int(sum(values)) if share and _binary(values) else None
                iid_low, iid_high = wilson_interval(correct, judged.height) if correct is not None \
                    else bootstrap_mean_interval(values)
                runs, run_sd = spreads[scope["dataset"], scope["category"], method, judge]
                row: dict[str, Any] = {**scope, "method": method, "judge": judge, "items": sub.height,
                                       "skipped": skipped, "failed": failed, "judged": judged.height,
                                       "episodes": len(set(episodes)), "correct": correct,
                                       "score": sum(values) / len(values) if values else None,
                                       "ci_low": low, "ci_high": high, "iid_low": iid_low, "iid_high": iid_high,
                                       **_paired_test(method, sub, reference,
                                                      methods.get(reference) if reference else None, share),
                                       "runs": runs, "run_sd": run_sd,
                                       "history_sources": _counted(sub["history_source"].to_list()),
                                       "skip_reasons": "; ".join(sorted({r for r in sub["skipped"].to_list() if r}))
                                       or None,
                                       "judge_model": next(iter(sub["judge_model"].drop_nulls().to_list()), None),
                                       "prompt_fingerprint": next(iter(sub["prompt_fingerprint"].drop_nulls()
                                                                       .to_list()), None)}
                rows.append(row)
                if scope["dataset"] == LONGMEMEVAL and scope["category"] is None:
                    rows.append(_task_average_row(row, sub, share))
    rows.sort(key=lambda r: (r["dataset"] == "all", r["dataset"], r["category"] is not None, r["category"] or "",
                             r["method"], r["judge"]))
    return from_table(pa.Table.from_pylist(rows, ANSWER_SUMMARY))


def teafarm_summary(judgments: pl.DataFrame, reference: str | None = None) -> pl.DataFrame:
    """Correct / total of the TeaFarm judge per dataset and method, and over every dataset ("all"),
    with `episodes`, a 95% episode-level cluster bootstrap interval (`ci_*`) beside the Wilson one
    (`iid_*`) and, with `reference` (the run's first method), the paired cluster test of each method
    against it on the questions both have a verdict on (`p_value`) beside the exact McNemar test
    (`mcnemar_p`). A failed response is in `total`, scored wrong, and counted in `failed`; an item
    the judge gave no verdict on is in `failed` only."""
    tf = judgments.filter(pl.col("judge") == "teafarm") if not judgments.is_empty() else judgments
    if tf.is_empty():
        return empty(TEAFARM_SUMMARY)
    tf = judge_runs(_judgment_columns(tf))
    rows: list[dict[str, Any]] = []
    for scope, part in [s for s in _dataset_scopes(tf) if s[0]["category"] is None]:
        methods = {m: sub for (m,), sub in part.group_by(["method"], maintain_order=True)}
        for method, sub in methods.items():
            judged = _with_verdict(sub)
            values, episodes = _item_values(judged), _episodes(judged)
            correct = int(sum(values)) if _binary(values) else None  # None: shares over several judge runs
            low, high = cluster_bootstrap_interval(values, episodes)
            iid_low, iid_high = wilson_interval(correct, judged.height) if correct is not None \
                else bootstrap_mean_interval(values)
            rows.append({"dataset": scope["dataset"], "method": method, "correct": correct, "total": judged.height,
                         "episodes": len(set(episodes)),
                         "correctness": sum(values) / judged.height if judged.height else None,
                         "ci_low": low, "ci_high": high, "iid_low": iid_low, "iid_high": iid_high,
                         "failed": sub.filter(pl.col("skipped").is_null() & (pl.col("error").is_not_null()
                                                                             | pl.col("score").is_null())).height,
                         **_paired_test(method, sub, reference, methods.get(reference) if reference else None, True),
                         "judge_model": next(iter(sub["judge_model"].drop_nulls().to_list()), None),
                         "prompt_fingerprint": next(iter(sub["prompt_fingerprint"].drop_nulls().to_list()), None)})
    rows.sort(key=lambda r: (r["dataset"] == "all", r["dataset"], r["method"]))
    return from_table(pa.Table.from_pylist(rows, TEAFARM_SUMMARY))


ANSWER_KEYS = pa.schema([
    pa.field("dataset", pa.string()),
    pa.field("method", pa.string()),
    pa.field("judge", pa.string()),
    pa.field("judged", pa.int64()),  # items with a verdict under the run's key
    pa.field("changed", pa.int64()),  # of those, judged against the dataset's gold too (the audit changed it)
    pa.field("audited", pa.float64()),  # the score against the audited key (the run's)
    pa.field("original", pa.float64()),  # the same answers against the dataset's own gold
])


def run_key_rows(judgments: pl.DataFrame) -> pl.DataFrame:
    """The judgments under the run's answer key: an audited run's extra rows against the dataset's own
    gold (`answer_key` original beside audited ones) left out, so no item counts twice."""
    if "answer_key" not in judgments.columns or not (judgments["answer_key"] == "audited").any():
        return judgments
    return judgments.filter(pl.col("answer_key") != "original")


def answer_keys(judgments: pl.DataFrame) -> pl.DataFrame:
    """Per dataset, method and judge of an audited run: the score against the audited key and against
    the dataset's own gold, side by side (the same answers; each item's runs averaged first), and how
    many items the audit changed. Empty for a run on the original key."""
    if judgments.is_empty() or "answer_key" not in judgments.columns or not (judgments["answer_key"] == "audited").any():
        return empty(ANSWER_KEYS)
    j = _judgment_columns(judgments.filter(pl.col("kind") != "teafarm"))
    audited = judge_runs(j.filter(pl.col("answer_key") != "original")).filter(_HAS_VERDICT)
    original = judge_runs(j.filter(pl.col("answer_key") == "original")).filter(_HAS_VERDICT)
    key = [*_QUESTION_KEY, "method", "judge"]
    under_original = pl.concat([audited.join(original.select(key), on=key, how="anti"), original], how="diagonal_relaxed")
    rows = []
    for (dataset, method, judge), sub in audited.group_by(["dataset", "method", "judge"], maintain_order=True):
        mine = under_original.filter((pl.col("dataset") == dataset) & (pl.col("method") == method)
                                     & (pl.col("judge") == judge))
        rows.append({"dataset": dataset, "method": method, "judge": judge, "judged": sub.height,
                     "changed": original.filter((pl.col("dataset") == dataset) & (pl.col("method") == method)
                                                & (pl.col("judge") == judge)).height,
                     "audited": as_float(sub["score"].mean()), "original": as_float(mine["score"].mean())})
    return from_table(pa.Table.from_pylist(rows, ANSWER_KEYS))
