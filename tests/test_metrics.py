"""Segmentation and retrieval metrics: agreement with nltk, conversions, hand-computed cases."""

from __future__ import annotations

import math
import random

import pytest
from nltk.metrics.segmentation import pk as nltk_pk
from nltk.metrics.segmentation import windowdiff as nltk_windowdiff

from stages.metrics.retrieval import dcg_at_k, recall_at_k, turn_relevance
from stages.metrics.segmentation import (
    boundaries_to_lengths,
    boundaries_to_spans,
    default_k,
    evaluate,
    gold_boundaries,
    lengths_to_boundaries,
    lengths_to_spans,
    pk,
    precision_recall_f1,
    segment_score,
    spans_to_boundaries,
    spans_to_lengths,
    to_nltk,
    window_diff,
)


def _random_boundaries(rng: random.Random, n: int) -> list[bool]:
    density = rng.choice([0.0, 0.05, 0.15, 0.3, 0.6, 1.0])
    return [True] + [rng.random() < density for _ in range(n - 1)]


def test_pk_and_windowdiff_agree_with_nltk_on_random_cases() -> None:
    rng = random.Random(1234)
    checked = 0
    for _ in range(600):
        n = rng.randint(2, 90)
        ref, hyp = _random_boundaries(rng, n), _random_boundaries(rng, n)
        k = rng.choice([None, 1, 2, 3, rng.randint(1, n - 1)])
        used_k = min(default_k(ref) if k is None else k, n - 1)
        r, h = to_nltk(ref), to_nltk(hyp)
        assert pk(ref, hyp, k) == pytest.approx(nltk_pk(r, h, used_k), abs=1e-12)
        assert window_diff(ref, hyp, k) == pytest.approx(nltk_windowdiff(r, h, used_k), abs=1e-12)
        checked += 1
    assert checked == 600


def test_default_k_is_half_mean_reference_segment_length() -> None:
    assert default_k(lengths_to_boundaries([4, 4, 4])) == 2
    assert default_k(lengths_to_boundaries([5, 5])) == 3  # 2.5 rounds half up
    assert default_k(lengths_to_boundaries([1, 1, 1, 1])) == 1  # 0.5 -> 1, and never below 1
    assert default_k(lengths_to_boundaries([20])) == 10


def test_pk_windowdiff_hand_cases() -> None:
    ref = lengths_to_boundaries([3, 3])  # slots: 0 0 1 0 0
    assert pk(ref, ref) == 0.0 and window_diff(ref, ref) == 0.0
    none = [True] + [False] * 5
    # k=2 (mean length 3 / 2 = 1.5 -> 2): windows over slots (0,0) (0,1) (1,0) (0,0): two contain the boundary.
    assert pk(ref, none) == pytest.approx(2 / 4)
    assert window_diff(ref, none) == pytest.approx(2 / 4)
    # WindowDiff counts boundaries, Pk only their presence: two boundaries where one is expected.
    double = [True, False, True, True, False, False]  # slots 0 1 1 0 0
    assert pk(ref, double, 2) == pytest.approx(1 / 4)  # only window (0,1) vs (0,0) differs
    assert window_diff(ref, double, 2) == pytest.approx(2 / 4)
    assert pk([True], [True]) == 0.0 and window_diff([True], [True]) == 0.0
    with pytest.raises(ValueError):
        pk(ref, ref[:-1])


def test_conversions_round_trip() -> None:
    lengths = [2, 1, 4, 3]
    b = lengths_to_boundaries(lengths)
    assert b == [True, False, True, True, False, False, False, True, False, False]
    spans = boundaries_to_spans(b)
    assert spans == [(0, 1), (2, 2), (3, 6), (7, 9)]
    assert spans_to_boundaries(spans) == b
    assert boundaries_to_lengths(b) == lengths
    assert spans_to_lengths(spans) == lengths and lengths_to_spans(lengths) == spans
    assert to_nltk(b) == "011000100"  # slot j: does turn j+1 start a segment
    with pytest.raises(ValueError):
        spans_to_boundaries([(0, 1), (3, 4)])  # gap
    with pytest.raises(ValueError):
        spans_to_boundaries([(0, 1)], n_turns=4)  # does not cover the session


