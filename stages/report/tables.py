"""The report's summary tables: per-item scores and judgments aggregated per method, dataset,
category, criterion and session. Pure functions over polars frames; one schema per table.

Intervals and tests are cluster-aware first: the items of one episode (a conversation's questions,
its probes, its two speakers' memory ratings) are not independent, so every interval the report
shows first (`ci_low/ci_high`, `score_low/high`, `<metric>_low/_high`, `win_share_low/high`) is an
episode-level cluster bootstrap and `p_value` a paired cluster test against the reference, with
`episodes` beside the item count. The intervals and tests that treat items as independent stay as
extra columns named `*iid*`, `mcnemar_p` and `sign_p`."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl
import pyarrow as pa

from pipeline.corpus.longmemeval import DATASET as LONGMEMEVAL
from pipeline.llm.usage import SHARED, method_shares, stage_kind
from pipeline.manifest import USAGE_TOTAL_KEYS, Manifest
from pipeline.reproduction import PaperSheet, run_value, sheet_deviations
from stages.metrics.retrieval import LONGMEMEVAL_MEASURES
from stages.metrics.segmentation import segment_score
from stages.report.memory_accuracy import MEMORY_ACCURACY
from stages.response_metrics import BOUNDED_SCORES, GROUP_COLUMNS, RESPONSE_SCORES
from stages.scorers import scorer
from stages.metrics.significance import (bootstrap_mean_interval, cluster_bootstrap_interval, majority,
                                         mcnemar_exact, pair_outcome, paired_cluster_test, wilson_interval,
                                         win_rates, win_share)

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
        # LongMemEval's measures (stages/score.py): means over the questions that have gold.
        *(pa.field(name, pa.float64()) for name in LONGMEMEVAL_MEASURES),
    ]
)

# Cost beside quality per dataset, probe kind and method: what it spent (LLM calls and tokens of its
# memory and respond stages, memory in the context, response length) and how it scored. Rows labelled
# `all` pool every dataset, or every kind, of the run (only when it holds several). The stages' LLM
# usage is the whole run's, so the cost columns are filled on the whole-run row only (dataset and
# kind both the whole run's); memory quality rates a method's memory of an episode whatever the probe
# kind, so it sits on the rows of every kind (`all`, or the run's only kind).
METHOD_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),  # "all": every dataset of the run
        pa.field("kind", pa.string()),  # next_response | qa | teafarm; "all": every kind of the run
        pa.field("method", pa.string()),
        pa.field("probes", pa.int64()),
        pa.field("episodes", pa.int64()),  # the episodes those probes come from
        pa.field("failed", pa.int64()),
        pa.field("llm_calls", pa.int64()),  # the cost columns: on the whole-run row only
        pa.field("cached_calls", pa.int64()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("cached_prompt_tokens", pa.int64()),  # of prompt_tokens, served from the endpoint's prompt cache
        pa.field("completion_tokens", pa.int64()),
        pa.field("cost_usd", pa.float64()),  # batch answers at the Batch API's discount
        pa.field("batch_calls", pa.int64()),  # of llm_calls, sent through the Batch API
        pa.field("mean_context_tokens", pa.float64()),
        pa.field("mean_context_turns", pa.float64()),
        pa.field("mean_response_words", pa.float64()),  # whitespace words of the answered responses
        pa.field("gpt4score", pa.float64()),
        pa.field("strict_accuracy", pa.float64()),
        pa.field("lenient_accuracy", pa.float64()),
        pa.field("teafarm_correctness", pa.float64()),
        pa.field("token_f1", pa.float64()),
        pa.field("rougeL", pa.float64()),
        pa.field("memory_quality", pa.float64()),  # mean 1-5 over CREEM's criteria; on the rows of every kind
    ]
)

# Head-to-head per dataset (and "all": every dataset pooled, as Theanine's Table 1 pools MSC and CC),
# criterion, opponent and session (null: every session). Pairs are clustered by episode: the interval
# resamples whole episodes and `p_value` flips each episode's wins and losses together.
PAIRWISE_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("session_idx", pa.int32()),  # null: every session of the dataset
        pa.field("criterion", pa.string()),
        pa.field("reference", pa.string()),
        pa.field("other", pa.string()),
        pa.field("protocol", pa.string()),
        pa.field("pairs", pa.int64()),  # pairs with a verdict (both_orders: both orders judged)
        pa.field("episodes", pa.int64()),  # episodes those pairs come from
        pa.field("wins", pa.int64()),  # pairs the reference won
        pa.field("ties", pa.int64()),
        pa.field("losses", pa.int64()),
        pa.field("win_rate", pa.float64()),  # wins / pairs
        pa.field("tie_rate", pa.float64()),
        pa.field("loss_rate", pa.float64()),
        pa.field("win_share", pa.float64()),  # wins / (wins + losses): the rate over decided pairs
        pa.field("win_share_low", pa.float64()),  # 95% episode-level cluster bootstrap interval of win_share
        pa.field("win_share_high", pa.float64()),
        pa.field("win_share_iid_low", pa.float64()),  # Wilson 95% interval: pairs assumed independent
        pa.field("win_share_iid_high", pa.float64()),
        # paired cluster permutation test of wins vs losses: each episode's wins and losses swapped together
        pa.field("p_value", pa.float64()),
        pa.field("sign_p", pa.float64()),  # two-sided sign test of wins vs losses (SeCom A.4), pairs independent
        pa.field("incomplete", pa.int64()),  # both_orders pairs with one order missing: not in `pairs`
        pa.field("past_shown", pa.bool_()),  # the judge saw the earlier sessions
        pa.field("past_truncated", pa.int64()),  # pairs whose judge saw a cut past
        pa.field("judge_model", pa.string()),
        pa.field("prompt_fingerprint", pa.string()),
    ]
)

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
        pa.field("failed", pa.int64()),  # no response from the method or no verdict from the judge
        pa.field("judged", pa.int64()),  # items - skipped - failed: what score is over
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
        pa.field("total", pa.int64()),  # questions judged
        pa.field("episodes", pa.int64()),  # episodes those questions come from
        pa.field("correctness", pa.float64()),  # correct / total
        pa.field("ci_low", pa.float64()),  # 95% episode-level cluster bootstrap interval; null with one episode
        pa.field("ci_high", pa.float64()),
        pa.field("iid_low", pa.float64()),  # Wilson 95% interval: questions assumed independent
        pa.field("iid_high", pa.float64()),
        pa.field("failed", pa.int64()),  # no response or no verdict: not in total
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

# CREEM's memory-quality ratings per dataset, method and criterion; a rating is one (episode, speaker),
# so an episode's two speakers are resampled together.
MEMORY_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("method", pa.string()),
        pa.field("group", pa.string()),
        pa.field("criterion", pa.string()),
        pa.field("ratings", pa.int64()),  # (episode, speaker) ratings, each a mean over samples
        pa.field("episodes", pa.int64()),
        pa.field("score", pa.float64()),  # mean of the ratings
        pa.field("score_low", pa.float64()),  # 95% episode-level cluster bootstrap interval; null with one episode
        pa.field("score_high", pa.float64()),
        pa.field("score_iid_low", pa.float64()),  # 95% percentile bootstrap, ratings assumed independent
        pa.field("score_iid_high", pa.float64()),
        pa.field("memory_truncated", pa.int64()),  # ratings whose memory was cut to the budget
        pa.field("dialogue_truncated", pa.int64()),  # ratings whose dialogue was cut to the budget
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


# The run beside each paper it reproduces or is compared with (`paper:` sheets): per sheet, one
# `result` row per number of the paper's table (the run's value x scale, its cluster interval, n and
# episodes, or produced = false), then one `deviation` row per protocol setting where the run differs.
REPRODUCTION_SUMMARY = pa.schema(
    [
        pa.field("sheet", pa.string()),  # the sheet's title
        pa.field("origin", pa.string()),  # the config file whose `paper:` block it is
        pa.field("kind", pa.string()),  # result | deviation
        pa.field("name", pa.string()),  # the result's name, or the setting's dotted config path
        pa.field("source", pa.string()),  # where the paper states it ("Table 6", "Sec. 3.1")
        pa.field("paper", pa.float64()),  # result: the paper's number
        pa.field("run", pa.float64()),  # result: the run's number, scaled as the paper prints it
        pa.field("run_low", pa.float64()),  # the table's episode-level cluster interval, scaled
        pa.field("run_high", pa.float64()),
        pa.field("n", pa.int64()),
        pa.field("episodes", pa.int64()),  # the episodes behind n (null: the table has no `episodes`)
        pa.field("produced", pa.bool_()),  # result: the run wrote the row the sheet names
        pa.field("difference", pa.float64()),  # run - paper
        pa.field("looked_up", pa.string()),  # result: table, column, where and scale
        pa.field("scorer", pa.string()),  # result: the scorer that computed the column (stages/scorers.py)
        pa.field("paper_setting", pa.string()),  # deviation: the paper's value (JSON)
        pa.field("run_setting", pa.string()),  # deviation: the run's value (JSON)
    ]
)


def _looked_up(r: Any) -> str:
    where = ", ".join(f"{k}={'null' if v is None else v}" for k, v in r.where.items())
    return f"{r.table}.{r.column}" + (f" where {where}" if where else "") + (f" x {r.scale:g}" if r.scale != 1 else "")


def whole_run_scope(frame: pl.DataFrame) -> dict[str, Any]:
    """{"dataset": ..., "kind": ...} of the rows standing for the whole run: the value labelled `all`
    when the run pooled several, else the run's only one (None when there is no single one)."""
    scope = {}
    for col in ("dataset", "kind"):
        if col in frame.columns:
            values = set(frame[col].to_list())
            scope[col] = ALL if ALL in values else next(iter(values)) if len(values) == 1 else None
    return scope


