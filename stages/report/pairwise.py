"""The report's head-to-head summaries: each pair of judgments reduced to its outcome, then win /
tie / loss of the reference per dataset, criterion, opponent and session, and the leaderboard's pooled
win shares."""

from __future__ import annotations

import statistics
from typing import Any, cast

import polars as pl
import pyarrow as pa

from stages.metrics.significance import (cluster_bootstrap_interval, majority, pair_outcome, paired_cluster_test,
                                         wilson_interval, win_rates, win_share)
from stages.report.frames import empty, from_table

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
        # judge_pairwise.runs: independent runs of the judge per pair (each pair's outcome is its majority
        # over its runs, a tie where they split evenly; the counts, rates and tests above are over those
        # pairs, never over run rows); run_sd: the standard deviation (n - 1) across runs of the win rate
        # each run alone gives; null for one run
        pa.field("runs", pa.int64()),
        pa.field("run_sd", pa.float64()),
        pa.field("past_shown", pa.bool_()),  # the judge saw the earlier sessions
        pa.field("past_truncated", pa.int64()),  # pairs whose judge saw a cut past
        pa.field("judge_model", pa.string()),
        pa.field("prompt_fingerprint", pa.string()),
    ]
)


# Said beside every p-value the report renders (head-to-head, answers, TeaFarm): each is one cell's
# test, uncorrected for the many cells a table holds (the papers correct none either).
MULTIPLICITY_NOTE = ("Every p-value is a per-cell test, uncorrected for multiple comparisons: a table tests many "
                     "cells (methods x criteria x sessions x datasets), so about 1 in 20 null cells shows p < 0.05 by "
                     "chance; read them as descriptive, or apply a correction (e.g. Holm) over the cells you compare.")


_PAIR_KEYS = ("dataset", "episode_id", "probe_id", "session_idx", "criterion", "reference", "other", "protocol")


def pair_outcomes(judgments: pl.DataFrame) -> dict[tuple, dict[str, Any]]:
    """Each pair (probe, criterion, opponent; keyed by `_PAIR_KEYS`) of head-to-head judgments with
    its `outcome` ("reference", "other", "tie"; None when no run of a both_orders pair has both
    orders), each judge run's own outcome (`runs`: run -> outcome or None), its `episode`
    ((dataset, episode_id): its cluster), whether the judge saw the past, a cut past, and its judge
    stamp. Within a run, `both_orders`: the samples of each order are reduced by majority vote, then
    the two orders by `pair_outcome`; other protocols (`creem`): the majority of every sample. The
    pair's outcome is the majority of its runs' outcomes (`judge_pairwise.runs`; a tie where they
    split evenly): one item, however many runs judged it. A table without `run` is one run."""
    ok = judgments.filter(pl.col("error").is_null() & pl.col("preferred").is_not_null()) \
        if not judgments.is_empty() else judgments
    pairs: dict[tuple, dict[str, Any]] = {}
    for r in ok.iter_rows(named=True):
        p = pairs.setdefault(tuple(r[k] for k in _PAIR_KEYS), {"orders": {}, "past_shown": False,
                                                               "past_truncated": False, "stamp": {},
                                                               "episode": (r["dataset"], r["episode_id"])})
        p["orders"].setdefault(r.get("run") or 0, {}).setdefault(r["reference_first"], []).append(r["preferred"])
        p["past_shown"] |= r.get("past_shown") is not None
        p["past_truncated"] |= bool(r.get("past_truncated"))
        for c in ("judge_model", "prompt_fingerprint"):
            if p["stamp"].get(c) is None:
                p["stamp"][c] = r.get(c)
    for key, p in pairs.items():
        both_orders = dict(zip(_PAIR_KEYS, key))["protocol"] == "both_orders"
        p["runs"] = {run: run_outcome(orders, both_orders) for run, orders in sorted(p.pop("orders").items())}
        decided = [o for o in p["runs"].values() if o is not None]
        p["outcome"] = majority(decided) if decided else None
    return pairs


def run_outcome(orders: dict[bool, list[str]], both_orders: bool) -> str | None:
    """One judge run's outcome of a pair from its verdicts per order shown (reference first or not):
    both_orders: each order's majority, then `pair_outcome` (None with an order missing); otherwise
    the majority of every verdict."""
    if both_orders:
        return pair_outcome(majority(v) for v in orders.values()) if len(orders) == 2 else None
    return majority([v for votes in orders.values() for v in votes])


def run_spread(pairs: list[dict[str, Any]]) -> tuple[int, float | None]:
    """(runs, s.d. (n - 1) across runs of the win rate each run alone gives over the pairs it decided)
    of one scope's pairs (`pair_outcomes`); None with one run."""
    by_run: dict[int, list[str]] = {}
    for p in pairs:
        for run, outcome in p["runs"].items():
            if outcome is not None:
                by_run.setdefault(run, []).append(outcome)
    rates = [sum(o == "reference" for o in outcomes) / len(outcomes) for outcomes in by_run.values()]
    return max(len(by_run), 1), (statistics.stdev(rates) if len(rates) > 1 else None)


def pairwise_summary(judgments: pl.DataFrame) -> pl.DataFrame:
    """Win / tie / loss of the reference per criterion and opponent, per dataset and per session,
    plus the same pooled over datasets (dataset "all", when the run holds more than one).

    A pair is one (probe, criterion, opponent), reduced to its outcome by `pair_outcomes` (with
    several judge runs: its majority over them, so every count, rate and test is over pairs, never
    over run rows; `runs` and `run_sd` give the runs' spread); a both_orders pair with an order
    missing in every run (its judgments failed) is counted in `incomplete` and not scored.
    `win_share` is wins / (wins + losses), the rate the papers report (over decided pairs), with its
    episode-level cluster bootstrap interval (the decided pairs of an episode resampled together)
    and its Wilson interval (`win_share_iid_*`); `p_value` is the paired cluster permutation test of
    wins against losses over episodes, `sign_p` the sign test over pairs.
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
        wins, losses = cast(int, rates["wins"]), cast(int, rates["losses"])  # counts (win_rates)
        iid_low, iid_high = wilson_interval(wins, wins + losses)
        # Per pair: did the reference win, did the other; a tie is 0 for both and moves nothing.
        test = paired_cluster_test([float(p["outcome"] == "reference") for p in scored],
                                   [float(p["outcome"] == "other") for p in scored], [p["episode"] for p in scored])
        runs, run_sd = run_spread(part)
        rows.append({"dataset": dataset, "session_idx": session, "criterion": criterion, "reference": reference,
                     "other": other, "protocol": protocol, **rates, "sign_p": rates["p_value"], "p_value": test,
                     "runs": runs, "run_sd": run_sd,
                     "episodes": len({p["episode"] for p in scored}),
                     "win_share": win_share(wins, losses), "win_share_low": low,
                     "win_share_high": high, "win_share_iid_low": iid_low, "win_share_iid_high": iid_high,
                     "incomplete": len(part) - len(scored),
                     "past_shown": any(p["past_shown"] for p in part),
                     "past_truncated": sum(p["past_truncated"] for p in part),
                     "judge_model": next((p["stamp"]["judge_model"] for p in part if p["stamp"]["judge_model"]), None),
                     "prompt_fingerprint": next((p["stamp"]["prompt_fingerprint"] for p in part
                                                 if p["stamp"]["prompt_fingerprint"]), None)})
    out = from_table(pa.Table.from_pylist(rows, PAIRWISE_SUMMARY))
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
    return from_table(pa.Table.from_pylist(rows, POOLED_WIN_SHARES)).sort(
        ["dataset", "reference", "other"])