def test_gold_boundaries_treats_null_as_no_boundary_and_first_turn_as_start() -> None:
    assert gold_boundaries([None, False, True, None]) == [True, False, True, False]
    assert gold_boundaries([False]) == [True]


def test_precision_recall_f1_exact_match() -> None:
    ref = [True, False, True, False, True, False]
    hyp = [True, True, True, False, False, False]
    p, r, f1 = precision_recall_f1(ref, hyp)  # hyp slots {1, 2}, ref slots {2, 4}
    assert (p, r) == (0.5, 0.5) and f1 == pytest.approx(0.5)
    # Nothing to find and nothing found: 0, as scikit-learn's f1_score (zero_division=0) gives.
    assert precision_recall_f1([True, False], [True, False]) == (0.0, 0.0, 0.0)
    assert precision_recall_f1([True, True], [True, False]) == (0.0, 0.0, 0.0)
    # SuperDialseg zeroes the final label on both sides: one segment on each side finds nothing, 0.0.
    assert precision_recall_f1([True, False], [True, False], "superdialseg") == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("convention", ["slots", "superdialseg"])
def test_f1_agrees_with_scikit_learn_in_both_conventions(convention: str) -> None:
    from sklearn.metrics import f1_score, precision_score, recall_score

    from stages.metrics.segmentation import boundary_items

    rng = random.Random(7)
    for _ in range(100):  # scikit-learn's checks cost ~2 ms a call: 100 cases cover every density
        n = rng.randint(2, 40)
        ref, hyp = _random_boundaries(rng, n), _random_boundaries(rng, n)
        r, h = boundary_items(ref, convention), boundary_items(hyp, convention)
        p, rec, f1 = precision_recall_f1(ref, hyp, convention)
        assert p == pytest.approx(precision_score(r, h, zero_division=0))
        assert rec == pytest.approx(recall_score(r, h, zero_division=0))
        assert f1 == pytest.approx(f1_score(r, h, zero_division=0))


def test_superdialseg_labels_end_segments_and_the_final_label_is_always_zero() -> None:
    from stages.metrics.segmentation import superdialseg_k, superdialseg_labels

    assert superdialseg_labels([True, False, True, False, False]) == [0, 1, 0, 0, 0]
    assert superdialseg_labels([True, False, False, True]) == [0, 0, 1, 0]
    assert superdialseg_labels([True, True, True]) == [1, 1, 0]  # three one-turn segments
    assert to_nltk([True, False, True, False], "superdialseg") == "0100"
    # k = max(2, round(n / (boundaries + 1) / 2)); Python's round: 10 / 2 / 2 = 2.5 -> 2
    assert superdialseg_k(lengths_to_boundaries([5, 5])) == 2
    assert superdialseg_k(lengths_to_boundaries([14])) == 7  # 14 / 1 / 2
    assert superdialseg_k(lengths_to_boundaries([6, 6, 6])) == 3  # 18 / 3 / 2
    assert superdialseg_k(lengths_to_boundaries([1, 1])) == 2  # never below 2


def test_superdialseg_worked_cases_from_the_audit() -> None:
    # gold segments [0,1] [2,3], prediction one segment: labels 0100 vs 0000, k = max(2, round(4/2/2)) = 2.
    m = evaluate([True, False, True, False], [True, False, False, False])
    assert m["f1"] == 0.0 and m["precision"] == 0.0 and m["recall"] == 0.0 and m["k"] == 2.0
    # windows of 2 over 0100: (01) (10) (00) hold a boundary, yes yes no; over 0000 never -> 2 of 3 differ
    assert m["pk"] == pytest.approx(2 / 3) and m["wd"] == pytest.approx(2 / 3)
    # gold segments [0,2] [3], prediction one segment: labels 0010 vs 0000 -> windows (00) (01) (10)
    m = evaluate([True, False, False, True], [True, False, False, False])
    assert m["pk"] == pytest.approx(2 / 3) and m["wd"] == pytest.approx(2 / 3) and m["f1"] == 0.0
    # a correct one-segment prediction: Pk and WD 0, F1 0.0 (nothing to find), score (0 + 2) / 4
    m = evaluate([True, False, False], [True, False, False])
    assert (m["pk"], m["wd"], m["f1"], m["score"]) == (0.0, 0.0, 0.0, 0.5)
    # an exact prediction with a boundary: F1 1, and the final label (0 on both sides) never counts
    m = evaluate([True, False, True, False], [True, False, True, False])
    assert (m["pk"], m["wd"], m["precision"], m["recall"], m["f1"], m["score"]) == (0.0, 0.0, 1.0, 1.0, 1.0, 1.0)


