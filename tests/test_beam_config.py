"""configs/beam.yaml runs offline against the fake server on the fixture (BEAM's published layout): the
long-context and RAG baselines' requests, the rubric judge's per-nugget calls and event ordering's tau-b,
and no failed row of ours."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_shipped_config_offline
from pipeline.artifacts import StageDir
from stages import load_config
from stages.judging import beam as judge
from stages.methods.shared import beam_reader as reader

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "corpora" / "beam"
NUGGET_OPENING = judge.NUGGET_PROMPT.split("\n", 1)[0]


def _responder(body: dict) -> str | None:
    first = body["messages"][0]
    if first["role"] == "system" and first["content"] == judge.EQUIVALENCE_SYSTEM:
        return "YES"
    if first["content"].startswith(NUGGET_OPENING):
        return 'It does. {"score": 1, "reason": "met"}'
    return "First this\nthen that"  # every reader's answer: two lines, so an order can be scored


@pytest.mark.heavy(seconds=18)
def test_the_config_runs_offline_with_the_baselines_requests_and_the_rubric_judge(tmp_path, fake_llm, models_cache,
                                                                                  monkeypatch):
    cfg = run_shipped_config_offline("beam", [
        f"corpus.path={FIXTURE}", "embedding.model=all-MiniLM-L6-v2"],  # packaged; the config names bge-small
        tmp_path, fake_llm, models_cache, monkeypatch, _responder)

    asked = [r["body"] for r in fake_llm.requests if r["path"] == "/v1/chat/completions"]
    readers = [b for b in asked if not b["messages"][0]["content"].startswith(NUGGET_OPENING)
               and b["messages"][0]["content"] != judge.EQUIVALENCE_SYSTEM]
    assert readers and all(b["temperature"] == 0.0 and "max_tokens" not in b for b in readers)
    rag = [b for b in readers if b["messages"][-1]["content"].endswith(reader.RAG_CUE)]
    chats = [b for b in readers if len(b["messages"]) > 1]  # the long-context baseline: the chat as turns
    assert len(rag) == 11 and len(chats) == 11  # the default slice's 11 questions, once each
    assert {m["role"] for b in chats for m in b["messages"][:-1]} == {"user", "assistant"}

    judged = StageDir(cfg.run_dir, "judge_answers").read_table("answer_judgments").to_pylist()
    mine = [r for r in judged if r["method"] == "turn"]
    assert len(mine) == 11 and all(r["skipped"] is None for r in mine)
    by_prompt = {r["judge_prompt"] for r in mine}
    assert by_prompt == {judge.RUBRIC, judge.ORDER}
    assert {r["score"] for r in mine} == {1.0}  # every nugget met; the two lines aligned in the rubric's order


def test_an_edit_to_one_conversations_chat_changes_the_corpus_fingerprint(tmp_path):
    import shutil

    from stages.ingest import IngestStage

    corpus = tmp_path / "beam"
    shutil.copytree(FIXTURE, corpus)
    cfg = load_config(ROOT / "configs" / "beam.yaml", [f"corpus.path={corpus}"])
    before = IngestStage().extra_fingerprint(cfg)
    assert {"100K/1/chat.json", "100K/2/chat_trunecated.json"} <= set(before["files"])  # nested: by path
    chat = corpus / "100K" / "2" / "chat_trunecated.json"
    chat.write_text(chat.read_text().replace("}", "} ", 1))
    after = IngestStage().extra_fingerprint(cfg)
    assert [k for k in before["files"] if before["files"][k] != after["files"][k]] == ["100K/2/chat_trunecated.json"]
