"""The report page a researcher reads: the leaderboard first, the win rates as a heat map, and a
per-probe browser whose data is inline, from hand-built frames."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import polars as pl
import pyarrow as pa
import pytest

from stages import report as report_stage
from stages.report import (
    ReportSettings,
    ReportStage,
    probe_browser_data,
    render,
    tables,
)

METHODS = ["secom", "turn"]


def frames() -> dict[str, pl.DataFrame]:
    t = {name: tables.empty(schema) for name, schema in tables.SUMMARY_TABLES.items()}
    t["method_summary"] = pl.concat([t["method_summary"], pl.DataFrame(
        {"method": METHODS, "probes": [4, 4], "gpt4score": [70.0, 55.0]})], how="diagonal_relaxed")
    t["answer_summary"] = pl.concat([t["answer_summary"], pl.DataFrame({
        "dataset": ["locomo"] * 4, "category": [None] * 4, "method": ["secom", "secom", "turn", "turn"],
        "judge": ["gpt4score", "strict"] * 2, "items": [40] * 4, "judged": [40, 40, 38, 38], "episodes": [10, 10, 9, 9],
        "score": [70.0, 0.625, 55.0, 0.5], "ci_low": [60.0, 0.47, 45.0, 0.35], "ci_high": [80.0, 0.76, 65.0, 0.65]})],
        how="diagonal_relaxed")
    t["pairwise_summary"] = pl.concat([t["pairwise_summary"], pl.DataFrame({
        "dataset": ["locomo", "locomo"], "session_idx": pl.Series([None, 3], dtype=pl.Int32),
        "criterion": ["coherence", "coherence"], "reference": ["secom"] * 2, "other": ["turn"] * 2,
        "protocol": ["both_orders"] * 2, "pairs": [40, 10], "wins": [25, 6], "ties": [0, 0], "losses": [15, 4],
        "win_rate": [0.625, 0.6], "tie_rate": [0.0, 0.0],
        "loss_rate": [0.375, 0.4], "win_share": [0.625, 0.6], "p_value": [0.03, 0.75]})], how="diagonal_relaxed")
    return t


# The leaderboard's head-to-head column: turn won 15 of the 40 decided pairs (10 episodes) against secom.
WINS = pl.from_arrow(pa.Table.from_pylist([
    {"dataset": "locomo", "reference": "secom", "other": "turn", "pairs": 40, "episodes": 10, "won": 15, "lost": 25,
     "share": 0.375, "share_low": 0.2, "share_high": 0.55}], tables.POOLED_WIN_SHARES))


PROBES = pl.DataFrame({
    "episode_id": ["e1", "e1"], "probe_id": ["q1", "q2"], "kind": ["qa", "next_response"],
    "session_idx": pl.Series([3, 3], dtype=pl.Int32), "request": ["When did Ann move?", "How was the trip?"],
    "gold": ["In May </script><script>alert(1)</script>", "Great"], "category": [None, None],
    "context": [None, [{"speaker": "Ann", "text": "I'm back!"}]]})
RESPONSES = pl.DataFrame({
    "episode_id": ["e1"] * 4, "probe_id": ["q1", "q1", "q2", "q2"], "method": METHODS * 2,
    "response": ["May", "June", "Fun", "Ok"], "memory_ids": [["m1", "m2"], [], ["m3"], []],
    "context_tokens": [12, 0, 5, 0], "details_json": ['{"timeline": "a"}', None, None, None],
    "error": [None, None, None, None]})
ANSWERS = pl.DataFrame({
    "episode_id": ["e1"] * 2, "dataset": ["locomo"] * 2, "probe_id": ["q1"] * 2, "method": METHODS,
    "judge": ["strict"] * 2, "score": [1.0, 0.0], "reason": ["matches the gold", "wrong month"],
    "skipped": [None, None], "error": [None, None]})
PAIRS = pl.DataFrame({
    "episode_id": ["e1"] * 2, "dataset": ["locomo"] * 2, "probe_id": ["q2"] * 2, "session_idx": [3, 3],
    "criterion": ["coherence"] * 2, "reference": ["secom"] * 2, "other": ["turn"] * 2,
    "reference_first": [True, False], "sample": [0, 0], "preferred": ["reference", "tie"],
    "reason": ["remembers the trip", "both vague"], "error": [None, None]})


@pytest.fixture
def page(tmp_path) -> tuple[str, str]:
    stage = ReportStage()
    stage.methods = tuple(METHODS)
    cfg = SimpleNamespace(judge_pairwise=SimpleNamespace(reference=None), paper=None, report=ReportSettings(),
                          roles={}, role=lambda r: SimpleNamespace(model="m"), run_name="r",
                          corpus=SimpleNamespace(sources=list))
    t = frames()
    t["reproduction_summary"] = tables.empty(tables.REPRODUCTION_SUMMARY)
    ctx = SimpleNamespace(out_dir=tmp_path, cfg=cfg)
    browser = probe_browser_data(PROBES, RESPONSES, ANSWERS, PAIRS, limit=10, chars=240)
    stage.write_report(ctx, ReportSettings(), t, [], pl.DataFrame({"method": METHODS}), pl.DataFrame(),
                       pl.DataFrame(), browser, wins=WINS)
    return (tmp_path / report_stage.REPORT_HTML).read_text(), (tmp_path / report_stage.REPORT_MD).read_text()


def test_the_leaderboard_comes_first_with_each_methods_headline_numbers(page):
    html, md = page
    assert html.index("<h2 id='s0'>Leaderboard</h2>") < html.index("<h2 id='s1'>Head-to-head")
    board = re.search(r"<table class='leaderboard'>(.*?)</table>", html).group(1)
    assert "gpt4score (0-100)" in board and "strict correct" in board and "win share vs secom" in board
    assert "<td>secom</td><td>70.0 [60.0–80.0] n=40 ep=10</td><td>62% [47–76] n=40 ep=10</td><td>reference</td>" \
        in board
    # turn won 15 of the 40 decided pairs against secom: its share is 38%, its interval over 10 episodes
    assert "<td>turn</td><td>55.0 [45.0–65.0] n=38 ep=9</td><td>50% [35–65] n=38 ep=9</td><td>38% [20–55] n=40 ep=10</td>" \
        in board
    assert md.index("## Leaderboard") < md.index("## Head-to-head") and "| secom | 70.0 [60.0–80.0] n=40 ep=10" in md
    # The page says once why its intervals resample whole episodes.
    assert "resample whole episodes" in md and "not independent" in md


def test_without_the_pairs_the_leaderboard_shows_the_pooled_share_with_no_interval():
    t = frames()
    board = render.leaderboard(t["method_summary"], t["answer_summary"], t["teafarm_summary"], t["metric_summary"],
                               t["pairwise_summary"])
    assert dict(zip(board["method"], board["win share vs secom"])) == {"secom": "reference", "turn": "38% n=40"}


def test_win_rates_are_a_method_by_criterion_heat_map_of_whole_dataset_rows():
    [(caption, text, share)] = render.win_matrices(frames()["pairwise_summary"])
    assert caption.startswith("locomo") and text.rows() == [("turn", "62% (p=0.03, n=40)")]
    cell = re.search(r"<td style='background:([^']+)'>62% \(p=0\.03, n=40\)</td>", render.heatmap_table(text, share))
    assert cell and cell.group(1).startswith("hsl(120")  # the reference wins: green
    assert render.win_cell(0.3, 0.0001, 12) == "30% (p<0.001, n=12)"


def test_the_probe_browser_holds_each_probe_with_its_responses_and_verdicts_inline(page):
    html, _ = page
    blob = re.search(r"<script type='application/json' id='probe-data'>(.*?)</script>", html, re.DOTALL).group(1)
    data = {p["probe_id"]: p for p in json.loads(blob)}
    assert set(data) == {"q1", "q2"} and data["q1"]["dataset"] == "locomo"
    q1, q2 = data["q1"], data["q2"]
    assert [(r["method"], r["response"], r["memory_ids"]) for r in q1["responses"]] == \
        [("secom", "May", ["m1", "m2"]), ("turn", "June", [])]
    assert q1["responses"][0]["details"] == '{"timeline": "a"}'
    assert {(a["method"], a["verdict"], a["reason"]) for a in q1["answers"]} == \
        {("secom", "secom strict correct", "matches the gold"), ("turn", "turn strict incorrect", "wrong month")}
    assert [(x["first"], x["preferred"], x["reason"]) for x in q2["pairwise"]] == \
        [("secom", "reference", "remembers the trip"), ("turn", "tie", "both vague")]
    assert q2["verdicts"] == ["secom beats turn", "secom ties turn"] and q2["context"] == [["Ann", "I'm back!"]]
    assert "</script><script>alert" not in html  # text in the blob cannot close the script


def test_the_browser_caps_probes_and_text():
    data = probe_browser_data(PROBES, RESPONSES, ANSWERS, PAIRS, limit=1, chars=20)
    assert [p["probe_id"] for p in data] == ["q1"] and data[0]["gold"] == "In May </script><scr…"


def test_the_page_loads_nothing_from_outside_and_wide_tables_scroll(page):
    html, _ = page
    assert not re.search(r"(src|href)\s*=\s*['\"]?(https?:)?//", html) and "http://" not in html \
        and "https://" not in html
    assert all(m.start() > 0 and html[:m.start()].rstrip().endswith("<div class='scroll'>")
               for m in re.finditer(r"<table class=", html))


def test_the_leaderboard_lists_each_method_once_though_method_summary_has_a_row_per_dataset_and_kind():
    t = frames()
    per_scope = pl.DataFrame({"dataset": ["msc", "cc", "all"] * 2, "kind": ["qa"] * 6,
                              "method": ["secom"] * 3 + ["turn"] * 3})
    board = render.leaderboard(per_scope, t["answer_summary"], t["teafarm_summary"], t["metric_summary"],
                               t["pairwise_summary"], WINS)
    assert board["method"].to_list() == ["secom", "turn"]
