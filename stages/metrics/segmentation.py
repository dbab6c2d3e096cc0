"""Dialogue segmentation metrics: Pk, WindowDiff, boundary F1 and SeCom's segment score.

Canonical representation ("boundaries"): one bool per turn, True = this turn starts a new segment
(the same meaning as the TURNS column `gold_topic_boundary`). Element 0 is ignored: the first turn
always starts a segment. Helpers convert from/to segment spans (inclusive (start, end) turn
indices) and segment lengths.

Two conventions for the sequence Pk, WindowDiff and F1 run over:
- "superdialseg" (default; SuperDialseg, Jiang et al. 2023, whose evaluation SeCom reports): n
  per-utterance labels, 1 = the utterance ends a segment, except that the final utterance is always
  labelled 0 on both sides (SuperDialseg's evaluation zeroes the last label of gold and prediction),
  and the window k = max(2, round(n / (boundaries + 1) / 2)) with Python's round, boundaries = the
  reference's 1-labels;
- "slots": the n-1 *slots between consecutive turns* (slot j holds a boundary iff turn j+1 starts a
  segment), k = half the mean reference segment length rounded half up, at least 1, as in
  Pevzner & Hearst (2002).
The superdialseg labels are the slots followed by one 0; the conventions differ in that trailing
item (one more window) and in k. In both, a window of width k covers k consecutive items and there
are len-k+1 windows, exactly as nltk computes them: `pk(ref, hyp, k, c) == nltk.pk(to_nltk(ref, c),
to_nltk(hyp, c), k)` (same for WindowDiff). F1 is the binary F1 of the boundary items, 0 when there
is none on either side (as scikit-learn's f1_score with zero_division=0); the trailing 0 never
changes it, so F1 is the same in both conventions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Boundaries = Sequence[bool]


# ---------------------------------------------------------------- conversions


def spans_to_boundaries(spans: Sequence[tuple[int, int]], n_turns: int | None = None) -> list[bool]:
    """Inclusive (start, end) spans that tile 0..n-1 -> per-turn boundary flags."""
    n = spans[-1][1] + 1 if n_turns is None else n_turns
    out = [False] * n
    expect = 0
    for start, end in spans:
        if start != expect or end < start:
            raise ValueError(f"spans must tile the turns in order; got {list(spans)}")
        out[start] = True
        expect = end + 1
    if expect != n:
        raise ValueError(f"spans cover {expect} turns, expected {n}")
    return out


def boundaries_to_spans(boundaries: Boundaries) -> list[tuple[int, int]]:
    """Per-turn boundary flags -> inclusive (start, end) spans."""
    n = len(boundaries)
    if n == 0:
        return []
    starts = [0] + [i for i in range(1, n) if boundaries[i]]
    return [(s, e - 1) for s, e in zip(starts, starts[1:] + [n])]


def lengths_to_boundaries(lengths: Sequence[int]) -> list[bool]:
    """Segment lengths (e.g. DialSeg711 / TIAGE annotations) -> per-turn boundary flags."""
    out: list[bool] = []
    for length in lengths:
        if length < 1:
            raise ValueError(f"segment lengths must be >= 1; got {list(lengths)}")
        out += [True] + [False] * (length - 1)
    return out


def boundaries_to_lengths(boundaries: Boundaries) -> list[int]:
    return [e - s + 1 for s, e in boundaries_to_spans(boundaries)]


def spans_to_lengths(spans: Sequence[tuple[int, int]]) -> list[int]:
    return boundaries_to_lengths(spans_to_boundaries(spans))


def lengths_to_spans(lengths: Sequence[int]) -> list[tuple[int, int]]:
    return boundaries_to_spans(lengths_to_boundaries(lengths))


def gold_boundaries(values: Sequence[bool | None]) -> list[bool]:
    """The `gold_topic_boundary` column of one session -> boundary flags (null counts as no boundary)."""
    out = [bool(v) for v in values]
    if out:
        out[0] = True
    return out


Convention = str  # "superdialseg" | "slots"
CONVENTIONS = ("superdialseg", "slots")


def superdialseg_labels(boundaries: Boundaries) -> list[int]:
    """Per-turn boundary flags -> SuperDialseg's evaluation labels: 1 = the utterance ends a segment,
    and the final utterance 0 (its evaluation zeroes the last gold and predicted label, so that a
    segmentation's necessary final end is never counted as a found boundary)."""
    b = list(boundaries)
    return [1 if i < len(b) - 1 and b[i + 1] else 0 for i in range(len(b))]


def boundary_items(boundaries: Boundaries, convention: Convention = "superdialseg") -> np.ndarray:
    """The 0/1 sequence the metrics run over in a convention."""
    if convention == "superdialseg":
        return np.asarray(superdialseg_labels(boundaries), dtype=np.int64)
    if convention == "slots":
        return _slots(boundaries)
    raise ValueError(f"unknown segmentation convention {convention!r}; use one of {CONVENTIONS}")


def to_nltk(boundaries: Boundaries, convention: Convention = "slots") -> str:
    """The items of a convention as nltk's segmentation string ('1' = boundary)."""
    return "".join(str(int(x)) for x in boundary_items(boundaries, convention))


# ---------------------------------------------------------------- metrics


def _slots(boundaries: Boundaries) -> np.ndarray:
    return np.asarray(list(boundaries)[1:], dtype=bool).astype(np.int64)


def _check(ref: Boundaries, hyp: Boundaries) -> None:
    if len(ref) != len(hyp):
        raise ValueError(f"segmentations differ in length: {len(ref)} vs {len(hyp)} turns")
    if len(ref) == 0:
        raise ValueError("empty segmentation")


def default_k(ref: Boundaries) -> int:
    """Half the mean reference segment length, rounded half up, at least 1 (the usual convention)."""
    n_segments = 1 + int(_slots(ref).sum())
    return max(1, math.floor(len(ref) / n_segments / 2 + 0.5))


def _window_counts(slots: np.ndarray, k: int) -> np.ndarray:
    # Boundaries inside each window of k consecutive slots, via a prefix sum.
    cs = np.concatenate([[0], np.cumsum(slots)])
    return cs[k:] - cs[:-k]


def superdialseg_k(ref: Boundaries) -> int:
    """SuperDialseg's window over the reference's n labels: max(2, round(n / (boundaries + 1) / 2)),
    boundaries + 1 being the number of reference segments; Python's round (half to even)."""
    labels = superdialseg_labels(ref)
    return max(2, round(len(labels) / (sum(labels) + 1) / 2))


def _resolve_k(ref: Boundaries, k: int | None, n_items: int, convention: Convention) -> int:
    if k is None:
        k = superdialseg_k(ref) if convention == "superdialseg" else default_k(ref)
    if k < 1:
        raise ValueError(f"window width k must be >= 1; got {k}")
    # A window wider than the conversation would leave no window at all; clamp to one window.
    return min(int(k), n_items)


def pk(ref: Boundaries, hyp: Boundaries, k: int | None = None, convention: Convention = "slots") -> float:
    """Beeferman's Pk: share of windows where ref and hyp disagree on 'is there any boundary'."""
    _check(ref, hyp)
    r, h = boundary_items(ref, convention), boundary_items(hyp, convention)
    if len(ref) < 2:
        return 0.0  # a single turn cannot be segmented wrongly
    k = _resolve_k(ref, k, len(r), convention)
    return float(np.mean((_window_counts(r, k) > 0) != (_window_counts(h, k) > 0)))


def window_diff(ref: Boundaries, hyp: Boundaries, k: int | None = None, convention: Convention = "slots") -> float:
    """Pevzner & Hearst's WindowDiff: share of windows whose boundary counts differ."""
    _check(ref, hyp)
    r, h = boundary_items(ref, convention), boundary_items(hyp, convention)
    if len(ref) < 2:
        return 0.0
    k = _resolve_k(ref, k, len(r), convention)
    return float(np.mean(_window_counts(r, k) != _window_counts(h, k)))


def precision_recall_f1(ref: Boundaries, hyp: Boundaries, convention: Convention = "slots"
                        ) -> tuple[float, float, float]:
    """Exact-match boundary precision, recall and F1 over the convention's items; a ratio with an
    empty denominator is 0.0 (scikit-learn's zero_division=0), also when neither side has a
    boundary."""
    _check(ref, hyp)
    r, h = boundary_items(ref, convention).astype(bool), boundary_items(hyp, convention).astype(bool)
    n_ref, n_hyp, tp = int(r.sum()), int(h.sum()), int((r & h).sum())
    p = tp / n_hyp if n_hyp else 0.0
    rec = tp / n_ref if n_ref else 0.0
    f1 = 2 * p * rec / (p + rec) if p + rec else 0.0
    return p, rec, f1


def segment_score(pk_value: float, wd_value: float, f1_value: float) -> float:
    """SeCom's segment score (its Eq. 3, from the ICASSP 2023 MUG challenge, as in SuperDialSeg):

        Score = (2 * F1 + 2 - Pk - WD) / 4  =  ( F1 + (1 - (Pk + WD) / 2) ) / 2

    i.e. the mean of boundary F1 and one minus the mean window error. Checked against the paper's
    Table 4 (e.g. Pk .093, WD .103, F1 .888 -> .895). For a dataset, apply it to the mean Pk, WD
    and F1, as the paper's table does.
    """
    return (2.0 * f1_value + 2.0 - pk_value - wd_value) / 4.0


def evaluate(ref: Boundaries, hyp: Boundaries, k: int | None = None,
             convention: Convention = "superdialseg") -> dict[str, float]:
    """All segmentation metrics for one session: pk, wd, precision, recall, f1, score, k."""
    _check(ref, hyp)
    p_k, wd = pk(ref, hyp, k, convention), window_diff(ref, hyp, k, convention)
    p, r, f1 = precision_recall_f1(ref, hyp, convention)
    n_items = len(boundary_items(ref, convention))
    used_k = _resolve_k(ref, k, n_items, convention) if len(ref) > 1 else 0
    return {"pk": p_k, "wd": wd, "precision": p, "recall": r, "f1": f1,
            "score": segment_score(p_k, wd, f1), "k": float(used_k)}
