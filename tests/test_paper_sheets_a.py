"""The reproduction sheets (`paper:` blocks) of the SeCom, RSum and LD-Agent configs: each config runs
the protocol its paper states, a `--set` away from it is reported as a deviation, and every paper
number names a report table and column the run writes."""

from __future__ import annotations

from pathlib import Path

import pytest

import stages
from pipeline.reproduction import deviations, effective
from stages.report.tables import SUMMARY_TABLES

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
SHEETS = ["secom_locomo", "secom_longmtbench", "secom_dialseg", "rsum_msc", "ldagent_msc"]

# The tables a paper number can be compared in: every summary the report writes, whatever other
# engineers add, except a table of the comparison itself.
TARGETS = {name: schema for name, schema in SUMMARY_TABLES.items() if "reproduction" not in name}


def load(name: str, overrides: list[str] | None = None):
    return stages.load_config(CONFIGS / f"{name}.yaml", overrides)


def listed(devs) -> str:
    return "\n".join(f"{d.path}: config {d.run!r}, paper {d.paper!r} ({d.source})" for d in devs)


@pytest.mark.parametrize("name", SHEETS)
def test_config_runs_the_protocol_its_paper_states(name):
    cfg = load(name)
    assert cfg.paper is not None, f"{name} has no paper: block"
    assert cfg.paper.protocol and cfg.paper.results
    for path in cfg.paper.protocol:
        effective(cfg, path)  # every setting names one the run has (KeyError otherwise)
    devs = deviations(cfg)
    assert devs == [], f"{name} deviates from its paper:\n{listed(devs)}"


@pytest.mark.parametrize("name", SHEETS)
def test_every_setting_says_where_the_paper_states_it(name):
    for path, setting in load(name).paper.protocol.items():
        assert setting.source.strip(), f"{name}: {path} has no source"


@pytest.mark.parametrize("name", SHEETS)
def test_every_paper_number_names_a_report_table_and_its_columns(name):
    sheet = load(name).paper
    seen = set()
    for r in sheet.results:
        assert r.table in TARGETS, f"{name}: {r.name!r} names table {r.table!r}, not one of {sorted(TARGETS)}"
        columns = set(TARGETS[r.table].names)
        assert r.column in columns, f"{name}: {r.name!r}: {r.table} has no column {r.column!r}"
        assert set(r.where) <= columns, f"{name}: {r.name!r}: {r.table} lacks {sorted(set(r.where) - columns)}"
        assert r.scale > 0 and r.source.strip()
        key = (r.table, tuple(sorted(r.where.items(), key=lambda kv: kv[0])), r.column)
        assert key not in seen, f"{name}: two paper numbers for {key}"
        seen.add(key)


def test_a_set_away_from_the_paper_is_exactly_that_deviation():
    cfg = load("secom_locomo", ["roles.judge.model=gpt-4o-mini"])
    devs = deviations(cfg)
    assert [(d.path, d.paper, d.run) for d in devs] == [("roles.judge.model", "gpt-4-0125-preview", "gpt-4o-mini")]
    assert "Sec. 3.1" in devs[0].source
    text = listed(devs)
    assert text.startswith("roles.judge.model: config 'gpt-4o-mini', paper 'gpt-4-0125-preview' (Sec. 3.1")


def test_a_role_setting_through_the_llm_fallback_is_compared_too():
    """rsum_msc sets no memory role: its temperature is llm's, and changing llm's changes it."""
    devs = deviations(load("rsum_msc", ["llm.temperature=0.7"]))
    paths = {d.path for d in devs}
    assert {"roles.memory.temperature", "roles.generator.temperature"} <= paths
    assert all(d.paper == 0.0 and d.run == 0.7 for d in devs if d.path.startswith("roles."))


def test_sheets_quote_the_papers_headline_numbers():
    def number(name, row):
        return next(r.paper for r in load(name).paper.results if r.name == row)

    assert number("secom_locomo", "SeCom, GPT4Score") == 84.21
    assert number("secom_longmtbench", "SeCom (MPNet, GPT4-Seg), GPT4Score") == 88.81
    assert number("secom_dialseg", "Ours (zero-shot), DialSeg711, Pk") == 0.093
    assert number("rsum_msc", "Predicted Memory, Session 5, DIST-2") == 27.04
    assert number("ldagent_msc", "Zero-shot ChatGPT_LDA, MSC Session 2, BL-2") == 8.67
