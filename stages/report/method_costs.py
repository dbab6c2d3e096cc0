"""The report's cost tables: cost beside quality per dataset, probe kind and method (method_summary)
and where the money goes per stage, role and method (cost_breakdown, cost_views)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl
import pyarrow as pa

from pipeline.llm.usage import SHARED, method_shares, stage_kind
from pipeline.manifest import USAGE_TOTAL_KEYS, Manifest
from stages.report.frames import ALL, empty, from_table

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
        # SeCom Table 6's LoCoMo "# Turns": per session the utterances in the context halved, rounded down
        # (response.context_turn_pairs, from each answer's details); null where no answer records it
        pa.field("mean_context_turn_pairs", pa.float64()),
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

# Where the money goes: one row per (stage, role, method) of every stage that fed the report (its
# inputs and, transitively, theirs: `Stage.whole_upstream`).
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
        pa.field("truncated_calls", pa.float64()),  # outputs cut at max_tokens (Usage.truncated_calls)
        pa.field("requests", pa.float64()),  # chat requests sent fresh to the endpoint
        pa.field("prompt_tokens", pa.float64()),
        pa.field("cached_prompt_tokens", pa.float64()),  # of prompt_tokens, served from the prompt cache
        pa.field("completion_tokens", pa.float64()),
        pa.field("cost_usd", pa.float64()),
        pa.field("spent_usd", pa.float64()),
    ]
)

# When each stage of the run ran (stages whose inputs were done ran at once: the runner's DAG).
STAGE_SPANS = pa.schema(
    [
        pa.field("stage", pa.string()),
        pa.field("started_at", pa.string()),  # UTC, to the millisecond (empty: a manifest older than the field)
        pa.field("finished_at", pa.string()),
        pa.field("wall_s", pa.float64()),
        pa.field("shards", pa.int64()),
        pa.field("resumed_shards", pa.int64()),  # finished by an earlier, interrupted invocation
    ]
)

# A probe's kind from its id (stages/probes.py: "nr:...", "qa:...", "tf:..."), for a response that
# no scored or judged row names.
_KIND_OF_PREFIX = {"nr": "next_response", "qa": "qa", "tf": "teafarm"}
_COST_COLUMNS = ("llm_calls", "cached_calls", "prompt_tokens", "cached_prompt_tokens", "completion_tokens",
                 "cost_usd", "batch_calls")
# What `method_summary` sums per method over its stages' roles (the report's `stage_usage`).
USAGE_KEYS = (*USAGE_TOTAL_KEYS, "cached_prompt_tokens")


def whole_run_scope(frame: pl.DataFrame) -> dict[str, str | None]:
    """{"dataset": ..., "kind": ...} of the rows standing for the whole run: the value labelled `all`
    when the run pooled several, else the run's only one (None when there is no single one)."""
    scope: dict[str, str | None] = {}
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


def _scoped(df: pl.DataFrame, pool_datasets: bool, pool_kinds: bool) -> pl.DataFrame:
    """`df` once per scope its rows fall in: their own dataset and kind, and the pooled ones (`ALL`
    datasets when `pool_datasets`, `ALL` kinds when `pool_kinds`), each row with its `_episode`."""
    df = df.with_columns(pl.col("dataset").cast(pl.String), pl.col("kind").cast(pl.String),
                         pl.concat_str([pl.col("dataset").fill_null(""), pl.col("episode_id")],
                                       separator="\x1f").alias("_episode"))
    frames = [df]
    if pool_datasets:
        frames.append(df.with_columns(pl.lit(ALL).alias("dataset")))
    if pool_kinds:
        frames += [f.with_columns(pl.lit(ALL).alias("kind")) for f in frames]
    return pl.concat(frames)


def _pairs(responses: pl.DataFrame) -> pl.Expr:
    """Each response's `context_turn_pairs` from its details (null when it records none)."""
    if "details_json" not in responses.columns:
        return pl.lit(None, pl.Float64)
    return pl.col("details_json").cast(pl.String).str.json_path_match("$.context_turn_pairs").cast(pl.Float64)


