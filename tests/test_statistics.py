"""The report's statistics through scipy / statsmodels, and intervals that respect clustering: items
of one episode (a conversation's questions) are not independent, so the intervals the report shows
first resample whole episodes and the test against the reference permutes whole episodes, while the
iid intervals and tests stay in columns of their own."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from pipeline.reproduction import PaperResult, run_value
from stages.metrics.significance import (bootstrap_mean_interval, cluster_bootstrap_interval, mcnemar_exact,
                                         paired_cluster_test, sign_test, wilson_interval)
from stages.report import render, tables
from stages.scoring.response_metrics import RESPONSE_METRICS


# --- the library-backed functions keep the worked cases ------------------------------------------

def test_the_library_backed_statistics_give_the_hand_worked_numbers():
    # Wilson 95% for 8/10: centre 0.71674, half-width 0.22658 (statsmodels proportion_confint).
    assert wilson_interval(8, 10) == pytest.approx((0.49016, 0.94332), abs=1e-5)
    assert wilson_interval(0, 0) == (None, None)
    # Exact McNemar with 1 vs 6 discordant questions: 2 * (1 + 7) / 128 (statsmodels mcnemar).
    assert mcnemar_exact(1, 6) == pytest.approx(0.125)
    assert mcnemar_exact(0, 0) is None
    assert sign_test(9, 1) == pytest.approx(22 / 1024)
    # The resample means of [0, 100] are 0, 50, 100 with probabilities 1/4, 1/2, 1/4.
    assert bootstrap_mean_interval([0.0, 100.0]) == (0.0, 100.0)
    assert bootstrap_mean_interval([7.0]) == (7.0, 7.0) and bootstrap_mean_interval([]) == (None, None)


def test_the_iid_bootstrap_is_seeded_so_a_report_is_reproducible():
    values = [0.1 * i for i in range(30)]
    assert bootstrap_mean_interval(values, seed=3) == bootstrap_mean_interval(values, seed=3)
    assert bootstrap_mean_interval(values, seed=3) != bootstrap_mean_interval(values, seed=4)


# --- the episode-level cluster bootstrap ---------------------------------------------------------

def correlated_episodes(episodes: int = 10, items: int = 200, seed: int = 7) -> tuple[list[float], list[str]]:
    """Right/wrong items whose episode shares a random rate: strong within-episode correlation."""
    rng = np.random.default_rng(seed)
    rates = rng.uniform(0.05, 0.95, episodes)
    values = [float(rng.random() < rate) for rate in rates for _ in range(items)]
    return values, [f"e{e}" for e in range(episodes) for _ in range(items)]


def test_correlated_episodes_give_a_cluster_interval_much_wider_than_the_iid_one():
    values, episodes = correlated_episodes()
    low, high = cluster_bootstrap_interval(values, episodes)
    iid_low, iid_high = wilson_interval(int(sum(values)), len(values))
    mean = sum(values) / len(values)
    assert low < mean < high and iid_low < mean < iid_high
    assert high - low > 3 * (iid_high - iid_low)  # 10 episodes, not 2,000 independent items
    # Items that do not depend on their episode: the cluster interval is about as wide as the iid one.
    rng = np.random.default_rng(1)
    flat = [float(rng.random() < 0.5) for _ in episodes]
    low, high = cluster_bootstrap_interval(flat, episodes)
    iid_low, iid_high = wilson_interval(int(sum(flat)), len(flat))
    assert 0.5 < (high - low) / (iid_high - iid_low) < 2.0


def test_the_cluster_interval_keeps_an_episodes_items_together():
    # Two episodes with 0.0 items and 1.0 items in equal parts: every resample of whole episodes has mean 0.5.
    assert cluster_bootstrap_interval([0.0, 1.0, 1.0, 0.0], ["a", "a", "b", "b"]) == (0.5, 0.5)
    # Split the same items by value instead and the resamples range from 0 to 1.
    assert cluster_bootstrap_interval([0.0, 0.0, 1.0, 1.0], ["a", "a", "b", "b"]) == (0.0, 1.0)
    # The order of the rows does not move the interval.
    values, episodes = correlated_episodes(episodes=6, items=20)
    order = np.random.default_rng(0).permutation(len(values))
    assert cluster_bootstrap_interval(values, episodes) == \
        cluster_bootstrap_interval([values[i] for i in order], [episodes[i] for i in order])


def test_one_episode_has_no_cluster_interval_and_equal_items_raise_no_warning():
    assert cluster_bootstrap_interval([1.0, 0.0, 1.0], ["e"] * 3) == (None, None)
    assert cluster_bootstrap_interval([], []) == (None, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a NaN or degenerate-data warning would fail here
        assert cluster_bootstrap_interval([2.0] * 6, list("aabbcc")) == (2.0, 2.0)
        assert bootstrap_mean_interval([2.0] * 6) == (2.0, 2.0)
        assert cluster_bootstrap_interval([1.0, 0.0] * 3, list("aabbcc")) == (0.5, 0.5)
        assert paired_cluster_test([1.0] * 4, [1.0] * 4, list("aabb")) is None  # never disagree: no test


# --- the paired cluster test ---------------------------------------------------------------------

def by_hand_sign_flips(differences: list[float]) -> float:
    """The exact two-sided p of a sign-flip permutation test: the share of the 2^k flips of the
    episodes' differences whose |sum| reaches the observed |sum|."""
    observed = abs(sum(differences))
    flips = list(itertools.product((1, -1), repeat=len(differences)))
    return sum(abs(sum(s * d for s, d in zip(signs, differences))) >= observed - 1e-12 for signs in flips) / len(flips)


