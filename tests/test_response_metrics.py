"""Corpus-level statistics per dataset, kind, method, category and session (HF evaluate's corpus BLEU
by sacrebleu, our corpus distinct-n), failed responses as scored rows, and the metric summary per
dataset, category and session, on hand-worked cases. Each paper's scorer against its library:
test_paper_scorers.py."""

from __future__ import annotations

import random
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from sacrebleu.metrics import BLEU

from stages.metrics import text
from stages.metrics.significance import bootstrap_mean_interval
from stages.report.tables import METRIC_SUMMARY, metric_summary
from stages.scoring.response_metrics import (
    CORPUS_METRICS,
    RESPONSE_METRICS,
    corpus_rows,
    score_rows,
)

# (response, gold) pair worked by hand below.
CAT = ("the cat sat on the mat", "the cat is on the mat")


def sacrebleu_1(predictions: list[str], golds: list[str]) -> float:
    """HF evaluate's corpus BLEU-1 as sacrebleu computes it (13a tokens, case kept, no smoothing)."""
    bleu = BLEU(tokenize="13a", lowercase=False, smooth_method="none", max_ngram_order=1)
    return bleu.corpus_score(predictions, [golds]).score / 100


def _probe(method: str, response: str | None, gold: str | None, *, dataset: str = "msc",
           kind: str = "next_response", category: str | None = None, session_idx: int = 3,
           probe_id: str = "p") -> dict[str, Any]:
    return {"episode_id": "e1", "dataset": dataset, "probe_id": probe_id, "kind": kind, "category": category,
            "method": method, "session_idx": session_idx, "response": response, "gold": gold}


def test_a_failed_response_keeps_its_row_and_scores_zero_on_every_reference_metric() -> None:
    rows = score_rows([
        _probe("m", None, "the cat is on the mat"),
        _probe("m", None, "Paris", dataset="locomo", kind="qa", category="single-hop", session_idx=20),
        _probe("m", None, None, dataset="locomo", kind="qa", category="adversarial", session_idx=20),
        _probe("m", CAT[0], CAT[1]),
    ])
    failed, locomo, adversarial, answered = rows
    assert failed["failed"] and failed["words"] is None and failed["distinct1"] is None
    assert all(failed[k] == 0.0 for k in ("bleu1", "bleu4", "rouge1", "rougeL", "token_f1"))
    assert failed["locomo_f1"] is None and failed["bertscore"] is None  # not a LoCoMo question; no BERTScore run
    assert locomo["locomo_f1"] == 0.0 and locomo["token_f1"] == 0.0
    # an adversarial question has no gold text: only its abstention score, 0 when nothing was said
    assert adversarial["locomo_f1"] == 0.0 and adversarial["token_f1"] is None
    assert not answered["failed"] and answered["words"] == 6 and answered["session_idx"] == 3
    assert answered["token_f1"] == pytest.approx(text.token_f1(*CAT))
    pa.Table.from_pylist(rows, schema=RESPONSE_METRICS)  # the stage's schema takes them


def test_corpus_distinct_counts_ngrams_over_all_responses_per_dataset_kind_method_and_session() -> None:
    raw = [
        _probe("m", "i like tea", "gold one", session_idx=3, probe_id="a"),
        _probe("m", "i like tea a lot", "gold two", session_idx=3, probe_id="b"),
        _probe("m", None, "gold three", session_idx=4, probe_id="c"),
        _probe("m", "where were we", "gold four", session_idx=4, probe_id="d"),
        _probe("m", "paris", "paris", dataset="locomo", kind="qa", category="single-hop", session_idx=20),
    ]
    out = {(r["dataset"], r["kind"], r["category"], r["session_idx"], r["method"]): r for r in corpus_rows(raw)}
    assert set(out) == {("msc", "next_response", None, None, "m"), ("msc", "next_response", None, 3, "m"),
                        ("msc", "next_response", None, 4, "m"), ("locomo", "qa", None, None, "m"),
                        ("locomo", "qa", "single-hop", None, "m")}  # no session rows for questions
    every = out[("msc", "next_response", None, None, "m")]
    assert (every["responses"], every["failed"]) == (4, 1)
    # unigrams i like tea | i like tea a lot | where were we: 11, of which 8 distinct (the failed one adds none)
    assert every["corpus_distinct1"] == pytest.approx(8 / 11)
    # bigrams: (i like) (like tea) | (i like) (like tea) (tea a) (a lot) | (where were) (were we): 6 of 8
    assert every["corpus_distinct2"] == pytest.approx(6 / 8)
    # per response every one of these is 1.0: the corpus statistic is what falls (RSum's ~4% / 26%)
    assert all(text.distinct([r["response"]], 1) == 1.0 for r in raw if r["response"])
    session3 = out[("msc", "next_response", None, 3, "m")]
    assert session3["corpus_distinct1"] == pytest.approx(5 / 8) and session3["failed"] == 0
    session4 = out[("msc", "next_response", None, 4, "m")]
    assert (session4["responses"], session4["failed"], session4["corpus_distinct1"]) == (2, 1, 1.0)
    # the failed response enters corpus BLEU as an empty hypothesis: its gold still counts in the length
    assert session4["evaluate_bleu1"] == pytest.approx(sacrebleu_1(["", "where were we"], ["gold three", "gold four"]))
    assert out[("locomo", "qa", "single-hop", None, "m")]["evaluate_bleu1"] == pytest.approx(1.0)
    pa.Table.from_pylist(list(out.values()), schema=CORPUS_METRICS)


