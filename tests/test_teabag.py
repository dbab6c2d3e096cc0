"""TeaBag generation and TeaFarm evaluation: with a scripted LLM, and end to end on the sample corpus."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import polars as pl
import pytest

from conftest import ROOT
from pipeline.testing.fake_chat import FakeChat
from pipeline.errors import PipelineError
from pipeline.llm.types import LLMError
from pipeline.engine.stage import StageContext
from stages.teabag import TeabagStage, generate
from stages.teabag.generate import Attempt, Summary


class SampledChat(FakeChat):
    """FakeChat that also records each call's sample index (the seed offset of a retry)."""

    async def chat(self, messages, *, sample=0, **kwargs):
        try:
            return await super().chat(messages, sample=sample, **kwargs)
        finally:
            self.calls[-1]["sample"] = sample


def conversation(user: str) -> str:
    """The turns a leak check is shown."""
    return user.split("The conversation:\n")[1].split("\n\nThe question that follows")[0]


def speaker_turns(session: int, n: int = 4) -> list[dict]:
    return [{"episode_id": "e1", "session_idx": session, "turn_idx": i, "speaker": "Ann" if i % 2 == 0 else "Bob",
             "text": f"talk {session}.{i}", "session_time": None, "source_turn_id": None} for i in range(n)]


def scripted(verdicts: list[bool] | None = None, fail_session: bool = False, leak_first: int = 0):
    """A responder for the whole stage: session memories name their session; questions name their
    asker and attempt; the check answers from `verdicts` in order (True when they run out). The first
    `leak_first` sessions written say "Rome" (the truth); the leak check calls a session leaking
    exactly when its turns say "Rome"."""
    verdicts = list(verdicts or [])
    sessions_written = [0]

    def respond(messages, schema):
        name = schema.__name__ if schema else ""
        user = messages[-1]["content"]
        if name == "SessionNotes":
            session = user.split("(session ")[1].split(")")[0]
            return {"notes": [f"memory of session {session}"]}
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
            sessions_written[0] += 1
            if sessions_written[0] <= leak_first:
                return {"exchanges": [{"asker": "hi", "answerer": "back from Rome, where I live now"}]}
            return {"exchanges": [{"asker": "hi", "answerer": "hello"}]}
        if name == "LeakVerdict":
            leaks = "Rome" in conversation(user)
            return {"hidden": not leaks, "reason": "it says Ann lives in Rome" if leaks else "nothing given away"}
        raise AssertionError(f"unexpected call {name}")

    return respond


def run_stage(llm: FakeChat, *sets: str, sessions: int = 3, summariser: FakeChat | None = None) -> dict:
    """The stage over one episode of `sessions` sessions; `summariser` is the `teabag_summary` role's
    client (the generator's fake when None)."""
    import stages

    cfg = stages.load_config(None, ["teabag.enabled=true", *sets])
    llm.cfg = SimpleNamespace(model="fake-gen", seed=7)  # type: ignore[attr-defined]
    if summariser is not None:
        summariser.cfg = SimpleNamespace(model="fake-sum", seed=3)  # type: ignore[attr-defined]
    stage = TeabagStage()
    clients = {"teabag": llm, "teabag_summary": summariser or llm}
    ctx = StageContext(cfg=cfg, stage=stage, out_dir=None, clients=clients)  # type: ignore[arg-type]
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
        # the asker opens, the two alternate, the answerer speaks last before the asker's question
        assert [t["speaker"] for t in session] == [q["asker"], q["answerer"], q["asker"]]
        assert [t["text"] for t in session[:-1]] == ["hi", "hello"]
        assert session[-1]["text"] == q["question"] and session[-1]["speaker"] == q["asker"]
        assert session[-1]["is_question"] and not any(t["is_question"] for t in session[:-1])
        assert q["session_attempts"] == 1 and q["leak_checked"] is True and q["leak_reason"] == "nothing given away"
    assert qs[0]["evidence_sessions"] == [2] and out["session_rejects"] == []


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


