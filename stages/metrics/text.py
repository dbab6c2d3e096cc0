"""Reference metrics of a response against a gold text: BLEU-1..4, ROUGE-1/2/L, token F1,
distinct-n, and (optional) BERTScore; and the corpus-level statistics over many responses: corpus
BLEU-1..4 and corpus distinct-n. Pure functions over strings.

Sentence BLEU comes from nltk and ROUGE from rouge-score (the libraries the dialogue-memory papers
report with); corpus BLEU is the tensorflow/nmt `compute_bleu` formula that Hugging Face
`evaluate`'s "bleu" runs (SeCom's official scorer). `IMPLEMENTATIONS` names what computed each
number, and the score tables carry it.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from functools import lru_cache
from importlib.metadata import version
from typing import Any, Sequence

_WORD = re.compile(r"\w+|[^\w\s]")
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def bleu_tokens(text: str) -> list[str]:
    """Lowercased words and punctuation marks, the tokens BLEU counts."""
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


def corpus_bleu_tokens(hypotheses: Sequence[Sequence[str]], references: Sequence[Sequence[str]],
                       max_order: int = 4) -> float:
    """Corpus BLEU of tokenised hypotheses, one reference each, as tensorflow/nmt's compute_bleu
    (Hugging Face evaluate's "bleu") without smoothing: clipped n-gram matches and possible n-grams
    summed over the corpus per order 1..max_order, the geometric mean of those precisions (0 when
    any is 0), times the brevity penalty exp(1 - ref_len / hyp_len) of the corpus lengths when the
    hypotheses are not longer. In [0, 1]; 0.0 for an empty corpus or empty hypotheses."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    matches, possible = [0] * max_order, [0] * max_order
    hyp_len = ref_len = 0
    for hyp, ref in zip(hypotheses, references):
        hyp_len, ref_len = hyp_len + len(hyp), ref_len + len(ref)
        for n in range(1, max_order + 1):
            hyp_grams, ref_grams = Counter(ngrams(hyp, n)), Counter(ngrams(ref, n))
            matches[n - 1] += sum((hyp_grams & ref_grams).values())
            possible[n - 1] += max(0, len(hyp) - n + 1)  # a hypothesis shorter than n adds nothing
    if hyp_len == 0 or min(matches) == 0:
        return 0.0
    log_precision = sum(math.log(m / p) for m, p in zip(matches, possible)) / max_order
    brevity = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / hyp_len)
    return math.exp(log_precision) * brevity


def corpus_bleu(predictions: Sequence[str], references: Sequence[str], n: int) -> float | None:
    """Corpus BLEU-n (cumulative, orders 1..n) of responses against their gold texts, over
    `bleu_tokens`; None for no pair."""
    if not predictions:
        return None
    return corpus_bleu_tokens([bleu_tokens(p) for p in predictions], [bleu_tokens(r) for r in references], n)


@lru_cache(maxsize=1)
def _rouge() -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False)


def rouge(prediction: str, reference: str) -> dict[str, float]:
    """ROUGE-1, ROUGE-2 and ROUGE-L F-measures (rouge-score, no stemming)."""
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
    """Distinct-n: unique n-grams over all n-grams of the texts: of one response (the per-response
    statistic), or of all of a method's responses (corpus distinct-n, RSum's DIST-n); None when the
    texts hold no n-gram."""
    grams = [g for t in texts for g in ngrams(bleu_tokens(t), n)]
    return len(set(grams)) / len(grams) if grams else None


def reference_scores(prediction: str, reference: str) -> dict[str, float | None]:
    """Every reference metric of one response against its gold text."""
    out: dict[str, float | None] = {f"bleu{n}": bleu(prediction, reference, n) for n in (1, 2, 3, 4)}
    out.update(rouge(prediction, reference))
    out["token_f1"] = token_f1(prediction, reference)
    out.update({f"distinct{n}": distinct([prediction], n) for n in (1, 2, 3)})
    return out


def _version(dist: str) -> str:
    try:
        return version(dist)
    except Exception:  # noqa: BLE001 - a name for the record only
        return "?"


IMPLEMENTATIONS = {
    "bleu": f"nltk {_version('nltk')} sentence_bleu, cumulative uniform weights, smoothing method1, "
            "lowercased word/punctuation tokens",
    "rouge": f"rouge-score {_version('rouge-score')} F-measure, no stemming",
    "token_f1": "SQuAD-style normalised token multiset F1",
    "corpus_bleu": "tensorflow/nmt compute_bleu formula (as Hugging Face evaluate 'bleu'): corpus clipped n-gram "
                   "precisions, geometric mean of orders 1..n, corpus brevity penalty, no smoothing; lowercased "
                   "word/punctuation tokens (evaluate's default tokenizer_13a keeps case and in-word apostrophes)",
    "distinct": "per response: unique / total n-grams of its lowercased word/punctuation tokens, averaged",
    "corpus_distinct": "unique / total n-grams over all responses of the group (RSum's DIST-n)",
    "locomo_f1": "LoCoMo task_eval F1: normalised, Porter-stemmed (nltk), per category",
    "bertscore": f"bert-score {_version('bert-score')} F1",
}


class BertScoreUnavailable(RuntimeError):
    """BERTScore was asked for but its package or model cannot be loaded here."""


def bertscore(predictions: list[str], references: list[str], model: str, num_layers: int | None = None,
              batch_size: int = 16) -> list[float]:
    """BERTScore F1 per pair. The model comes from the Hugging Face hub or a local path; without
    either this raises BertScoreUnavailable with what to do."""
    try:
        from bert_score import score
    except ImportError as e:
        raise BertScoreUnavailable(
            "BERTScore needs the bert-score package: pip install -e '.[bertscore]'") from e
    try:
        _, _, f1 = score(predictions, references, model_type=model, num_layers=num_layers, batch_size=batch_size,
                         lang="en", verbose=False)
    except Exception as e:  # noqa: BLE001 - hub/network/local-path failures all mean "model unavailable"
        raise BertScoreUnavailable(
            f"BERTScore model {model!r} could not be loaded ({type(e).__name__}: {str(e)[:200]}); it comes from "
            "the Hugging Face hub, which this machine may not reach: set metrics.bertscore_model to a local "
            "model directory (and metrics.bertscore_layers), or metrics.bertscore: false") from e
    return [float(x) for x in f1.tolist()]
