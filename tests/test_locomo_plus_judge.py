"""LoCoMo-Plus's judge (`correctness: [locomo_plus]`, stages/judging/locomo_plus.py): a prompt per
category with that category's elements of the release's prompt.py (the cognitive one shows the cue and the
reply, no question and no reference; the adversarial one the reply alone), the reply read as
llm_as_judge.py reads it, and correct / partial / wrong scored 1 / 0.5 / 0 and averaged per category.
The reading cases' expected labels and the summary come from running llm_as_judge.py's
_parse_judge_response, label_to_score and _compute_summary once (xjtuleeyf/Locomo-Plus at commit
059f4e3d38f7f1f96765e8e2cb7de3097551bffb)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from conftest import run_shipped_config_offline
from pipeline.testing.fake_chat import FakeChat

from pipeline.artifacts import StageDir
from stages.judging import locomo_plus as lp

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "corpora" / "locomo_plus"


@pytest.mark.parametrize(("category", "kind"), [
    ("single-hop", "fact"), ("multi-hop", "fact"), ("temporal", "temporal"), ("open-domain", "common_sense"),
    ("adversarial", "adversarial"), ("cognitive", "cognitive"), ("knowledge-update", "default"), (None, "default"),
])
def test_each_category_gets_its_own_prompt(category: str | None, kind: str) -> None:
    assert lp.prompt_kind(category) == kind


def test_the_cognitive_prompt_shows_the_cue_and_the_reply_and_no_reference() -> None:
    system, user = lp.build_messages("cognitive", "Maybe pace yourself first?", "REF", "Priya：I learnt to say no.")
    assert "Priya：I learnt to say no." in user["content"] and "Maybe pace yourself first?" in user["content"]
    assert "REF" not in user["content"]
    assert '"correct"' in system["content"] and '"wrong"' in system["content"] and "partial" not in system["content"]


def test_the_adversarial_prompt_shows_the_reply_alone_and_fact_prompts_allow_partial() -> None:
    _, user = lp.build_messages("adversarial", "It was never said.", "REF", "EVIDENCE")
    assert user["content"] == "Model answer:\nIt was never said."
    for kind in ("fact", "common_sense", "default"):
        system, user = lp.build_messages(kind, "Paris", "Lyon", "Dev：I moved to Lyon.")
        assert all(x in user["content"] for x in ("Paris", "Lyon", "Dev：I moved to Lyon."))
        assert '"partial"' in system["content"]
    assert "partial" not in lp.build_messages("temporal", "a", "b", "c")[0]["content"]


@pytest.mark.parametrize(("reply", "label"), [
    ('{"label": "partial", "reason": "misses the date"}', "partial"),
    ('Sure. {"label": "correct", "reason": "it\'s right"} done', "correct"),
    ('{"reason": "first", "label": "wrong"}', "wrong"),
    ('{"label": 1}', ""),
    ('["correct"]', "correct"),
    ("The answer is incorrect.", "correct"),  # the release's fallback finds "correct" inside "incorrect"
    ("This is WRONG and partial", "wrong"),
    ("no verdict here", ""),
    ('{"label": "Correct ", "reason": ""}', "Correct"),
    ('"correct"', "correct"),
])
def test_the_reply_is_read_as_the_release_reads_it(reply: str, label: str) -> None:
    assert lp.parse_label(reply) == label


def test_labels_score_one_half_zero_and_the_category_mean_is_the_releases_avg() -> None:
    replies = ['{"label": "correct", "reason": "uses the cue"}', '{"label": "wrong", "reason": "no link"}',
               "verdict: correct"]
    llm = FakeChat(replies)
    got = [asyncio.run(lp.judge_call("cognitive", "r", "", "cue").once(llm)) for _ in replies]
    assert [g[:2] for g in got] == [(1.0, "cognitive"), (0.0, "cognitive"), (1.0, "cognitive")]
    assert got[0][2] == replies[0] and got[0][3] == "fake"
    temporal = asyncio.run(lp.judge_call("temporal", "r", "g", "e").once(FakeChat(['{"label": "partial", "reason": "x"}'])))
    # the release's summary for these four: Cognitive avg 0.6667 (2.0 / 3), temporal 0.5, overall 0.625
    scores = [g[0] for g in got]
    assert round(sum(scores) / 3, 4) == 0.6667 and temporal[0] == 0.5
    assert round((sum(scores) + temporal[0]) / 4, 4) == 0.625
    assert lp.score("unknown") == 0.0 and lp.score(" Partial ") == 0.5


def test_evidence_is_shown_as_speaker_lines_of_the_evidence_turns() -> None:
    turns = [{"source_turn_id": "C1:1", "speaker": "Priya", "text": "I learnt to say no."},
             {"source_turn_id": "C1:2", "speaker": "Dev", "text": "Good for you."},
             {"source_turn_id": "D1:1", "speaker": "Dev", "text": "Hi"}]
    assert lp.evidence_text(["C1:1", "C1:2", "D9:9"], turns) == "Priya：I learnt to say no.\nDev：Good for you."


# --- configs/locomo_plus.yaml on the fixture, judged by the fake server -------------------------------

KIND_OF_SYSTEM = {text: kind for kind, text in lp.SYSTEMS.items()}
REPLY = "You were learning to say no, so maybe step back from that project."


def _responder(body: dict) -> str | None:
    """The judge labels a cognitive reply correct when it mentions the cue's "say no", partial elsewhere;
    every method gives the same reply."""
    messages = body["messages"]
    kind = KIND_OF_SYSTEM.get(messages[0]["content"]) if messages[0]["role"] == "system" else None
    if kind is None:
        return None if "response_format" in body else REPLY
    if kind == "cognitive":
        cue = messages[1]["content"].split("Model reply:")[0]
        return '{"label": "%s", "reason": "r"}' % ("correct" if "say 'no'" in cue else "wrong")
    return '{"label": "partial", "reason": "r"}'


@pytest.mark.heavy(seconds=9)
def test_the_config_runs_offline_judging_cognitive_items_on_their_cue(tmp_path, fake_llm, models_cache,
                                                                      monkeypatch):
    cfg = run_shipped_config_offline("locomo_plus", [f"corpus.path={FIXTURE}"], tmp_path, fake_llm, models_cache,
                                     monkeypatch, _responder)
    assert cfg.corpus.limit == 5  # the default slice: the fixture's 3 cognitive items and its 2 conversations
    rows = StageDir(cfg.run_dir, "judge_answers").read_table("answer_judgments").to_pylist()
    cognitive = {(r["probe_id"], r["method"]): r for r in rows if r["category"] == "cognitive"}
    assert len(cognitive) == 3 * len(cfg.methods)
    assert all(r["skipped"] is None and r["judge_prompt"] == "cognitive" for r in cognitive.values())
    # item 0's cue says "say 'no'": correct; items 1 and 2 have other cues: wrong
    assert {(p.split(":")[-1], r["score"]) for (p, _), r in cognitive.items()} >= {
        ("locomo_plus-c0-q0", 1.0), ("locomo_plus-c1-q0", 0.0)}
    summary = StageDir(cfg.run_dir, "report").read_table("answer_summary").to_pylist()
    by = {(r["category"], r["method"]): r for r in summary if r["dataset"] == "locomo_plus"}
    assert by[("cognitive", "zero_history")]["score"] == pytest.approx(1 / 3)
    partial = [r for r in rows if r["category"] not in ("cognitive", "adversarial") and r["skipped"] is None]
    assert partial and {r["score"] for r in partial} == {0.5}