def test_a_session_that_gives_the_truth_away_is_kept_as_a_reject_with_its_reason_and_the_next_one_is_used():
    llm = SampledChat(responder=scripted(leak_first=1))
    out = run_stage(llm, "teabag.questions_per_episode=1")
    (q,) = out["questions"]
    assert q["error"] is None and q["session_attempts"] == 2 and q["leak_checked"] is True
    (leak,) = out["session_rejects"]
    assert leak["attempt"] == 0 and leak["reason"] == "it says Ann lives in Rome" and leak["seed"] == 7
    assert leak["turns"] == [{"speaker": "Ann", "text": "hi"}, {"speaker": "Bob", "text": "back from Rome, where I live now"},
                             {"speaker": "Ann", "text": "Ann asks?"}]
    used = out["sessions"]
    assert [t["text"] for t in used] == ["hi", "hello", "Ann asks?"] and {t["seed"] for t in used} == {8}
    writes = [c for c in llm.calls if c["schema"].__name__ == "NewSession"]
    checks = [c for c in llm.calls if c["schema"].__name__ == "LeakVerdict"]
    assert [c["sample"] for c in writes] == [0, 1] and [c["sample"] for c in checks] == [0, 1]
    assert all(c["params"]["temperature"] == 0.0 for c in checks)
    assert "it says Ann lives in Rome" in writes[1]["messages"][-1]["content"]  # the retry is told why
    assert "Rome" not in conversation(checks[1]["messages"][-1]["content"])
    assert "Ann asks?" not in conversation(checks[0]["messages"][-1]["content"])  # the check sees the turns before it


def test_when_every_session_leaks_the_question_fails_with_a_reason_and_keeps_the_leaking_sessions():
    out = run_stage(FakeChat(responder=scripted(leak_first=99)), "teabag.questions_per_episode=1",
                    "teabag.session_attempts=2")
    (q,) = out["questions"]
    assert q["error"] == "session 4 gave the truth away in all 2 attempts"
    assert q["question"] == "Ann asks?" and q["session_attempts"] == 2 and q["leak_checked"] is False
    assert q["leak_reason"] == "it says Ann lives in Rome"
    assert [r["attempt"] for r in out["session_rejects"]] == [0, 1] and out["sessions"] == []
    from stages.probes import teafarm_probes

    assert teafarm_probes(out["questions"], out["sessions"]) == []


def test_without_the_leak_check_the_first_session_is_used_unchecked():
    llm = FakeChat(responder=scripted(leak_first=1))
    out = run_stage(llm, "teabag.leak_check=false", "teabag.questions_per_episode=1")
    (q,) = out["questions"]
    assert q["error"] is None and q["leak_checked"] is None and q["session_attempts"] == 1
    assert out["session_rejects"] == [] and "Rome" in out["sessions"][1]["text"]
    assert not [c for c in llm.calls if c["schema"].__name__ == "LeakVerdict"]


def test_the_session_prompt_names_the_truth_and_forbids_stating_or_hinting_at_it():
    q = Attempt(0, "Still in Oslo?", "Ann still lives in Oslo", "No, Ann moved to Rome.", [2])
    system, user = generate.session_messages("- notes", "Ann: hi", "Ann", "Bob", q, 8, None)
    assert "nobody states, hints at or confirms the correct answer or the true current state" in system["content"]
    assert "nobody corrects the mistaken belief" in system["content"]
    assert "strictly in turn, Ann first" in system["content"] and "the last turn you write is Bob's" in system["content"]
    assert "The truth, which must stay out of this session: No, Ann moved to Rome." in user["content"]
    assert "What it wrongly takes for granted: Ann still lives in Oslo" in user["content"]
    assert "Write about 4 exchanges" in user["content"]


def test_a_blank_turn_is_asked_again_so_the_turns_still_alternate():
    answers = [{"exchanges": [{"asker": "hi", "answerer": "   "}]}, {"exchanges": [{"asker": "hi", "answerer": "yo"}]}]
    llm = FakeChat(answers)
    q = Attempt(0, "Q?", "p", "a", [1])
    turns = asyncio.run(generate.synthesize_session(llm, generate.SessionBrief([Summary(1, None, ["x"])], "Ann", "Bob",
                                                                               q, [])))
    assert turns == [{"speaker": "Ann", "text": "hi"}, {"speaker": "Bob", "text": "yo"}, {"speaker": "Ann", "text": "Q?"}]
    assert llm.calls[0]["attempts"] == 2


