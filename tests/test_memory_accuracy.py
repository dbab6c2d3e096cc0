"""RSum Table 2: a method's memory after session k-1 against MSC's gold persona summaries of
sessions 1..k-1, as RSum's compute_f1 precision / recall / F1 and evaluate's n-gram precisions
(BLEU-1/2), in the report of an MSC run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from stages.methods.baselines.mem0_style import Mem0Settings, Mem0Style
from stages.methods.rsum import RSum, RSumSettings
from stages.report.memory_accuracy import (gold_persona_memory, memory_accuracy_rows, memory_accuracy_summary,
                                           memory_points)

EPISODE = {"episode_id": "e1", "dataset": "msc", "speakers": ["Speaker 1", "Speaker 2"], "notes": [
    {"session_idx": 1, "kind": "persona", "speaker": "Speaker 1", "text": "I grow tomatoes."},
    {"session_idx": 2, "kind": "persona", "speaker": "Speaker 1", "text": "I moved to Leeds."},
    {"session_idx": 2, "kind": "persona", "speaker": "Speaker 1", "text": "I grow tomatoes."},  # repeated: once
]}


def summary(session: int, text: str | None) -> dict:
    return {"episode_id": "e1", "snapshot_session": session, "snapshot_turn": None, "memory": text,
            "tokens": None, "error": None, "raw": None}


def test_the_gold_memory_of_a_point_is_every_summary_up_to_it_each_line_once():
    assert gold_persona_memory(EPISODE, 1) == "I grow tomatoes."
    assert gold_persona_memory(EPISODE, 2) == "I grow tomatoes.\nI moved to Leeds."
    assert memory_points(EPISODE) == [1, 2] and memory_points({"notes": None}) == []


def test_rsums_memory_scores_against_the_gold_as_worked_by_hand():
    memory = {"rsum": {"summary": [summary(1, "Speaker 1 grows tomatoes."),
                                   summary(2, "Speaker 1 grows tomatoes and moved to Leeds."),
                                   summary(3, "not scored: no gold after session 3")]}}
    rows = memory_accuracy_rows([(RSum(), RSumSettings())], [EPISODE], memory)
    assert [(r["session_idx"], r["memory_after_session"]) for r in rows] == [(2, 1), (3, 2)]
    # Session 2: memory [speaker, 1, grows, tomatoes] vs gold [i, grow, tomatoes]: one shared token.
    s2 = rows[0]
    assert (s2["rsum_precision"], s2["rsum_recall"], s2["rsum_mem_f1"]) == pytest.approx((1 / 4, 1 / 3, 2 / 7))
    # BLEU over words and punctuation: 2 of 5 unigrams match (tomatoes, .); 1 of 4 bigrams (tomatoes .).
    assert s2["bleu1"] == pytest.approx(0.4) and s2["bleu2"] == pytest.approx(math.sqrt(0.4 * 0.25))
    # Session 3: 4 of 8 memory tokens in the 7 gold tokens (tomatoes, moved, to, leeds).
    s3 = rows[1]
    assert (s3["rsum_precision"], s3["rsum_recall"], s3["rsum_mem_f1"]) == pytest.approx((1 / 2, 4 / 7, 8 / 15))
    table = memory_accuracy_summary(rows).to_dicts()
    assert [(r["method"], r["session_idx"], r["episodes"]) for r in table] == [("rsum", 2, 1), ("rsum", 3, 1)]
    assert table[0]["rsum_mem_f1"] == pytest.approx(2 / 7) and table[0]["rsum_mem_f1_low"] == pytest.approx(2 / 7)
    # evaluate's precisions over 13a tokens, case kept: Speaker 1 grows tomatoes . vs I grow tomatoes .
    # unigrams: 2 of 5 (tomatoes, .); bigrams: 1 of 4 (tomatoes .)
    assert (table[0]["evaluate_precision1"], table[0]["evaluate_precision2"]) == pytest.approx((0.4, 0.25))


def test_a_session_without_memory_yet_is_not_scored_and_means_run_over_episodes():
    other = {**EPISODE, "episode_id": "e2"}
    rows = [summary(1, None), summary(2, "I grow tomatoes. I moved to Leeds."),
            {**summary(1, "I grow tomatoes."), "episode_id": "e2"}]
    out = memory_accuracy_rows([(RSum(), RSumSettings())], [EPISODE, other], {"rsum": {"summary": rows}})
    assert [(r["episode_id"], r["session_idx"]) for r in out] == [("e1", 3), ("e2", 2), ("e2", 3)]
    assert out[0]["rsum_mem_f1"] == pytest.approx(1.0) and out[1]["rsum_mem_f1"] == pytest.approx(1.0)
    # e2 keeps its session 1 memory through session 2: recall 3/7 of the gold after session 2
    assert out[2]["rsum_recall"] == pytest.approx(3 / 7)
    table = memory_accuracy_summary(out).to_dicts()
    assert [(r["session_idx"], r["episodes"]) for r in table] == [(2, 1), (3, 2)]
    assert table[1]["rsum_recall"] == pytest.approx((1 + 3 / 7) / 2)


def test_a_snapshot_memory_is_scored_as_it_stood_after_each_session():
    fact = {"episode_id": "e1", "snapshot_turn": None, "speaker": "Speaker 1", "session_idx": 1, "turn_idx": None,
            "updated_session": None}
    facts = [{**fact, "snapshot_session": 1, "fact_id": "f1", "text": "grows tomatoes"},
             {**fact, "snapshot_session": 2, "fact_id": "f1", "text": "moved to Leeds"}]
    out = memory_accuracy_rows([(Mem0Style(), Mem0Settings())], [EPISODE], {"mem0_style": {"facts": facts}})
    assert [r["memory"] for r in out] == ["[Speaker 1] grows tomatoes", "[Speaker 1] moved to Leeds"]


def msc_record() -> dict:
    lines = [["I grow tomatoes in my garden."], ["I play the cello."]]
    return {"metadata": {"initial_data_id": "acc1"}, "personas": lines,
            "previous_dialogs": [
                {"dialog": [{"text": "I spent all day in the garden with my tomatoes."},
                            {"text": "Nice, I practised the cello."}], "personas": lines},
                {"dialog": [{"text": "My tomatoes are ripe now."}, {"text": "I have a concert soon."}],
                 "personas": [["My tomatoes are ripe."], ["I have a cello concert soon."]]}],
            "dialog": [{"id": "Speaker 1", "text": "How did the concert go?"},
                       {"id": "Speaker 2", "text": "It went well, thanks!"},
                       {"id": "Speaker 1", "text": "Great to hear."},
                       {"id": "Speaker 2", "text": "How are the tomatoes?"}]}


def test_an_msc_run_reports_memory_accuracy_for_rsum_and_mem0_style(run_cfg, fake_llm, tmp_path):
    from pipeline.artifacts import StageDir
    from pipeline.engine.runner import Runner
    from stages import registry
    from stages.metrics.rsum_eval import f1_parts

    path = tmp_path / "msc.jsonl"
    path.write_text(json.dumps(msc_record()) + "\n")
    cfg = run_cfg("corpus.format=msc", f"corpus.path={path}", "corpus.limit=1", "methods=[rsum,mem0_style]",
                  "stages=[ingest,probes,memory_rsum,memory_mem0_style,respond_rsum,respond_mem0_style,report]")
    assert "ingest" in registry(cfg)["report"].inputs
    assert set(Runner(cfg, registry(cfg)).run().values()) == {"ran"}
    table = StageDir(cfg.run_dir, "report").read_table("memory_accuracy_summary").to_pylist()
    rsum = [r for r in table if r["method"] == "rsum"]
    assert [r["session_idx"] for r in rsum] == [2, 3] and all(r["dataset"] == "msc" for r in rsum)
    built = {r["snapshot_session"]: r["memory"]
             for r in StageDir(cfg.run_dir, "memory_rsum").read_table("summary").to_pylist()}
    gold = "I grow tomatoes in my garden.\nI play the cello."
    assert rsum[0]["rsum_mem_f1"] == pytest.approx(f1_parts(built[1], gold)[2])
    assert {r["method"] for r in table} == {"rsum", "mem0_style"}
    assert StageDir(cfg.run_dir, "memory_mem0_style").read_table("extractions").num_rows > 0
    for m in ("rsum", "mem0_style"):
        responses = StageDir(cfg.run_dir, f"respond_{m}").read_table("responses").to_pylist()
        assert responses and all(r["error"] is None for r in responses), m
    assert "Memory accuracy against gold persona summaries" in (Path(cfg.run_dir) / "report" / "report.md").read_text()


def test_a_run_without_msc_does_not_read_ingest_in_the_report(run_cfg):
    from stages import registry

    cfg = run_cfg("methods=[rsum]")
    assert "ingest" not in registry(cfg)["report"].inputs
