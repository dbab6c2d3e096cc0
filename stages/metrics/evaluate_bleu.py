"""Hugging Face `evaluate`'s "bleu" (SeCom's scorer; RSum's Table 1 BLEU-1/2), computed by sacrebleu.

`evaluate.load("bleu").compute(predictions, references)` tokenises with its copy of sacrebleu's
13a tokenizer, keeps case, and runs tensorflow/nmt's `compute_bleu` without smoothing: clipped
n-gram matches and hypothesis n-grams summed over the corpus per order, the geometric mean of the
orders' precisions (0 when one is 0), times the brevity penalty exp(1 - r/c) when the corpus of
hypotheses (c tokens) is not longer than the references (r tokens). Its metric script loads from the
Hugging Face hub, which an offline run cannot reach; sacrebleu's corpus BLEU with the 13a tokenizer,
case kept and no smoothing is the same statistic (`score / 100`), and its `precisions` are evaluate's
`precisions` (x100). One reference per prediction.
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
