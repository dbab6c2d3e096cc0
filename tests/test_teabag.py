"""TeaBag generation and TeaFarm evaluation: with a scripted LLM, and end to end on the sample corpus."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import polars as pl
import pytest

from conftest import ROOT
from fake_chat import FakeChat
from pipeline.llm.types import LLMError
from pipeline.stage import StageContext
from stages.teabag import TeabagStage, generate
from stages.teabag.generate import Summary


def speaker_turns(session: int, n: int = 4) -> list[dict]:
    return [{"episode_id": "e1", "session_idx": session, "turn_idx": i, "speaker": "Ann" if i % 2 == 0 else "Bob",
             "text": f"talk {session}.{i}", "session_time": None, "source_turn_id": None} for i in range(n)]


def scripted(verdicts: list[bool] | None = None, fail_session: bool = False):
    """A responder for the whole stage: session memories name their session; questions name their
    asker and attempt; the check answers from `verdicts` in order (True when they run out)."""
    verdicts = list(verdicts or [])

    def respond(messages, schema):
        name = schema.__name__ if schema else ""
        user = messages[-1]["content"]
        if name == "SessionMemories":
            session = user.split("(session ")[1].split(")")[0]
            return {"memories": [f"memory of session {session}"]}
        if name == "CounterfactualQuestion":
            asker = messages[0]["content"].split("that ")[1].split(" could ask")[0]
            tried = "rejected the previous try" in user
            return {"question": f"{asker} asks{' again' if tried else ''}?", "false_premise": "p",
                    "answer": "No, that changed.", "evidence_sessions": [2]}
        if name == "Verdict":
            ok = verdicts.pop(0) if verdicts else True
            return {"counterfactual": ok, "reason": "fine" if ok else "it matches the notes"}
        if name == "NewSession":
            if fail_session:
                return LLMError("endpoint down")
            return {"turns": [{"speaker": "Ann", "text": "hi"}, {"speaker": "Bob", "text": "hello"}]}
        raise AssertionError(f"unexpected call {name}")

    return respond


def run_stage(llm: FakeChat, *sets: str, sessions: int = 3) -> dict:
    import stages

    cfg = stages.load_config(None, ["teabag.enabled=true", *sets])
    llm.cfg = SimpleNamespace(model="fake-gen", seed=7)  # type: ignore[attr-defined]
    stage = TeabagStage()
    ctx = StageContext(cfg=cfg, stage=stage, out_dir=None, clients={"teabag": llm, "memory": llm})  # type: ignore[arg-type]
    episode = {"episode_id": "e1", "dataset": "msc", "speakers": ["Ann", "Bob"]}
    turns = [t for s in range(sessions, 0, -1) for t in speaker_turns(s)]  # sessions out of order on purpose
    return asyncio.run(stage.process_episode(ctx, "e1", {"ingest.episodes": [episode], "ingest.turns": turns}))


def test_summaries_reach_the_generator_in_session_order():
    summaries = [Summary(3, None, ["Ann moved to Rome"]), Summary(1, "2023-01-02", ["Ann lives in Oslo"]),
                 Summary(2, None, [])]
    notes = generate.notes_text(summaries)
    assert notes.index("session 1 (2023-01-02)") < notes.index("session 2") < notes.index("session 3")
    assert "(nothing noted)" in notes
    llm = FakeChat(responder=scripted())
    out = run_stage(llm)
    question_calls = [c for c in llm.calls if c["schema"] and c["schema"].__name__ == "CounterfactualQuestion"]
    prompt = question_calls[0]["messages"][-1]["content"]
    assert prompt.index("memory of session 1") < prompt.index("memory of session 2") < prompt.index("memory of session 3")
    assert [r["session_idx"] for r in out["summaries"]] == [1, 2, 3]


def test_both_speakers_ask_the_other_answers_and_each_new_session_ends_with_the_question():
    out = run_stage(FakeChat(responder=scripted()), "teabag.questions_per_episode=4")
    qs = out["questions"]
    assert [(q["asker"], q["answerer"]) for q in qs] == [("Ann", "Bob"), ("Bob", "Ann")] * 2
    assert all(q["error"] is None and q["memory_sessions"] == 3 and q["checked"] for q in qs)
    assert all(q["model"] == "fake-gen" and q["seed"] == 7 and len(q["prompt_fingerprint"]) == 12 for q in qs)
    for q in qs:
        session = [t for t in out["sessions"] if t["question_id"] == q["question_id"]]
        assert [t["session_idx"] for t in session] == [4] * 3
        assert session[-1]["text"] == q["question"] and session[-1]["speaker"] == q["asker"]
        assert session[-1]["is_question"] and not any(t["is_question"] for t in session[:-1])
    assert qs[0]["evidence_sessions"] == [2]


def test_a_rejected_question_is_regenerated_with_the_reason_and_kept():
    llm = FakeChat(responder=scripted(verdicts=[False, True]))
    made = asyncio.run(generate.generate_question(llm, [Summary(1, None, ["x"]), Summary(2, None, ["y"])],
                                                ["Ann", "Bob"], "Ann", "Bob"))
    assert made.accepted is not None and made.accepted.question == "Ann asks again?" and made.accepted.attempt == 1
    assert [(r.question, r.accepted, r.reason) for r in made.rejects] == [("Ann asks?", False, "it matches the notes")]
    retry = [c for c in llm.calls if c["schema"].__name__ == "CounterfactualQuestion"][1]
    assert "it matches the notes" in retry["messages"][-1]["content"]


def test_a_slot_whose_every_try_is_rejected_fails_with_a_reason_and_keeps_the_rejects():
    out = run_stage(FakeChat(responder=scripted(verdicts=[False] * 3)), "teabag.questions_per_episode=1")
    (q,) = out["questions"]
    assert q["error"] == "no counterfactual question after 3 attempts" and q["checked"] is False
    assert [r["attempt"] for r in out["rejects"]] == [0, 1, 2] and [r["seed"] for r in out["rejects"]] == [7, 8, 9]
    assert out["sessions"] == []


def test_without_the_check_the_first_question_is_kept_unchecked():
    llm = FakeChat(responder=scripted(verdicts=[False]))
    out = run_stage(llm, "teabag.counterfactual_check=false", "teabag.questions_per_episode=1")
    assert out["questions"][0]["checked"] is None and out["questions"][0]["error"] is None
    assert not [c for c in llm.calls if c["schema"].__name__ == "Verdict"]


def test_a_failed_new_session_fails_its_question_only():
    out = run_stage(FakeChat(responder=scripted(fail_session=True)), "teabag.questions_per_episode=2")
    assert all(q["error"].startswith("session 4: ") for q in out["questions"]) and out["sessions"] == []
    assert all(q["question"] for q in out["questions"])  # what was generated is kept


def test_episodes_too_short_or_with_one_speaker_get_no_questions():
    out = run_stage(FakeChat(responder=scripted()), "teabag.min_sessions=4", sessions=3)
    assert out["questions"] == [] and out["summaries"] == []


def test_teafarm_correctness_is_correct_over_total_per_method_and_dataset():
    from stages.report.tables import teafarm_summary

    rows = [("msc", "theanine", 1.0), ("msc", "theanine", 0.0), ("msc", "theanine", 1.0), ("cc", "theanine", 0.0),
            ("msc", "rsum", 0.0), ("msc", "rsum", None), ("cc", "rsum", 1.0), ("msc", "theanine", None)]
    judgments = pl.DataFrame(
        [{"dataset": d, "method": m, "judge": "teafarm", "score": s, "error": None if s is not None else "no response"}
         for d, m, s in rows] + [{"dataset": "msc", "method": "theanine", "judge": "strict", "score": 1.0, "error": None}])
    got = {(r["dataset"], r["method"]): (r["correct"], r["total"], r["failed"], r["correctness"])
           for r in teafarm_summary(judgments).iter_rows(named=True)}
    assert got == {("msc", "theanine"): (2, 3, 1, 2 / 3), ("cc", "theanine"): (0, 1, 0, 0.0),
                   ("all", "theanine"): (2, 4, 1, 0.5), ("msc", "rsum"): (0, 1, 1, 0.0),
                   ("cc", "rsum"): (1, 1, 0, 1.0), ("all", "rsum"): (1, 2, 1, 0.5)}


@pytest.fixture
def teafarm_run(run_cfg):
    from pipeline.runner import Runner
    from stages import registry

    cfg = run_cfg("corpus.limit=1", "teabag.enabled=true", "methods=[theanine,memory_retrieval,full_history]",
                  "stages=null", "judge_pairwise.enabled=false", "judge_memory.enabled=false")
    Runner(cfg, registry(cfg)).run()
    return cfg


def test_on_the_sample_corpus_every_method_answers_every_teafarm_question_and_is_judged(teafarm_run, tmp_path):
    from pipeline.artifacts import StageDir
    from pipeline.runner import Runner
    from stages import registry
    from stages.teabag.export import export_teabag

    cfg = teafarm_run
    run = cfg.run_dir
    questions = StageDir(run, "teabag").read_table("questions").to_pylist()
    assert len(questions) == 2 and all(q["error"] is None for q in questions)
    assert {q["asker"] for q in questions} == {q["answerer"] for q in questions} and len({q["asker"] for q in questions}) == 2
    probes = [p for p in StageDir(run, "probes").read_table("probes").to_pylist() if p["kind"] == "teafarm"]
    assert sorted(p["qa_id"] for p in probes) == sorted(q["question_id"] for q in questions)
    for p in probes:
        q = next(q for q in questions if q["question_id"] == p["qa_id"])
        assert p["respondent"] == q["answerer"] and p["request"] == q["question"] == p["context"][-1]["text"]
        assert p["session_idx"] == q["memory_sessions"] + 1 == 6
    for m in cfg.methods:
        responses = {r["probe_id"]: r for r in StageDir(run, f"respond_{m}").read_table("responses").to_pylist()}
        for p in probes:
            r = responses[p["probe_id"]]
            assert r["error"] is None and r["response"], m
            # memory of the corpus's own session 6 never reaches a question asked after session 5
            assert r["memory_after_session"] is None or r["memory_after_session"] <= 5, m
    judged = [j for j in StageDir(run, "judge_answers").read_table("answer_judgments").to_pylist() if j["judge"] == "teafarm"]
    assert sorted((j["method"], j["probe_id"]) for j in judged) == sorted((m, p["probe_id"]) for m in cfg.methods for p in probes)
    summary = StageDir(run, "report").read_table("teafarm_summary").to_pylist()
    assert {(r["dataset"], r["method"]) for r in summary} == {(d, m) for d in ("sample", "all") for m in cfg.methods}
    assert all(r["total"] + r["failed"] == 2 for r in summary)

    first, second = tmp_path / "x1", tmp_path / "x2"
    export_teabag(run, first, cfg.teabag)
    Runner(cfg, registry(cfg)).run(force=["teabag"])  # generated again from the same config and cache
    export_teabag(run, second, cfg.teabag)
    names = sorted(p.name for p in first.iterdir())
    assert names == ["README.md", "episodes.parquet", "next_sessions.parquet", "questions.parquet",
                     "rejects.parquet", "sessions.parquet"]
    assert all((first / n).read_bytes() == (second / n).read_bytes() for n in names)
    qs = pl.read_parquet(first / "questions.parquet")
    assert qs.height == 2 and set(qs["asker"]) == set(qs["answerer"])
    sessions = pl.read_parquet(first / "sessions.parquet")
    assert sessions["session_idx"].max() == 5 and sessions["episode_id"].unique().to_list() == qs["episode_id"].unique().to_list()
    assert pl.read_parquet(first / "next_sessions.parquet").filter(pl.col("is_question")).height == 2
    card = (first / "README.md").read_text()
    assert "Counterfactual check (ours, not in the paper): on" in card
    assert f"generator model(s): {cfg.role('teabag').model}" in card and "- seed(s): 0" in card

    from stages.cli import main

    third = tmp_path / "x3"  # the command a user types, with the config of the run
    assert main(["export", "teabag", "--out", str(third), "-c", str(ROOT / "configs" / "default.yaml"),
                 "--set", f"artifacts_dir={cfg.artifacts_dir}", "--set", "teabag.enabled=true"]) == 0
    assert all((first / n).read_bytes() == (third / n).read_bytes() for n in names)