def _superdialseg_reference(dialogues: list[tuple[list[int], list[int]]]) -> dict[str, float]:
    """A faithful transcription of SuperDialseg's own evaluation, to compare against (Coldog2333/
    SuperDialseg: examples/reproduce/main.py `easy_evaluate` zeroes the last label and prediction;
    src/super_dialseg/metrics/segmentation.py `Pk` / `Windowdiff` with window_size 'auto' call nltk;
    metrics/classification.py `F1Score` is sklearn's binary f1 with zero_division=0; metrics/basic.py
    `EvaluationBase._compute` averages per dialogue; `SegmentationEvaluation.compute_total_score`).
    Input: (gold, predicted) labels per dialogue in SuperDialseg's format, 1 = end of a topic."""
    from sklearn.metrics import f1_score

    result = {"pk": 0.0, "windowdiff": 0.0, "f1(binary)": 0.0}
    for labels, predictions in dialogues:
        segmentation_labels, segmentation_predictions = list(labels), list(predictions)
        segmentation_labels[-1] = 0
        segmentation_predictions[-1] = 0
        y_true, y_pred = segmentation_labels, segmentation_predictions
        n_segment = sum(y_true) + 1
        aver_length_of_segment = len(y_true) / n_segment / 2
        window_size = max(2, int(round(aver_length_of_segment)))
        t, p = "".join([str(v) for v in y_true]), "".join([str(v) for v in y_pred])
        result["pk"] += nltk_pk(ref=t, hyp=p, k=window_size)
        result["windowdiff"] += nltk_windowdiff(seg1=t, seg2=p, k=window_size)
        result["f1(binary)"] += f1_score(y_true=y_true, y_pred=y_pred, labels=None, average="binary", zero_division=0)
    result = {k: v / len(dialogues) for k, v in result.items()}
    result["total_score"] = 0.5 * result["f1(binary)"] + 0.25 * (1 - result["pk"]) + 0.25 * (1 - result["windowdiff"])
    return result


def _random_topic_end_labels(rng: random.Random, n: int) -> list[int]:
    # SuperDialseg's data format; the final label is either value (the evaluation zeroes it).
    density = rng.choice([0.0, 0.05, 0.15, 0.3, 0.6, 1.0])
    return [int(rng.random() < density) for _ in range(n - 1)] + [rng.randint(0, 1)]


def _starts_from_topic_ends(labels: list[int]) -> list[bool]:
    return [i == 0 or labels[i - 1] == 1 for i in range(len(labels))]


def test_superdialseg_convention_agrees_with_superdialsegs_own_evaluation_on_random_cases() -> None:
    rng = random.Random(2023)
    dialogues = []
    for _ in range(150):
        n = rng.randint(2, 60)
        dialogues.append((_random_topic_end_labels(rng, n), _random_topic_end_labels(rng, n)))
    ours = []
    for gold, pred in dialogues:
        m = evaluate(_starts_from_topic_ends(gold), _starts_from_topic_ends(pred), convention="superdialseg")
        theirs = _superdialseg_reference([(gold, pred)])
        assert m["pk"] == pytest.approx(theirs["pk"], abs=1e-12)
        assert m["wd"] == pytest.approx(theirs["windowdiff"], abs=1e-12)
        assert m["f1"] == pytest.approx(theirs["f1(binary)"], abs=1e-12)
        ours.append(m)
    # The dataset figures: means per dialogue, and the score on the means (SeCom Eq. 3).
    theirs = _superdialseg_reference(dialogues)
    mean = {k: sum(m[k] for m in ours) / len(ours) for k in ("pk", "wd", "f1")}
    assert mean["pk"] == pytest.approx(theirs["pk"]) and mean["wd"] == pytest.approx(theirs["windowdiff"])
    assert mean["f1"] == pytest.approx(theirs["f1(binary)"])
    assert segment_score(mean["pk"], mean["wd"], mean["f1"]) == pytest.approx(theirs["total_score"])
    # the cases exercised every branch: no gold boundary, a perfect match, F1 strictly between 0 and 1
    assert any(sum(g[:-1]) == 0 for g, _ in dialogues) and any(m["f1"] == 1.0 for m in ours)
    assert any(0 < m["f1"] < 1 for m in ours)


