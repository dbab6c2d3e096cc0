"""Reproduction sheets (`paper:` blocks): the run's effective settings against a paper's protocol,
the run's numbers looked up in the report tables, `mempipe check`, and the report's rows."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
import yaml

from pipeline.errors import ConfigError
from pipeline.reproduction import (
    PaperResult,
    PaperSheet,
    effective,
    load_sheet,
    run_value,
)
from stages import load_config
from stages.cli import main
from stages.report import ReportStage, reproduction_section
from stages.report.tables import REPRODUCTION_SUMMARY, reproduction_summary

ROOT = Path(__file__).resolve().parent.parent

PAPER = {
    "title": "Toy paper", "seed": "000", "reproduces": "Table 1: toy",
    "protocol": {
        "llm.model": {"value": "SmolLM2-135M-Instruct", "source": "Sec. 4"},
        "roles.judge.temperature": {"value": 0.0, "source": "App. A"},
        "method.theanine.j": {"value": 2, "source": "Table 9"},
        "probes.max_per_episode": {"value": 1, "source": "inferred: one probe"},
    },
    "results": [
        {"name": "Theanine, G-Eval", "paper": 80.0, "source": "Table 1", "table": "answer_summary",
         "where": {"method": "theanine", "judge": "gpt4score", "category": None}, "column": "score", "scale": 100},
        {"name": "RSum, G-Eval", "paper": 70.0, "source": "Table 1", "table": "answer_summary",
         "where": {"method": "rsum", "judge": "gpt4score", "category": None}, "column": "score", "scale": 100},
        {"name": "Theanine, memory", "paper": 4.0, "source": "Table 2", "table": "memory_summary",
         "where": {"method": "theanine"}, "column": "score"},
    ],
}


def paper_config(tmp_path: Path, paper: dict = PAPER) -> Path:
    """configs/default.yaml's keys with a `paper:` block and no compared configs."""
    data = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())
    data["report"] = {"compare_with": []}
    data["paper"] = paper
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def answers() -> pa.Table:
    return pa.table({
        "method": ["theanine", "theanine"], "judge": ["gpt4score", "gpt4score"], "category": [None, "multi-hop"],
        "score": [0.75, 0.5], "score_low": [0.7, 0.4], "score_high": [0.8, 0.6],
        "ci_low": [0.0, 0.0], "ci_high": [1.0, 1.0], "items": [12, 4], "judged": [10, 4], "episodes": [3, 1]})


def test_a_role_setting_falls_back_to_llm_and_a_method_setting_is_read_from_its_section(tmp_path):
    cfg = load_config(paper_config(tmp_path), ["roles.generator.temperature=0.7"])
    assert effective(cfg, "roles.judge.temperature") == cfg.llm.temperature == 0.0  # no judge role: `llm`
    assert effective(cfg, "roles.generator.temperature") == 0.7
    assert effective(cfg, "roles.generator.model") == "SmolLM2-135M-Instruct"
    assert effective(cfg, "method.theanine.j") == 2
    assert effective(cfg, "method.creem")["update_every"] == 12  # a whole section, as JSON
    with pytest.raises(KeyError, match="method.theanine.nope"):
        effective(cfg, "method.theanine.nope")


def test_the_run_value_is_the_matching_row_scaled_with_its_interval_and_n():
    got = run_value(answers(), PaperResult(name="x", paper=80, source="T1", table="answer_summary",
                                           where={"method": "theanine", "category": None}, column="score", scale=100))
    assert got.produced and got.value == pytest.approx(75.0)
    assert (got.low, got.high) == (pytest.approx(70.0), pytest.approx(80.0))  # score_low/high before ci_low/high
    assert got.n == 10  # `judged` before `items`
    assert got.episodes == 3


