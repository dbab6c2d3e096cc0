"""The report's summary tables: per-item scores and judgments aggregated per method, dataset,
category, criterion and session. Pure functions over polars frames; one schema per table."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl
import pyarrow as pa

from pipeline.manifest import USAGE_TOTAL_KEYS
from pipeline.reproduction import PaperSheet, run_value, sheet_deviations
from stages.metrics.segmentation import segment_score
from stages.report.memory_accuracy import MEMORY_ACCURACY
from stages.metrics.significance import (bootstrap_mean_interval, majority, pair_outcome, wilson_interval, win_rates,
                                         win_share)

SEGMENTATION_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("sessions", pa.int64()),
        pa.field("pk", pa.float64()),
        pa.field("window_diff", pa.float64()),
        pa.field("f1", pa.float64()),
        pa.field("segment_score", pa.float64()),  # SeCom Eq. 3 on the mean Pk, WD and F1
        pa.field("fallback_sessions", pa.int64()),
    ]
)

RETRIEVAL_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("granularity", pa.string()),
        pa.field("compressed", pa.bool_()),
        pa.field("retriever", pa.string()),
        pa.field("k", pa.int32()),
        pa.field("questions", pa.int64()),
        pa.field("recall", pa.float64()),
        pa.field("dcg", pa.float64()),
    ]
)

# Cost beside quality, one row per method: what it spent (LLM calls and tokens of its memory and
# respond stages, memory in the context, response length) and how it scored.
METHOD_SUMMARY = pa.schema(
    [
        pa.field("method", pa.string()),
        pa.field("probes", pa.int64()),
        pa.field("failed", pa.int64()),
        pa.field("llm_calls", pa.int64()),
        pa.field("cached_calls", pa.int64()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("completion_tokens", pa.int64()),
        pa.field("cost_usd", pa.float64()),  # batch answers at the Batch API's discount
        pa.field("batch_calls", pa.int64()),  # of llm_calls, sent through the Batch API
        pa.field("mean_context_tokens", pa.float64()),
        pa.field("mean_context_turns", pa.float64()),
        pa.field("mean_response_words", pa.float64()),
        pa.field("gpt4score", pa.float64()),
        pa.field("strict_accuracy", pa.float64()),
        pa.field("lenient_accuracy", pa.float64()),
        pa.field("teafarm_correctness", pa.float64()),
        pa.field("token_f1", pa.float64()),
        pa.field("rougeL", pa.float64()),
        pa.field("memory_quality", pa.float64()),  # mean 1-5 over CREEM's criteria
    ]
)

# Head-to-head per dataset (and "all": every dataset pooled, as Theanine's Table 1 pools MSC and CC),
# criterion, opponent and session (null: every session).
PAIRWISE_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("session_idx", pa.int32()),  # null: every session of the dataset
        pa.field("criterion", pa.string()),
        pa.field("reference", pa.string()),
        pa.field("other", pa.string()),
        pa.field("protocol", pa.string()),
        pa.field("pairs", pa.int64()),  # pairs with a verdict (both_orders: both orders judged)
        pa.field("wins", pa.int64()),  # pairs the reference won
        pa.field("ties", pa.int64()),
        pa.field("losses", pa.int64()),
        pa.field("win_rate", pa.float64()),  # wins / pairs
        pa.field("tie_rate", pa.float64()),
        pa.field("loss_rate", pa.float64()),
        pa.field("win_share", pa.float64()),  # wins / (wins + losses): the rate over decided pairs
        pa.field("win_share_low", pa.float64()),  # Wilson 95% interval of win_share
        pa.field("win_share_high", pa.float64()),
        pa.field("p_value", pa.float64()),  # two-sided sign test of wins vs losses
        pa.field("incomplete", pa.int64()),  # both_orders pairs with one order missing: not in `pairs`
        pa.field("past_shown", pa.bool_()),  # the judge saw the earlier sessions
        pa.field("past_truncated", pa.int64()),  # pairs whose judge saw a cut past
        pa.field("judge_model", pa.string()),
        pa.field("prompt_fingerprint", pa.string()),
    ]
)

# Answers judged alone, per dataset ("all": every dataset pooled), category (null: every category),
# method and judge, with 95% intervals and, for the binary judges, an exact McNemar test of each
# method against the reference method on the questions both have a verdict on.
ANSWER_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("category", pa.string()),  # null: every category
        pa.field("method", pa.string()),
        pa.field("judge", pa.string()),
        pa.field("items", pa.int64()),  # (question, method) rows of this judge
        pa.field("skipped", pa.int64()),  # not judged by design (reasons in skip_reasons)
        pa.field("failed", pa.int64()),  # no response from the method or no verdict from the judge
        pa.field("judged", pa.int64()),  # items - skipped - failed: what score is over
        pa.field("correct", pa.int64()),  # judged correct; null for gpt4score
        pa.field("score", pa.float64()),  # mean 0-100 (gpt4score) or share judged correct
        # 95% interval of score: Wilson for a share, percentile bootstrap (seeded) for a gpt4score mean
        pa.field("ci_low", pa.float64()),
        pa.field("ci_high", pa.float64()),
        pa.field("reference", pa.string()),  # the method the test compares against; null: no test asked
        pa.field("paired", pa.int64()),  # questions both this method and the reference have a verdict on
        pa.field("only_reference", pa.int64()),  # of those, correct for the reference only
        pa.field("only_other", pa.int64()),  # correct for this method only
        pa.field("p_value", pa.float64()),  # exact McNemar (binary judges); null for the reference itself
        pa.field("history_sources", pa.string()),  # memochat: what history the judge saw, with counts
        pa.field("skip_reasons", pa.string()),
        pa.field("judge_model", pa.string()),
        pa.field("prompt_fingerprint", pa.string()),
    ]
)

# TeaFarm as Theanine's Table 3: correct / total per method and dataset ("all": every dataset), with a
# Wilson 95% interval and an exact McNemar test against the reference method on the same questions.
TEAFARM_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("method", pa.string()),
        pa.field("correct", pa.int64()),
        pa.field("total", pa.int64()),  # questions judged
        pa.field("correctness", pa.float64()),  # correct / total
        pa.field("ci_low", pa.float64()),  # Wilson 95% interval of correctness
        pa.field("ci_high", pa.float64()),
        pa.field("failed", pa.int64()),  # no response or no verdict: not in total
        pa.field("reference", pa.string()),
        pa.field("paired", pa.int64()),
        pa.field("only_reference", pa.int64()),
        pa.field("only_other", pa.int64()),
        pa.field("p_value", pa.float64()),  # exact McNemar; null for the reference itself
        pa.field("judge_model", pa.string()),
        pa.field("prompt_fingerprint", pa.string()),
    ]
)

MEMORY_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("method", pa.string()),
        pa.field("group", pa.string()),
        pa.field("criterion", pa.string()),
        pa.field("ratings", pa.int64()),  # (episode, speaker) ratings, each a mean over samples
        pa.field("score", pa.float64()),  # mean of the ratings
        pa.field("score_low", pa.float64()),  # 95% percentile bootstrap interval of that mean
        pa.field("score_high", pa.float64()),
        pa.field("memory_truncated", pa.int64()),  # ratings whose memory was cut to the budget
        pa.field("dialogue_truncated", pa.int64()),  # ratings whose dialogue was cut to the budget
        pa.field("judge_model", pa.string()),
        pa.field("prompt_fingerprint", pa.string()),
    ]
)

# Reference metrics per dataset, probe kind and method: over every probe (category and session
# null), per category, and per session of next-response probes (LD-Agent's Table 1 is per session).
# Means are over responses, a failed one scoring 0.0 (words and distinct-n: over answered ones);
# `<mean>_low` / `_high` bound the main means (95% percentile bootstrap); `distinct{n}` is the mean
# per-response statistic, `corpus_*` the corpus-level ones (response_metrics' corpus_metrics table:
# corpus BLEU as Hugging Face evaluate's "bleu", corpus distinct-n as RSum's DIST-n).
METRIC_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("kind", pa.string()),
        pa.field("category", pa.string()),  # null: every category
        pa.field("session_idx", pa.int32()),  # null: every session
        pa.field("method", pa.string()),
        pa.field("responses", pa.int64()),  # failed ones included
        pa.field("failed", pa.int64()),  # no response: 0.0 in the means
        *[pa.field(f, pa.float64()) for m in ("bleu1", "bleu2", "bleu3", "bleu4", "rouge1", "rouge2", "rougeL",
                                             "token_f1", "locomo_f1", "bertscore", "distinct1", "distinct2",
                                             "distinct3", "words")
          for f in ([m, f"{m}_low", f"{m}_high"] if m in ("token_f1", "rougeL", "bleu4", "locomo_f1") else [m])],
        *[pa.field(f"corpus_bleu{n}", pa.float64()) for n in (1, 2, 3, 4)],
        *[pa.field(f"corpus_distinct{n}", pa.float64()) for n in (1, 2, 3)],
    ]
)


# The run beside each paper it reproduces or is compared with (`paper:` sheets): per sheet, one
# `result` row per number of the paper's table (the run's value x scale, interval, n, or
# produced = false), then one `deviation` row per protocol setting where the run differs.
REPRODUCTION_SUMMARY = pa.schema(
    [
        pa.field("sheet", pa.string()),  # the sheet's title
        pa.field("origin", pa.string()),  # the config file whose `paper:` block it is
        pa.field("kind", pa.string()),  # result | deviation
        pa.field("name", pa.string()),  # the result's name, or the setting's dotted config path
        pa.field("source", pa.string()),  # where the paper states it ("Table 6", "Sec. 3.1")
        pa.field("paper", pa.float64()),  # result: the paper's number
        pa.field("run", pa.float64()),  # result: the run's number, scaled as the paper prints it
        pa.field("run_low", pa.float64()),
        pa.field("run_high", pa.float64()),
        pa.field("n", pa.int64()),
        pa.field("produced", pa.bool_()),  # result: the run wrote the row the sheet names
        pa.field("difference", pa.float64()),  # run - paper
        pa.field("looked_up", pa.string()),  # result: table, column, where and scale
        pa.field("paper_setting", pa.string()),  # deviation: the paper's value (JSON)
        pa.field("run_setting", pa.string()),  # deviation: the run's value (JSON)
    ]
)


def _looked_up(r: Any) -> str:
    where = ", ".join(f"{k}={'null' if v is None else v}" for k, v in r.where.items())
    return f"{r.table}.{r.column}" + (f" where {where}" if where else "") + (f" x {r.scale:g}" if r.scale != 1 else "")


def reproduction_summary(cfg: Any, sheets: Sequence[tuple[str, PaperSheet]],
                         produced: Mapping[str, Any]) -> pl.DataFrame:
    """`REPRODUCTION_SUMMARY` rows for each (origin, sheet): its results looked up in the run's
    report tables `produced` (name -> pyarrow or polars table; a table the run did not write makes
    the result `produced = false`), then the run's deviations from the sheet's protocol."""
    rows: list[dict[str, Any]] = []
    for origin, sheet in sheets:
        base = {"sheet": sheet.title, "origin": origin}
        for r in sheet.results:
            got = run_value(produced[r.table], r) if r.table in produced else None
            value = got.value if got is not None else None
            rows.append({**base, "kind": "result", "name": r.name, "source": r.source, "paper": r.paper,
                         "run": value, "run_low": got.low if got else None, "run_high": got.high if got else None,
                         "n": got.n if got else None, "produced": bool(got and got.produced),
                         "difference": None if value is None else value - r.paper, "looked_up": _looked_up(r)})
        for d in sheet_deviations(cfg, sheet, origin):
            rows.append({**base, "kind": "deviation", "name": d.path, "source": d.source,
                         "paper_setting": json.dumps(d.paper, default=str),
                         "run_setting": json.dumps(d.run, default=str)})
    return pl.from_arrow(pa.Table.from_pylist(rows, REPRODUCTION_SUMMARY))  # type: ignore[return-value]


# Every table the report writes, whatever the run's methods (methods' panels add their own).
SUMMARY_TABLES = {
    "segmentation_summary": SEGMENTATION_SUMMARY,
    "retrieval_summary": RETRIEVAL_SUMMARY,
    "method_summary": METHOD_SUMMARY,
    "pairwise_summary": PAIRWISE_SUMMARY,
    "answer_summary": ANSWER_SUMMARY,
    "memory_summary": MEMORY_SUMMARY,
    "metric_summary": METRIC_SUMMARY,
    "teafarm_summary": TEAFARM_SUMMARY,
    "memory_accuracy_summary": MEMORY_ACCURACY,  # RSum Table 2 (stages/report/memory_accuracy.py)
    "reproduction_summary": REPRODUCTION_SUMMARY,
}


def empty(schema: pa.Schema) -> pl.DataFrame:
    return pl.from_arrow(schema.empty_table())  # type: ignore[return-value]


def to_arrow(df: pl.DataFrame, schema: pa.Schema) -> pa.Table:
    if df.is_empty():
        return schema.empty_table()
    return df.select(schema.names).to_arrow().cast(schema)


def _first(col: str) -> pl.Expr:
    return pl.col(col).drop_nulls().first()


def segmentation_summary(scores: pl.DataFrame) -> pl.DataFrame:
    if scores.is_empty():
        return empty(SEGMENTATION_SUMMARY)
    out = scores.group_by("dataset").agg(
        pl.len().alias("sessions"), pl.col("pk").mean(), pl.col("window_diff").mean(), pl.col("f1").mean(),
        pl.col("fallback").sum().alias("fallback_sessions"),
    )
    out = out.with_columns(
        pl.struct(["pk", "window_diff", "f1"]).map_elements(
            lambda r: segment_score(r["pk"], r["window_diff"], r["f1"]), return_dtype=pl.Float64
        ).alias("segment_score")
    )
    return out.sort("dataset")


def retrieval_summary(scores: pl.DataFrame) -> pl.DataFrame:
    if scores.is_empty():
        return empty(RETRIEVAL_SUMMARY)
    keys = ["dataset", "granularity", "compressed", "retriever", "k"]
    return scores.group_by(keys).agg(
        pl.col("qa_id").n_unique().alias("questions"), pl.col("recall").fill_nan(None).mean(),
        pl.col("dcg").fill_nan(None).mean(),
    ).sort(keys)


def pairwise_summary(judgments: pl.DataFrame) -> pl.DataFrame:
    """Win / tie / loss of the reference per criterion and opponent, per dataset and per session,
    plus the same pooled over datasets (dataset "all", when the run holds more than one).

    A pair is one (probe, criterion, opponent). `both_orders`: the samples of each order are reduced
    by majority vote, then the two orders by `pair_outcome`; a pair with an order missing (its
    judgments failed) is counted in `incomplete` and not scored. Other protocols (`creem`, whose
    order is drawn per sample): the majority vote of every sample of the pair. `win_share` is
    wins / (wins + losses), the rate the papers report (over decided pairs), with its Wilson interval.
    """
    ok = judgments.filter(pl.col("error").is_null() & pl.col("preferred").is_not_null()) \
        if not judgments.is_empty() else judgments
    if ok.is_empty():
        return empty(PAIRWISE_SUMMARY)
    pair_keys = ("dataset", "episode_id", "probe_id", "session_idx", "criterion", "reference", "other", "protocol")
    pairs: dict[tuple, dict[str, Any]] = {}
    for r in ok.iter_rows(named=True):
        p = pairs.setdefault(tuple(r[k] for k in pair_keys), {"orders": {}, "past_shown": False,
                                                              "past_truncated": False, "stamp": {}})
        p["orders"].setdefault(r["reference_first"], []).append(r["preferred"])
        p["past_shown"] |= r.get("past_shown") is not None
        p["past_truncated"] |= bool(r.get("past_truncated"))
        for c in ("judge_model", "prompt_fingerprint"):
            if p["stamp"].get(c) is None:
                p["stamp"][c] = r.get(c)
    datasets = {key[0] for key in pairs}
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for key, p in pairs.items():
        k = dict(zip(pair_keys, key))
        if k["protocol"] == "both_orders":
            p["outcome"] = pair_outcome(majority(v) for v in p["orders"].values()) if len(p["orders"]) == 2 else None
        else:
            p["outcome"] = majority([v for votes in p["orders"].values() for v in votes])
        for dataset in (k["dataset"], "all") if len(datasets) > 1 else (k["dataset"],):
            for session in (None, k["session_idx"]):
                groups.setdefault((dataset, session, k["criterion"], k["reference"], k["other"], k["protocol"]),
                                  []).append(p)
    rows: list[dict[str, Any]] = []
    for (dataset, session, criterion, reference, other, protocol), part in groups.items():
        outcomes = [p["outcome"] for p in part if p["outcome"] is not None]
        rates = win_rates(outcomes)
        low, high = wilson_interval(rates["wins"], rates["wins"] + rates["losses"])
        rows.append({"dataset": dataset, "session_idx": session, "criterion": criterion, "reference": reference,
                     "other": other, "protocol": protocol, **rates,
                     "win_share": win_share(rates["wins"], rates["losses"]), "win_share_low": low,
                     "win_share_high": high, "incomplete": len(part) - len(outcomes),
                     "past_shown": any(p["past_shown"] for p in part),
                     "past_truncated": sum(p["past_truncated"] for p in part),
                     "judge_model": next((p["stamp"]["judge_model"] for p in part if p["stamp"]["judge_model"]), None),
                     "prompt_fingerprint": next((p["stamp"]["prompt_fingerprint"] for p in part
                                                 if p["stamp"]["prompt_fingerprint"]), None)})
    out = pl.from_arrow(pa.Table.from_pylist(rows, PAIRWISE_SUMMARY))
    pooled_last = pl.when(pl.col("dataset") == "all").then(1).otherwise(0)
    return out.sort([pooled_last, "dataset", "criterion", "other", "session_idx"], nulls_last=False)


_QUESTION_KEY = ("dataset", "episode_id", "probe_id")
_JUDGMENT_COLUMNS = {"episode_id": pl.String, "probe_id": pl.String, "category": pl.String, "skipped": pl.String,
                     "history_source": pl.String, "judge_model": pl.String, "prompt_fingerprint": pl.String,
                     "abstention": pl.Boolean}


def _judgment_columns(judgments: pl.DataFrame) -> pl.DataFrame:
    """Judgments with every column the summaries read (null where an older table lacks one)."""
    return judgments.with_columns([pl.lit(None, dtype=t).alias(c) for c, t in _JUDGMENT_COLUMNS.items()
                                   if c not in judgments.columns])


def _with_verdict(rows: pl.DataFrame) -> pl.DataFrame:
    return rows.filter(pl.col("error").is_null() & pl.col("skipped").is_null() & pl.col("score").is_not_null())


def _question_verdicts(rows: pl.DataFrame) -> dict[tuple, bool]:
    """Question -> judged correct, over the rows with a verdict."""
    return {tuple(r[k] for k in _QUESTION_KEY): r["score"] == 1.0 for r in _with_verdict(rows).iter_rows(named=True)}


def _paired_test(method: str, rows: pl.DataFrame, reference: str | None,
                 reference_rows: pl.DataFrame | None) -> dict[str, Any]:
    """The reference, the questions both have a verdict on, the discordant counts and the exact McNemar p."""
    if reference is None or reference_rows is None:
        return {"reference": reference, "paired": None, "only_reference": None, "only_other": None, "p_value": None}
    from stages.metrics.significance import mcnemar_exact  # here: the module's import line is shared

    mine, theirs = _question_verdicts(rows), _question_verdicts(reference_rows)
    both = mine.keys() & theirs.keys()
    only_ref = sum(theirs[q] and not mine[q] for q in both)
    only_other = sum(mine[q] and not theirs[q] for q in both)
    p = None if method == reference else mcnemar_exact(only_ref, only_other)
    return {"reference": reference, "paired": len(both), "only_reference": only_ref, "only_other": only_other,
            "p_value": p}


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


def answer_summary(judgments: pl.DataFrame, reference: str | None = None) -> pl.DataFrame:
    """Per dataset (and pooled as "all"), category, method and judge: items, skipped, failed, judged,
    the mean score or share correct over the judged, its 95% interval and, with `reference` (the run's
    first method), an exact McNemar test of each method against it for the binary judges."""
    if judgments.is_empty():
        return empty(ANSWER_SUMMARY)
    j = _judgment_columns(judgments)
    rows: list[dict[str, Any]] = []
    for scope, part in _dataset_scopes(j):
        for (judge,), by_judge in part.group_by(["judge"], maintain_order=True):
            methods = {m: sub for (m,), sub in by_judge.group_by(["method"], maintain_order=True)}
            for method, sub in methods.items():
                judged = _with_verdict(sub)
                skipped = sub.filter(pl.col("skipped").is_not_null()).height
                failed = sub.filter(pl.col("skipped").is_null() & (pl.col("error").is_not_null()
                                                                   | pl.col("score").is_null())).height
                row: dict[str, Any] = {**scope, "method": method, "judge": judge, "items": sub.height,
                                       "skipped": skipped, "failed": failed, "judged": judged.height}
                if judge == "gpt4score":
                    values = judged["score"].cast(pl.Float64).to_list()
                    low, high = bootstrap_mean_interval(values)
                    row |= {"correct": None, "score": sum(values) / len(values) if values else None,
                            "ci_low": low, "ci_high": high, "reference": None, "paired": None,
                            "only_reference": None, "only_other": None, "p_value": None}
                else:
                    correct = judged.filter(pl.col("score") == 1.0).height
                    low, high = wilson_interval(correct, judged.height)
                    row |= {"correct": correct, "score": correct / judged.height if judged.height else None,
                            "ci_low": low, "ci_high": high,
                            **_paired_test(method, sub, reference, methods.get(reference) if reference else None)}
                row |= {"history_sources": _counted(sub["history_source"].to_list()),
                        "skip_reasons": "; ".join(sorted({r for r in sub["skipped"].to_list() if r})) or None,
                        "judge_model": next(iter(sub["judge_model"].drop_nulls().to_list()), None),
                        "prompt_fingerprint": next(iter(sub["prompt_fingerprint"].drop_nulls().to_list()), None)}
                rows.append(row)
    rows.sort(key=lambda r: (r["dataset"] == "all", r["dataset"], r["category"] is not None, r["category"] or "",
                             r["method"], r["judge"]))
    return pl.from_arrow(pa.Table.from_pylist(rows, ANSWER_SUMMARY))  # type: ignore[return-value]


def teafarm_summary(judgments: pl.DataFrame, reference: str | None = None) -> pl.DataFrame:
    """Correct / total of the TeaFarm judge per dataset and method, and over every dataset ("all"),
    with a Wilson 95% interval and, with `reference` (the run's first method), an exact McNemar test
    of each method against it on the questions both have a verdict on. Failed rows are counted in
    `failed`, not in `total`."""
    tf = judgments.filter(pl.col("judge") == "teafarm") if not judgments.is_empty() else judgments
    if tf.is_empty():
        return empty(TEAFARM_SUMMARY)
    tf = _judgment_columns(tf)
    rows: list[dict[str, Any]] = []
    for scope, part in [s for s in _dataset_scopes(tf) if s[0]["category"] is None]:
        methods = {m: sub for (m,), sub in part.group_by(["method"], maintain_order=True)}
        for method, sub in methods.items():
            judged = _with_verdict(sub)
            correct = judged.filter(pl.col("score") == 1.0).height
            low, high = wilson_interval(correct, judged.height)
            rows.append({"dataset": scope["dataset"], "method": method, "correct": correct, "total": judged.height,
                         "correctness": correct / judged.height if judged.height else None,
                         "ci_low": low, "ci_high": high,
                         "failed": sub.filter(pl.col("skipped").is_null()).height - judged.height,
                         **_paired_test(method, sub, reference, methods.get(reference) if reference else None),
                         "judge_model": next(iter(sub["judge_model"].drop_nulls().to_list()), None),
                         "prompt_fingerprint": next(iter(sub["prompt_fingerprint"].drop_nulls().to_list()), None)})
    rows.sort(key=lambda r: (r["dataset"] == "all", r["dataset"], r["method"]))
    return pl.from_arrow(pa.Table.from_pylist(rows, TEAFARM_SUMMARY))  # type: ignore[return-value]


def memory_summary(judgments: pl.DataFrame) -> pl.DataFrame:
    """Mean 1-5 rating per dataset, method and criterion: the samples of each (episode, speaker)
    are averaged into one rating, the ratings averaged into the score, with a 95% percentile
    bootstrap interval of that mean (seeded) over the ratings; and how many ratings saw a cut
    memory or dialogue."""
    ok = judgments.filter(pl.col("score").is_not_null()) if not judgments.is_empty() else judgments
    if ok.is_empty():
        return empty(MEMORY_SUMMARY)
    cut = [(pl.col(c).fill_null(False).any() if c in ok.columns else pl.lit(False)).alias(c)
           for c in ("memory_truncated", "dialogue_truncated")]
    per_rating = ok.group_by(["dataset", "episode_id", "method", "speaker", "group", "criterion"]).agg(
        pl.col("score").cast(pl.Float64).mean(), *cut, _first("judge_model").alias("judge_model"),
        _first("prompt_fingerprint").alias("prompt_fingerprint"))
    keys = ["dataset", "method", "group", "criterion"]
    out = per_rating.group_by(keys).agg(
        pl.len().alias("ratings"), pl.col("score").mean().alias("mean"), pl.col("score").sort().alias("scores"),
        pl.col("memory_truncated").cast(pl.Int64).sum(), pl.col("dialogue_truncated").cast(pl.Int64).sum(),
        _first("judge_model").alias("judge_model"), _first("prompt_fingerprint").alias("prompt_fingerprint"))
    intervals = [bootstrap_mean_interval(v) for v in out["scores"].to_list()]
    out = out.with_columns(pl.col("mean").alias("score"),
                           pl.Series("score_low", [lo for lo, _ in intervals], dtype=pl.Float64),
                           pl.Series("score_high", [hi for _, hi in intervals], dtype=pl.Float64))
    return out.select(MEMORY_SUMMARY.names).sort(keys)


def metric_summary(metrics: pl.DataFrame, corpus: pl.DataFrame | None = None) -> pl.DataFrame:
    """METRIC_SUMMARY from response_metrics rows (one per probe and method) and, when given, the
    corpus_metrics rows of the same run (joined on dataset, kind, category, session and method)."""
    if metrics.is_empty():
        return empty(METRIC_SUMMARY)
    names = METRIC_SUMMARY.names
    corpus_cols = [n for n in names if n.startswith("corpus_")]
    bounded = [n.removesuffix("_low") for n in names if n.endswith("_low")]
    means = [n for n in names[names.index("failed") + 1:]
             if n not in corpus_cols and not n.endswith(("_low", "_high"))]
    aggs = [pl.len().cast(pl.Int64).alias("responses"), pl.col("failed").sum().cast(pl.Int64).alias("failed"),
            *[pl.col(n).cast(pl.Float64).mean() for n in means],
            *[pl.col(n).cast(pl.Float64).drop_nulls().alias(f"{n}_values") for n in bounded]]
    # Per session only for next-response probes: a question's session_idx is "after the whole history".
    scopes = [(["dataset", "kind", "method"], metrics),
              (["dataset", "kind", "category", "method"], metrics.filter(pl.col("category").is_not_null())),
              (["dataset", "kind", "session_idx", "method"], metrics.filter(pl.col("kind") == "next_response"))]
    out = pl.concat([frame.group_by(keys).agg(aggs) for keys, frame in scopes if not frame.is_empty()],
                    how="diagonal")
    keys = {"dataset": pl.String, "kind": pl.String, "category": pl.String, "session_idx": pl.Int32,
            "method": pl.String}
    out = out.with_columns([pl.col(k).cast(t) if k in out.columns else pl.lit(None, dtype=t).alias(k)
                            for k, t in keys.items()])
    for n in bounded:
        bounds = [bootstrap_mean_interval(v) for v in out[f"{n}_values"].to_list()]
        out = out.with_columns(pl.Series(f"{n}_low", [lo for lo, _ in bounds], dtype=pl.Float64),
                               pl.Series(f"{n}_high", [hi for _, hi in bounds], dtype=pl.Float64))
    if corpus is not None and not corpus.is_empty():
        corpus = corpus.with_columns([pl.col(k).cast(t) for k, t in keys.items()])
        out = out.join(corpus.select([*keys, *corpus_cols]), on=list(keys), how="left", nulls_equal=True)
    out = out.with_columns([pl.lit(None, dtype=pl.Float64).alias(c) for c in corpus_cols if c not in out.columns])
    return out.select(names).sort(list(keys), nulls_last=False)


def method_summary(responses: pl.DataFrame, usage: dict[str, dict[str, float]], answers: pl.DataFrame,
                   metrics: pl.DataFrame, memory: pl.DataFrame) -> pl.DataFrame:
    """One row per method: cost (usage: method -> summed LLM usage of its stages) beside quality."""
    if responses.is_empty():
        return empty(METHOD_SUMMARY)
    out = responses.group_by("method").agg(
        pl.len().alias("probes"), pl.col("error").is_not_null().sum().alias("failed"),
        pl.col("context_tokens").cast(pl.Float64).mean().alias("mean_context_tokens"),
        pl.col("context_turns").cast(pl.Float64).mean().alias("mean_context_turns"),
        pl.col("response").str.split(" ").list.len().cast(pl.Float64).mean().alias("mean_response_words"),
    )
    cost = pl.DataFrame([{"method": m, **{k: u.get(k, 0) for k in USAGE_TOTAL_KEYS}} for m, u in usage.items()],
                        schema={"method": pl.String, "calls": pl.Int64, "cached_calls": pl.Int64,
                                "prompt_tokens": pl.Int64, "completion_tokens": pl.Int64, "cost_usd": pl.Float64,
                                "batch_calls": pl.Int64})
    out = out.join(cost.rename({"calls": "llm_calls"}), on="method", how="left")
    if not answers.is_empty():
        judged = answers.group_by("method").agg(
            *[pl.col("score").filter(pl.col("judge") == j).mean().alias(name) for j, name in
              (("gpt4score", "gpt4score"), ("strict", "strict_accuracy"), ("lenient", "lenient_accuracy"),
               ("teafarm", "teafarm_correctness"))])
        out = out.join(judged, on="method", how="left")
    if not metrics.is_empty():
        out = out.join(metrics.group_by("method").agg(pl.col("token_f1").mean(), pl.col("rougeL").mean()),
                       on="method", how="left")
    if not memory.is_empty():
        out = out.join(memory.filter(pl.col("score").is_not_null()).group_by("method").agg(
            pl.col("score").cast(pl.Float64).mean().alias("memory_quality")), on="method", how="left")
    for f in METHOD_SUMMARY:
        if f.name not in out.columns:
            out = out.with_columns(pl.lit(None, dtype=pl.Float64).alias(f.name))
    return out.sort("method")
