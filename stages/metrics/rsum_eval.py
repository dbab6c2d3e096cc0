"""RSum's scorer (its utils/evaluation.py, as main_chatgpt.py's `print_eval_metrics` calls it), on
nltk `word_tokenize` tokens (`stages/metrics/tokens.py`).

- F1 (`compute_f1`): per (prediction, gold) pair, the tokens of the normalised text (lowercased,
  every ASCII punctuation mark replaced by a space, the articles a / an / the removed, spaces
  collapsed); a side without tokens scores F1 1 when both are empty and 0 otherwise, and adds nothing
  to precision or recall; no shared token scores 0; else SQuAD's precision, recall and F1 of the
  token multisets. The score of a set of pairs is the plain mean of each part over the pairs
  (Table 1's F1; Table 2's Prec., Recall and Mem_F1).
- DIST-n (`calc_distinct_n`): distinct n-grams over all responses of the set divided by all their
  n-grams, tokens of the lowercased response.

Table 1's BLEU-1/2 are evaluate's clipped n-gram precisions (`stages/metrics/evaluate_bleu.py`).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

from stages.metrics.tokens import word_tokenize

_PUNCTUATION = re.compile(f"[{re.escape(string.punctuation)}]")
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lowercased, each ASCII punctuation mark turned into a space ("don't" -> "don t"), articles
    removed, single spaces."""
    return " ".join(_ARTICLES.sub(" ", _PUNCTUATION.sub(" ", text.lower())).split())


def f1_parts(prediction: str, gold: str) -> tuple[float, float, float]:
    """What RSum's `compute_f1` adds up for one pair: (precision, recall, F1). Both texts without
    tokens: (0, 0, 1); one of them without tokens, or no shared token: (0, 0, 0)."""
    pred, ref = word_tokenize(normalize_answer(prediction)), word_tokenize(normalize_answer(gold))
    if not pred or not ref:
        return 0.0, 0.0, float(pred == ref)
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0, 0.0, 0.0
    p, r = same / len(pred), same / len(ref)
    return p, r, 2 * p * r / (p + r)


def distinct(texts: Sequence[str], n: int) -> float | None:
    """RSum's DIST-n of a set of responses: unique n-grams over all of them / their n-gram count,
    in [0, 1]; None when they hold no n-gram (RSum's code gives 0 there)."""
    grams = [tuple(tokens[i:i + n]) for t in texts for tokens in [word_tokenize(t.lower())]
             for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else None