def test_the_interval_falls_back_to_ci_and_win_share_columns_and_a_polars_frame_works():
    table = pl.from_arrow(answers()).drop("score_low", "score_high", "judged")
    got = run_value(table, PaperResult(name="x", paper=1, source="T", table="t",
                                       where={"category": "multi-hop"}, column="score"))
    assert (got.value, got.low, got.high, got.n, got.episodes) == (0.5, 0.0, 1.0, 4, 1)
    shares = pa.table({"method": ["a"], "win_share": [0.6], "win_share_low": [0.5], "win_share_high": [0.7],
                       "pairs": [30]})
    got = run_value(shares, PaperResult(name="y", paper=60, source="T", table="t", where={"method": "a"},
                                        column="win_share", scale=100))
    assert (got.value, got.low, got.high, got.n) == pytest.approx((60.0, 50.0, 70.0, 30))
    assert got.episodes is None  # the table does not say


def test_a_row_the_run_did_not_write_is_not_produced_and_a_missing_column_is_named():
    absent = run_value(answers(), PaperResult(name="x", paper=1, source="T", table="t",
                                              where={"method": "rsum"}, column="score"))
    assert absent.model_dump() == {"produced": False, "value": None, "low": None, "high": None, "n": None,
                                   "episodes": None}
    with pytest.raises(ConfigError, match="no column 'dataset'"):
        run_value(answers(), PaperResult(name="x", paper=1, source="T", table="t", where={"dataset": "msc"},
                                         column="score"))
    with pytest.raises(ConfigError, match="2 rows"):
        run_value(answers(), PaperResult(name="x", paper=1, source="T", table="t", where={"method": "theanine"},
                                         column="score"))


# What `check` says computed the toy sheet's results: the judge behind each column, per the run's settings.
SCORED_BY = ["  scored by (3 results):",
             "    answer_summary.score (2): ours: 0-100 rating against the reference answer, mean",
             "    memory_summary.score (1): CREEM's scorer: App. B.2 memory G-Eval, 1-5 per criterion, samples averaged per "
             "(episode, speaker)"]


# The default job's methods that the toy sheet (theanine, rsum) does not name: one line each.
UNNAMED = [f"{m}: no paper sheet names it (a paper: block or a report.compare_with config); nothing to compare"
           for m in ("secom", "ld_agent", "creem", "full_history")]


def sheet_lines(out: str) -> list[str]:
    """`mempipe check`'s sheet lines, before the run's stage graph it prints last."""
    return out.split("\n\nstages of this run")[0].splitlines()


def test_check_lists_a_set_override_of_a_protocol_setting_as_a_deviation(tmp_path, capsys):
    cfg = str(paper_config(tmp_path))
    assert main(["check", "-c", cfg]) == 0
    assert sheet_lines(capsys.readouterr().out) == \
        [f"Toy paper (paper: block of {cfg}): matches the paper's protocol (4 settings)", *SCORED_BY, *UNNAMED]
    assert main(["check", "-c", cfg, "--set", "method.theanine.j=3"]) == 0
    out = sheet_lines(capsys.readouterr().out)
    assert out == [f"Toy paper (paper: block of {cfg}): 1 of 4 settings differ",
                   "  method.theanine.j: 3 (paper: 2, Table 9)", *SCORED_BY, *UNNAMED]


def test_check_names_the_scorer_the_runs_settings_choose(tmp_path, capsys):
    cfg = str(paper_config(tmp_path))
    assert main(["check", "-c", cfg, "--set", "judge_answers.gpt4score_mode=memochat"]) == 0
    out = sheet_lines(capsys.readouterr().out)
    assert out[2].startswith("    answer_summary.score (2): SeCom's scorer: GPT4Score with MemoChat's judge")


