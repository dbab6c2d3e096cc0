"""Dialogue segmentation metrics: Pk, WindowDiff, boundary F1 and SeCom's segment score.

Canonical representation ("boundaries"): one bool per turn, True = this turn starts a new segment
(the same meaning as the TURNS column `gold_topic_boundary`). Element 0 is ignored: the first turn
always starts a segment. Helpers convert from/to segment spans (inclusive (start, end) turn
indices) and segment lengths.

Pk and WindowDiff are computed over the n-1 *slots between consecutive turns* (slot j holds a
boundary iff turn j+1 starts a segment). A window of width k covers k consecutive slots, so it
compares turn i with turn i+k, and there are (n-1)-k+1 = n-k windows, as in Pevzner & Hearst
(2002). `to_nltk` writes exactly these slots as the "0100.." string nltk expects, so
`pk(ref, hyp, k) == nltk.metrics.segmentation.pk(to_nltk(ref), to_nltk(hyp), k)` (same for
WindowDiff).
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


def to_nltk(boundaries: Boundaries) -> str:
    """The n-1 between-turn slots as nltk's segmentation string ('1' = boundary)."""
    return "".join("1" if b else "0" for b in list(boundaries)[1:])


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


def _resolve_k(ref: Boundaries, k: int | None, n_slots: int) -> int:
    k = default_k(ref) if k is None else int(k)
    if k < 1:
        raise ValueError(f"window width k must be >= 1; got {k}")
    # A window wider than the conversation would leave no window at all; clamp to one window.
    return min(k, n_slots)


def pk(ref: Boundaries, hyp: Boundaries, k: int | None = None) -> float:
    """Beeferman's Pk: share of windows where ref and hyp disagree on 'is there any boundary'."""
    _check(ref, hyp)
    r, h = _slots(ref), _slots(hyp)
    if len(r) == 0:
        return 0.0  # a single turn cannot be segmented wrongly
    k = _resolve_k(ref, k, len(r))
    return float(np.mean((_window_counts(r, k) > 0) != (_window_counts(h, k) > 0)))


def window_diff(ref: Boundaries, hyp: Boundaries, k: int | None = None) -> float:
    """Pevzner & Hearst's WindowDiff: share of windows whose boundary counts differ."""
    _check(ref, hyp)
    r, h = _slots(ref), _slots(hyp)
    if len(r) == 0:
        return 0.0
    k = _resolve_k(ref, k, len(r))
    return float(np.mean(_window_counts(r, k) != _window_counts(h, k)))


def precision_recall_f1(ref: Boundaries, hyp: Boundaries) -> tuple[float, float, float]:
    """Exact-match boundary precision, recall and F1 over the between-turn slots.

    When there is nothing to find and nothing was predicted, all three are 1.0; a ratio with an
    empty denominator otherwise counts as 0.0.
    """
    _check(ref, hyp)
    r, h = _slots(ref).astype(bool), _slots(hyp).astype(bool)
    n_ref, n_hyp, tp = int(r.sum()), int(h.sum()), int((r & h).sum())
    if n_ref == 0 and n_hyp == 0:
        return 1.0, 1.0, 1.0
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


def evaluate(ref: Boundaries, hyp: Boundaries, k: int | None = None) -> dict[str, float]:
    """All segmentation metrics for one session: pk, wd, precision, recall, f1, score, k."""
    _check(ref, hyp)
    p_k, wd = pk(ref, hyp, k), window_diff(ref, hyp, k)
    p, r, f1 = precision_recall_f1(ref, hyp)
    used_k = _resolve_k(ref, k, len(ref) - 1) if len(ref) > 1 else 0
    return {"pk": p_k, "wd": wd, "precision": p, "recall": r, "f1": f1,
            "score": segment_score(p_k, wd, f1), "k": float(used_k)}
