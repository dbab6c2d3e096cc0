"""Reference metrics of a response against a gold text: sentence BLEU-1..4 (ours, nltk), ROUGE-1/2/L
(rouge-score, SeCom's scorer as HF evaluate's "rouge" runs it), token F1 and distinct-n (ours), and
BERTScore (bert-score, SeCom's scorer as HF evaluate's "bertscore" runs it). Pure functions over
strings.

The papers' corpus-level scorers live beside this module: `evaluate_bleu.py` (SeCom; RSum Table 1's
BLEU-1/2), `rsum_eval.py` (RSum's F1 and DIST-n), `nlgeval.py` (LD-Agent's BLEU and ROUGE-L);
`stages/scoring/response_metrics.py`'s `COLUMN_SCORERS` names which scorer computes each column.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from functools import lru_cache
from typing import Any, Sequence

_WORD = re.compile(r"\w+|[^\w\s]")
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def bleu_tokens(text: str) -> list[str]:
    """Lowercased words and punctuation marks, the tokens our sentence BLEU and distinct-n count."""
    return _WORD.findall(text.lower())


@lru_cache(maxsize=1)
def _bleu() -> tuple[Any, Any]:
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    return sentence_bleu, SmoothingFunction().method1


def bleu(prediction: str, reference: str, n: int) -> float:
    """Sentence BLEU-n (cumulative, uniform weights over 1..n-grams) with nltk's smoothing
    method 1 (epsilon counts for an order with no match), in [0, 1]."""
    hyp, ref = bleu_tokens(prediction), bleu_tokens(reference)
    if not hyp or not ref:
        return 0.0
    sentence_bleu, smoothing = _bleu()
    return float(sentence_bleu([ref], hyp, weights=tuple([1.0 / n] * n), smoothing_function=smoothing))


@lru_cache(maxsize=1)
def _rouge() -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False)


def rouge(prediction: str, reference: str) -> dict[str, float]:
    """ROUGE-1, ROUGE-2 and ROUGE-L F-measures of one pair as HF evaluate's "rouge" scores it
    (rouge-score's RougeScorer, no stemmer, its default tokenizer); evaluate's aggregate is a
    bootstrap over these per-pair scores whose middle value converges to their plain mean."""
    scores = _rouge().score(reference, prediction)
    return {"rouge1": scores["rouge1"].fmeasure, "rouge2": scores["rouge2"].fmeasure,
            "rougeL": scores["rougeL"].fmeasure}


def normalise_answer(text: str) -> str:
    """SQuAD-style normalisation: lowercase, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_prf(prediction: str, reference: str) -> tuple[float, float, float]:
    """Precision, recall and F1 of the normalised tokens (multiset overlap); all 0 without overlap."""
    pred, gold = normalise_answer(prediction).split(), normalise_answer(reference).split()
    same = sum((Counter(pred) & Counter(gold)).values())
    if same == 0:
        return 0.0, 0.0, 0.0
    p, r = same / len(pred), same / len(gold)
    return p, r, 2 * p * r / (p + r)


def token_f1(prediction: str, reference: str) -> float:
    """Harmonic mean of precision and recall of the normalised tokens (multiset overlap)."""
    return token_prf(prediction, reference)[2]


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def distinct(texts: Sequence[str], n: int) -> float | None:
    """Our distinct-n over `bleu_tokens`: unique n-grams over all n-grams of the texts, of one
    response (the per-response statistic) or of all of a method's responses (corpus distinct-n);
    None when the texts hold no n-gram. RSum's own DIST-n is `rsum_eval.distinct`."""
    grams = [g for t in texts for g in ngrams(bleu_tokens(t), n)]
    return len(set(grams)) / len(grams) if grams else None


def reference_scores(prediction: str, reference: str) -> dict[str, float | None]:
    """Every reference metric of one response against its gold text."""
    out: dict[str, float | None] = {f"bleu{n}": bleu(prediction, reference, n) for n in (1, 2, 3, 4)}
    out.update(rouge(prediction, reference))
    out["token_f1"] = token_f1(prediction, reference)
    out.update({f"distinct{n}": distinct([prediction], n) for n in (1, 2, 3)})
    return out


class BertScoreUnavailable(RuntimeError):
    """BERTScore was asked for but its package or model cannot be loaded here."""


def bertscore(predictions: list[str], references: list[str], model: str, num_layers: int | None = None,
              batch_size: int = 16) -> list[float]:
    """BERTScore F1 per pair, as HF evaluate's "bertscore" with lang="en" (SeCom's call) computes it
    when `model` is "roberta-large" and `num_layers` None: bert-score's `score` with lang en, that
    model's default layer (17), no idf weighting, no baseline rescaling. The model comes from the
    Hugging Face hub or a local path; without either this raises BertScoreUnavailable with what to do."""
    try:
        from bert_score import score
    except ImportError as e:
        raise BertScoreUnavailable(
            "BERTScore needs the bert-score package, a dependency of mempipe: reinstall it (pip install -e .)") from e
    try:
        _, _, f1 = score(predictions, references, model_type=model, num_layers=num_layers, batch_size=batch_size,
                         lang="en", idf=False, rescale_with_baseline=False, verbose=False)
    except Exception as e:  # noqa: BLE001 - hub/network/local-path failures all mean "model unavailable"
        raise BertScoreUnavailable(
            f"BERTScore model {model!r} could not be loaded ({type(e).__name__}: {str(e)[:200]}); it comes from "
            "the Hugging Face hub, which this machine may not reach: set response_metrics.bertscore_model to a "
            "local model directory (and response_metrics.bertscore_layers), or response_metrics.bertscore: "
            "false") from e
    return [float(x) for x in f1.tolist()]