def whole_run_rows(methods: pl.DataFrame) -> pl.DataFrame:
    """`method_summary`'s whole-run rows: one per method (the cost columns live there)."""
    out = methods
    for col, value in whole_run_scope(methods).items():
        out = out.filter(pl.col(col).is_null() if value is None else pl.col(col) == value)
    return out


def _whole_run_where(table: Any, result: Any) -> Any:
    """A `method_summary` result that names no `dataset` (or no `kind`) reads the whole-run row, as
    the table held a single pooled row per method before it was split by dataset and probe kind.
    Any other result: as is."""
    if result.table != "method_summary":
        return result
    frame = table if isinstance(table, pl.DataFrame) else pl.from_arrow(table)
    where = {**result.where, **{k: v for k, v in whole_run_scope(frame).items() if k not in result.where}}
    return result.model_copy(update={"where": where})


def reproduction_summary(cfg: Any, sheets: Sequence[tuple[str, PaperSheet]],
                         produced: Mapping[str, Any]) -> pl.DataFrame:
    """`REPRODUCTION_SUMMARY` rows for each (origin, sheet): its results looked up in the run's
    report tables `produced` (name -> pyarrow or polars table; a table the run did not write makes
    the result `produced = false`), then the run's deviations from the sheet's protocol."""
    rows: list[dict[str, Any]] = []
    for origin, sheet in sheets:
        base = {"sheet": sheet.title, "origin": origin}
        for r in sheet.results:
            r = _whole_run_where(produced[r.table], r) if r.table in produced else r
            got = run_value(produced[r.table], r) if r.table in produced else None
            value = got.value if got is not None else None
            rows.append({**base, "kind": "result", "name": r.name, "source": r.source, "paper": r.paper,
                         "run": value, "run_low": got.low if got else None, "run_high": got.high if got else None,
                         "n": got.n if got else None, "episodes": got.episodes if got else None,
                         "produced": bool(got and got.produced), "difference": None if value is None else value - r.paper,
                         "looked_up": _looked_up(r), "scorer": scorer(cfg, r)})
        for d in sheet_deviations(cfg, sheet, origin):
            rows.append({**base, "kind": "deviation", "name": d.path, "source": d.source,
                         "paper_setting": json.dumps(d.paper, default=str),
                         "run_setting": json.dumps(d.run, default=str)})
    return pl.from_arrow(pa.Table.from_pylist(rows, REPRODUCTION_SUMMARY))  # type: ignore[return-value]


