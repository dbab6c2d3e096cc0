"""Retrieval metrics against gold evidence turns (recall@k and SeCom's DCG, App. A.8).

A retrieved memory unit (a turn, a segment or a whole session) is represented by the
source_turn_ids of the turns it contains, so one definition serves every granularity.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def _gold_set(gold: Iterable[str]) -> set[str]:
    return {g for g in gold if g is not None}


def recall_at_k(retrieved_units: Sequence[Iterable[str]], gold: Iterable[str], k: int) -> float:
    """Fraction of gold evidence turns contained in the top-k retrieved units.

    Returns NaN when there is no gold evidence (e.g. adversarial questions), so that callers can
    average with nanmean instead of counting such questions as perfect or as failures.
    """
    g = _gold_set(gold)
    if not g:
        return math.nan
    covered: set[str] = set()
    for unit in list(retrieved_units)[: max(k, 0)]:
        covered |= g.intersection(unit)
    return len(covered) / len(g)


def turn_relevance(gold: Iterable[str]) -> dict[str, float]:
    """App. A.8: the relevance of a question is spread evenly over its gold turns (1/|gold| each);
    every other turn has relevance 0."""
    g = _gold_set(gold)
    return {t: 1.0 / len(g) for t in g}


def dcg_at_k(
    retrieved_units: Sequence[Iterable[str]], gold: Iterable[str], k: int, *, by_turn: bool = False
) -> float:
    """Discounted cumulative gain of the top-k units: DCG = sum_i r_i / log2(i + 1), i from 1.

    Relevance follows App. A.8: each gold turn has relevance 1/|gold|, other turns 0.
    - by_turn=False (default): position i is the rank of the unit, and r_i is the summed relevance
      of the gold turns the unit contains, i.e. the share of the gold evidence it holds.
    - by_turn=True: the paper's literal per-turn form: the distinct turns of the top-k units are
      listed in rank order (within a unit, in the unit's own order; sets are sorted; an id repeated
      in a unit, as Long-MT-Bench+'s exchange id on its user and assistant turns, is listed once)
      and position i is the turn's position in that list.
    A gold turn earns its gain once, at its first occurrence, so DCG lies in [0, 1] and equals 1
    exactly when all evidence is in the first unit (first turn, when by_turn). When every unit holds
    one distinct id both modes agree. NaN when there is no gold evidence.
    """
    rel = turn_relevance(gold)
    if not rel:
        return math.nan
    units = [sorted(u) if isinstance(u, (set, frozenset)) else list(u) for u in list(retrieved_units)[: max(k, 0)]]
    seen: set[str] = set()
    total = 0.0
    if by_turn:
        ranked = list(dict.fromkeys(t for u in units for t in u))  # distinct ids, first occurrence
        for pos, t in enumerate(ranked, start=1):
            if t in rel:
                total += rel[t] / math.log2(pos + 1)
        return total
    for pos, unit in enumerate(units, start=1):
        new = {t for t in unit if t in rel and t not in seen}
        seen |= new
        total += sum(rel[t] for t in new) / math.log2(pos + 1)
    return total