def test_superdialseg_and_slots_conventions_differ_in_the_trailing_label_and_k_but_not_f1() -> None:
    ref, hyp = [True, False, False, True], [True, False, False, False]
    assert precision_recall_f1(ref, hyp, "slots") == precision_recall_f1(ref, hyp, "superdialseg") == (0, 0, 0)
    # slots 001 vs 000, k = floor(4 / 2 / 2 + 0.5) = 1: windows (0) (0) (1) -> 1 of 3 differ
    assert pk(ref, hyp, convention="slots") == pytest.approx(1 / 3)
    # labels 0010 vs 0000, k = max(2, round(1.0)) = 2: windows (00) (01) (10) -> 2 of 3 differ
    assert pk(ref, hyp, convention="superdialseg") == pytest.approx(2 / 3)
    # with the same k the trailing 0 adds one window that always agrees: 1 of 4
    assert pk(ref, hyp, 1, convention="superdialseg") == pytest.approx(1 / 4)


def test_segment_score_matches_paper_table() -> None:
    # SeCom Table 4, zero-shot rows: (Pk, WD, F1) -> Score.
    assert segment_score(0.093, 0.103, 0.888) == pytest.approx(0.895, abs=6e-4)
    assert segment_score(0.277, 0.289, 0.758) == pytest.approx(0.738, abs=6e-4)
    assert segment_score(0.363, 0.401, 0.596) == pytest.approx(0.607, abs=6e-4)
    perfect = evaluate(lengths_to_boundaries([3, 4]), lengths_to_boundaries([3, 4]))
    assert perfect["score"] == 1.0 and perfect["pk"] == 0.0 and perfect["f1"] == 1.0


def test_recall_at_k_hand_computed() -> None:
    units = [{"x", "a"}, {"b", "c", "y"}, {"z", "d"}]
    gold = {"a", "b", "c", "d"}
    assert recall_at_k(units, gold, 1) == 0.25
    assert recall_at_k(units, gold, 2) == 0.75
    assert recall_at_k(units, gold, 10) == 1.0
    assert recall_at_k(units, gold, 0) == 0.0
    assert math.isnan(recall_at_k(units, set(), 3))


def test_dcg_unit_level_hand_computed() -> None:
    units = [{"x", "a"}, {"b", "c", "y"}, {"z"}]
    gold = {"a", "b", "c", "d"}
    assert turn_relevance(gold) == {g: 0.25 for g in gold}
    expected = 0.25 / math.log2(2) + 0.5 / math.log2(3)
    assert dcg_at_k(units, gold, 2) == pytest.approx(expected)
    assert dcg_at_k(units, gold, 3) == pytest.approx(expected)  # irrelevant unit adds nothing
    assert dcg_at_k([gold | {"q"}], gold, 1) == pytest.approx(1.0)  # everything at rank 1
    # a gold turn earns its gain once, at its first rank
    assert dcg_at_k([{"a"}, {"a", "b"}], {"a", "b"}, 2) == pytest.approx(0.5 + 0.5 / math.log2(3))
    assert math.isnan(dcg_at_k(units, [], 2))


def test_dcg_by_turn_positions_and_turn_bank_agreement() -> None:
    units = [["x", "a"], ["b", "c", "y"]]
    gold = {"a", "b", "c", "d"}
    expected = 0.25 / math.log2(3) + 0.25 / math.log2(4) + 0.25 / math.log2(5)
    assert dcg_at_k(units, gold, 2, by_turn=True) == pytest.approx(expected)
    turn_bank = [["q"], ["b"], ["r"], ["a"]]
    assert dcg_at_k(turn_bank, gold, 4) == pytest.approx(dcg_at_k(turn_bank, gold, 4, by_turn=True))