# Where the money goes: one row per (stage, role, method) of every stage that fed the report (its
# inputs and, transitively, theirs: the report's `run_manifests`).
# `method` is the method the calls were made for (memory and respond: the stage's; a judge: the
# judged row's, head-to-head the non-reference one), SHARED for calls made for no one method. Where
# the manifest splits the role's cost by method (`Usage.cost_by_method`), each method gets its cost
# and a share of the calls, requests and tokens in proportion to it (hence floats); else the whole
# (stage, role) goes to the stage's method, or SHARED for a stage of no one method. cost_usd counts
# every call, cache replays included (as the manifests do); spent_usd is what this run paid
# (cost_usd less what the LLM cache saved).
COST_BREAKDOWN = pa.schema(
    [
        pa.field("stage", pa.string()),
        pa.field("stage_kind", pa.string()),  # memory | respond | judge | other: the per-method view's column
        pa.field("role", pa.string()),
        pa.field("model", pa.string()),
        pa.field("method", pa.string()),
        pa.field("calls", pa.float64()),  # answered calls, live or cached (one per text for embeddings)
        pa.field("requests", pa.float64()),  # chat requests sent fresh to the endpoint
        pa.field("prompt_tokens", pa.float64()),
        pa.field("cached_prompt_tokens", pa.float64()),  # of prompt_tokens, served from the prompt cache
        pa.field("completion_tokens", pa.float64()),
        pa.field("cost_usd", pa.float64()),
        pa.field("spent_usd", pa.float64()),
    ]
)

