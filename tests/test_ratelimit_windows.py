"""The sliding-window counting of bench/rate_limit.py (peak and mean load per 60 s window)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from rate_limit import full_window_starts, peak_window, window_stats, window_sums  # noqa: E402


def test_window_sums_are_half_open() -> None:
    times = [0.0, 1.0, 2.0, 3.0]
    # [0, 2) holds 0 and 1, not 2; [2, 4) holds 2 and 3
    assert window_sums(times, [1, 1, 1, 1], [0.0, 2.0, 3.5, 10.0], 2.0) == [2, 2, 0, 0]


def test_window_sums_weigh_events() -> None:
    # [0, 5) holds the first two; [0.5, 5.5) the last two
    assert window_sums([0.0, 0.5, 5.0], [10, 20, 40], [0.0, 0.5], 5.0) == [30, 60]


def test_peak_finds_a_window_between_grid_points() -> None:
    # three events within 1 s straddle every whole-second boundary grid a coarse scan would use
    times = [0.7, 1.2, 1.6, 5.0]
    assert peak_window(times, [1] * 4, 1.0) == 3
    assert peak_window([], [], 60.0) == 0


def test_even_spacing_at_the_limit_peaks_at_the_limit() -> None:
    # 480 rpm: one request every 0.125 s (exact in binary) for 3 minutes
    times = [i * 0.125 for i in range(1440)]
    s = window_stats(times, None, 480)
    assert s["peak"] == 480
    assert s["peak_ratio"] == pytest.approx(1.0)
    assert s["used"] == pytest.approx(1.0, abs=0.01)
    assert s["full_windows"] == len(full_window_starts(sorted(times), 60.0)) > 100


def test_a_burst_shows_in_the_peak_not_in_the_mean() -> None:
    steady = [i * 0.25 for i in range(720)]  # 240 rpm for 180 s
    burst = [90.0 + i / 1024 for i in range(360)]  # 360 more at once
    s = window_stats(steady + burst, None, 600)
    assert s["peak"] == 600
    assert s["used"] < 0.9  # most windows hold 240 or 600: the mean is well below the peak


def test_full_windows_lie_inside_the_run() -> None:
    times = [0.0, 30.0, 125.5]
    starts = full_window_starts(times, 60.0, step=1.0)
    assert starts[0] == 0.0 and starts[-1] + 60.0 <= 125.5
    assert len(starts) == 66
    assert full_window_starts([0.0, 59.0], 60.0) == []


def test_short_run_falls_back_to_first_to_last_rate() -> None:
    times = [i * 0.125 for i in range(161)]  # 20 s at 8 per second
    s = window_stats(times, None, 480)
    assert s["full_windows"] == 0
    assert s["used"] == pytest.approx(1.0)
    assert math.isclose(s["span_s"], 20.0)


def test_unsorted_input_keeps_weights_with_their_times() -> None:
    s = window_stats([100.0, 0.0, 0.5], [1, 50, 50], 100, width=60.0)
    assert s["peak"] == 100
