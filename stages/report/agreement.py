"""Whether a verdict survives the judge: each method's score and rank under each judge of the answer
panel (`panel_scores`), how far the judges agree (`judge_agreement`), and which differences between
two methods every judge confirms (`robust_pairs`).

Everything is over items (question x method) with each judge's runs averaged first (judge_runs), never
over run rows. A judge's verdict on an item: accepted when the majority of its runs judged the answer
correct (a tie accepts), or when LoCoMo's F1 reaches the judge's `accept_at` (stored per row as
`accepted`); GPT4Score (0-100) has no verdict: it enters rankings and robust differences by its score,
not agreement. The statistics come from their libraries: Cohen's kappa from statsmodels, Krippendorff's
alpha from `krippendorff`, Kendall's tau from scipy, the intervals from
stages/metrics/significance.py (scipy's bootstrap).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from stages.metrics.significance import cluster_bootstrap_interval
from stages.report.answers import _HAS_VERDICT, NOT_SHARES, _judgment_columns, judge_runs
from stages.report.frames import as_float, empty, from_table

PANEL_SCORES = pa.schema([
    pa.field("dataset", pa.string()),  # a dataset, or "all" (pooled) when the run has several
    pa.field("method", pa.string()),
    pa.field("judge", pa.string()),
    pa.field("judge_kind", pa.string()),  # its prompt, or f1
    pa.field("score", pa.float64()),  # share accepted; GPT4Score 0-100; F1 its mean
    pa.field("rank", pa.int32()),  # 1 = best under this judge; ties share the better rank
    pa.field("judged", pa.int64()),
])
JUDGE_AGREEMENT = pa.schema([
    pa.field("dataset", pa.string()),
    pa.field("judge_a", pa.string()),  # "panel" on the row of the whole panel (alpha, split share)
    pa.field("judge_b", pa.string()),  # null on the panel row
    pa.field("kappa", pa.float64()),  # Cohen's kappa over the items both judged (verdict judges)
    pa.field("tau", pa.float64()),  # Kendall's tau between the two judges' rankings of the methods
    pa.field("alpha", pa.float64()),  # panel row: Krippendorff's alpha (nominal) over every verdict judge
    pa.field("n", pa.int64()),  # items both judged (panel row: items any two judged); methods for tau alone
    pa.field("split_share", pa.float64()),  # panel row: share of items the verdict judges do not agree on
])
ROBUST_PAIRS = pa.schema([
    pa.field("dataset", pa.string()),
    pa.field("method_a", pa.string()),
    pa.field("method_b", pa.string()),
    pa.field("verdict", pa.string()),  # a_better | b_better | not_separable
    pa.field("judges", pa.int32()),  # judges of the panel that scored both
    pa.field("paired", pa.int64()),  # the fewest questions both methods have under one judge
    pa.field("comparisons", pa.int32()),  # pairs of methods compared in this dataset (for multiplicity)
    # each judge's paired cluster-bootstrap 95% interval of A - B: "judge [low, high]; ..."
    pa.field("intervals", pa.string()),
])
PANEL = "panel"
_ITEM = ["dataset", "episode_id", "probe_id", "method"]


def judged_items(judgments: pl.DataFrame) -> pl.DataFrame:
    """Question judgments (not TeaFarm's) with verdicts, one row per (item, judge): the runs'
    mean score and the majority verdict (`verdict`: 1 accepted, 0 not, null without one)."""
    if judgments.is_empty():
        return judgments
    raw = _judgment_columns(judgments.filter(pl.col("kind") != "teafarm"))
    if "accepted" not in raw.columns:
        raw = raw.with_columns(pl.lit(None, dtype=pl.Boolean).alias("accepted"))
    # A failed response is scored wrong by a correct / wrong judge (_judgment_columns): rejected too.
    binary = ~pl.col("judge_kind").is_in(NOT_SHARES)
    raw = raw.with_columns(pl.coalesce(pl.col("accepted"), pl.when(binary).then(pl.col("score") >= 0.5)))
    share = raw.filter(_HAS_VERDICT).group_by([*_ITEM, "judge"]).agg(
        pl.col("accepted").cast(pl.Float64).mean().alias("_accepted"))
    items = judge_runs(raw).filter(_HAS_VERDICT).join(share, on=[*_ITEM, "judge"], how="left")
    return items.with_columns(pl.when(pl.col("_accepted").is_null()).then(None)
                              .otherwise((pl.col("_accepted") >= 0.5).cast(pl.Int8)).alias("verdict"))


def _scopes(items: pl.DataFrame) -> list[tuple[str, pl.DataFrame]]:
    datasets = items["dataset"].unique(maintain_order=True).to_list()
    return [(d, items.filter(pl.col("dataset") == d)) for d in datasets] + ([("all", items)] if len(datasets) > 1
                                                                           else [])


def _ranked(scores: dict[str, float]) -> dict[str, int]:
    """1 for the best score; ties share the better rank (scipy's "min" ranking of the negated scores)."""
    from scipy.stats import rankdata

    names = list(scores)
    ranks = rankdata([-scores[m] for m in names], method="min")
    return {m: int(r) for m, r in zip(names, ranks)}


def panel_scores(judgments: pl.DataFrame) -> pl.DataFrame:
    """Each method's score and rank under each judge, per dataset (and pooled)."""
    items = judged_items(judgments)
    if items.is_empty():
        return empty(PANEL_SCORES)
    rows: list[dict[str, Any]] = []
    for dataset, part in _scopes(items):
        for (judge, kind), sub in part.group_by(["judge", "judge_kind"], maintain_order=True):
            means = {m: as_float(g["score"].mean()) for (m,), g in sub.group_by(["method"], maintain_order=True)}
            ranks = _ranked(means)
            rows += [{"dataset": dataset, "method": m, "judge": judge, "judge_kind": kind, "score": v,
                      "rank": ranks[m], "judged": sub.filter(pl.col("method") == m).height} for m, v in means.items()]
    return from_table(pa.Table.from_pylist(rows, PANEL_SCORES))


def _verdict_matrix(part: pl.DataFrame) -> tuple[list[str], np.ndarray]:
    """(verdict judges, judges x items matrix of 0 / 1 with NaN where a judge has no verdict)."""
    verdicts = part.filter(pl.col("verdict").is_not_null())
    judges = verdicts["judge"].unique(maintain_order=True).to_list()
    if not judges:
        return [], np.zeros((0, 0))
    wide = verdicts.pivot(on="judge", index=_ITEM, values="verdict", aggregate_function="first")
    return judges, np.array([wide[j].cast(pl.Float64).fill_null(np.nan).to_numpy() for j in judges], dtype=float)


def _kappa(a: np.ndarray, b: np.ndarray) -> tuple[float | None, int]:
    """Cohen's kappa (statsmodels) of two judges' 0 / 1 verdicts over the items both gave one."""
    from statsmodels.stats.inter_rater import cohens_kappa

    both = ~np.isnan(a) & ~np.isnan(b)
    n = int(both.sum())
    if n == 0:
        return None, 0
    table = np.zeros((2, 2))
    for x, y in zip(a[both].astype(int), b[both].astype(int)):
        table[x, y] += 1
    if (table.sum(axis=0) == n).any() and (table.sum(axis=1) == n).any() and np.trace(table) == n:
        return 1.0, n  # both judges gave one and the same verdict to every item: kappa's 0 / 0, full agreement
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa = float(cohens_kappa(table, return_results=False))
    return (None if np.isnan(kappa) else kappa), n


def _alpha(matrix: np.ndarray) -> float | None:
    """Krippendorff's alpha (nominal) over the judges' verdicts; None when no item has two verdicts
    or every verdict is the same (no variation to agree on)."""
    import krippendorff

    pairable = (~np.isnan(matrix)).sum(axis=0) >= 2
    values = matrix[:, pairable]
    if values.size == 0 or len(np.unique(values[~np.isnan(values)])) < 2:
        return None
    return float(krippendorff.alpha(reliability_data=values, level_of_measurement="nominal"))


def _tau(a: dict[str, float], b: dict[str, float]) -> tuple[float | None, int]:
    """Kendall's tau (scipy, tau-b) between two judges' scores of the methods both scored."""
    from scipy.stats import kendalltau

    common = [m for m in a if m in b]
    if len(common) < 2:
        return None, len(common)
    tau = kendalltau([a[m] for m in common], [b[m] for m in common]).statistic
    return (None if np.isnan(tau) else float(tau)), len(common)


def judge_agreement(judgments: pl.DataFrame) -> pl.DataFrame:
    """Per dataset (and pooled): Cohen's kappa and Kendall's tau for each pair of the panel's judges,
    and one panel row with Krippendorff's alpha and the share of items the verdict judges split on."""
    items = judged_items(judgments)
    if items.is_empty():
        return empty(JUDGE_AGREEMENT)
    rows: list[dict[str, Any]] = []
    for dataset, part in _scopes(items):
        judges = part["judge"].unique(maintain_order=True).to_list()
        if len(judges) < 2:
            continue
        means = {j: {m: as_float(g["score"].mean()) for (m,), g in part.filter(pl.col("judge") == j)
                     .group_by(["method"], maintain_order=True)} for j in judges}
        with_verdicts, matrix = _verdict_matrix(part)
        for a, b in itertools.combinations(judges, 2):
            tau, methods = _tau(means[a], means[b])
            kappa, n = (_kappa(matrix[with_verdicts.index(a)], matrix[with_verdicts.index(b)])
                        if a in with_verdicts and b in with_verdicts else (None, methods))
            rows.append({"dataset": dataset, "judge_a": a, "judge_b": b, "kappa": kappa, "tau": tau, "alpha": None,
                         "n": n, "split_share": None})
        if len(with_verdicts) >= 2:
            several = (~np.isnan(matrix)).sum(axis=0) >= 2
            both = matrix[:, several]
            split = [len(set(col[~np.isnan(col)])) > 1 for col in both.T]
            rows.append({"dataset": dataset, "judge_a": PANEL, "judge_b": None, "kappa": None, "tau": None,
                         "alpha": _alpha(matrix), "n": int(several.sum()),
                         "split_share": sum(split) / len(split) if split else None})
    return from_table(pa.Table.from_pylist(rows, JUDGE_AGREEMENT))


def _values(part: pl.DataFrame, judge: str, method: str) -> dict[tuple, float]:
    """Question -> a method's value under a judge: its verdict where the judge gives verdicts (F1 as
    accepted at `accept_at`), else its score (GPT4Score)."""
    sub = part.filter((pl.col("judge") == judge) & (pl.col("method") == method))
    value = pl.when(pl.col("verdict").is_not_null()).then(pl.col("verdict").cast(pl.Float64)).otherwise(
        pl.col("score").cast(pl.Float64))
    return {(r["dataset"], r["episode_id"], r["probe_id"]): r["_v"]
            for r in sub.with_columns(value.alias("_v")).iter_rows(named=True) if r["_v"] is not None}


def robust_verdict(intervals: list[tuple[float | None, float | None]]) -> str:
    """a_better when every judge's interval of A - B lies above 0, b_better when every one lies below,
    else not_separable (an interval that touches 0 or is missing, or two judges that disagree)."""
    if intervals and all(lo is not None and lo > 0 for lo, _ in intervals):
        return "a_better"
    if intervals and all(hi is not None and hi < 0 for _, hi in intervals):
        return "b_better"
    return "not_separable"


def robust_pairs(judgments: pl.DataFrame, level: float = 0.95) -> pl.DataFrame:
    """Every pair of methods per dataset (and pooled): "A beats B" only where, under every judge of the
    panel, the paired episode-cluster bootstrap interval of A - B (over the questions both have a
    value on) excludes 0 on the same side."""
    items = judged_items(judgments)
    if items.is_empty():
        return empty(ROBUST_PAIRS)
    rows: list[dict[str, Any]] = []
    for dataset, part in _scopes(items):
        methods = part["method"].unique(maintain_order=True).to_list()
        judges = part["judge"].unique(maintain_order=True).to_list()
        pairs = list(itertools.combinations(methods, 2))
        for a, b in pairs:
            intervals, shown, paired = [], [], []
            for judge in judges:
                va, vb = _values(part, judge, a), _values(part, judge, b)
                both = sorted(va.keys() & vb.keys())
                if not both:
                    continue
                interval = cluster_bootstrap_interval([va[q] - vb[q] for q in both], [q[:2] for q in both], level)
                intervals.append(interval)
                paired.append(len(both))
                lo, hi = interval
                shown.append(f"{judge} [{'-' if lo is None else f'{lo:.3g}'}, {'-' if hi is None else f'{hi:.3g}'}]")
            rows.append({"dataset": dataset, "method_a": a, "method_b": b, "verdict": robust_verdict(intervals),
                         "judges": len(intervals), "paired": min(paired) if paired else 0, "comparisons": len(pairs),
                         "intervals": "; ".join(shown) or None})
    return from_table(pa.Table.from_pylist(rows, ROBUST_PAIRS))
