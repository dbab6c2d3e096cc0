"""A judge panel (judge_answers.panel, configs/locomo_judge_panel.yaml): several judges of the same
answers, their agreement (Cohen's kappa, Krippendorff's alpha, Kendall's tau, each from its library),
each method's score and rank under each, and "A beats B" only where every judge confirms it."""

from __future__ import annotations

import json
from pathlib import Path

import krippendorff
import numpy as np
import polars as pl
import pytest
from scipy.stats import kendalltau
from statsmodels.stats.inter_rater import cohens_kappa

from pipeline.artifacts import StageDir
from pipeline.config import ConfigError, resolve_paths
from stages import load_config
from pipeline.engine.runner import Runner
from stages import registry
from stages.judging.judge_answers import JudgeAnswersSettings
from stages.judging.panel import PanelJudge, accepted, f1_score
from stages.report.agreement import judge_agreement, panel_scores, robust_pairs, robust_verdict

ROOT = Path(__file__).resolve().parent.parent


def judgments(verdicts: dict[str, dict[str, list[int]]], episodes: int = 1, kinds: dict[str, str] | None = None,
              runs: int = 1) -> pl.DataFrame:
    """answer_judgments rows: judge -> method -> one 0/1 verdict per question (questions spread over
    `episodes`), each repeated over `runs`."""
    rows = []
    for judge, by_method in verdicts.items():
        for method, values in by_method.items():
            for q, v in enumerate(values):
                for run in range(runs):
                    rows.append({"dataset": "locomo", "episode_id": f"e{q % episodes}", "probe_id": f"q{q}",
                                 "kind": "qa", "category": "single-hop", "method": method, "judge": judge,
                                 "judge_kind": (kinds or {}).get(judge, "strict"), "run": run, "score": float(v),
                                 "accepted": bool(v), "skipped": None, "error": None, "judge_model": "m",
                                 "prompt_fingerprint": "p"})
    return pl.DataFrame(rows)


LABELS_A = [1, 0, 1, 1, 0, 1, 0, 0, 1, 1, 1, 0]
LABELS_B = [1, 0, 0, 1, 0, 1, 1, 0, 1, 0, 1, 0]
LABELS_C = [1, 1, 1, 1, 0, 1, 0, 0, 0, 1, 1, 0]


def test_two_identical_judges_have_kappa_one_and_the_panel_alpha_one():
    table = judge_agreement(judgments({"x": {"m": LABELS_A}, "y": {"m": LABELS_A}}))
    pair = table.filter(pl.col("judge_a") == "x").row(0, named=True)
    assert pair["kappa"] == pytest.approx(1.0) and pair["n"] == len(LABELS_A)
    panel = table.filter(pl.col("judge_a") == "panel").row(0, named=True)
    assert panel["alpha"] == pytest.approx(1.0) and panel["split_share"] == 0.0


def test_agreement_figures_are_the_libraries_on_fixed_labels():
    frame = judgments({"a": {"m1": LABELS_A[:6], "m2": LABELS_A[6:]}, "b": {"m1": LABELS_B[:6], "m2": LABELS_B[6:]},
                       "c": {"m1": LABELS_C[:6], "m2": LABELS_C[6:]}})
    table = judge_agreement(frame)
    # Items in the table's order: (method, question); the labels above are m1's six then m2's six.
    contingency = np.zeros((2, 2))
    for x, y in zip(LABELS_A, LABELS_B):
        contingency[x, y] += 1
    ab = table.filter((pl.col("judge_a") == "a") & (pl.col("judge_b") == "b")).row(0, named=True)
    assert ab["kappa"] == pytest.approx(float(cohens_kappa(contingency, return_results=False)))
    alpha = krippendorff.alpha(reliability_data=np.array([LABELS_A, LABELS_B, LABELS_C], dtype=float),
                               level_of_measurement="nominal")
    panel = table.filter(pl.col("judge_a") == "panel").row(0, named=True)
    assert panel["alpha"] == pytest.approx(alpha) and panel["n"] == 12
    split = sum(len({a, b, c}) > 1 for a, b, c in zip(LABELS_A, LABELS_B, LABELS_C)) / 12
    assert panel["split_share"] == pytest.approx(split)
    # tau between two judges' rankings of the methods (their shares per method)
    shares = {j: [np.mean(v[:6]), np.mean(v[6:])] for j, v in (("a", LABELS_A), ("c", LABELS_C))}
    ac = table.filter((pl.col("judge_a") == "a") & (pl.col("judge_b") == "c")).row(0, named=True)
    assert ac["tau"] == pytest.approx(kendalltau(shares["a"], shares["c"]).statistic)


