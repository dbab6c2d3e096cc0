"""The reproduction sheets (`paper:` blocks) of the Theanine, TeaFarm and CREEM configs: a `--set`
away from the paper shows as exactly that deviation, and every paper number names a report table
and column the run writes (test_paper_sheets.py holds every config to its protocol)."""

from __future__ import annotations

import pytest

from pipeline.reproduction import deviations
from sheets import described, sheet_config
from stages.methods.creem import EVOLUTION_SUMMARY
from stages.report.method_costs import METHOD_SUMMARY
from stages.report.tables import MEMORY_SUMMARY, PAIRWISE_SUMMARY, TEAFARM_SUMMARY

SHEETS = {"theanine_msc": "000", "theanine_cc": "000", "theanine_msc_cc": "000", "teafarm_msc_cc": "000",
          "creem_msc": "004"}
TABLES = {"pairwise_summary": PAIRWISE_SUMMARY, "teafarm_summary": TEAFARM_SUMMARY,
          "memory_summary": MEMORY_SUMMARY, "evolution_summary": EVOLUTION_SUMMARY,
          "method_summary": METHOD_SUMMARY}  # Theanine Sec. 4's response lengths


@pytest.mark.parametrize("name", SHEETS)
def test_the_sheet_names_its_paper(name):
    assert sheet_config(name).paper.seed == SHEETS[name]


def test_a_set_away_from_the_paper_is_exactly_that_deviation():
    cfg = sheet_config("creem_msc", ["judge_pairwise.samples=5"])
    devs = deviations(cfg)
    assert [(d.path, d.paper, d.run) for d in devs] == [("judge_pairwise.samples", 19, 5)], described(devs)
    assert "B.1" in devs[0].source


def test_a_role_setting_deviates_through_the_role_fallback():
    """`roles.generator.temperature` is unset in the Theanine config: it comes from `llm`, so moving
    `llm.temperature` moves both (and RSum-LLM's, whose own temperature is null)."""
    devs = deviations(sheet_config("theanine_msc", ["llm.temperature=0.0"]))
    assert [d.path for d in devs] == ["llm.temperature", "roles.generator.temperature", "roles.memory.temperature"]


@pytest.mark.parametrize("name", SHEETS)
def test_every_paper_number_names_a_report_table_and_column(name):
    cfg = sheet_config(name)
    seen = set()
    for r in cfg.paper.results:
        assert r.table in TABLES, f"{name}: {r.name}: unknown report table {r.table!r}"
        columns = set(TABLES[r.table].names)
        assert r.column in columns, f"{name}: {r.name}: {r.table} has no column {r.column!r}"
        assert set(r.where) <= columns, f"{name}: {r.name}: {r.table} has no column {set(r.where) - columns}"
        assert r.scale > 0
        key = (r.table, tuple(sorted(r.where.items(), key=lambda kv: kv[0])), r.column)
        assert key not in seen or "stand-in" in r.name, f"{name}: {r.name}: two paper numbers for one cell"
        seen.add(key)
        if r.where.get("dataset") not in (None, "all"):
            assert r.where["dataset"] in ("msc", "cc"), f"{name}: {r.name}: dataset {r.where['dataset']!r}"
        if r.table == "pairwise_summary":
            assert r.where["reference"] == cfg.judge_pairwise.reference
            assert r.where["protocol"] == cfg.judge_pairwise.protocol
            assert r.where["other"] in cfg.methods and r.where["criterion"]
        if "method" in r.where:
            assert r.where["method"] in cfg.methods, f"{name}: {r.name}: {r.where['method']} is not run"