def _summary(raw: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    metrics = pl.from_arrow(pa.Table.from_pylist(score_rows(raw), schema=RESPONSE_METRICS))
    corpus = pl.from_arrow(pa.Table.from_pylist(corpus_rows(raw), schema=CORPUS_METRICS))
    df = metric_summary(metrics, corpus)
    assert df.columns == METRIC_SUMMARY.names
    return {(r["dataset"], r["kind"], r["category"], r["session_idx"], r["method"]): r for r in df.to_dicts()}


def test_metric_summary_means_count_failures_as_zero_and_show_them_per_session() -> None:
    raw = [
        _probe("m", "the cat is on the mat", "the cat is on the mat", session_idx=3, probe_id="a"),  # F1 1
        _probe("m", "a cat", "the cat is here", session_idx=3, probe_id="b"),  # F1 2 * 1 * 1/3 / (4/3) = 0.5
        _probe("m", None, "anything", session_idx=4, probe_id="c"),  # failed: 0
        _probe("m", "paris", "paris", dataset="locomo", kind="qa", category="single-hop", session_idx=20),
        _probe("m", "rome", "paris", dataset="locomo", kind="qa", category="multi-hop", session_idx=20, probe_id="q"),
    ]
    out = _summary(raw)
    every = out[("msc", "next_response", None, None, "m")]
    assert (every["responses"], every["failed"]) == (3, 1)
    assert every["token_f1"] == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    assert every["words"] == pytest.approx((6 + 2) / 2)  # over the answered responses
    # One episode (e1): no interval over episodes; the bootstrap over responses taken as independent beside it.
    assert (every["episodes"], every["token_f1_low"], every["token_f1_high"]) == (1, None, None)
    assert (every["token_f1_iid_low"], every["token_f1_iid_high"]) == bootstrap_mean_interval([1.0, 0.5, 0.0])
    assert every["token_f1_iid_low"] <= every["token_f1"] <= every["token_f1_iid_high"]
    assert out[("msc", "next_response", None, 3, "m")]["token_f1"] == pytest.approx(0.75)
    session4 = out[("msc", "next_response", None, 4, "m")]
    assert (session4["responses"], session4["failed"], session4["token_f1"]) == (1, 1, 0.0)
    assert session4["token_f1_iid_low"] == session4["token_f1_iid_high"] == 0.0  # one value: the value itself
    # LoCoMo questions: per category, no per-session rows; locomo_f1 only where it applies
    assert out[("locomo", "qa", None, None, "m")]["locomo_f1"] == pytest.approx(0.5)
    assert out[("locomo", "qa", "single-hop", None, "m")]["locomo_f1"] == 1.0
    assert every["locomo_f1"] is None and every["locomo_f1_low"] is None and every["locomo_f1_iid_low"] is None
    assert not any(k[0] == "locomo" and k[3] is not None for k in out)
    # the corpus statistics land on the row of the same group
    assert every["evaluate_bleu1"] == pytest.approx(sacrebleu_1(
        ["the cat is on the mat", "a cat", ""], ["the cat is on the mat", "the cat is here", "anything"]))
    assert out[("locomo", "qa", "multi-hop", None, "m")]["evaluate_bleu1"] == 0.0
    assert every["corpus_distinct1"] == pytest.approx(6 / 8)  # the cat is on the mat a cat: 6 distinct of 8


def test_metric_summary_rows_and_corpus_rows_cover_the_same_groups() -> None:
    rng = random.Random(5)
    raw = [_probe(m, rng.choice(["yes", "no way", None]), "yes", session_idx=s, probe_id=f"{m}{s}{i}",
                  dataset=d, kind=k, category=c)
           for m in ("a", "b") for s in (2, 3) for i in range(3)
           for d, k, c in (("msc", "next_response", None), ("locomo", "qa", "temporal"))]
    metrics = pl.from_arrow(pa.Table.from_pylist(score_rows(raw), schema=RESPONSE_METRICS))
    keys = ["dataset", "kind", "category", "session_idx", "method"]
    summary = metric_summary(metrics)  # without the corpus table: its columns are there, empty
    assert summary["evaluate_bleu4"].null_count() == summary.height
    assert {tuple(r[k] for k in keys) for r in summary.to_dicts()} == {tuple(r[k] for k in keys)
                                                                        for r in corpus_rows(raw)}
