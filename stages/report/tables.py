"""The report's summary tables: per-item scores and judgments aggregated per method, dataset,
category, criterion and session. Pure functions over polars frames; one schema per table."""

from __future__ import annotations

from typing import Any

import polars as pl
import pyarrow as pa

from stages.metrics.segmentation import segment_score
from stages.metrics.significance import majority, pair_outcome, win_rates

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
        pa.field("cost_usd", pa.float64()),
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

PAIRWISE_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("session_idx", pa.int32()),  # null: every session of the dataset
        pa.field("criterion", pa.string()),
        pa.field("reference", pa.string()),
        pa.field("other", pa.string()),
        pa.field("protocol", pa.string()),
        pa.field("pairs", pa.int64()),
        pa.field("wins", pa.int64()),  # pairs the reference won
        pa.field("ties", pa.int64()),
        pa.field("losses", pa.int64()),
        pa.field("win_rate", pa.float64()),
        pa.field("tie_rate", pa.float64()),
        pa.field("loss_rate", pa.float64()),
        pa.field("p_value", pa.float64()),  # two-sided sign test of wins vs losses
        pa.field("judge_model", pa.string()),
        pa.field("prompt_fingerprint", pa.string()),
    ]
)

ANSWER_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("category", pa.string()),  # null: every category
        pa.field("method", pa.string()),
        pa.field("judge", pa.string()),
        pa.field("items", pa.int64()),
        pa.field("failed", pa.int64()),
        pa.field("score", pa.float64()),  # mean 0-100 (gpt4score) or share correct
        pa.field("judge_model", pa.string()),
        pa.field("prompt_fingerprint", pa.string()),
    ]
)

# TeaFarm as Theanine's Table 3: correct / total per method and dataset ("all": every dataset).
TEAFARM_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("method", pa.string()),
        pa.field("correct", pa.int64()),
        pa.field("total", pa.int64()),  # questions judged
        pa.field("correctness", pa.float64()),  # correct / total
        pa.field("failed", pa.int64()),  # no response or no verdict: not in total
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
        pa.field("score", pa.float64()),
        pa.field("judge_model", pa.string()),
        pa.field("prompt_fingerprint", pa.string()),
    ]
)

METRIC_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("kind", pa.string()),
        pa.field("category", pa.string()),  # null: every category
        pa.field("method", pa.string()),
        pa.field("responses", pa.int64()),
        *[pa.field(m, pa.float64()) for m in ("bleu1", "bleu2", "bleu3", "bleu4", "rouge1", "rouge2", "rougeL",
                                             "token_f1", "locomo_f1", "bertscore", "distinct1", "distinct2",
                                             "distinct3", "words")],
    ]
)


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
    """Win / tie / loss of the reference per criterion, per dataset and per session. Samples of one
    order are reduced by majority vote, then the orders of a pair by `pair_outcome`."""
    ok = judgments.filter(pl.col("error").is_null()) if not judgments.is_empty() else judgments
    if ok.is_empty():
        return empty(PAIRWISE_SUMMARY)
    pair_keys = ["dataset", "episode_id", "probe_id", "session_idx", "criterion", "reference", "other", "protocol"]
    stamp = [_first("judge_model").alias("judge_model"), _first("prompt_fingerprint").alias("prompt_fingerprint")]
    per_order = ok.group_by([*pair_keys, "reference_first"]).agg(pl.col("preferred"), *stamp)
    per_order = per_order.with_columns(pl.Series("verdict", [majority(v) for v in per_order["preferred"].to_list()],
                                                 dtype=pl.String))
    pairs = per_order.group_by(pair_keys).agg(pl.col("verdict"), *stamp)
    pairs = pairs.with_columns(pl.Series("outcome", [pair_outcome(v) for v in pairs["verdict"].to_list()],
                                         dtype=pl.String))
    rows: list[dict[str, Any]] = []
    keys = ["dataset", "criterion", "reference", "other", "protocol"]
    for scope in (keys, [*keys, "session_idx"]):
        for key, part in pairs.group_by(scope, maintain_order=True):
            rows.append(dict(zip(scope, key)) | {"session_idx": dict(zip(scope, key)).get("session_idx")}
                        | win_rates(part["outcome"].to_list())
                        | {"judge_model": part["judge_model"][0], "prompt_fingerprint": part["prompt_fingerprint"][0]})
    out = pl.DataFrame(rows, schema_overrides={"p_value": pl.Float64, "win_rate": pl.Float64, "tie_rate": pl.Float64,
                                               "loss_rate": pl.Float64, "session_idx": pl.Int32})
    return out.sort(["dataset", "criterion", "other", "session_idx"], nulls_last=False)


