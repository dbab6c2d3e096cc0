"""Retrieval metrics against gold evidence turns (recall@k and SeCom's DCG, App. A.8; LongMemEval's
recall_any / recall_all / ndcg_any at k, at turn and at session level).

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


# LongMemEval's retrieval metrics (xiaowu0162/LongMemEval src/retrieval/eval_utils.py, as
# run_retrieval.py and print_retrieval_metrics.py use them): a question's gold is its user-side
# evidence (the `has_answer` user turns: its corpus holds user turns only), or at session level the
# sessions of `answer_session_ids` that hold such a turn; each ranked item is relevant (1) or not (0).
# recall_any@k: some gold item is in the top k; recall_all@k: every one is; ndcg_any@k: the DCG of
# the top k's 0/1 relevances (rank 1 undiscounted, rank r by log2(r)) over the DCG of the ideal order
# (every gold item first). A unit holding several turns (a round: the user turn and its answer) is
# relevant when it holds a gold turn. At session level a ranking of rounds is read as its distinct
# sessions in order of first appearance, so k counts sessions (evaluate_retrieval_turn2session widens
# k the same way). NaN for a question without gold: `_abs` questions are left out as there.

LONGMEMEVAL_MEASURES = ("recall_any", "recall_all", "ndcg_any", "session_recall_any", "session_recall_all",
                        "session_ndcg_any")


def _ideal_dcg(n_gold: int, k: int) -> float:
    return _dcg([1.0] * min(n_gold, max(k, 0)))


def _dcg(relevances: Sequence[float]) -> float:
    """eval_utils.dcg: the first relevance as is, the one at rank r >= 2 over log2(r)."""
    return sum(r if i == 0 else r / math.log2(i + 1) for i, r in enumerate(relevances))


def any_all_ndcg(retrieved_units: Sequence[Iterable[str]], gold: Iterable[str], k: int) -> dict[str, float]:
    """{"recall_any", "recall_all", "ndcg_any"} of the top-k units against the gold ids (NaN each
    when there is no gold)."""
    g = _gold_set(gold)
    if not g:
        return {"recall_any": math.nan, "recall_all": math.nan, "ndcg_any": math.nan}
    top = [set(u) for u in list(retrieved_units)[: max(k, 0)]]
    covered = set().union(*top) & g if top else set()
    relevances = [1.0 if unit & g else 0.0 for unit in top]
    return {"recall_any": float(bool(covered)), "recall_all": float(covered == g),
            "ndcg_any": _dcg(relevances) / _ideal_dcg(len(g), k) if k > 0 else 0.0}


def session_of(turn_id: str) -> str:
    """"<session id>:<turn number>" -> the session id (LongMemEval's and LoCoMo's turn ids)."""
    return turn_id.rsplit(":", 1)[0]


def distinct_sessions(retrieved_units: Sequence[Iterable[str]]) -> list[set[str]]:
    """The sessions a ranking of units touches, each once, in order of first appearance (one per unit
    position when every unit lies in one session)."""
    seen: list[str] = []
    for unit in retrieved_units:
        for s in dict.fromkeys(session_of(t) for t in unit):
            if s not in seen:
                seen.append(s)
    return [{s} for s in seen]


def gold_sessions(gold_turns: Iterable[str], answer_sessions: Iterable[str] | None) -> set[str]:
    """The sessions of the gold turns, within `answer_sessions` when the dataset names them."""
    touched = {session_of(t) for t in _gold_set(gold_turns)}
    return touched if answer_sessions is None else touched & {str(s) for s in answer_sessions}


def longmemeval_retrieval(retrieved_units: Sequence[Iterable[str]], gold_turns: Iterable[str] | None,
                          answer_sessions: Iterable[str] | None, k: int) -> dict[str, float]:
    """LongMemEval's turn-level and session-level measures of one ranking at k: recall_any,
    recall_all, ndcg_any and session_recall_any, session_recall_all, session_ndcg_any."""
    turns = list(gold_turns or [])
    units = list(retrieved_units)
    turn_level = any_all_ndcg(units, turns, k)
    session_level = any_all_ndcg(distinct_sessions(units), gold_sessions(turns, answer_sessions), k)
    return {**turn_level, **{f"session_{name}": v for name, v in session_level.items()}}
