"""The report's statistics: head-to-head verdicts into outcomes and win rates, intervals and tests,
all through scipy / statsmodels (nothing hand-written).

A verdict names which response a judge preferred: "reference", "other" or "tie". Our protocol
judges each pair in both orders; the pair's outcome is the sign of (reference verdicts - other
verdicts) over the orders, so a preference that flips with the order is a tie.

Two families of intervals and tests. The iid ones (`wilson_interval`, `bootstrap_mean_interval`,
`mcnemar_exact`, `sign_test`) treat every item as independent. The cluster ones
(`cluster_bootstrap_interval`, `paired_cluster_test`) resample or permute whole episodes, since the
questions of one conversation are not independent (LoCoMo: ~2,000 questions from 10 conversations).
scipy and statsmodels are imported inside the functions: every Ray worker imports this module.
"""

from __future__ import annotations

import inspect
import warnings
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

VERDICTS = ("reference", "other", "tie")


def majority(verdicts: Sequence[str]) -> str:
    """The most frequent verdict of N samples; a tie between the most frequent is a tie."""
    counts = Counter(verdicts).most_common()
    if not counts:
        raise ValueError("no verdicts")
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        return "tie"
    return counts[0][0]


def pair_outcome(order_verdicts: Iterable[str]) -> str:
    """One pair's outcome from its verdict per order (each already a majority over samples)."""
    score = sum({"reference": 1, "other": -1, "tie": 0}[v] for v in order_verdicts)
    return "reference" if score > 0 else "other" if score < 0 else "tie"


def sign_test(wins: int, losses: int) -> float | None:
    """Two-sided exact binomial test of wins against losses at p = 0.5 (ties dropped, as the sign
    test does); None when every pair tied."""
    n = wins + losses
    if not n:
        return None
    from scipy.stats import binomtest  # here, not at the top: every Ray worker imports this module

    return float(binomtest(wins, n, 0.5, alternative="two-sided").pvalue)


def win_rates(outcomes: Sequence[str]) -> dict[str, float | int | None]:
    """Counts and rates of the reference's wins, ties and losses, and the sign test p-value."""
    c = Counter(outcomes)
    n = len(outcomes)
    wins, ties, losses = c["reference"], c["tie"], c["other"]
    return {
        "pairs": n, "wins": wins, "ties": ties, "losses": losses,
        "win_rate": wins / n if n else None, "tie_rate": ties / n if n else None,
        "loss_rate": losses / n if n else None, "p_value": sign_test(wins, losses),
    }


def win_share(wins: int, losses: int) -> float | None:
    """wins / (wins + losses): the share of decided pairs the reference won (Theanine Table 1 and
    CREEM report win rates over decided pairs); None when every pair tied."""
    return wins / (wins + losses) if wins + losses else None


def wilson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float | None, float | None]:
    """The Wilson score interval of a proportion successes / n, items independent (statsmodels
    `proportion_confint(method="wilson")`); (None, None) when n is 0."""
    if n <= 0:
        return None, None
    from statsmodels.stats.proportion import proportion_confint

    low, high = proportion_confint(successes, n, alpha=1 - level, method="wilson")
    return max(0.0, float(low)), min(1.0, float(high))  # clipped: float rounding can step past 0 or 1


def _seeded(func: Any, seed: int) -> dict[str, Any]:
    """The seed keyword of a scipy resampling function: `rng` from scipy 1.15, `random_state` before."""
    import numpy as np

    name = "rng" if "rng" in inspect.signature(func).parameters else "random_state"
    return {name: np.random.default_rng(seed)}