def answer_summary(judgments: pl.DataFrame) -> pl.DataFrame:
    if judgments.is_empty():
        return empty(ANSWER_SUMMARY)
    aggs = [pl.len().alias("items"), pl.col("error").is_not_null().sum().alias("failed"),
            pl.col("score").mean().alias("score"), _first("judge_model").alias("judge_model"),
            _first("prompt_fingerprint").alias("prompt_fingerprint")]
    overall = judgments.group_by(["dataset", "method", "judge"]).agg(aggs).with_columns(
        pl.lit(None, dtype=pl.String).alias("category"))
    by_category = judgments.filter(pl.col("category").is_not_null()).group_by(
        ["dataset", "category", "method", "judge"]).agg(aggs)
    out = pl.concat([overall, by_category], how="diagonal")
    return out.sort(["dataset", "category", "method", "judge"], nulls_last=False)


def teafarm_summary(judgments: pl.DataFrame) -> pl.DataFrame:
    """Correct / total of the TeaFarm judge per dataset and method, and over every dataset."""
    tf = judgments.filter(pl.col("judge") == "teafarm") if not judgments.is_empty() else judgments
    if tf.is_empty():
        return empty(TEAFARM_SUMMARY)
    judged = pl.col("score").is_not_null() & pl.col("error").is_null()
    aggs = [(pl.col("score") == 1.0).filter(judged).sum().cast(pl.Int64).alias("correct"),
            judged.sum().cast(pl.Int64).alias("total"), (~judged).sum().cast(pl.Int64).alias("failed"),
            *[_first(c).alias(c) for c in ("judge_model", "prompt_fingerprint") if c in tf.columns]]
    per = tf.group_by(["dataset", "method"]).agg(aggs)
    overall = tf.group_by("method").agg(aggs).with_columns(pl.lit("all").alias("dataset"))
    out = pl.concat([per, overall.select(per.columns)])
    out = out.with_columns(pl.when(pl.col("total") > 0).then(pl.col("correct") / pl.col("total"))
                           .otherwise(None).alias("correctness"))
    order = pl.when(pl.col("dataset") == "all").then(1).otherwise(0)
    return out.sort([order, "dataset", "method"]).select([c for c in TEAFARM_SUMMARY.names if c in out.columns])


def memory_summary(judgments: pl.DataFrame) -> pl.DataFrame:
    ok = judgments.filter(pl.col("score").is_not_null()) if not judgments.is_empty() else judgments
    if ok.is_empty():
        return empty(MEMORY_SUMMARY)
    per_rating = ok.group_by(["dataset", "episode_id", "method", "speaker", "group", "criterion"]).agg(
        pl.col("score").cast(pl.Float64).mean(), _first("judge_model").alias("judge_model"),
        _first("prompt_fingerprint").alias("prompt_fingerprint"))
    return per_rating.group_by(["dataset", "method", "group", "criterion"]).agg(
        pl.len().alias("ratings"), pl.col("score").mean(), _first("judge_model").alias("judge_model"),
        _first("prompt_fingerprint").alias("prompt_fingerprint")).sort(["dataset", "method", "group", "criterion"])


def metric_summary(metrics: pl.DataFrame) -> pl.DataFrame:
    if metrics.is_empty():
        return empty(METRIC_SUMMARY)
    names = [f.name for f in METRIC_SUMMARY][5:]
    aggs = [pl.len().alias("responses"), *[pl.col(n).cast(pl.Float64).mean() for n in names]]
    overall = metrics.group_by(["dataset", "kind", "method"]).agg(aggs).with_columns(
        pl.lit(None, dtype=pl.String).alias("category"))
    by_category = metrics.filter(pl.col("category").is_not_null()).group_by(
        ["dataset", "kind", "category", "method"]).agg(aggs)
    return pl.concat([overall, by_category], how="diagonal").sort(["dataset", "kind", "category", "method"],
                                                                   nulls_last=False)


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
    cost = pl.DataFrame([{"method": m, **{k: u.get(k, 0) for k in ("calls", "cached_calls", "prompt_tokens",
                                                                   "completion_tokens", "cost_usd")}}
                         for m, u in usage.items()],
                        schema={"method": pl.String, "calls": pl.Int64, "cached_calls": pl.Int64,
                                "prompt_tokens": pl.Int64, "completion_tokens": pl.Int64, "cost_usd": pl.Float64})
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
