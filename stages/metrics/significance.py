"""Head-to-head verdicts into outcomes, win rates and a two-sided sign (binomial) test.

A verdict names which response a judge preferred: "reference", "other" or "tie". Our protocol
judges each pair in both orders; the pair's outcome is the sign of (reference verdicts - other
verdicts) over the orders, so a preference that flips with the order is a tie.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterable, Sequence

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
    """The Wilson score interval of a proportion (successes / n); (None, None) when n is 0."""
    if n <= 0:
        return None, None
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + level / 2))
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_mean_interval(values: Sequence[float], level: float = 0.95, resamples: int = 2000,
                            seed: int = 0) -> tuple[float | None, float | None]:
    """A percentile bootstrap interval of the mean (seeded, so a report is reproducible);
    (None, None) for no values, the value itself for one."""
    if not values:
        return None, None
    import numpy as np

    data = np.asarray(values, dtype=float)
    if len(data) == 1:
        return float(data[0]), float(data[0])
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(resamples, len(data)))].mean(axis=1)
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def mcnemar_exact(only_reference: int, only_other: int) -> float | None:
    """Exact (binomial) McNemar test on paired right/wrong outcomes of two methods on the same
    questions: `only_reference` questions only the reference got right, `only_other` only the other;
    None when they never disagree."""
    return sign_test(only_reference, only_other)
