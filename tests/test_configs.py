"""Every shipped config validates against every stage and method and plans a run."""

from __future__ import annotations

from pathlib import Path

import pytest

import stages
from pipeline.engine.runner import Runner
from stages.teabag import TeabagStage

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


def config(name: str):
    return stages.load_config(CONFIGS[0].parent / f"{name}.yaml")


@pytest.mark.parametrize("name", ["secom_locomo", "secom_longmtbench"])
def test_secom_configs_score_answers_as_the_paper(name):
    """SeCom Sec. 3.1 / App. A.4: a GPT-4-0125 GPT4Score judge with MemoChat's prompt, never the
    generator; BERTScore on; the judges the paper does not use are off."""
    cfg = config(name)
    assert cfg.role("judge").model == "gpt-4-0125-preview" != cfg.role("generator").model
    assert cfg.judge_answers.gpt4score_mode == "memochat" and cfg.judge_answers.score_0_100
    assert cfg.response_metrics.bertscore
    assert not cfg.judge_pairwise.enabled and not cfg.judge_memory.enabled


def test_creem_config_judges_with_chatgpt_under_b1_and_b2():
    cfg = config("creem_msc")
    assert cfg.role("judge").model == "gpt-3.5-turbo"
    assert cfg.judge_pairwise.protocol == "creem" and cfg.judge_pairwise.samples in (None, 19)
    assert cfg.judge_pairwise.show_past and cfg.judge_memory.samples == 20


def test_creem_config_runs_algorithm_1_as_section_3_1_sets_it():
    """ChatGPT builds and answers; top-5 retrieval, 2 insights per step, an update every turn; 5
    probes per episode in the final session of 50 MSC episodes; ablations and the stand-in baseline."""
    cfg = config("creem_msc")
    assert cfg.role("memory").model == cfg.role("generator").model == "gpt-3.5-turbo"
    for name in ("creem", "creem_no_refine", "creem_no_preblend"):
        m = getattr(cfg.method, name)
        assert (m.k, m.insights, m.first_session_insights, m.update_every) == (5, 2, 2, 1)
    assert cfg.method.creem.refine and not cfg.method.creem_no_refine.refine
    assert cfg.method.creem.preblend and not cfg.method.creem_no_preblend.preblend
    assert (cfg.corpus.limit, cfg.probes.from_session, cfg.probes.max_per_episode) == (50, 5, 5)
    # all_memories and ld_agent (persona banks only) are the stand-ins for Table 3's REBOT_CC and SumMem_MSC
    assert cfg.methods == ["creem", "creem_no_refine", "creem_no_preblend", "all_memories", "ld_agent"]
    assert not cfg.method.ld_agent.events and cfg.method.ld_agent.persona_every == 1


def test_creem_sheet_compares_each_table_3_baseline_with_its_stand_in():
    others = {r.name.split(" (")[0]: r.where["other"] for r in config("creem_msc").paper.results
              if r.table == "pairwise_summary" and "vs" in r.name and r.where["other"] in ("all_memories", "ld_agent")}
    assert others == {"CREEM vs REBOT_CC": "all_memories", "CREEM vs SumMem_MSC": "ld_agent"}


@pytest.mark.parametrize("name", ["theanine_msc", "theanine_cc"])
def test_theanine_configs_judge_head_to_head_with_the_past_and_golden_responses(name):
    cfg = config(name)
    assert cfg.judge_pairwise.protocol == "both_orders" and cfg.judge_pairwise.show_past
    assert cfg.judge_pairwise.reference == "theanine" and "golden" in cfg.methods


def test_teafarm_config_generates_with_gpt4_and_summarises_outside_the_tested_methods():
    cfg = config("teafarm_msc_cc")
    assert (cfg.role("teabag").model, cfg.role("teabag").temperature) == ("gpt-4", 0.75)
    assert not cfg.teabag.counterfactual_check and not cfg.teabag.leak_check  # ours, both off as in the paper
    assert "memory" not in TeabagStage.roles  # the tested methods' memory role makes no TeaBag summary


def test_a_composed_config_travels_by_how_it_was_composed_not_as_a_class_by_value():
    """Ray pickles a task's config for every shard: the model class made at run time is not sent
    (a process would rebuild it per task), only its composition; the copy equals the original,
    private state (the embedded servers' URLs) included, and shares one class per process."""
    import pickle

    import cloudpickle

    cfg = stages.load_config(CONFIGS[0].parent / "default.yaml", ["method.creem.k=5"])
    cfg.set_local_url(cfg.llm, ["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"])
    sent = cloudpickle.dumps(cfg)
    assert b"__pydantic_core_schema__" not in sent and len(sent) < 30_000  # no class by value (~74 kB)
    first, second = pickle.loads(sent), pickle.loads(sent)
    assert first == cfg and type(first) is type(second) is type(cfg)
    assert first.method.creem.k == 5 and type(first.method) is type(cfg.method)
    assert first.role("generator").server_urls == ("http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1")
    from pipeline.config import RunConfig

    bare = RunConfig(run_name="bare")  # the run-level model alone: pickled as any class, by reference
    assert pickle.loads(cloudpickle.dumps(bare)) == bare
