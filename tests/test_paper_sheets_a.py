"""The reproduction sheets (`paper:` blocks) of the SeCom, RSum and LD-Agent configs, and of the mem0
and LongMemEval boards: a `--set` away from the paper is reported as a deviation, and every paper number
names a report table and column the run writes (test_paper_sheets.py holds every config to its protocol)."""

from __future__ import annotations

import pytest

from pipeline.reproduction import deviations
from sheets import described, sheet_config
from stages.report.tables import SUMMARY_TABLES

SHEETS = ["secom_locomo", "secom_longmtbench", "secom_dialseg", "rsum_msc", "ldagent_msc",
          "locomo_memory_systems", "longmemeval"]

# The tables a paper number can be compared in: every summary the report writes, whatever other
# engineers add, except a table of the comparison itself.
TARGETS = {name: schema for name, schema in SUMMARY_TABLES.items() if "reproduction" not in name}


@pytest.mark.parametrize("name", SHEETS)
def test_every_paper_number_names_a_report_table_and_its_columns(name):
    sheet = sheet_config(name).paper
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
    cfg = sheet_config("secom_locomo", ["roles.judge.model=gpt-4o-mini"])
    devs = deviations(cfg)
    assert [(d.path, d.paper, d.run) for d in devs] == [("roles.judge.model", "gpt-4-0125-preview", "gpt-4o-mini")]
    assert "Sec. 3.1" in devs[0].source
    text = described(devs)
    assert text.startswith("roles.judge.model: config 'gpt-4o-mini', paper 'gpt-4-0125-preview' (Sec. 3.1")


def test_a_role_setting_through_the_llm_fallback_is_compared_too():
    """rsum_msc sets no memory role: its temperature is llm's, and changing llm's changes it."""
    devs = deviations(sheet_config("rsum_msc", ["llm.temperature=0.7"]))
    paths = {d.path for d in devs}
    assert {"roles.memory.temperature", "roles.generator.temperature"} <= paths
    assert all(d.paper == 0.0 and d.run == 0.7 for d in devs if d.path.startswith("roles."))


def test_sheets_quote_the_papers_headline_numbers():
    def number(name, row):
        return next(r.paper for r in sheet_config(name).paper.results if r.name == row)

    assert number("secom_locomo", "SeCom, GPT4Score") == 84.21
    assert number("secom_longmtbench", "SeCom (MPNet, GPT4-Seg), GPT4Score") == 88.81
    assert number("secom_dialseg", "Ours (zero-shot), DialSeg711, Pk") == 0.093
    assert number("rsum_msc", "Predicted Memory, Session 5, DIST-2") == 27.04
    assert number("ldagent_msc", "Zero-shot ChatGPT_LDA, MSC Session 2, BL-2") == 8.67