# Every table the report writes, whatever the run's methods (methods' panels add their own).
SUMMARY_TABLES = {
    "segmentation_summary": SEGMENTATION_SUMMARY,
    "retrieval_summary": RETRIEVAL_SUMMARY,
    "method_summary": METHOD_SUMMARY,
    "cost_breakdown": COST_BREAKDOWN,
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
        *(pl.col(m).fill_nan(None).mean() for m in LONGMEMEVAL_MEASURES),
    ).sort(keys)


_PAIR_KEYS = ("dataset", "episode_id", "probe_id", "session_idx", "criterion", "reference", "other", "protocol")


def pair_outcomes(judgments: pl.DataFrame) -> dict[tuple, dict[str, Any]]:
    """Each pair (probe, criterion, opponent; keyed by `_PAIR_KEYS`) of head-to-head judgments with
    its `outcome` ("reference", "other", "tie"; None when a both_orders pair lacks an order), its
    `episode` ((dataset, episode_id): its cluster), whether the judge saw the past, a cut past, and
    its judge stamp. `both_orders`: the samples of each order are reduced by majority vote, then
    the two orders by `pair_outcome`; other protocols (`creem`): the majority of every sample."""
    ok = judgments.filter(pl.col("error").is_null() & pl.col("preferred").is_not_null()) \
        if not judgments.is_empty() else judgments
    pairs: dict[tuple, dict[str, Any]] = {}
    for r in ok.iter_rows(named=True):
        p = pairs.setdefault(tuple(r[k] for k in _PAIR_KEYS), {"orders": {}, "past_shown": False,
                                                               "past_truncated": False, "stamp": {},
                                                               "episode": (r["dataset"], r["episode_id"])})
        p["orders"].setdefault(r["reference_first"], []).append(r["preferred"])
        p["past_shown"] |= r.get("past_shown") is not None
        p["past_truncated"] |= bool(r.get("past_truncated"))
        for c in ("judge_model", "prompt_fingerprint"):
            if p["stamp"].get(c) is None:
                p["stamp"][c] = r.get(c)
    for key, p in pairs.items():
        if dict(zip(_PAIR_KEYS, key))["protocol"] == "both_orders":
            p["outcome"] = pair_outcome(majority(v) for v in p["orders"].values()) if len(p["orders"]) == 2 else None
        else:
            p["outcome"] = majority([v for votes in p["orders"].values() for v in votes])
    return pairs


def pairwise_summary(judgments: pl.DataFrame) -> pl.DataFrame:
    """Win / tie / loss of the reference per criterion and opponent, per dataset and per session,
    plus the same pooled over datasets (dataset "all", when the run holds more than one).

    A pair is one (probe, criterion, opponent), reduced to its outcome by `pair_outcomes`; a
    both_orders pair with an order missing (its judgments failed) is counted in `incomplete` and not
    scored. `win_share` is wins / (wins + losses), the rate the papers report (over decided pairs),
    with its episode-level cluster bootstrap interval (the decided pairs of an episode resampled
    together) and its Wilson interval (`win_share_iid_*`); `p_value` is the paired cluster
    permutation test of wins against losses over episodes, `sign_p` the sign test over pairs.
    """
    pairs = pair_outcomes(judgments)
    if not pairs:
        return empty(PAIRWISE_SUMMARY)
    datasets = {key[0] for key in pairs}
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for key, p in pairs.items():
        k = dict(zip(_PAIR_KEYS, key))
        for dataset in (k["dataset"], "all") if len(datasets) > 1 else (k["dataset"],):
            for session in (None, k["session_idx"]):
                groups.setdefault((dataset, session, k["criterion"], k["reference"], k["other"], k["protocol"]),
                                  []).append(p)
    rows: list[dict[str, Any]] = []
    for (dataset, session, criterion, reference, other, protocol), part in groups.items():
        scored = [p for p in part if p["outcome"] is not None]
        rates = win_rates([p["outcome"] for p in scored])
        low, high = _share_interval(scored, "reference")
        iid_low, iid_high = wilson_interval(rates["wins"], rates["wins"] + rates["losses"])
        # Per pair: did the reference win, did the other; a tie is 0 for both and moves nothing.
        test = paired_cluster_test([float(p["outcome"] == "reference") for p in scored],
                                   [float(p["outcome"] == "other") for p in scored], [p["episode"] for p in scored])
        rows.append({"dataset": dataset, "session_idx": session, "criterion": criterion, "reference": reference,
                     "other": other, "protocol": protocol, **rates, "sign_p": rates["p_value"], "p_value": test,
                     "episodes": len({p["episode"] for p in scored}),
                     "win_share": win_share(rates["wins"], rates["losses"]), "win_share_low": low,
                     "win_share_high": high, "win_share_iid_low": iid_low, "win_share_iid_high": iid_high,
                     "incomplete": len(part) - len(scored),
                     "past_shown": any(p["past_shown"] for p in part),
                     "past_truncated": sum(p["past_truncated"] for p in part),
                     "judge_model": next((p["stamp"]["judge_model"] for p in part if p["stamp"]["judge_model"]), None),
                     "prompt_fingerprint": next((p["stamp"]["prompt_fingerprint"] for p in part
                                                 if p["stamp"]["prompt_fingerprint"]), None)})
    out = pl.from_arrow(pa.Table.from_pylist(rows, PAIRWISE_SUMMARY))
    pooled_last = pl.when(pl.col("dataset") == "all").then(1).otherwise(0)
    return out.sort([pooled_last, "dataset", "criterion", "other", "session_idx"], nulls_last=False)