def test_session_n_plus_1_holds_no_more_exchanges_than_the_prompt_asks_for():
    """8 turns asked: "about 4 exchanges"; a reply of 5 is asked again, so the session stays within
    the requested length (4 exchanges and the question: 9 turns)."""
    five = {"exchanges": [{"asker": f"a{i}", "answerer": f"b{i}"} for i in range(5)]}
    four = {"exchanges": [{"asker": f"a{i}", "answerer": f"b{i}"} for i in range(4)]}
    llm = FakeChat([five, four])
    q = Attempt(0, "Q?", "p", "a", [1])
    brief = generate.SessionBrief([Summary(1, None, ["x"])], "Ann", "Bob", q, [])
    turns = asyncio.run(generate.synthesize_session(llm, brief, generate.SessionShape(turns=8)))
    assert "Write about 4 exchanges" in llm.calls[0]["messages"][1]["content"]
    assert llm.calls[0]["attempts"] == 2 and len(turns) == 9 and turns[-1] == {"speaker": "Ann", "text": "Q?"}
    assert generate.exchanges(8) == generate.exchanges(9) == 4 and generate.exchanges(2) == 1


def test_summaries_come_from_teabags_own_role_never_the_memory_methods_role():
    assert "memory" not in TeabagStage.roles and "teabag_summary" in TeabagStage.roles
    gen, summ = FakeChat(responder=scripted()), FakeChat(responder=scripted())
    out = run_stage(gen, "teabag.questions_per_episode=1", summariser=summ)  # roles.teabag_summary unset
    assert {r["model"] for r in out["summaries"]} == {"fake-gen"} and not summ.calls  # the generator's client
    gen, summ = FakeChat(responder=scripted()), FakeChat(responder=scripted())
    out = run_stage(gen, "teabag.questions_per_episode=1", "roles.teabag_summary.model=sum-model", summariser=summ)
    assert {r["model"] for r in out["summaries"]} == {"fake-sum"} and {r["seed"] for r in out["summaries"]} == {3}
    assert {c["schema"].__name__ for c in summ.calls} == {"SessionNotes"}
    assert "SessionNotes" not in {c["schema"].__name__ for c in gen.calls}


def test_teabag_summarises_with_its_own_prompt_so_no_call_equals_a_memory_methods_call():
    from stages.methods.shared.session_memories import summarize_messages

    turns = speaker_turns(2)
    ours = generate.summary_messages(turns, 2, "2023-01-02", 10)
    theirs = summarize_messages(turns, 2, "2023-01-02", 10)
    assert ours[0]["content"] != theirs[0]["content"] and ours[1]["content"] != theirs[1]["content"]
    assert "Conversation (session 2 (2023-01-02)):\nAnn: talk 2.0\nBob: talk 2.1" in ours[1]["content"]
    assert "List at most 10 notes" in ours[1]["content"] and "where anything they spoke of before now stands" in ours[0]["content"]


def test_the_run_records_the_settings_and_the_models_that_made_it(tmp_path):
    import json

    import stages
    from stages.teabag import SETTINGS_FILE

    cfg = stages.load_config(None, ["teabag.enabled=true", "teabag.session_turns=6"])
    gen, summ = FakeChat(responder=scripted()), FakeChat(responder=scripted())
    gen.cfg = SimpleNamespace(model="gen-model", temperature=0.75, seed=0, max_tokens=512)  # type: ignore[attr-defined]
    summ.cfg = SimpleNamespace(model="sum-model", temperature=0.2, seed=1, max_tokens=256)  # type: ignore[attr-defined]
    stage = TeabagStage()
    ctx = StageContext(cfg=cfg, stage=stage, out_dir=tmp_path, clients={"teabag": gen, "teabag_summary": summ})  # type: ignore[arg-type]
    episode = {"episode_id": "e1", "dataset": "msc", "speakers": ["Ann", "Bob"]}
    turns = [t for s in (1, 2) for t in speaker_turns(s)]
    asyncio.run(stage.process_episode(ctx, "e1", {"ingest.episodes": [episode], "ingest.turns": turns}))
    recorded = json.loads((tmp_path / SETTINGS_FILE).read_text())
    assert recorded["teabag"]["session_turns"] == 6 and recorded["teabag"]["leak_check"] is True
    assert recorded["generator"] == {"role": "teabag", "model": "gen-model", "temperature": 0.75, "seed": 0,
                                     "max_tokens": 512}
    assert recorded["summariser"]["role"] == "teabag" and recorded["summariser"]["model"] == "gen-model"