def test_the_paired_cluster_test_is_the_exact_permutation_of_whole_episodes():
    # Four episodes whose items are identical within the episode: the reference right and the other
    # wrong on 3, 2 and 1 items, the other way round on 1: episode differences 3, 2, 1, -1.
    sizes_and_values = [(3, 1.0, 0.0), (2, 1.0, 0.0), (1, 1.0, 0.0), (1, 0.0, 1.0)]
    reference, other, episodes = [], [], []
    for e, (n, ref, oth) in enumerate(sizes_and_values):
        reference += [ref] * n
        other += [oth] * n
        episodes += [f"e{e}"] * n
    assert by_hand_sign_flips([3, 2, 1, -1]) == 6 / 16
    assert paired_cluster_test(reference, other, episodes) == pytest.approx(6 / 16)
    assert paired_cluster_test(other, reference, episodes) == pytest.approx(6 / 16)  # two-sided
    # Three episodes of GPT4Score-like values: the same by hand.
    reference, other, episodes = [70.0, 50.0, 90.0, 40.0], [60.0, 20.0, 95.0, 10.0], ["a", "a", "b", "c"]
    assert paired_cluster_test(reference, other, episodes) == pytest.approx(by_hand_sign_flips([-40.0, 5.0, -30.0]))
    # Every item an independent episode instead: 7 items all won by the reference (p = 2 / 2^7).
    assert paired_cluster_test([1.0] * 7, [0.0] * 7, [str(i) for i in range(7)]) == pytest.approx(2 / 128)
    # ... but the same 7 items in one episode: one episode cannot show a difference.
    assert paired_cluster_test([1.0] * 7, [0.0] * 7, ["e"] * 7) == 1.0


def test_many_episodes_use_seeded_random_swaps():
    rng = np.random.default_rng(2)
    reference = [float(v) for v in rng.random(40) < 0.6]
    other = [float(v) for v in rng.random(40) < 0.4]
    episodes = [f"e{i // 2}" for i in range(40)]  # 20 episodes: 2^20 swaps, more than the 9,999 drawn
    p = paired_cluster_test(reference, other, episodes)
    assert p == paired_cluster_test(reference, other, episodes) and 0.0 < p <= 1.0


# --- the summary tables --------------------------------------------------------------------------