def _unjudged(responses: pl.DataFrame, answers: pl.DataFrame) -> pl.DataFrame:
    """`responses` with `_unjudged`: every judge row of the (probe, method) was skipped by design (e.g.
    `judge_answers.unanswerable: skip`), so the context means leave it out as the scores do."""
    keys = ["episode_id", "probe_id", "method"]
    if answers.is_empty() or "skipped" not in answers.columns or not set(keys) <= set(answers.columns):
        return responses.with_columns(pl.lit(False).alias("_unjudged"))
    skipped = (answers.group_by(keys).agg(pl.col("skipped").is_not_null().all().alias("_unjudged"))
               .with_columns([pl.col(k).cast(responses.schema[k]) for k in keys]))
    return responses.join(skipped, on=keys, how="left").with_columns(pl.col("_unjudged").fill_null(False))


def _response_columns(scoped: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Per scope: probes, episodes, failed, mean context (over the probes the judges did not skip by
    design: `_unjudged`) and mean response words."""
    answered = pl.col("error").is_null()
    judged = ~pl.col("_unjudged")
    return scoped.group_by(keys).agg(
        pl.len().cast(pl.Int64).alias("probes"), pl.col("_episode").n_unique().cast(pl.Int64).alias("episodes"),
        (~answered).sum().cast(pl.Int64).alias("failed"),
        pl.col("context_tokens").cast(pl.Float64).filter(judged).mean().alias("mean_context_tokens"),
        pl.col("context_turns").cast(pl.Float64).filter(judged).mean().alias("mean_context_turns"),
        pl.col("_pairs").filter(judged).mean().alias("mean_context_turn_pairs"),
        # whitespace words, as response_metrics counts them (str.split()), of the answered responses
        pl.col("response").cast(pl.String).filter(answered).str.extract_all(r"\S+").list.len()
        .cast(pl.Float64).mean().alias("mean_response_words"),
    )


def _cost_columns(usage: dict[str, dict[str, float]], whole_dataset: str, whole_kind: str) -> pl.DataFrame:
    """The cost columns per method (`usage`: its memory and respond stages' LLM usage), on the whole-run row."""
    cost = pl.DataFrame([{"method": m, **{k: u.get(k, 0) for k in USAGE_KEYS}} for m, u in usage.items()],
                        schema={"method": pl.String, "calls": pl.Int64, "cached_calls": pl.Int64,
                                "prompt_tokens": pl.Int64, "completion_tokens": pl.Int64, "cost_usd": pl.Float64,
                                "batch_calls": pl.Int64, "cached_prompt_tokens": pl.Int64})
    return cost.rename({"calls": "llm_calls"}).with_columns(pl.lit(whole_dataset, pl.String).alias("dataset"),
                                                             pl.lit(whole_kind, pl.String).alias("kind"))


def _quality_columns(answers: pl.DataFrame, metrics: pl.DataFrame, memory: pl.DataFrame, keys: list[str],
                     pool_datasets: bool, pool_kinds: bool, whole_kind: str) -> list[pl.DataFrame]:
    """The quality columns per scope: the judges' means (answers), token F1 and ROUGE-L (metrics) over
    each scope's own probes, and memory quality (memory) on the rows of every kind."""
    parts = []
    if not answers.is_empty():
        parts.append(_scoped(answers, pool_datasets, pool_kinds).group_by(keys).agg(
            *[pl.col("score").cast(pl.Float64).filter(pl.col("judge") == j).mean().alias(name) for j, name in
              (("gpt4score", "gpt4score"), ("strict", "strict_accuracy"), ("lenient", "lenient_accuracy"),
               ("teafarm", "teafarm_correctness"))]))
    if not metrics.is_empty():
        parts.append(_scoped(metrics, pool_datasets, pool_kinds).group_by(keys).agg(
            pl.col("token_f1").cast(pl.Float64).mean(), pl.col("rougeL").cast(pl.Float64).mean()))
    if not memory.is_empty():
        rated = memory.filter(pl.col("score").is_not_null()).with_columns(pl.lit(whole_kind, pl.String).alias("kind"))
        if pool_datasets:
            rated = pl.concat([rated, rated.with_columns(pl.lit(ALL).alias("dataset"))], how="diagonal_relaxed")
        parts.append(rated.group_by(keys).agg(pl.col("score").cast(pl.Float64).mean().alias("memory_quality")))
    return parts


def method_summary(responses: pl.DataFrame, usage: dict[str, dict[str, float]], answers: pl.DataFrame,
                   metrics: pl.DataFrame, memory: pl.DataFrame) -> pl.DataFrame:
    """Cost beside quality per method, dataset and probe kind, never pooled silently: a row per
    (dataset, kind, method) the run's responses hold, plus rows labelled `all` that pool every dataset
    (when the run holds several) and every kind (likewise), so a run of one dataset and one kind has
    one row per method. usage: method -> the LLM usage of its memory and respond stages over the whole
    run, on the whole-run row only; the judges' means (answers), token F1 and ROUGE-L (metrics) over
    each row's own probes; memory quality (memory: per episode, whatever the kind) on the rows of every
    kind. Words: whitespace words of the answered responses. The context means leave out a probe every
    judge skipped by design (`judge_answers.unanswerable: skip`), so they average the questions the
    scores average."""
    if responses.is_empty():
        return empty(METHOD_SUMMARY)
    answers, metrics = [f if f.is_empty() or "kind" in f.columns else f.with_columns(_kind_from_id().alias("kind"))
                        for f in (answers, metrics)]  # an older table without `kind`
    r = _unjudged(_labelled(responses, [answers, metrics], [answers, metrics, memory]), answers)
    r = r.with_columns(_pairs(r).alias("_pairs"))
    datasets, kinds = r["dataset"].unique().to_list(), r["kind"].unique().to_list()
    pool_datasets, pool_kinds = len(datasets) > 1, len(kinds) > 1
    whole_dataset = ALL if pool_datasets else datasets[0]
    whole_kind = ALL if pool_kinds else kinds[0]
    keys = ["dataset", "kind", "method"]
    out = _response_columns(_scoped(r, pool_datasets, pool_kinds), keys)
    parts = [_cost_columns(usage, whole_dataset, whole_kind),
             *_quality_columns(answers, metrics, memory, keys, pool_datasets, pool_kinds, whole_kind)]
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
                             "truncated_calls": u.truncated_calls * share, "requests": u.requests * share, "prompt_tokens": u.prompt_tokens * share,
                             "cached_prompt_tokens": u.cached_prompt_tokens * share,
                             "completion_tokens": u.completion_tokens * share, "cost_usd": cost,
                             "spent_usd": cost - u.cached_cost_usd * cached.get(method, 0.0)})
    return from_table(pa.Table.from_pylist(rows, COST_BREAKDOWN))