def test_a_teafarm_probe_carries_the_false_premise_and_other_probes_carry_none():
    import pyarrow as pa

    from stages.probes import PROBES, qa_probes, teafarm_probes

    question = {"episode_id": "e1", "question_id": "e1:tb0", "error": None, "memory_sessions": 5, "answerer": "Bob",
                "question": "Still in Oslo?", "answer": "No, Rome.", "evidence_sessions": [4],
                "false_premise": "Ann still lives in Oslo"}
    session = [{"question_id": "e1:tb0", "turn_idx": 0, "speaker": "Ann", "text": "Still in Oslo?"}]
    episode = {"episode_id": "e1", "n_sessions": 5, "speakers": ["Ann", "Bob"]}
    qa = [{"qa_id": "q1", "question": "Where?", "answer": "Rome", "evidence": [], "category": "single"}]
    rows = pa.Table.from_pylist(teafarm_probes([question], session) + qa_probes(episode, qa), schema=PROBES).to_pylist()
    assert [(r["kind"], r["false_premise"]) for r in rows] == [("teafarm", "Ann still lives in Oslo"), ("qa", None)]


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
    from pipeline.engine.runner import Runner
    from stages import registry

    cfg = run_cfg("corpus.limit=1", "teabag.enabled=true", "teabag.questions_per_episode=2",  # both speakers ask
                  "methods=[theanine,memory_retrieval,full_history]",
                  "stages=null", "judge_pairwise.enabled=false", "judge_memory.enabled=false")
    Runner(cfg, registry(cfg)).run()
    return cfg


def test_on_the_sample_corpus_every_method_answers_every_teafarm_question_and_is_judged(teafarm_run, tmp_path,
                                                                                        monkeypatch):
    from pipeline.artifacts import StageDir
    from pipeline.engine.runner import Runner
    from stages import registry, teabag_fingerprint
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
    export_teabag(run, first, cfg, fingerprint=teabag_fingerprint(cfg))
    Runner(cfg, registry(cfg)).run(force=["teabag"])  # generated again from the same config and cache
    export_teabag(run, second, cfg, fingerprint=teabag_fingerprint(cfg))
    names = sorted(p.name for p in first.iterdir())
    assert names == ["README.md", "episodes.parquet", "next_sessions.parquet", "questions.parquet",
                     "rejects.parquet", "session_rejects.parquet", "sessions.parquet", "summaries.parquet"]
    assert all((first / n).read_bytes() == (second / n).read_bytes() for n in names)
    qs = pl.read_parquet(first / "questions.parquet")
    assert qs.height == 2 and set(qs["asker"]) == set(qs["answerer"])
    sessions = pl.read_parquet(first / "sessions.parquet")
    assert sessions["session_idx"].max() == 5 and sessions["episode_id"].unique().to_list() == qs["episode_id"].unique().to_list()
    assert pl.read_parquet(first / "next_sessions.parquet").filter(pl.col("is_question")).height == 2
    summaries = pl.read_parquet(first / "summaries.parquet")
    assert summaries["session_idx"].to_list() == [1, 2, 3, 4, 5] and set(summaries["model"]) == {cfg.role("teabag").model}
    card = (first / "README.md").read_text()
    # The default job writes without our counterfactual check (as the paper) and keeps the leak check.
    assert "Counterfactual check (ours, not in the paper): off" in card and "Leak check (ours, not in the paper): on" in card
    assert f"generator model(s): {cfg.role('teabag').model}; temperature: {cfg.role('teabag').temperature}" in card
    assert f"summariser model(s): {cfg.role('teabag').model}; temperature: {cfg.role('teabag').temperature}" in card
    assert "the generator's role since `roles.teabag_summary` was not set" in card and "- seed(s): 0" in card
    episodes = pl.read_parquet(first / "episodes.parquet")
    assert "/" not in episodes["source_file"][0] and episodes["n_sessions"].to_list() == [5]
    # the `datasets` library reads the export from its card: every table with rows, one `test` split each
    for var, value in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("HF_HOME", str(tmp_path / "hf"))):
        monkeypatch.setenv(var, value)  # read when `datasets` is first imported: no network, no home cache
    import datasets

    for name in names[1:]:
        table = pl.read_parquet(first / name)
        if table.height:
            loaded = datasets.load_dataset(str(first), name.removesuffix(".parquet"), split="test",
                                           cache_dir=str(tmp_path / "hf"))
            assert loaded.num_rows == table.height and loaded.column_names == table.columns, name
    assert datasets.load_dataset(str(first), split="test", cache_dir=str(tmp_path / "hf"))["question_id"] == \
        qs["question_id"].to_list()
    for p in probes:
        q = next(q for q in questions if q["question_id"] == p["qa_id"])
        assert p["false_premise"] == q["false_premise"] and p["false_premise"]

    from stages.cli import main

    third = tmp_path / "x3"  # the command a user types: the run's config with the run's overrides
    run_sets = [f"artifacts_dir={cfg.artifacts_dir}", "llm.provider=openai", f"llm.base_url={cfg.llm.base_url}",
                f"llm.api_key_env={cfg.llm.api_key_env}", f"llm.cache_dir={cfg.llm.cache_dir}",
                f"embedding.cache_dir={cfg.embedding.cache_dir}", "llm.backoff_base_s=0.01",
                "ray.episodes_per_shard=1", "corpus.limit=1", "teabag.enabled=true", "teabag.questions_per_episode=2",
                "methods=[theanine,memory_retrieval,full_history]", "stages=null",
                "judge_pairwise.enabled=false", "judge_memory.enabled=false"]
    same = ["-c", str(ROOT / "configs" / "default.yaml"), *(a for s in run_sets for a in ("--set", s))]
    assert main(["export", "teabag", "--out", str(third), *same]) == 0
    assert all((first / n).read_bytes() == (third / n).read_bytes() for n in names)
    assert main(["export", "teabag", "--out", str(tmp_path / "x4"), *same, "--set", "teabag.session_turns=6"]) == 1
    assert not (tmp_path / "x4").exists()