def _share_interval(scored: list[dict[str, Any]], winner: str) -> tuple[float | None, float | None]:
    """The cluster bootstrap interval of `winner`'s share of the decided pairs (ties left out)."""
    decided = [p for p in scored if p["outcome"] != "tie"]
    return cluster_bootstrap_interval([float(p["outcome"] == winner) for p in decided],
                                      [p["episode"] for p in decided])


# The leaderboard's head-to-head column: each method's share of the decided pairs against the
# reference over a whole dataset ("all" when the run holds several), every criterion and session pooled.
POOLED_WIN_SHARES = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("reference", pa.string()),
        pa.field("other", pa.string()),
        pa.field("pairs", pa.int64()),  # scored pairs, every criterion
        pa.field("episodes", pa.int64()),
        pa.field("won", pa.int64()),  # pairs the other method won
        pa.field("lost", pa.int64()),
        pa.field("share", pa.float64()),  # won / (won + lost); null: ties only
        pa.field("share_low", pa.float64()),  # 95% episode-level cluster bootstrap interval
        pa.field("share_high", pa.float64()),
    ]
)


def pooled_win_shares(judgments: pl.DataFrame) -> pl.DataFrame:
    """POOLED_WIN_SHARES from the head-to-head judgments: per opponent, its share of the decided pairs
    against the reference over the whole run (dataset "all" when it holds several datasets), every
    criterion and session pooled, with the episode-level cluster bootstrap interval of that share
    (all the pairs of an episode, whatever their criterion, resampled together)."""
    pairs = pair_outcomes(judgments)
    datasets = {key[0] for key in pairs}
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for key, p in pairs.items():
        k = dict(zip(_PAIR_KEYS, key))
        if p["outcome"] is not None:
            groups.setdefault(("all" if len(datasets) > 1 else k["dataset"], k["reference"], k["other"]),
                              []).append(p)
    rows = []
    for (dataset, reference, other), scored in groups.items():
        won, lost = (sum(p["outcome"] == w for p in scored) for w in ("other", "reference"))
        low, high = _share_interval(scored, "other")
        rows.append({"dataset": dataset, "reference": reference, "other": other, "pairs": len(scored),
                     "episodes": len({p["episode"] for p in scored}), "won": won, "lost": lost,
                     "share": won / (won + lost) if won + lost else None, "share_low": low, "share_high": high})
    return pl.from_arrow(pa.Table.from_pylist(rows, POOLED_WIN_SHARES)).sort(  # type: ignore[union-attr]
        ["dataset", "reference", "other"])


_QUESTION_KEY = ("dataset", "episode_id", "probe_id")
_JUDGMENT_COLUMNS = {"episode_id": pl.String, "probe_id": pl.String, "category": pl.String, "skipped": pl.String,
                     "history_source": pl.String, "judge_model": pl.String, "prompt_fingerprint": pl.String,
                     "abstention": pl.Boolean}