def test_scores_and_ranks_per_judge_and_runs_averaged_per_item_first():
    frame = judgments({"a": {"m1": [1, 1, 0, 0], "m2": [1, 0, 0, 0]}, "b": {"m1": [0, 0, 0, 0], "m2": [1, 1, 1, 0]}},
                      runs=3)
    scores = {(r["judge"], r["method"]): (r["score"], r["rank"], r["judged"])
              for r in panel_scores(frame).iter_rows(named=True)}
    assert scores == {("a", "m1"): (0.5, 1, 4), ("a", "m2"): (0.25, 2, 4), ("b", "m1"): (0.0, 2, 4),
                      ("b", "m2"): (0.75, 1, 4)}  # four items each, not twelve run rows


def _separated(better: list[int], worse: list[int], episodes: int) -> dict[str, list[int]]:
    return {"good": better, "bad": worse}


def test_a_difference_every_judge_confirms_is_robust_and_one_that_flips_under_a_judge_is_not():
    n = 40
    good, bad = [1] * n, [0] * n
    both_agree = judgments({"x": {"good": good, "bad": bad}, "y": {"good": good, "bad": bad}}, episodes=10)
    row = robust_pairs(both_agree).row(0, named=True)
    assert (row["method_a"], row["method_b"], row["verdict"], row["judges"]) == ("good", "bad", "a_better", 2)
    assert row["comparisons"] == 1 and row["paired"] == n
    flipped = judgments({"x": {"good": good, "bad": bad}, "y": {"good": bad, "bad": good}}, episodes=10)
    assert robust_pairs(flipped).row(0, named=True)["verdict"] == "not_separable"
    assert robust_verdict([(-0.5, -0.1), (-0.3, -0.2)]) == "b_better"
    assert robust_verdict([(0.1, 0.5), (-0.1, 0.3)]) == "not_separable"  # one interval holds 0
    assert robust_verdict([]) == "not_separable"


def test_f1_accepts_at_its_threshold_and_scores_locomo_by_its_own_rules():
    assert f1_score("locomo", "single-hop", "in Paris", "Paris") == pytest.approx(2 / 3)
    assert f1_score("locomo", "adversarial", "Not mentioned in the conversation", None) == 1.0
    assert f1_score("locomo", "single-hop", "x", None) is None and f1_score("msc", "x", "a b", "a b") == 1.0
    assert accepted(0.5, "f1", 0.5) and not accepted(0.49, "f1", 0.5) and accepted(0.3, "f1", 0.25)
    assert accepted(70.0, "gpt4score") is None and accepted(0.5, "strict") and not accepted(0.0, "locomo_j")


def test_a_panel_needs_distinct_names_and_may_name_its_own_roles(tmp_path: Path):
    with pytest.raises(ValueError, match="distinct names"):
        JudgeAnswersSettings(panel=[PanelJudge(name="a", prompt="strict"), PanelJudge(name="a", prompt="lenient")])
    with pytest.raises(ConfigError, match="roles.nobody: unknown role"):
        load_config(ROOT / "configs" / "locomo_judge_panel.yaml", ["roles.nobody.model=x"])
    cfg = load_config(ROOT / "configs" / "locomo_judge_panel.yaml")
    stage = registry(cfg)["judge_answers"]
    assert stage.llm_roles(cfg) == ("judge", "judge_longmemeval")
    assert [j.name for j in cfg.judge_answers.judges()] == ["mem0_j", "longmemeval", "strict", "f1"]
    assert cfg.judge_answers.runs == 3


