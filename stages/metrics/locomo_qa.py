"""LoCoMo QA F1 as the LoCoMo benchmark's own evaluation (task_eval) scores an answer.

- normalisation: commas dropped, lowercase, punctuation removed, the words a / an / the / and
  removed, whitespace collapsed; every token Porter-stemmed (nltk);
- F1: multiset overlap of the stemmed tokens (0 when nothing overlaps);
- category 1 (multi-hop): prediction and gold split on commas, each gold part scored by its best
  prediction part, the mean over gold parts;
- category 3 (open-domain): the gold answer is cut at the first ';';
- categories 2 and 4: plain F1;
- category 5 (adversarial): 1 when the answer says "no information available" or "not mentioned",
  else 0 (the gold is not used).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from functools import lru_cache

from pipeline.corpus.locomo import CATEGORIES

CATEGORY_IDS = {name: cid for cid, name in CATEGORIES.items()}
ABSTENTIONS = ("no information available", "not mentioned")
_DROPPED_WORDS = re.compile(r"\b(a|an|the|and)\b")
_PUNCTUATION = frozenset(string.punctuation)


@lru_cache(maxsize=1)
def _stemmer():
    from nltk.stem import PorterStemmer

    return PorterStemmer()


def normalise(text: str) -> str:
    text = "".join(ch for ch in text.replace(",", "").lower() if ch not in _PUNCTUATION)
    return " ".join(_DROPPED_WORDS.sub(" ", text).split())


def stemmed_tokens(text: str) -> list[str]:
    stem = _stemmer().stem
    return [stem(w) for w in normalise(text).split()]


def f1(prediction: str, gold: str) -> float:
    pred, ref = stemmed_tokens(prediction), stemmed_tokens(gold)
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    p, r = same / len(pred), same / len(ref)
    return 2 * p * r / (p + r)


def multi_answer_f1(prediction: str, gold: str) -> float:
    preds = [p.strip() for p in prediction.split(",")]
    golds = [g.strip() for g in gold.split(",")]
    return sum(max(f1(p, g) for p in preds) for g in golds) / len(golds)


def locomo_f1(prediction: str, gold: str | None, category: int | str) -> float:
    """The LoCoMo score of one answer; `category` is the official id (1-5) or its name."""
    cid = CATEGORY_IDS[category] if isinstance(category, str) else int(category)
    if cid == 5:
        said = prediction.lower()
        return 1.0 if any(phrase in said for phrase in ABSTENTIONS) else 0.0
    if gold is None:
        raise ValueError(f"LoCoMo category {cid} needs a gold answer")
    if cid == 1:
        return multi_answer_f1(prediction, gold)
    if cid == 3:
        gold = gold.split(";")[0].strip()
    if cid in (2, 3, 4):
        return f1(prediction, gold)
    raise ValueError(f"unknown LoCoMo category {category!r}")