def _judgment_columns(judgments: pl.DataFrame) -> pl.DataFrame:
    """Judgments with every column the summaries read (null where an older table lacks one)."""
    return judgments.with_columns([pl.lit(None, dtype=t).alias(c) for c, t in _JUDGMENT_COLUMNS.items()
                                   if c not in judgments.columns])


_HAS_VERDICT = pl.col("error").is_null() & pl.col("skipped").is_null() & pl.col("score").is_not_null()
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
    return runs, (float(per_run["score"].std()) if per_run.height > 1 else None)


def _binary(values: Sequence[float]) -> bool:
    """Whether every item's value is a plain 0 / 1 verdict (not a share over several judge runs)."""
    return all(v in (0.0, 1.0) for v in values)


def _with_verdict(rows: pl.DataFrame) -> pl.DataFrame:
    return rows.filter(pl.col("error").is_null() & pl.col("skipped").is_null() & pl.col("score").is_not_null())


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
            share = judge != "gpt4score"
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
    return pl.from_arrow(pa.Table.from_pylist(rows, ANSWER_SUMMARY))  # type: ignore[return-value]


def teafarm_summary(judgments: pl.DataFrame, reference: str | None = None) -> pl.DataFrame:
    """Correct / total of the TeaFarm judge per dataset and method, and over every dataset ("all"),
    with `episodes`, a 95% episode-level cluster bootstrap interval (`ci_*`) beside the Wilson one
    (`iid_*`) and, with `reference` (the run's first method), the paired cluster test of each method
    against it on the questions both have a verdict on (`p_value`) beside the exact McNemar test
    (`mcnemar_p`). Failed rows are counted in `failed`, not in `total`."""
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
                         "failed": sub.filter(pl.col("skipped").is_null()).height - judged.height,
                         **_paired_test(method, sub, reference, methods.get(reference) if reference else None, True),
                         "judge_model": next(iter(sub["judge_model"].drop_nulls().to_list()), None),
                         "prompt_fingerprint": next(iter(sub["prompt_fingerprint"].drop_nulls().to_list()), None)})
    rows.sort(key=lambda r: (r["dataset"] == "all", r["dataset"], r["method"]))
    return pl.from_arrow(pa.Table.from_pylist(rows, TEAFARM_SUMMARY))  # type: ignore[return-value]


def memory_summary(judgments: pl.DataFrame) -> pl.DataFrame:
    """Mean 1-5 rating per dataset, method and criterion: the samples of each (episode, speaker)
    are averaged into one rating, the ratings averaged into the score, with the 95% episode-level
    cluster bootstrap interval of that mean (an episode's speakers resampled together; `score_*`) and
    the percentile bootstrap over ratings assumed independent (`score_iid_*`), both seeded; the
    ratings' episodes; and how many ratings saw a cut memory or dialogue."""
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


ALL = "all"  # the label of a row that pools every dataset, or every probe kind, of the run
# A probe's kind from its id (stages/probes.py: "nr:...", "qa:...", "tf:..."), for a response that
# no scored or judged row names.
_KIND_OF_PREFIX = {"nr": "next_response", "qa": "qa", "tf": "teafarm"}
_COST_COLUMNS = ("llm_calls", "cached_calls", "prompt_tokens", "cached_prompt_tokens", "completion_tokens",
                 "cost_usd", "batch_calls")
# What `method_summary` sums per method over its stages' roles (the report's `stage_usage`).
USAGE_KEYS = (*USAGE_TOTAL_KEYS, "cached_prompt_tokens")


def _named(frames: Sequence[pl.DataFrame], keys: list[str], columns: list[str]) -> pl.DataFrame | None:
    """`keys` -> `columns` from every frame that has them (the first frame naming a key wins)."""
    parts = [f.select(*keys, *columns).with_columns([pl.col(c).cast(pl.String) for c in columns])
             for f in frames if not f.is_empty() and set(keys) | set(columns) <= set(f.columns)]
    return pl.concat(parts).drop_nulls(columns).unique(keys, keep="first", maintain_order=True) if parts else None