def _batch(n: int, resamples: int) -> int:
    """Resamples drawn at once: about 4M values in memory whatever n (20k responses x 2,000 would be 320 MB)."""
    return max(1, min(resamples, 4_000_000 // max(n, 1)))


def _interval(result: Any) -> tuple[float | None, float | None]:
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    return (None if low != low else low), (None if high != high else high)  # NaN: no interval


def bootstrap_mean_interval(values: Sequence[float], level: float = 0.95, resamples: int = 2000,
                            seed: int = 0) -> tuple[float | None, float | None]:
    """The percentile bootstrap interval of the mean of `values`, items resampled independently
    (scipy `stats.bootstrap`, seeded, so a report is reproducible); (None, None) for no values, the
    value itself for one value or when all are equal."""
    if not len(values):
        return None, None
    import numpy as np
    from scipy.stats import bootstrap

    data = np.asarray(values, dtype=float)
    if np.all(data == data[0]):  # nothing to resample: the mean is the value
        return float(data[0]), float(data[0])
    with warnings.catch_warnings():
        # scipy warns (DegenerateDataWarning, a RuntimeWarning) when every resample is equal: the
        # percentile interval is then that value, which is the answer.
        warnings.simplefilter("ignore", RuntimeWarning)
        res = bootstrap((data,), np.mean, n_resamples=resamples, confidence_level=level, method="percentile",
                        vectorized=True, batch=_batch(len(data), resamples), **_seeded(bootstrap, seed))
    return _interval(res)


def cluster_totals(values: Sequence[float] | np.ndarray, clusters: Sequence[Hashable]) -> tuple[list[Hashable], Any, Any]:
    """Per cluster (an episode), the sum and the count of its items' values: (cluster names in
    sorted order, sums, counts) as numpy arrays; item i is `values[i]` of cluster `clusters[i]`."""
    import numpy as np

    if len(values) != len(clusters):
        raise ValueError(f"{len(values)} values but {len(clusters)} cluster labels")
    totals: dict[Hashable, list[float]] = {}
    for v, c in zip(values, clusters):
        t = totals.setdefault(c, [0.0, 0])
        t[0] += float(v)
        t[1] += 1
    names = sorted(totals, key=repr)  # sorted: the interval does not depend on the rows' order
    return names, np.array([totals[c][0] for c in names]), np.array([totals[c][1] for c in names], dtype=float)


def _ratio(sums: Any, counts: Any, axis: int = -1) -> Any:
    """The mean over the items of a resample of clusters: its summed values over its summed counts."""
    import numpy as np

    return np.sum(sums, axis=axis) / np.sum(counts, axis=axis)


def cluster_bootstrap_interval(values: Sequence[float], clusters: Sequence[Hashable], level: float = 0.95,
                               resamples: int = 2000, seed: int = 0, strata: Sequence[Hashable] | None = None
                               ) -> tuple[float | None, float | None]:
    """The episode-level cluster bootstrap percentile interval of the mean of `values` (a share when
    they are 0/1): item i is `values[i]` of cluster `clusters[i]` (its episode). Whole clusters are
    resampled with replacement, each keeping its items together as its (sum, count), and the
    statistic is sum / count of the resample (scipy `stats.bootstrap` over the per-cluster pairs with
    `paired=True`, percentile method, seeded).

    With `strata` (one label per item, e.g. LongMemEval's question type; each cluster must lie in
    one stratum): the statistic is the mean over strata of each stratum's mean (a task average), and
    clusters are resampled within their stratum, so every stratum keeps its size.

    (None, None) when no interval exists: no values, or fewer than two clusters (in some stratum);
    (v, v) when every value is v."""
    import numpy as np

    if not len(values):
        return None, None
    if len(values) != len(clusters) or (strata is not None and len(strata) != len(values)):
        raise ValueError("values, clusters and strata must have one entry per item")
    data = np.asarray(values, dtype=float)
    groups: dict[Hashable, list[int]] = {}
    for i, s in enumerate(strata if strata is not None else [None] * len(values)):
        groups.setdefault(s, []).append(i)
    per_stratum = [cluster_totals(data[idx], [clusters[i] for i in idx]) for idx in groups.values()]
    if strata is not None:
        where = Counter(c for names, _, _ in per_stratum for c in names)
        if any(n > 1 for n in where.values()):
            raise ValueError("a cluster lies in several strata: it cannot be resampled within one")
    if any(len(names) < 2 for names, _, _ in per_stratum):  # one episode: no spread between episodes to resample
        return None, None
    if np.all(data == data[0]):
        return float(data[0]), float(data[0])
    from scipy.stats import bootstrap

    with warnings.catch_warnings():
        # scipy warns (DegenerateDataWarning, a RuntimeWarning) when every resample is equal: the
        # percentile interval is then that value, which is the answer.
        warnings.simplefilter("ignore", RuntimeWarning)
        if strata is None:
            _, sums, counts = per_stratum[0]
            res = bootstrap((sums, counts), _ratio, paired=True, vectorized=True, n_resamples=resamples,
                            confidence_level=level, method="percentile", **_seeded(bootstrap, seed))
        else:
            # One (2, clusters) sample per stratum: resampling its columns keeps each cluster's sum with its count.
            samples = [np.vstack([sums, counts]) for _, sums, counts in per_stratum]

            def task_average(*resampled: Any, axis: int = -1) -> Any:
                return np.mean([_ratio(s[0], s[1], axis=axis) for s in resampled], axis=0)

            res = bootstrap(samples, task_average, vectorized=True, axis=-1, n_resamples=resamples,
                            confidence_level=level, method="percentile", **_seeded(bootstrap, seed))
    return _interval(res)


def cluster_bootstrap_statistic(cluster_stats: Sequence[Sequence[float]], statistic: Callable[[Any], float | None],
                                level: float = 0.95, resamples: int = 2000, seed: int = 0
                                ) -> tuple[float | None, float | None]:
    """The episode-level cluster bootstrap percentile interval of a statistic that is a function of
    sufficient statistics summed over items (corpus BLEU of its n-gram counts and lengths, a ratio of
    sums): row c of `cluster_stats` is cluster c's summed statistics, `statistic` maps a summed row to
    the value. Whole clusters are resampled with replacement (scipy `stats.bootstrap` over the cluster
    indices, percentile method, seeded). (None, None) with fewer than two clusters."""
    import numpy as np

    stats = np.asarray(cluster_stats, dtype=float)
    if len(stats) < 2:
        return None, None
    from scipy.stats import bootstrap

    def of_resamples(indices: Any, axis: int = -1) -> Any:
        # A resample's value depends only on its summed row: the statistic (the scorer's own code,
        # one row at a time) runs once per distinct sum, so few episodes cost few calls.
        summed = stats[np.moveaxis(indices, axis, -1).astype(int)].sum(axis=-2)
        distinct, where = np.unique(summed.reshape(-1, stats.shape[1]), axis=0, return_inverse=True)
        values = np.array([np.nan if (v := statistic(row)) is None else v for row in distinct], dtype=float)
        return values[where.reshape(-1)].reshape(summed.shape[:-1])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # every resample equal: the interval is that value
        res = bootstrap((np.arange(len(stats)),), of_resamples, vectorized=True, n_resamples=resamples,
                        batch=_batch(len(stats), resamples), confidence_level=level, method="percentile",
                        **_seeded(bootstrap, seed))
    return _interval(res)


def paired_cluster_test(reference: Sequence[float], other: Sequence[float], clusters: Sequence[Hashable],
                        resamples: int = 9999, seed: int = 0) -> float | None:
    """Two-sided paired cluster permutation test of a method against the reference over episodes.

    Item i (a question both methods have a value for: 1/0 right or wrong, or a score) has the
    reference's value `reference[i]`, the other method's `other[i]`, and its cluster `clusters[i]`.
    Per cluster the two methods' totals are summed; a permutation swaps a cluster's two totals (a sign
    flip of its difference), and the statistic is the mean per-cluster difference other - reference
    (scipy `stats.permutation_test`, `permutation_type="samples"`). Exact over all 2^clusters swaps
    when that is at most `resamples`, else `resamples` seeded random swaps. None without items or
    when the methods agree on every item (no discordant item: nothing to test); 1.0 with one episode
    (its exact permutation distribution is +d and -d)."""
    if not (len(reference) == len(other) == len(clusters)):
        raise ValueError("reference, other and clusters must have one entry per item")
    if all(float(a) == float(b) for a, b in zip(reference, other)):
        return None
    import numpy as np
    from scipy.stats import permutation_test

    _, ref_totals, _ = cluster_totals(reference, clusters)
    _, other_totals, _ = cluster_totals(other, clusters)
    if len(ref_totals) < 2:  # one episode: its two swaps give +d and -d, so the exact p is 1
        return 1.0

    def mean_difference(x: Any, y: Any, axis: int = -1) -> Any:
        return np.mean(x - y, axis=axis)

    res = permutation_test((other_totals, ref_totals), mean_difference, permutation_type="samples",
                           vectorized=True, n_resamples=resamples, alternative="two-sided",
                           **_seeded(permutation_test, seed))
    return min(1.0, float(res.pvalue))


def mcnemar_exact(only_reference: int, only_other: int) -> float | None:
    """Exact McNemar test on paired right/wrong outcomes of two methods on the same questions,
    questions independent (statsmodels `contingency_tables.mcnemar(exact=True)`): `only_reference`
    questions only the reference got right, `only_other` only the other; None when they never
    disagree."""
    if not only_reference + only_other:
        return None
    from statsmodels.stats.contingency_tables import mcnemar

    # Only the discordant cells enter the exact test; the concordant ones are left at 0.
    return float(mcnemar([[0, only_reference], [only_other, 0]], exact=True).pvalue)