def test_check_names_a_protocol_path_that_names_no_setting_in_one_line(tmp_path, capsys):
    paper = {**PAPER, "protocol": {"llm.modle": {"value": "x", "source": "Sec. 4"}}}
    cfg = str(paper_config(tmp_path, paper))
    assert main(["check", "-c", cfg]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'llm.modle' names no setting" in err and cfg in err


def test_check_and_the_report_read_the_compared_configs_paper_blocks(tmp_path, capsys):
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"run_name": "other", "paper": {**PAPER, "title": "Other paper"}}))
    bare = tmp_path / "bare.yaml"
    bare.write_text("run_name: bare\n")
    data = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())
    data["report"] = {"compare_with": [str(other), str(bare)]}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["check", "-c", str(path), "--set", "probes.max_per_episode=5"]) == 0
    out = sheet_lines(capsys.readouterr().out)
    assert out == [f"Other paper (compared with {other}): 1 of 4 settings differ",
                   "  probes.max_per_episode: 5 (paper: 1, inferred: one probe)", *SCORED_BY,
                   f"{bare}: no paper: block", *UNNAMED]
    cfg = load_config(path)
    before = ReportStage().extra_fingerprint(cfg)
    other.write_text(yaml.safe_dump({"paper": {**PAPER, "title": "Other paper, edited"}}))
    assert ReportStage().extra_fingerprint(cfg) != before


def test_a_missing_or_invalid_compared_config_is_an_error_naming_the_file(tmp_path, capsys):
    with pytest.raises(ConfigError, match="cannot read .*gone.yaml"):
        load_sheet(tmp_path / "gone.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"paper": {**PAPER, "protocol": {"llm.model": {"value": "x"}}}}))
    with pytest.raises(ConfigError, match=r"bad.yaml: invalid paper: block: paper.protocol.llm.model.source"):
        load_sheet(bad)
    assert load_sheet(ROOT / "configs" / "default.yaml") is None


def test_the_reproduction_table_holds_each_result_and_each_deviation_of_the_run(tmp_path):
    cfg = load_config(paper_config(tmp_path), ["method.theanine.j=3"])
    sheet = PaperSheet.model_validate(PAPER)
    rows = reproduction_summary(cfg, [("toy.yaml", sheet)], {"answer_summary": pl.from_arrow(answers())})
    assert rows.columns == REPRODUCTION_SUMMARY.names
    results = rows.filter(pl.col("kind") == "result")
    assert results["name"].to_list() == ["Theanine, G-Eval", "RSum, G-Eval", "Theanine, memory"]
    assert results["produced"].to_list() == [True, False, False]  # no rsum row; no memory_summary table
    first = results.row(0, named=True)
    assert first["run"] == pytest.approx(75.0) and first["difference"] == pytest.approx(-5.0)
    assert (first["run_low"], first["run_high"], first["n"], first["episodes"]) == (pytest.approx(70.0),
                                                                                   pytest.approx(80.0), 10, 3)
    assert results["run"][1] is None and results["difference"][1] is None
    # Each result names the scorer behind its column, produced or not (memory_summary: CREEM's B.2 judge).
    assert [s.split(":")[0] for s in results["scorer"]] == ["ours", "ours", "CREEM's scorer"]
    deviations = rows.filter(pl.col("kind") == "deviation").select("name", "run_setting", "paper_setting", "source")
    assert deviations.rows() == [("method.theanine.j", "3", "2", "Table 9")]

    section = reproduction_section(rows, [])
    assert section is not None and section.title == "Reproduction"
    (caption, shown), (off_caption, off) = section.tables
    assert caption == "Toy paper (toy.yaml)"
    assert shown["run"].to_list() == ["75 [70, 80]", "not produced", "not produced"]
    assert shown["n"].to_list() == [10, None, None] and shown["episodes"].to_list() == [3, None, None]
    assert off_caption.endswith("(1)") and off["setting"].to_list() == ["method.theanine.j"]


def test_a_run_with_no_sheet_gets_no_reproduction_section(tmp_path):
    cfg = load_config(None, [])
    rows = reproduction_summary(cfg, [], {})
    assert rows.is_empty() and rows.columns == REPRODUCTION_SUMMARY.names
    assert reproduction_section(rows, []) is None