def answer_rows(values: list[float], episodes: list[str], method: str, judge: str = "strict",
                dataset: str = "locomo", categories: list[str] | None = None,
                abstention: list[bool] | None = None) -> list[dict]:
    return [{"dataset": dataset, "episode_id": e, "probe_id": f"q{i}", "kind": "qa",
             "category": categories[i] if categories else "single-hop", "method": method, "judge": judge,
             "score": v, "error": None, "skipped": None, "history_source": None, "judge_model": "j",
             "prompt_fingerprint": "p", "abstention": abstention[i] if abstention else False}
            for i, (v, e) in enumerate(zip(values, episodes))]


def test_answer_summary_shows_the_cluster_interval_first_with_episodes_and_keeps_wilson_and_mcnemar():
    values, episodes = correlated_episodes(episodes=10, items=40)
    other = [1.0 - v if i % 5 == 0 else v for i, v in enumerate(values)]  # b flips every fifth answer
    judgments = pl.DataFrame(answer_rows(values, episodes, "a") + answer_rows(other, episodes, "b"))
    got = {r["method"]: r for r in answer_summary_rows(judgments)}
    a, b = got["a"], got["b"]
    assert (a["judged"], a["episodes"]) == (400, 10)
    assert (a["ci_low"], a["ci_high"]) == cluster_bootstrap_interval(values, [("locomo", e) for e in episodes])
    assert (a["iid_low"], a["iid_high"]) == pytest.approx(wilson_interval(int(sum(values)), 400))
    assert a["ci_high"] - a["ci_low"] > 2 * (a["iid_high"] - a["iid_low"])
    only_ref = sum(v > o for v, o in zip(values, other))
    only_other = sum(o > v for v, o in zip(values, other))
    assert (b["paired"], b["only_reference"], b["only_other"]) == (400, only_ref, only_other)
    assert b["mcnemar_p"] == pytest.approx(mcnemar_exact(only_ref, only_other))
    assert b["p_value"] == pytest.approx(paired_cluster_test(values, other, [("locomo", e) for e in episodes]))
    assert a["p_value"] is None and a["mcnemar_p"] is None


def answer_summary_rows(judgments: pl.DataFrame) -> list[dict]:
    out = tables.answer_summary(judgments, "a")
    assert out.columns == tables.ANSWER_SUMMARY.names
    return out.filter((pl.col("dataset") == "locomo") & pl.col("category").is_null()).to_dicts()


def test_a_gpt4score_mean_gets_the_cluster_interval_and_the_paired_cluster_test_too():
    episodes = ["e1", "e1", "e2", "e2", "e3", "e3"]
    a, b = [80.0, 60.0, 40.0, 50.0, 90.0, 100.0], [70.0, 60.0, 10.0, 20.0, 95.0, 100.0]
    judgments = pl.DataFrame(answer_rows(a, episodes, "a", "gpt4score") + answer_rows(b, episodes, "b", "gpt4score"))
    got = {r["method"]: r for r in answer_summary_rows(judgments)}
    clusters = [("locomo", e) for e in episodes]
    assert (got["a"]["ci_low"], got["a"]["ci_high"]) == cluster_bootstrap_interval(a, clusters)
    assert (got["a"]["iid_low"], got["a"]["iid_high"]) == bootstrap_mean_interval(a)
    assert got["b"]["p_value"] == pytest.approx(by_hand_sign_flips([-10.0, -60.0, 5.0]))
    assert got["b"]["mcnemar_p"] is None and got["b"]["only_other"] is None


def test_one_conversation_gives_rows_with_episodes_1_and_no_cluster_interval():
    judgments = pl.DataFrame(answer_rows([1.0] * 8 + [0.0] * 2, ["e1"] * 10, "a"))
    [row] = answer_summary_rows(judgments)
    assert (row["judged"], row["episodes"], row["ci_low"], row["ci_high"]) == (10, 1, None, None)
    assert (row["iid_low"], row["iid_high"]) == pytest.approx((0.49016, 0.94332), abs=1e-5)


