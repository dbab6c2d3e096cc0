"""configs/memoryagentbench.yaml runs offline against the fake server on the fixture (every task's layout
as the hub release gives it): the long-context and BM25 RAG agents' requests per task, the official
per-task scores as response_metrics columns, the summary judge's F1 and no failed row of ours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_shipped_config_offline
from pipeline.artifacts import StageDir
from stages import load_config
from stages.judging import memoryagentbench as judge
from stages.methods.shared import memoryagentbench_reader as reader

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "corpora" / "memoryagentbench"
TITLES = {"<http://dbpedia.org/resource/Memento_(film)>": 7001, "<http://dbpedia.org/resource/Tenet_(film)>": 7002,
          "<http://dbpedia.org/resource/Inception>": 7003, "<http://dbpedia.org/resource/Up_(2009_film)>": 7004}
JUDGE_PARTS = {text: part for part, text in judge.SYSTEMS.items()}
JUDGE_REPLIES = {"fluency": 'Reads well. {"fluency": 1}',
                 "recall": 'The one point is there. {"supported_key_points": [1], "recall": 1}',
                 "precision": 'Three of four hold. {"precision": 3, "sentence_count": 4}'}


def _answer(user: str) -> str:
    """What every agent replies, by the task its query names."""
    if "20 recommendations" in user:
        return "1. Memento (2000)\n2. Tenet\n3. Inception\n4. Up"
    if "numerical label" in user:
        return "12"  # the query ends on its "label:" cue
    return "The keeper found that the lamp failed."


def _responder(body: dict) -> str | None:
    system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
    if system == reader.SYSTEM:
        return _answer(user)
    part = JUDGE_PARTS.get(system)
    return JUDGE_REPLIES[part] if part else None


@pytest.mark.heavy(seconds=10)
def test_the_config_runs_offline_with_the_agents_requests_the_task_scores_and_the_summary_judge(
        tmp_path, fake_llm, models_cache, monkeypatch):
    entities = tmp_path / "entity2id.json"
    entities.write_text(json.dumps(TITLES))
    shipped = load_config(ROOT / "configs" / "memoryagentbench.yaml")  # the default slice: a context a competency
    assert len(shipped.corpus.episode_ids or []) == 4 and shipped.probes.max_qa_per_episode == 10
    cfg = run_shipped_config_offline("memoryagentbench", [
        f"corpus.path={FIXTURE}", "corpus.episode_ids=null", f"response_metrics.memoryagentbench_entities={entities}"],
        tmp_path, fake_llm, models_cache, monkeypatch, _responder)

    asked = [r["body"] for r in fake_llm.requests
             if r["path"] == "/v1/chat/completions" and r["body"]["messages"][0]["content"] == reader.SYSTEM]
    recsys = [b for b in asked if "20 recommendations" in b["messages"][1]["content"]]
    assert len(recsys) == 3 and {b["max_tokens"] for b in recsys} == {300} and {b["temperature"] for b in recsys} == {0.7}
    rag = [b for b in recsys if "Memory 1:" in b["messages"][1]["content"]]
    assert len(rag) == 1  # turn asks as the RAG agent; full and zero history as the long-context agent

    metrics = StageDir(cfg.run_dir, "response_metrics").read_table("response_metrics").to_pylist()
    by_task: dict[str, list[dict]] = {}
    for r in metrics:
        by_task.setdefault(r["category"].split("/")[1], []).append(r)
    assert {r["mab_recsys_recall_at_5"] for r in by_task["recsys_redial_full"]} == {1.0}
    assert sorted(r["mab_exact_match"] for r in by_task["icl_banking77_5900shot_balance"]) == [0.0] * 3 + [1.0] * 3
    assert all(r["mab_substring_exact_match"] is not None for r in by_task["factconsolidation_sh_6k"])

    judged = StageDir(cfg.run_dir, "judge_answers").read_table("answer_judgments").to_pylist()
    summaries = [r for r in judged if r["category"].endswith("infbench_sum_eng_shots2")]
    assert len(summaries) == 3 and {round(r["score"], 4) for r in summaries} == {round(2 * 0.75 / 1.75, 4)}
    assert all(r["skipped"] for r in judged if r not in summaries)  # matched tasks: scored by response_metrics
