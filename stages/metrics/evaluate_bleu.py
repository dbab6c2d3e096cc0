"""Hugging Face `evaluate`'s "bleu" (SeCom's scorer; RSum's Table 1 BLEU-1/2), computed by sacrebleu.

`evaluate.load("bleu").compute(predictions, references)` tokenises with its copy of sacrebleu's
13a tokenizer, keeps case, and runs tensorflow/nmt's `compute_bleu` without smoothing: clipped
n-gram matches and hypothesis n-grams summed over the corpus per order, the geometric mean of the
orders' precisions (0 when one is 0), times the brevity penalty exp(1 - r/c) when the corpus of
hypotheses (c tokens) is not longer than the references (r tokens). Its metric script loads from the
Hugging Face hub, which an offline run cannot reach; sacrebleu's corpus BLEU with the 13a tokenizer,
case kept and no smoothing is the same statistic (`score / 100`), and its `precisions` are evaluate's
`precisions` (x100). One reference per prediction.

Both are functions of counts summed over the corpus (`segment_stats`: hypothesis and reference
lengths, clipped matches and hypothesis n-grams per order), so a resample of episodes is scored from
its summed counts (`bleu_from_stats`, `precision_from_stats`), by sacrebleu again.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

ORDERS = 4  # evaluate's default max_order


@lru_cache(maxsize=8)
def _bleu(max_order: int) -> Any:
    from sacrebleu.metrics import BLEU

    return BLEU(tokenize="13a", lowercase=False, smooth_method="none", max_ngram_order=max_order)


def _score(predictions: Sequence[str], references: Sequence[str], max_order: int) -> Any:
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    return _bleu(max_order).corpus_score(list(predictions), [list(references)])


def corpus_bleu(predictions: Sequence[str], references: Sequence[str], n: int = ORDERS) -> float | None:
    """evaluate's corpus BLEU-n (`compute(..., max_order=n)["bleu"]`, cumulative over orders 1..n)
    of the predictions against their references, in [0, 1]; None for an empty corpus."""
    if not predictions:
        return None
    return float(_score(predictions, references, n).score) / 100


def ngram_precisions(predictions: Sequence[str], references: Sequence[str],
                     orders: int = ORDERS) -> list[float] | None:
    """evaluate's `precisions`: per order 1..orders, clipped n-gram matches over the corpus divided
    by the hypotheses' n-grams (0 where there is none), no brevity penalty, in [0, 1]; None for an
    empty corpus."""
    if not predictions:
        return None
    return [float(p) / 100 for p in _score(predictions, references, orders).precisions]


def segment_stats(predictions: Sequence[str], references: Sequence[str]) -> list[list[int]]:
    """sacrebleu's sufficient statistics of each (prediction, reference) pair, up to order `ORDERS`:
    [hypothesis length, reference length, clipped matches of orders 1..4, hypothesis n-grams of
    orders 1..4]; summed over pairs they score the pairs as one corpus."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    if not predictions:
        return []
    return [list(map(int, row)) for row in _bleu(ORDERS)._extract_corpus_statistics(list(predictions),
                                                                                     [list(references)])]


def bleu_from_stats(stats: Sequence[float], n: int = ORDERS) -> float:
    """`corpus_bleu` (BLEU-n, in [0, 1]) of a corpus whose `segment_stats` sum to `stats`."""
    counts = [int(v) for v in stats]
    order_n = [*counts[:2], *counts[2:2 + n], *counts[2 + ORDERS:2 + ORDERS + n]]
    return float(_bleu(n)._compute_score_from_stats(order_n).score) / 100


def precision_from_stats(stats: Sequence[float], n: int) -> float:
    """evaluate's `precisions[n - 1]` (in [0, 1]; 0 without an n-gram) of a corpus whose `segment_stats`
    sum to `stats`."""
    total = stats[2 + ORDERS + n - 1]
    return float(stats[2 + n - 1] / total) if total else 0.0
