"""Mem0's scorer of a LoCoMo answer: the F1 and BLEU-1 of the mem0 paper's Table 1 (arXiv:2504.19413),
as mem0's evaluation code computes them (evaluation/metrics/utils.py, called by evals.py per question;
generate_scores.py takes the plain mean per category and over every scored question).

- F1 (`f1`): over the SETS of tokens of the two texts (a repeated word counts once), tokens = the text
  lowercased, each of `. , ! ?` replaced by a space, split on whitespace; 0 when a side has no token
  or nothing is shared. Not SQuAD's multiset F1, and no article or other punctuation removed.
- BLEU-1 (`bleu1`): nltk's `sentence_bleu` with weights (1, 0, 0, 0) and `SmoothingFunction().method1`
  on `word_tokenize` tokens of the lowercased texts (`stages/metrics/tokens.py`: nltk's own tokenizer,
  offline), i.e. the clipped unigram precision times the brevity penalty; 0 without a shared token.
- Only LoCoMo categories 1-4 are scored (evals.py skips category 5, which has no gold answer). An
  empty answer scores 0 on both, which is how a failed response is scored here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from stages.metrics.tokens import word_tokenize

CATEGORIES = (1, 2, 3, 4)  # LoCoMo's official ids that evals.py scores
_SPACED = str.maketrans(".,!?", "    ")


def simple_tokens(text: str) -> list[str]:
    """mem0's F1 tokens: lowercased, `.,!?` as spaces, whitespace-split."""
    return text.lower().translate(_SPACED).split()


def f1(prediction: str, gold: str) -> float:
    """F1 of the token sets of `prediction` and `gold`."""
    pred, ref = set(simple_tokens(prediction)), set(simple_tokens(gold))
    same = len(pred & ref)
    if same == 0:  # also covers a side without tokens
        return 0.0
    p, r = same / len(pred), same / len(ref)
    return 2 * p * r / (p + r)


@lru_cache(maxsize=1)
def _bleu() -> tuple[Any, Any]:
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    return sentence_bleu, SmoothingFunction().method1


def bleu1(prediction: str, gold: str) -> float:
    """nltk sentence BLEU-1 (smoothing method1) of the lowercased texts' word_tokenize tokens."""
    sentence_bleu, smooth = _bleu()
    return float(sentence_bleu([word_tokenize(gold.lower())], word_tokenize(prediction.lower()),
                               weights=(1, 0, 0, 0), smoothing_function=smooth))


def scores(prediction: str, gold: str) -> dict[str, float]:
    """`mem0_f1` and `mem0_bleu1` of one answer (response_metrics' column names)."""
    return {"mem0_f1": f1(prediction, gold), "mem0_bleu1": bleu1(prediction, gold)}
