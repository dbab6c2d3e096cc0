"""Head-to-head verdicts into outcomes, win rates and a two-sided sign (binomial) test.

A verdict names which response a judge preferred: "reference", "other" or "tie". Our protocol
judges each pair in both orders; the pair's outcome is the sign of (reference verdicts - other
verdicts) over the orders, so a preference that flips with the order is a tie.
"""

from __future__ import annotations

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
