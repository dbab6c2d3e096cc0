"""The report's score summaries: segmentation, retrieval, CREEM's memory ratings and the response
metrics, each aggregated per dataset and method with episode-level cluster bootstrap intervals."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from stages.metrics.retrieval import LONGMEMEVAL_MEASURES
from stages.metrics.segmentation import segment_score
from stages.metrics.significance import bootstrap_mean_interval, cluster_bootstrap_interval
from stages.report.frames import empty
from stages.scoring.response_metrics import BOUNDED_SCORES, GROUP_COLUMNS, RESPONSE_SCORES

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
        # LongMemEval's measures (stages/scoring/score.py): means over the questions that have gold.
        *(pa.field(name, pa.float64()) for name in LONGMEMEVAL_MEASURES),
    ]
)

# CREEM's memory-quality ratings per dataset, method and criterion; a rating is one (episode, speaker),
# so an episode's two speakers are resampled together.
MEMORY_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("method", pa.string()),
        pa.field("group", pa.string()),
        pa.field("criterion", pa.string()),
        pa.field("ratings", pa.int64()),  # (episode, speaker) ratings, each a mean over samples (then runs)
        pa.field("episodes", pa.int64()),
        pa.field("score", pa.float64()),  # mean of the ratings
        pa.field("score_low", pa.float64()),  # 95% episode-level cluster bootstrap interval; null with one episode
        pa.field("score_high", pa.float64()),
        pa.field("score_iid_low", pa.float64()),  # 95% percentile bootstrap, ratings assumed independent
        pa.field("score_iid_high", pa.float64()),
        pa.field("memory_truncated", pa.int64()),  # ratings whose memory was cut to the budget
        pa.field("dialogue_truncated", pa.int64()),  # ratings whose dialogue was cut to the budget
        # judge_memory.runs: independent runs of the judge per rating (each rating is its mean over its
        # runs, so the intervals are over ratings, never run rows); run_sd: the standard deviation (n - 1)
        # across runs of the score each run alone gives; null for one run
        pa.field("runs", pa.int64()),
        pa.field("run_sd", pa.float64()),
        pa.field("judge_model", pa.string()),
        pa.field("prompt_fingerprint", pa.string()),
    ]
)

# Reference metrics per dataset, probe kind and method: over every probe (category and session
# null), per category, and per session of next-response probes (LD-Agent's Table 1 is per session).
# Means are over responses, a failed one scoring 0.0 (words and distinct-n: over answered ones);
# `<mean>_low` / `_high` bound the main means (95% episode-level cluster bootstrap: whole episodes
# resampled; null with one episode), `<mean>_iid_low` / `_iid_high` the same with responses assumed
# independent (95% percentile bootstrap); `episodes` counts the episodes; `distinct{n}` is the mean
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
        pa.field("episodes", pa.int64()),  # episodes the responses come from
        pa.field("failed", pa.int64()),  # no response: 0.0 in the means
        *[pa.field(f, pa.float64()) for m in RESPONSE_SCORES
          for f in ([m, f"{m}_low", f"{m}_high", f"{m}_iid_low", f"{m}_iid_high"] if m in BOUNDED_SCORES else [m])],
        *[pa.field(name, pa.float64()) for name in GROUP_COLUMNS],
    ]
)


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
        *(pl.col(m).fill_nan(None).mean() for m in LONGMEMEVAL_MEASURES),
    ).sort(keys)


def memory_summary(judgments: pl.DataFrame) -> pl.DataFrame:
    """Mean 1-5 rating per dataset, method and criterion: the samples of each (episode, speaker)
    are averaged into one rating (with several judge runs: per run, then over the runs), the ratings
    averaged into the score, with the 95% episode-level cluster bootstrap interval of that mean (an
    episode's speakers resampled together; `score_*`) and the percentile bootstrap over ratings
    assumed independent (`score_iid_*`), both seeded; the ratings' episodes; how many ratings saw a
    cut memory or dialogue; and the runs' spread (`runs`, `run_sd`). A table without `run` is one run."""
    ok = judgments.filter(pl.col("score").is_not_null()) if not judgments.is_empty() else judgments
    if ok.is_empty():
        return empty(MEMORY_SUMMARY)
    if "run" not in ok.columns:
        ok = ok.with_columns(pl.lit(0).alias("run"))

    def cut(agg: pl.DataFrame) -> list[pl.Expr]:
        return [(pl.col(c).fill_null(False).any() if c in agg.columns else pl.lit(False)).alias(c)
                for c in ("memory_truncated", "dialogue_truncated")]

    stamp = [_first("judge_model").alias("judge_model"), _first("prompt_fingerprint").alias("prompt_fingerprint")]
    item = ["dataset", "episode_id", "method", "speaker", "group", "criterion"]
    keys = ["dataset", "method", "group", "criterion"]
    per_run = ok.group_by([*item, "run"]).agg(pl.col("score").cast(pl.Float64).mean(), *cut(ok), *stamp)
    per_rating = per_run.group_by(item).agg(pl.col("score").mean(), *cut(per_run), *stamp)
    spread = per_run.group_by([*keys, "run"]).agg(pl.col("score").mean()).group_by(keys).agg(
        pl.len().cast(pl.Int64).alias("runs"), pl.col("score").std(ddof=1).alias("run_sd"))
    out = per_rating.group_by(keys).agg(
        pl.len().alias("ratings"), pl.col("episode_id").n_unique().alias("episodes"),
        pl.col("score").mean().alias("mean"), pl.col("score").sort_by("episode_id", "speaker").alias("scores"),
        pl.col("episode_id").sort_by("episode_id", "speaker").alias("episode_ids"),
        pl.col("memory_truncated").cast(pl.Int64).sum(), pl.col("dialogue_truncated").cast(pl.Int64).sum(),
        _first("judge_model").alias("judge_model"), _first("prompt_fingerprint").alias("prompt_fingerprint"))
    clustered = [cluster_bootstrap_interval(v, e) for v, e in zip(out["scores"].to_list(), out["episode_ids"].to_list())]
    iid = [bootstrap_mean_interval(v) for v in out["scores"].to_list()]
    out = out.with_columns(pl.col("mean").alias("score"), pl.col("episodes").cast(pl.Int64),
                           *[pl.Series(name, [b[i] for b in bounds], dtype=pl.Float64)
                             for name, bounds, i in (("score_low", clustered, 0), ("score_high", clustered, 1),
                                                     ("score_iid_low", iid, 0), ("score_iid_high", iid, 1))])
    out = out.join(spread, on=keys, how="left").with_columns(
        pl.when(pl.col("runs") > 1).then(pl.col("run_sd")).otherwise(None).alias("run_sd"))
    return out.select(MEMORY_SUMMARY.names).sort(keys)


def metric_summary(metrics: pl.DataFrame, corpus: pl.DataFrame | None = None) -> pl.DataFrame:
    """METRIC_SUMMARY from response_metrics rows (one per probe and method) and, when given, the
    corpus_metrics rows of the same run (joined on dataset, kind, category, session and method). Each
    bounded mean gets its 95% episode-level cluster bootstrap interval (`<m>_low/_high`) and its
    bootstrap with responses assumed independent (`<m>_iid_low/_iid_high`)."""
    if metrics.is_empty():
        return empty(METRIC_SUMMARY)
    names = METRIC_SUMMARY.names
    corpus_cols, bounded, means = GROUP_COLUMNS, BOUNDED_SCORES, RESPONSE_SCORES
    aggs = [pl.len().cast(pl.Int64).alias("responses"), pl.col("episode_id").n_unique().cast(pl.Int64).alias("episodes"),
            pl.col("failed").sum().cast(pl.Int64).alias("failed"),
            *[pl.col(n).cast(pl.Float64).mean() for n in means],
            *[pl.col(n).cast(pl.Float64).drop_nulls().alias(f"{n}_values") for n in bounded],
            *[pl.col("episode_id").filter(pl.col(n).is_not_null()).alias(f"{n}_episodes") for n in bounded]]
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
        values = out[f"{n}_values"].to_list()
        clustered = [cluster_bootstrap_interval(v, e) for v, e in zip(values, out[f"{n}_episodes"].to_list())]
        iid = [bootstrap_mean_interval(v) for v in values]
        out = out.with_columns(*[pl.Series(name, [b[i] for b in bounds], dtype=pl.Float64)
                                 for name, bounds, i in ((f"{n}_low", clustered, 0), (f"{n}_high", clustered, 1),
                                                         (f"{n}_iid_low", iid, 0), (f"{n}_iid_high", iid, 1))])
    if corpus is not None and not corpus.is_empty():
        corpus = corpus.with_columns([pl.col(k).cast(t) for k, t in keys.items()])
        out = out.join(corpus.select([*keys, *corpus_cols]), on=list(keys), how="left", nulls_equal=True)
    out = out.with_columns([pl.lit(None, dtype=pl.Float64).alias(c) for c in corpus_cols if c not in out.columns])
    return out.select(names).sort(list(keys), nulls_last=False)