def test_exporting_with_another_config_than_the_runs_is_refused_or_warned_and_the_card_keeps_the_runs_settings(
        teafarm_run, run_cfg, tmp_path, caplog):
    from pipeline.artifacts import StageDir
    from stages import teabag_fingerprint
    from stages.teabag.export import export_teabag

    cfg = teafarm_run
    run_fp = StageDir(cfg.run_dir, "teabag").manifest().fingerprint
    assert teabag_fingerprint(cfg) == run_fp  # the export check computes what the runner did
    sets = ("corpus.limit=1", "teabag.enabled=true", "teabag.questions_per_episode=2",
            "methods=[theanine,memory_retrieval,full_history]", "stages=null")
    shorter = run_cfg(*sets, "teabag.session_turns=6")
    assert shorter.run_dir == cfg.run_dir
    other_fp = teabag_fingerprint(shorter)
    with pytest.raises(PipelineError) as refused:
        export_teabag(cfg.run_dir, tmp_path / "refused", shorter, fingerprint=other_fp)
    message = str(refused.value)
    assert run_fp in message and other_fp in message and "mempipe run -c CONFIG --until teabag" in message
    assert not (tmp_path / "refused").exists()
    # a role the section does not show (the generator's temperature) is caught too
    hotter = run_cfg(*sets, "roles.teabag.temperature=0.1")
    with pytest.raises(PipelineError, match="teabag stage fingerprint"):
        export_teabag(cfg.run_dir, tmp_path / "refused", hotter, fingerprint=teabag_fingerprint(hotter))
    # a bare teabag section (what `mempipe export` passes today) is checked against the recorded one
    with pytest.raises(PipelineError, match="teabag section fingerprint"):
        export_teabag(cfg.run_dir, tmp_path / "refused", shorter.teabag)

    with caplog.at_level("WARNING"):
        out = export_teabag(cfg.run_dir, tmp_path / "warned", shorter, on_mismatch="warn", fingerprint=other_fp)
    assert run_fp in caplog.text and other_fp in caplog.text
    card = (out / "README.md").read_text()
    assert "(about 2 turns)" in card and "(about 6 turns)" not in card  # the run's value (default.yaml), not the export's
    export_teabag(cfg.run_dir, tmp_path / "same", cfg, fingerprint=run_fp)
    assert card == (tmp_path / "same" / "README.md").read_text()
