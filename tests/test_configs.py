"""Every shipped config validates against every stage and method and plans a run."""

from __future__ import annotations

from pathlib import Path

import pytest

import stages
from pipeline.runner import Runner

CONFIGS = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_each_config_loads_and_plans_every_method_it_names(path):
    cfg = stages.load_config(path)
    plan = [s.name for s in Runner(cfg, stages.registry(cfg)).plan]
    assert all(f"respond_{m}" in plan for m in cfg.methods)
    assert plan[-1] == "report" or not cfg.methods


def test_the_default_job_runs_one_method_of_every_paper_landed_so_far_and_full_history():
    cfg = stages.load_config(CONFIGS[0].parent / "default.yaml")
    assert {"secom", "theanine", "rsum", "ld_agent", "creem", "full_history"} <= set(cfg.methods)