def _labelled(responses: pl.DataFrame, probes: Sequence[pl.DataFrame], episodes: Sequence[pl.DataFrame]) -> pl.DataFrame:
    """`responses` with each probe's `dataset` and `kind`: as the scored and judged rows of the probe
    name them (`probes`: frames keyed by episode and probe), else the kind from the probe id and the
    dataset from another row of its episode (`episodes`); null when nothing names it."""
    keys = ["episode_id", "probe_id"]
    out = responses.drop([c for c in ("dataset", "kind") if c in responses.columns])
    named = _named(probes, keys, ["dataset", "kind"])
    out = out.join(named, on=keys, how="left") if named is not None else \
        out.with_columns(pl.lit(None, pl.String).alias("dataset"), pl.lit(None, pl.String).alias("kind"))
    by_episode = _named(episodes, ["episode_id"], ["dataset"])
    if by_episode is not None:
        out = out.join(by_episode.rename({"dataset": "_dataset"}), on="episode_id", how="left").with_columns(
            pl.coalesce("dataset", "_dataset").alias("dataset")).drop("_dataset")
    return out.with_columns(pl.coalesce("kind", _kind_from_id()).alias("kind"))


def _kind_from_id() -> pl.Expr:
    return pl.col("probe_id").cast(pl.String).str.split(":").list.first().replace_strict(
        _KIND_OF_PREFIX, default=None, return_dtype=pl.String)


def method_summary(responses: pl.DataFrame, usage: dict[str, dict[str, float]], answers: pl.DataFrame,
                   metrics: pl.DataFrame, memory: pl.DataFrame) -> pl.DataFrame:
    """Cost beside quality per method, dataset and probe kind, never pooled silently: a row per
    (dataset, kind, method) the run's responses hold, plus rows labelled `all` that pool every dataset
    (when the run holds several) and every kind (likewise), so a run of one dataset and one kind has
    one row per method. usage: method -> the LLM usage of its memory and respond stages over the whole
    run, on the whole-run row only; the judges' means (answers), token F1 and ROUGE-L (metrics) over
    each row's own probes; memory quality (memory: per episode, whatever the kind) on the rows of every
    kind. Words: whitespace words of the answered responses."""
    if responses.is_empty():
        return empty(METHOD_SUMMARY)
    answers, metrics = [f if f.is_empty() or "kind" in f.columns else f.with_columns(_kind_from_id().alias("kind"))
                        for f in (answers, metrics)]  # an older table without `kind`
    r = _labelled(responses, [answers, metrics], [answers, metrics, memory])
    datasets, kinds = r["dataset"].unique().to_list(), r["kind"].unique().to_list()
    whole_dataset = ALL if len(datasets) > 1 else datasets[0]
    whole_kind = ALL if len(kinds) > 1 else kinds[0]

    def scoped(df: pl.DataFrame) -> pl.DataFrame:
        """`df` once per scope its rows fall in: their own dataset and kind, and the pooled ones."""
        df = df.with_columns(pl.col("dataset").cast(pl.String), pl.col("kind").cast(pl.String),
                             pl.concat_str([pl.col("dataset").fill_null(""), pl.col("episode_id")],
                                           separator="\x1f").alias("_episode"))
        frames = [df]
        if len(datasets) > 1:
            frames.append(df.with_columns(pl.lit(ALL).alias("dataset")))
        if len(kinds) > 1:
            frames += [f.with_columns(pl.lit(ALL).alias("kind")) for f in frames]
        return pl.concat(frames)

    keys = ["dataset", "kind", "method"]
    answered = pl.col("error").is_null()
    out = scoped(r).group_by(keys).agg(
        pl.len().cast(pl.Int64).alias("probes"), pl.col("_episode").n_unique().cast(pl.Int64).alias("episodes"),
        (~answered).sum().cast(pl.Int64).alias("failed"),
        pl.col("context_tokens").cast(pl.Float64).mean().alias("mean_context_tokens"),
        pl.col("context_turns").cast(pl.Float64).mean().alias("mean_context_turns"),
        # whitespace words, as response_metrics counts them (str.split()), of the answered responses
        pl.col("response").cast(pl.String).filter(answered).str.extract_all(r"\S+").list.len()
        .cast(pl.Float64).mean().alias("mean_response_words"),
    )
    cost = pl.DataFrame([{"method": m, **{k: u.get(k, 0) for k in USAGE_KEYS}} for m, u in usage.items()],
                        schema={"method": pl.String, "calls": pl.Int64, "cached_calls": pl.Int64,
                                "prompt_tokens": pl.Int64, "completion_tokens": pl.Int64, "cost_usd": pl.Float64,
                                "batch_calls": pl.Int64, "cached_prompt_tokens": pl.Int64})
    cost = cost.rename({"calls": "llm_calls"}).with_columns(pl.lit(whole_dataset, pl.String).alias("dataset"),
                                                              pl.lit(whole_kind, pl.String).alias("kind"))
    parts = [cost]
    if not answers.is_empty():
        parts.append(scoped(answers).group_by(keys).agg(
            *[pl.col("score").cast(pl.Float64).filter(pl.col("judge") == j).mean().alias(name) for j, name in
              (("gpt4score", "gpt4score"), ("strict", "strict_accuracy"), ("lenient", "lenient_accuracy"),
               ("teafarm", "teafarm_correctness"))]))
    if not metrics.is_empty():
        parts.append(scoped(metrics).group_by(keys).agg(pl.col("token_f1").cast(pl.Float64).mean(),
                                                       pl.col("rougeL").cast(pl.Float64).mean()))
    if not memory.is_empty():
        rated = memory.filter(pl.col("score").is_not_null()).with_columns(pl.lit(whole_kind, pl.String).alias("kind"))
        if len(datasets) > 1:
            rated = pl.concat([rated, rated.with_columns(pl.lit(ALL).alias("dataset"))], how="diagonal_relaxed")
        parts.append(rated.group_by(keys).agg(pl.col("score").cast(pl.Float64).mean().alias("memory_quality")))
    for part in parts:
        out = out.join(part, on=keys, how="left", nulls_equal=True)
    out = out.with_columns([pl.lit(None, dtype=pl.Float64).alias(f.name) for f in METHOD_SUMMARY
                            if f.name not in out.columns])
    pooled = [pl.col("dataset") == ALL, "dataset", pl.col("kind") == ALL, "kind", "method"]
    return out.sort(pooled, nulls_last=False).select(METHOD_SUMMARY.names)