def test_the_panel_config_runs_offline_shows_every_judge_and_a_warm_rerun_sends_nothing(
        tmp_path, fake_llm, models_cache, monkeypatch):
    monkeypatch.setenv("MEMPIPE_TEST_KEY", "sk-test-secret-value-123")
    verdicts = iter(["CORRECT", "WRONG"] * 1000)

    def responder(body: dict) -> str | None:
        text = json.dumps(body["messages"])
        if "CORRECT" in text and "WRONG" in text:  # mem0's J: JSON with a label
            return json.dumps({"reasoning": "r", "label": next(verdicts)})
        if "yes or no" in text:  # LongMemEval's judge
            return "yes" if len(text) % 2 else "no"
        return None

    fake_llm.responder = responder
    cfg = resolve_paths(load_config(ROOT / "configs" / "locomo_judge_panel.yaml", [
        f"artifacts_dir={tmp_path / 'artifacts'}", "llm.provider=openai", f"llm.base_url={fake_llm.base_url}",
        "llm.api_key_env=MEMPIPE_TEST_KEY", f"llm.cache_dir={tmp_path / 'llm-cache'}", "llm.rpm=null",
        "llm.tpm=null", "llm.backoff_base_s=0.01", "ray.executor=inline", "ray.episodes_per_shard=1",
        f"corpus.path={ROOT / 'tests/fixtures/corpora/locomo/locomo_mini.json'}", "corpus.limit=1",
        "probes.max_qa_per_episode=6", "methods=[full_history,turn]", "embedding.provider=local", "embedding.model=all-MiniLM-L6-v2",
        f"embedding.cache_dir={models_cache}", "compress.method=none", "segment.mode=zero_shot"]))
    Runner(cfg, registry(cfg)).run()
    judged = StageDir(cfg.run_dir, "judge_answers").read_table("answer_judgments").to_pylist()
    assert {r["judge"] for r in judged} == {"mem0_j", "longmemeval", "strict", "f1"}
    assert {r["run"] for r in judged if r["judge"] == "f1"} == {0}  # F1 asks no model: one row
    assert {r["run"] for r in judged if r["judge"] == "mem0_j"} == {0, 1, 2}
    report = StageDir(cfg.run_dir, "report")
    scores = report.read_table("panel_scores").to_pylist()
    assert {(r["judge"], r["method"]) for r in scores} == {(j, m) for j in ("mem0_j", "longmemeval", "strict", "f1")
                                                           for m in ("full_history", "turn")}
    agreement = report.read_table("judge_agreement").to_pylist()
    assert any(r["judge_a"] == "panel" for r in agreement) and len(agreement) == 6 + 1  # 4 judges: 6 pairs
    pairs = report.read_table("robust_pairs").to_pylist()
    assert [(r["method_a"], r["method_b"]) for r in pairs] == [("full_history", "turn")] and pairs[0]["judges"] == 4
    html = (Path(cfg.run_dir) / "report" / "report.html").read_text()
    assert "The judges side by side" in html and "beats, under every judge" in html
    sent = fake_llm.count()
    Runner(cfg, registry(cfg)).run()
    assert fake_llm.count() == sent  # warm: nothing sent again


def test_an_audited_run_judges_the_changed_items_against_both_keys_and_counts_each_item_once(
        tmp_path, fake_llm, models_cache, monkeypatch):
    monkeypatch.setenv("MEMPIPE_TEST_KEY", "sk-test-secret-value-123")
    audit = ROOT / "tests/fixtures/locomo_audit"
    cfg = resolve_paths(load_config(ROOT / "configs" / "locomo_judge_panel.yaml", [
        f"artifacts_dir={tmp_path / 'artifacts'}", "llm.provider=openai", f"llm.base_url={fake_llm.base_url}",
        "llm.api_key_env=MEMPIPE_TEST_KEY", f"llm.cache_dir={tmp_path / 'llm-cache'}", "llm.rpm=null",
        "llm.tpm=null", "ray.executor=inline", f"corpus.path={audit / 'locomo_mini.json'}",
        f"corpus.audit_path={audit / 'locomo-audit'}", "corpus.answer_key=audited", "methods=[full_history]",
        "roles={}", "judge_answers.runs=1",
        "judge_answers.panel=[{name: f1, prompt: f1}, {name: f1_strict, prompt: f1, accept_at: 0.9}]",
        "embedding.provider=local", "embedding.model=all-MiniLM-L6-v2", f"embedding.cache_dir={models_cache}"]))
    Runner(cfg, registry(cfg)).run()
    qa = StageDir(cfg.run_dir, "ingest").read_table("qa").to_pylist()
    changed = {f"qa:{q['qa_id']}" for q in qa if q["gold_original"] != q["answer"]}
    assert changed  # the fixture's audit changes some gold
    rows = StageDir(cfg.run_dir, "judge_answers").read_table("answer_judgments").to_pylist()
    assert {r["probe_id"] for r in rows if r["answer_key"] == "original"} == changed
    assert {r["answer_key"] for r in rows} == {"audited", "original"}
    report = StageDir(cfg.run_dir, "report")
    overall = [r for r in report.read_table("answer_summary").to_pylist()
               if r["dataset"] == "locomo" and r["category"] is None and r["judge"] == "f1"]
    audited_items = [r for r in rows if r["answer_key"] == "audited" and r["judge"] == "f1"]
    assert overall[0]["items"] == len(audited_items)  # each item once, under the run's key
    keys = report.read_table("answer_keys").to_pylist()
    f1 = next(r for r in keys if r["judge"] == "f1")
    judged = [r for r in audited_items if r["skipped"] is None and r["score"] is not None]
    assert f1["changed"] == len({r["probe_id"] for r in rows if r["answer_key"] == "original" and r["judge"] == "f1"
                                 and r["skipped"] is None})
    assert f1["audited"] == pytest.approx(sum(r["score"] for r in judged) / len(judged))
    by_original = {r["probe_id"]: r["score"] for r in rows if r["answer_key"] == "original" and r["judge"] == "f1"}
    expected = [by_original.get(r["probe_id"], r["score"]) for r in judged]
    assert f1["original"] == pytest.approx(sum(expected) / len(expected))