def test_teafarm_summary_clusters_its_two_questions_per_episode():
    values = [1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0]
    episodes = ["e1", "e1", "e2", "e2", "e3", "e3", "e4", "e4"]
    other = [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    judgments = pl.DataFrame(answer_rows(values, episodes, "a", "teafarm", "msc")
                             + answer_rows(other, episodes, "b", "teafarm", "msc"))
    got = {(r["dataset"], r["method"]): r for r in tables.teafarm_summary(judgments, "a").to_dicts()}
    a, b = got[("msc", "a")], got[("msc", "b")]
    assert (a["correct"], a["total"], a["episodes"]) == (5, 8, 4)
    assert (a["ci_low"], a["ci_high"]) == cluster_bootstrap_interval(values, [("msc", e) for e in episodes])
    assert (a["iid_low"], a["iid_high"]) == pytest.approx(wilson_interval(5, 8))
    # b loses 2 in e1, 0 in e2, 0 in e3, 1 in e4: episode differences -2, -1 over the 4 episodes.
    assert b["p_value"] == pytest.approx(by_hand_sign_flips([-2.0, 0.0, 0.0, -1.0]))
    assert b["mcnemar_p"] == pytest.approx(mcnemar_exact(3, 0))


def test_memory_summary_resamples_an_episodes_two_speakers_together():
    def rating(episode: str, speaker: str, score: float) -> dict:
        return {"episode_id": episode, "dataset": "msc", "method": "creem", "speaker": speaker,
                "criterion": "diversity", "group": "fundamental", "sample": 0, "score": score,
                "memory_truncated": False, "dialogue_truncated": False, "judge_model": "j",
                "prompt_fingerprint": "f", "error": None}

    ratings = {("e1", "Ann"): 5.0, ("e1", "Bob"): 4.0, ("e2", "Ann"): 2.0, ("e2", "Bob"): 1.0,
               ("e3", "Ann"): 3.0, ("e3", "Bob"): 3.0}
    [r] = tables.memory_summary(pl.DataFrame([rating(e, s, v) for (e, s), v in ratings.items()])).to_dicts()
    assert (r["ratings"], r["episodes"], r["score"]) == (6, 3, pytest.approx(3.0))
    assert (r["score_low"], r["score_high"]) == cluster_bootstrap_interval(list(ratings.values()),
                                                                           [e for e, _ in ratings])
    assert (r["score_iid_low"], r["score_iid_high"]) == pytest.approx(bootstrap_mean_interval(list(ratings.values())))


def test_metric_summary_bounds_each_mean_by_episodes_and_keeps_the_iid_bounds():
    f1 = [1.0, 0.8, 0.9, 0.1, 0.0, 0.2, 0.5, 0.6]
    episodes = ["e1", "e1", "e1", "e2", "e2", "e2", "e3", "e3"]
    metrics = pl.from_arrow(pa.Table.from_pylist(  # the other scores null
        [{"episode_id": e, "dataset": "locomo", "probe_id": f"q{i}", "kind": "qa", "category": None, "method": "a",
          "session_idx": 3, "failed": False, "token_f1": v} for i, (v, e) in enumerate(zip(f1, episodes))],
        RESPONSE_METRICS))
    [r] = tables.metric_summary(metrics).to_dicts()
    assert (r["responses"], r["episodes"]) == (8, 3)
    assert (r["token_f1_low"], r["token_f1_high"]) == cluster_bootstrap_interval(f1, episodes)
    assert (r["token_f1_iid_low"], r["token_f1_iid_high"]) == bootstrap_mean_interval(f1)


def pair_judgment(episode: str, probe: str, first: bool, preferred: str, criterion: str = "memorability") -> dict:
    return {"dataset": "msc", "episode_id": episode, "probe_id": probe, "session_idx": 3, "criterion": criterion,
            "reference": "theanine", "other": "rsum", "protocol": "both_orders", "reference_first": first,
            "sample": 0, "preferred": preferred, "past_shown": 2, "past_truncated": False, "judge_model": "j",
            "prompt_fingerprint": "f", "error": None}


# (episode, probe): the pair's verdict in both orders, reference won in e1, lost in e2 and e3 is mixed.
PAIRS = {("e1", "p1"): "reference", ("e1", "p2"): "reference", ("e1", "p3"): "reference",
         ("e2", "p4"): "other", ("e2", "p5"): "other", ("e3", "p6"): "reference", ("e3", "p7"): "other",
         ("e3", "p8"): "tie"}


def test_pairwise_summary_clusters_pairs_by_episode():
    rows = [pair_judgment(e, p, first, v) for (e, p), v in PAIRS.items() for first in (True, False)]
    [r] = tables.pairwise_summary(pl.DataFrame(rows)).filter(pl.col("session_idx").is_null()).to_dicts()
    assert (r["pairs"], r["episodes"], r["wins"], r["ties"], r["losses"]) == (8, 3, 4, 1, 3)
    decided = [(e, v) for (e, _), v in PAIRS.items() if v != "tie"]
    assert (r["win_share_low"], r["win_share_high"]) == cluster_bootstrap_interval(
        [float(v == "reference") for _, v in decided], [("msc", e) for e, _ in decided])
    assert (r["win_share_iid_low"], r["win_share_iid_high"]) == pytest.approx(wilson_interval(4, 7))
    assert r["sign_p"] == pytest.approx(sign_test(4, 3))
    # Episode differences of wins - losses: 3, -2, 0.
    assert r["p_value"] == pytest.approx(by_hand_sign_flips([3.0, -2.0, 0.0]))


def test_the_leaderboard_cell_shows_the_cluster_interval_and_the_episodes():
    rows = [pair_judgment(e, p, first, v, c) for (e, p), v in PAIRS.items() for first in (True, False)
            for c in ("memorability", "consistency")]
    wins = tables.pooled_win_shares(pl.DataFrame(rows))
    [w] = wins.to_dicts()
    assert (w["pairs"], w["episodes"], w["won"], w["lost"]) == (16, 3, 6, 8)
    decided = [(e, v) for (e, _), v in PAIRS.items() if v != "tie"] * 2
    low, high = cluster_bootstrap_interval([float(v == "other") for _, v in decided],
                                           [("msc", e) for e, _ in decided])
    assert (w["share_low"], w["share_high"]) == (low, high)
    methods = pl.DataFrame({"method": ["theanine", "rsum"]})
    answers = tables.answer_summary(pl.DataFrame(answer_rows([1.0, 0.0, 1.0, 1.0], ["e1", "e1", "e2", "e2"],
                                                             "rsum", dataset="msc")))
    board = render.leaderboard(methods, answers, tables.empty(tables.TEAFARM_SUMMARY),
                               tables.empty(tables.METRIC_SUMMARY), tables.pairwise_summary(pl.DataFrame(rows)), wins)
    cells = dict(zip(board["method"], board["win share vs theanine"]))
    assert cells == {"theanine": "reference",
                     "rsum": f"{6 / 14 * 100:.0f}% [{low * 100:.0f}–{high * 100:.0f}] n=16 ep=3"}
    strict = dict(zip(board["method"], board["strict correct"]))
    a_low, a_high = cluster_bootstrap_interval([1.0, 0.0, 1.0, 1.0], [("msc", "e1")] * 2 + [("msc", "e2")] * 2)
    assert strict["rsum"] == f"75% [{a_low * 100:.0f}–{a_high * 100:.0f}] n=4 ep=2"


def test_the_reproduction_value_takes_the_cluster_interval_and_the_episodes():
    values, episodes = correlated_episodes(episodes=5, items=10)
    judgments = pl.DataFrame(answer_rows(values, episodes, "a", "teafarm", "msc"))
    summary = tables.teafarm_summary(judgments, "a")
    got = run_value(summary, PaperResult(name="a", paper=50, source="T3", table="teafarm_summary",
                                         where={"dataset": "msc", "method": "a"}, column="correctness", scale=100))
    row = summary.filter(pl.col("dataset") == "msc").row(0, named=True)
    assert (got.n, got.episodes) == (50, 5)
    assert (got.low, got.high) == pytest.approx((row["ci_low"] * 100, row["ci_high"] * 100))
    assert (got.low, got.high) != pytest.approx((row["iid_low"] * 100, row["iid_high"] * 100))


# --- LongMemEval's task-averaged accuracy ---------------------------------------------------------

def test_longmemeval_gets_a_task_average_row_the_mean_of_the_per_type_accuracies():
    # Each LongMemEval question is its own episode. Types: 3 of 4 right, 1 of 2 right, 2 of 2 right;
    # one abstention question (of type "multi-session") counted in its type and in its own row.
    types = ["single-session-user"] * 4 + ["multi-session"] * 2 + ["temporal-reasoning"] * 2
    values = [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0]
    episodes = [f"longmemeval-q{i}" for i in range(8)]
    abstention = [False] * 5 + [True] + [False] * 2
    judgments = pl.DataFrame(answer_rows(values, episodes, "a", dataset="longmemeval", categories=types,
                                         abstention=abstention))
    out = {r["category"]: r for r in tables.answer_summary(judgments, "a").filter(
        pl.col("dataset") == "longmemeval").to_dicts()}
    assert set(out) == {None, "single-session-user", "multi-session", "temporal-reasoning", "abstention",
                        "task_average"}
    average = out["task_average"]
    assert average["score"] == pytest.approx((3 / 4 + 1 / 2 + 2 / 2) / 3)
    assert out[None]["score"] == pytest.approx(6 / 8)  # overall accuracy: not the same number
    assert (average["judged"], average["episodes"], average["correct"]) == (8, 8, None)
    assert (average["ci_low"], average["ci_high"]) == cluster_bootstrap_interval(
        values, [("longmemeval", e) for e in episodes], strata=types)
    assert average["ci_low"] <= average["score"] <= average["ci_high"]
    # Other datasets get no such row.
    other = tables.answer_summary(pl.DataFrame(answer_rows(values, episodes, "a", categories=types)))
    assert "task_average" not in other["category"].to_list()


def test_a_failed_answer_shows_in_every_leaderboard_column_and_a_blank_judge_cell_names_the_failures():
    """author_try F11: after an LLMError in `answer`, gpt4score (which has no "wrong") was a bare blank
    while strict correctness and token F1 counted the failed answer as a wrong / empty one."""
    rows = answer_rows([80.0], ["e1"], "a", "gpt4score") + answer_rows([1.0], ["e1"], "a", "strict")
    for judge in ("gpt4score", "strict"):
        rows.append({**answer_rows([0.0], ["e1"], "b", judge)[0], "score": None, "error": "no response from b"})
    answers = tables.answer_summary(pl.DataFrame(rows))
    metrics = tables.metric_summary(pl.from_arrow(pa.Table.from_pylist(  # the other scores null
        [{"episode_id": "e1", "dataset": "locomo", "probe_id": "q0", "kind": "qa", "category": None, "method": m,
          "session_idx": 1, "failed": failed, "token_f1": f1} for m, failed, f1 in (("a", False, 1.0), ("b", True, 0.0))],
        RESPONSE_METRICS)))
    board = render.leaderboard(pl.DataFrame({"method": ["a", "b"]}), answers, tables.empty(tables.TEAFARM_SUMMARY),
                               metrics, tables.empty(tables.PAIRWISE_SUMMARY)).to_dicts()
    a, b = board
    assert b["gpt4score (0-100)"] == "failed=1"  # left out of the 0-100 mean, and said so
    assert b["strict correct"] == "0% n=1 ep=1 failed=1"  # inside n, scored wrong
    assert b["token_f1 (qa)"].startswith("0.000 n=1") and b["token_f1 (qa)"].endswith(" failed=1")
    assert "failed" not in " ".join(v for k, v in a.items() if k != "method")