def cost_breakdown(manifests: Mapping[str, Manifest], owners: Mapping[str, str]) -> pl.DataFrame:
    """COST_BREAKDOWN from the stages' manifests (stage -> manifest; those without LLM usage add no
    row). owners: stage -> the method it is built for (memory_<m>, respond_<m>); absent: none."""
    rows: list[dict[str, Any]] = []
    for stage, m in manifests.items():
        owner = owners.get(stage, "")
        for role, u in sorted((m.llm_usage or {}).items()):
            shares = method_shares(u.cost_by_method, owner)
            # The cache's savings split by their own record where there is one, else like the cost.
            cached = method_shares(u.cached_cost_by_method, owner) if any(
                v > 0 for v in u.cached_cost_by_method.values()) else shares
            for method, share in sorted(shares.items()):
                cost = u.cost_usd * share
                rows.append({"stage": stage, "stage_kind": stage_kind(stage, owner), "role": role,
                             "model": m.roles.get(role), "method": method, "calls": u.calls * share,
                             "requests": u.requests * share, "prompt_tokens": u.prompt_tokens * share,
                             "cached_prompt_tokens": u.cached_prompt_tokens * share,
                             "completion_tokens": u.completion_tokens * share, "cost_usd": cost,
                             "spent_usd": cost - u.cached_cost_usd * cached.get(method, 0.0)})
    return pl.from_arrow(pa.Table.from_pylist(rows, COST_BREAKDOWN))  # type: ignore[return-value]


def cost_views(breakdown: pl.DataFrame) -> list[tuple[str, pl.DataFrame]]:
    """The report's "Where the money goes" tables from COST_BREAKDOWN: USD per method (memory,
    respond, judges, other, total, spent; SHARED last), then per stage and per role."""
    if breakdown.is_empty():
        return []
    usd = [pl.col("cost_usd").filter(pl.col("stage_kind") == k).sum().alias(f"{k}_usd")
           for k in ("memory", "respond", "judge", "other")]
    per_method = (breakdown.group_by("method").agg(*usd, pl.col("cost_usd").sum().alias("total_usd"),
                                                   pl.col("spent_usd").sum())
                  .rename({"judge_usd": "judges_usd"})
                  .sort([pl.col("method") == SHARED, "method"]))
    counts = ["calls", "requests", "prompt_tokens", "cached_prompt_tokens", "completion_tokens"]
    whole = [pl.col(c).round(0).cast(pl.Int64) for c in counts]  # shares of calls and tokens, shown whole
    sums = [pl.col(c).sum() for c in (*counts, "cost_usd", "spent_usd")]
    per_stage = breakdown.group_by("stage", maintain_order=True).agg(*sums).with_columns(whole)
    per_role = (breakdown.group_by("role", "model", maintain_order=True).agg(*sums).with_columns(whole)
                .sort("cost_usd", descending=True))
    return [("Per method", per_method), ("Per stage", per_stage), ("Per role", per_role),
            ("Every stage, role and method", breakdown.with_columns(whole))]