def stage_spans(manifests: Mapping[str, Manifest]) -> pl.DataFrame:
    """STAGE_SPANS from the stages' manifests, in the order they started."""
    rows = [{"stage": stage, "started_at": m.timings.started_at, "finished_at": m.timings.finished_at,
             "wall_s": m.timings.wall_s, "shards": m.shards, "resumed_shards": m.timings.resumed_shards}
            for stage, m in manifests.items()]
    rows.sort(key=lambda r: (r["started_at"] or r["finished_at"], r["finished_at"]))
    return from_table(pa.Table.from_pylist(rows, STAGE_SPANS))


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
    if breakdown["truncated_calls"].sum() > 0:  # outputs cut at max_tokens: shown where there are any
        counts.insert(1, "truncated_calls")
    else:
        breakdown = breakdown.drop("truncated_calls")
    whole = [pl.col(c).round(0).cast(pl.Int64) for c in counts]  # shares of calls and tokens, shown whole
    sums = [pl.col(c).sum() for c in (*counts, "cost_usd", "spent_usd")]
    per_stage = breakdown.group_by("stage", maintain_order=True).agg(*sums).with_columns(whole)
    per_role = (breakdown.group_by("role", "model", maintain_order=True).agg(*sums).with_columns(whole)
                .sort("cost_usd", descending=True))
    return [("Per method", per_method), ("Per stage", per_stage), ("Per role", per_role),
            ("Every stage, role and method", breakdown.with_columns(whole))]
