"""The run's stage graph follows what it selects: each method's stages (and the stages a method
brings itself, SeCom's or an outside package's), the judges its settings enable, the report and what
these read; nothing nobody reads. `stages:` only restricts it; plan, status and check show it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.errors import PipelineError
from pipeline.engine.runner import Runner
from stages import load_config, registry
from stages.cli import main
from stages.judging.memory_ops import writes_memory
from stages.methods import METHODS
from stages.testing import run_method
from toy_methods import KeywordRecall

ROOT = Path(__file__).resolve().parent.parent
BEFORE = json.loads((Path(__file__).parent / "fixtures" / "stage_graphs_before.json").read_text())
SECOM_STAGES = ["guidance", "segment", "compress", "banks"]


def _nothing_to_do(cfg, name: str) -> bool:
    """A stage the hand-written graph ran although it had no work in this config: a judge turned off,
    or one whose probe kinds the run makes none of."""
    kinds = ({"next_response"} if cfg.probes.next_response else set()) | ({"qa"} if cfg.probes.qa else set()) | (
        {"teafarm"} if cfg.teabag.enabled else set())
    settings = getattr(cfg, name, None)
    if name in ("judge_pairwise", "judge_answers", "judge_memory"):
        return not settings.enabled or (name != "judge_memory" and not set(settings.kinds) & kinds)
    return False


# The configs of the hand-written graph (later ones are checked to list no stages below).
@pytest.mark.parametrize("config", sorted(c for c in BEFORE if c.endswith(".yaml")))
def test_every_config_keeps_the_stages_it_ran_before_without_a_stage_list(config):
    cfg = load_config(ROOT / "configs" / config)
    assert cfg.stages is None, "the graph is derived: a shipped config lists no stages"
    graph = list(registry(cfg))
    before = BEFORE[config]
    # Stages added since the hand-written graph, each in every config whose run has their work; and
    # the memory / respond stages of methods a config selected since (the systems board's libraries).
    added = {"diagnose": cfg.diagnose.enabled and cfg.probes.qa and bool(cfg.methods),
             "memory_ops": cfg.memory_ops.enabled and cfg.probes.qa and any(writes_memory(METHODS[m]) for m in cfg.methods)}
    added |= {f"{kind}_{m}": True for m in cfg.methods if f"respond_{m}" not in before for kind in ("memory", "respond")
              if f"{kind}_{m}" in graph}
    assert {n for n in graph if n in added} == {n for n, wanted in added.items() if wanted}
    derived = [n for n in graph if n not in added]
    # Same order for what both hold; what the derived graph leaves out had nothing to do.
    assert [n for n in before if n in derived] == derived
    for name in set(before) - set(derived):
        assert _nothing_to_do(cfg, name), f"{config}: {name} dropped although it had work"


def test_no_shipped_config_lists_its_stages():
    for path in (ROOT / "configs").glob("*.yaml"):
        assert load_config(path).stages is None, path.name


def test_a_run_without_secom_holds_none_of_secoms_stages_and_each_stage_says_why():
    cfg = load_config(ROOT / "configs" / "default.yaml", ["methods=[rsum,full_history]"])
    graph = registry(cfg)
    assert not set(SECOM_STAGES + ["score"]) & set(graph)
    assert graph["memory_rsum"].why == "method rsum" and graph["probes"].why.startswith("read by ")
    secom = registry(load_config(ROOT / "configs" / "default.yaml", ["methods=[secom]"]))
    assert all(secom[n].why.startswith("method secom brings it") for n in SECOM_STAGES)
    assert "score" in secom


def test_a_stage_list_only_restricts_and_names_the_valid_stages(tmp_path):
    cfg = load_config(ROOT / "configs" / "default.yaml",
                      ["methods=[rsum]", "stages=[ingest, probes, segment]", f"artifacts_dir={tmp_path}"])
    with pytest.raises(PipelineError, match=r"unknown stage\(s\) \['segment'\]; known: \['ingest', .*'memory_rsum'"):
        Runner(cfg, registry(cfg))


def test_an_outside_method_brings_its_own_stage_which_runs_only_when_it_is_selected(fake_llm, tmp_path):
    method = KeywordRecall()
    methods = {**METHODS, method.name: method}
    cfg = load_config(None, [f"methods=[{method.name}]", "keyword_index.min_length=5"], methods=methods)
    assert cfg.keyword_index.min_length == 5  # its settings are a section of the config
    graph = registry(cfg, methods)
    assert graph["keyword_index"].why == "method keyword_recall brings it; read by respond_keyword_recall"
    assert "keyword_index" not in registry(load_config(None, ["methods=[rsum]"], methods=methods), methods)
    tables = run_method(method, fake_llm.base_url, tmp_path, settings={}, sets=["keyword_index.min_length=6"])
    words = tables["keyword_index.keywords"].to_pylist()
    assert words and all(len(r["word"]) >= 6 for r in words)
    answers = tables["respond_keyword_recall.responses"].to_pylist()
    assert answers and all(r["error"] is None for r in answers)


def test_plan_status_and_check_show_the_graph_and_why(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(METHODS, "keyword_recall", KeywordRecall())
    args = ["--set", f"artifacts_dir={tmp_path}", "--set", "methods=[keyword_recall]", "--set", "teabag.enabled=false"]
    assert main(["check", *args]) == 0
    check = capsys.readouterr().out
    assert "stages of this run (" in check and "keyword_index" in check and "method keyword_recall brings it" in check
    assert "segment" not in check.split("stages of this run")[1].split("\n\n")[0]
    assert main(["status", *args]) == 0
    status = capsys.readouterr().out
    line = next(ln for ln in status.splitlines() if ln.startswith("keyword_index"))
    assert "missing" in line and "read by respond_keyword_recall" in line
    assert main(["plan", *args, "--sample", "1"]) == 0
    plan = capsys.readouterr().out
    assert "the run's stage graph" in plan and "respond_keyword_recall  method keyword_recall" in plan

