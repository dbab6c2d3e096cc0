"""What one question costs each method: the tokens and dollars of building its memory, spread over
the probes it answers (episode by episode: each probe carries its own episode's build, split over
that episode's probes of the method, where the memory stage's manifest records `llm_per_episode`;
else the run's build over all its probes), and of answering; the latency of an answer (its calls' first latencies, so a
cached rerun reports what the run took when it was sent); and the cost per correct answer under the
run's first correct / wrong judge (issue 64, part 2)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl
import pyarrow as pa

from stages.report.answers import NOT_SHARES, _HAS_VERDICT, _judgment_columns, judge_runs
from stages.report.frames import as_float, empty, from_table

QUESTION_COSTS = pa.schema([
    pa.field("method", pa.string()),
    pa.field("probes", pa.int64()),
    # its memory stage's tokens per probe: each probe its episode's tokens over that episode's probes,
    # averaged over the method's probes (`build_spread` episode), else the run's over all (run)
    pa.field("build_tokens_per_probe", pa.float64()),
    pa.field("build_usd_per_probe", pa.float64()),  # the stage's USD split over episodes by their token share
    pa.field("build_spread", pa.string()),  # episode | run (a manifest without llm_per_episode) | null: no build
    pa.field("answer_tokens_per_probe", pa.float64()),  # prompt + completion of each answer's calls, mean
    pa.field("answer_usd_per_probe", pa.float64()),  # its respond stage's cost over its probes
    pa.field("latency_p50_s", pa.float64()),  # an answer's calls' seconds when sent, median and 95th percentile
    pa.field("latency_p95_s", pa.float64()),
    pa.field("judge", pa.string()),  # the correct / wrong judge the next columns count by
    pa.field("correct", pa.float64()),  # answers judged correct (each item's runs averaged)
    pa.field("judged", pa.int64()),
    pa.field("accuracy", pa.float64()),
    pa.field("usd_per_correct", pa.float64()),  # (build + answer dollars) / correct; null without a correct one
])


def verdict_judge(answers: pl.DataFrame) -> str | None:
    """The first correct / wrong judge of the answer table (not GPT4Score, F1 or TeaFarm's)."""
    if answers.is_empty():
        return None
    kinds = answers.with_columns(pl.col("judge_kind").fill_null(pl.col("judge"))) if "judge_kind" in answers.columns \
        else answers.with_columns(pl.col("judge").alias("judge_kind"))
    binary = kinds.filter(~pl.col("judge_kind").is_in([*NOT_SHARES, "teafarm"]))
    return binary["judge"][0] if binary.height else None


def question_costs(responses: pl.DataFrame, costs: pl.DataFrame, answers: pl.DataFrame,
                   per_episode: Mapping[str, Mapping[str, Mapping[str, float]]] | None = None) -> pl.DataFrame:
    """One row per method: `responses` (the respond rows, with their calls' tokens and latency),
    `costs` (cost_breakdown: each stage's tokens and dollars per method), `answers` (the answer
    judgments, runs not yet averaged) and `per_episode` (method -> episode -> its memory stage's
    `llm_per_episode` counts; a method not in it, or none, spreads the run's build over its probes)."""
    if responses.is_empty():
        return empty(QUESTION_COSTS)
    for col in ("prompt_tokens", "completion_tokens", "latency_s"):
        if col not in responses.columns:  # a respond table from before they were recorded
            responses = responses.with_columns(pl.lit(None, dtype=pl.Float64).alias(col))
    judge = verdict_judge(answers)
    items = judge_runs(_judgment_columns(answers)).filter(_HAS_VERDICT & (pl.col("judge") == judge)) \
        if judge is not None else pl.DataFrame()
    rows: list[dict[str, Any]] = []
    for (method,), r in responses.group_by(["method"], maintain_order=True):
        probes = r.height
        spent = {kind: _stage_total(costs, method, kind) for kind in ("memory", "respond")}
        build = _build_per_probe(r, *spent["memory"], (per_episode or {}).get(method))
        spread = build["spread"][0]  # a method without a memory stage built nothing: null
        answered = r.filter(pl.col("error").is_null())
        latency = answered["latency_s"].drop_nulls().cast(pl.Float64)
        mine = items.filter(pl.col("method") == method) if judge is not None else items
        correct = float(mine["score"].sum()) if judge is not None and mine.height else None
        usd = float(build["usd"].sum()) + spent["respond"][1]
        rows.append({
            "method": method, "probes": probes,
            "build_tokens_per_probe": as_float(build["tokens"].mean()), "build_usd_per_probe": as_float(build["usd"].mean()),
            "build_spread": spread if spread == "episode" or spent["memory"] != (0.0, 0.0) else None,
            "answer_tokens_per_probe": as_float((answered["prompt_tokens"].cast(pl.Float64)
                                              + answered["completion_tokens"].cast(pl.Float64)).mean() or 0.0)
            if answered.height else None,
            "answer_usd_per_probe": spent["respond"][1] / probes,
            "latency_p50_s": as_float(latency.quantile(0.5, "linear")) if latency.len() else None,
            "latency_p95_s": as_float(latency.quantile(0.95, "linear")) if latency.len() else None,
            "judge": judge, "correct": correct, "judged": mine.height if judge is not None else 0,
            "accuracy": correct / mine.height if correct is not None and mine.height else None,
            "usd_per_correct": usd / correct if correct else None,
        })
    return from_table(pa.Table.from_pylist(rows, QUESTION_COSTS))


def _build_per_probe(responses: pl.DataFrame, tokens: float, usd: float,
                     per_episode: Mapping[str, Mapping[str, float]] | None) -> pl.DataFrame:
    """Each of a method's probes (`responses`, one row each) with its share of the build: `tokens`,
    `usd` and `spread`. By episode where `per_episode` (episode -> its calls and tokens) is given: a
    probe gets its episode's tokens over that episode's probes, and the stage's `usd` split over the
    episodes by their token share, likewise; an episode none of whose probes the method answered adds
    nothing. Else the run's `tokens` and `usd` over all the probes."""
    episode_tokens = {str(ep): float(c.get("prompt_tokens", 0) or 0) + float(c.get("completion_tokens", 0) or 0)
                      for ep, c in (per_episode or {}).items()}
    total = sum(episode_tokens.values())
    if not per_episode or total <= 0:  # nothing to split by: the run-wide division
        n = responses.height
        return pl.DataFrame({"tokens": [tokens / n] * n, "usd": [usd / n] * n, "spread": ["run"] * n})
    counted = responses.group_by("episode_id").agg(pl.len().alias("n"))
    of_episode = dict(zip(counted["episode_id"].cast(pl.String).to_list(), counted["n"].to_list()))
    episodes = responses["episode_id"].cast(pl.String).to_list()
    mine = [episode_tokens.get(ep, 0.0) / of_episode[ep] for ep in episodes]
    return pl.DataFrame({"tokens": mine, "usd": [usd * t / total for t in mine], "spread": ["episode"] * len(mine)})


def _stage_total(costs: pl.DataFrame, method: str, kind: str) -> tuple[float, float]:
    """(tokens, dollars) of a method's stages of one kind (memory | respond) in cost_breakdown."""
    if costs.is_empty():
        return 0.0, 0.0
    part = costs.filter((pl.col("method") == method) & (pl.col("stage_kind") == kind))
    tokens = float((part["prompt_tokens"].fill_null(0) + part["completion_tokens"].fill_null(0)).sum())
    return tokens, float(part["cost_usd"].fill_null(0).sum())
