"""diagnose: every question of every method in one bucket (write, retrieval, read), from methods
built to fail at one place each, on the sample corpus against the fake server."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pipeline.artifacts import StageDir
from pipeline.config import ConfigError
from pipeline.plan import make_plan
from pipeline.engine.runner import Runner
from stages import registry
from stages.judging.diagnose import BUCKETS, F1_VERDICT, bucket_of, majority
from stages.judging.written import SYSTEM as WRITTEN_SYSTEM
from stages.methods import METHODS
from stages.methods.base import SNAPSHOT_FIELDS, Answer, EpisodeInput, Method, MethodContext, MethodSettings, ProbeInput
from stages.methods.shared.response import turn_spans

WRONG = "I have no idea."
NOTES = pa.schema([*SNAPSHOT_FIELDS, pa.field("memory_id", pa.string(), nullable=False),
                   pa.field("text", pa.string(), nullable=False)])


def past_units(probe: ProbeInput) -> list[dict]:
    return [{"session_idx": s, "turn_start": ts[0]["turn_idx"], "turn_end": ts[-1]["turn_idx"]}
            for s, ts in sorted(probe.history.items()) if ts]


class NeverWrites(Method[MethodSettings]):
    """Keeps a memory table and never writes to it; answers wrong."""

    name = "never_writes"
    memory = {"notes": NOTES}

    async def build(self, ctx: MethodContext[MethodSettings], episode: EpisodeInput) -> dict[str, list[dict]]:
        return {"notes": []}

    async def answer(self, ctx: MethodContext[MethodSettings], probe: ProbeInput, memory: dict[str, Any]) -> Answer:
        return Answer(text=WRONG)


class KeepsAllRetrievesNothing(Method[MethodSettings]):
    """Every turn kept verbatim (as SeCom's banks), none put in the answer's context; answers wrong."""

    name = "keeps_all"
    memory_evidence = "every_turn"

    async def answer(self, ctx: MethodContext[MethodSettings], probe: ProbeInput, memory: dict[str, Any]) -> Answer:
        return Answer(text=WRONG, details={"context_spans": []})


class GoldContext(Method[MethodSettings]):
    """Shown every earlier turn (so the evidence too); answers wrong, or with the gold (`right`)."""

    name = "gold_context_wrong"
    right = False

    async def answer(self, ctx: MethodContext[MethodSettings], probe: ProbeInput, memory: dict[str, Any]) -> Answer:
        text = probe.probe["gold"] if self.right and probe.probe["gold"] else WRONG
        return Answer(text=text, details={"context_spans": turn_spans(past_units(probe))})


class GoldContextRight(GoldContext):
    name = "gold_context_right"
    right = True


class NoteTaker(Method[MethodSettings]):
    """Writes every turn as a note of its own; its answer's context holds the notes of sessions
    `shown_sessions` (all: None) and answers wrong. The written check is the judge's."""

    name = "note_taker"
    memory = {"notes": NOTES}
    memory_kind = "log"
    shown_sessions: frozenset[int] | None = None

    async def build(self, ctx: MethodContext[MethodSettings], episode: EpisodeInput) -> dict[str, list[dict]]:
        eid = episode.episode["episode_id"]
        return {"notes": [{"episode_id": eid, "snapshot_session": s, "snapshot_turn": None,
                           "memory_id": f"n{s}.{t['turn_idx']}", "text": f"{t['speaker']}: {t['text']}"}
                          for s, turns in episode.sessions.items() for t in turns]}

    async def answer(self, ctx: MethodContext[MethodSettings], probe: ProbeInput, memory: dict[str, Any]) -> Answer:
        used = [n["memory_id"] for n in memory["notes"]
                if self.shown_sessions is None or n["snapshot_session"] in self.shown_sessions]
        return Answer(text=WRONG, used_ids=used)


class NoteTakerShowsNothing(NoteTaker):
    name = "note_taker_blind"
    shown_sessions = frozenset()


BUILT = [NeverWrites(), KeepsAllRetrievesNothing(), GoldContext(), GoldContextRight(), NoteTaker(),
         NoteTakerShowsNothing()]
PLUGINS = {**METHODS, **{m.name: m for m in BUILT}}


def written_judge(body: dict[str, Any]) -> str | None:
    """The written check's judge, scripted: an entry states an evidence turn when it holds its text."""
    messages = body["messages"]
    if messages[0]["content"] != WRITTEN_SYSTEM:
        return None
    user = messages[-1]["content"]
    evidence = re.findall(r"^E\d+\. \[Session [^\]]*\] (.*)$", user, re.M)
    entries = re.findall(r"^(\d+)\. (.*)$", user.split("Memory entries:")[1], re.M)
    return json.dumps({"stated_by": [[int(n) for n, text in entries if text == e] for e in evidence]})


def config(run_cfg: Any, methods: list[str], *sets: str) -> Any:
    """Two episodes of the sample corpus, every question, no other judge (F1 gives the verdicts)."""
    return run_cfg(f"methods=[{','.join(methods)}]", "probes.max_qa_per_episode=null", "corpus.limit=2",
                   "probes.next_response=false", "judge_answers.enabled=false", "judge_pairwise.enabled=false",
                   "judge_memory.enabled=false", "diagnose.max_memory_tokens=null", "memory_ops.enabled=false", *sets,
                   methods=PLUGINS)


def run(run_cfg: Any, fake_llm: Any, methods: list[str], *sets: str, responder: Any = written_judge) -> Any:
    cfg = config(run_cfg, methods, *sets)
    fake_llm.responder = responder
    Runner(cfg, registry(cfg, PLUGINS)).run()
    return cfg


def buckets(cfg: Any) -> list[dict[str, Any]]:
    return StageDir(cfg.run_dir, "diagnose").read_table("buckets").to_pylist()


def by_method(rows: list[dict[str, Any]], method: str) -> list[str]:
    return [r["bucket"] for r in rows if r["method"] == method]


def test_each_constructed_method_fails_where_it_was_built_to_and_buckets_sum_to_its_probes(run_cfg, fake_llm):
    cfg = run(run_cfg, fake_llm, [m.name for m in BUILT])
    rows = buckets(cfg)
    probes = [p for p in StageDir(cfg.run_dir, "probes").read_table("probes").to_pylist() if p["kind"] == "qa"]
    answerable = [p for p in probes if p["category"] != "adversarial"]
    assert len(probes) == 12 and len(answerable) == 10
    for m in BUILT:
        got = by_method(rows, m.name)
        assert len(got) == len(probes) and set(got) <= set(BUCKETS)  # one bucket per probe, no other
        assert got.count("no_evidence") == len(probes) - len(answerable)
    assert by_method(rows, "never_writes").count("missed_write") == len(answerable)
    assert by_method(rows, "keeps_all").count("missed_retrieval") == len(answerable)
    assert by_method(rows, "gold_context_wrong").count("misread") == len(answerable)
    assert by_method(rows, "gold_context_right").count("correct") == len(answerable)
    # the judge-checked memory: every turn written, all shown -> misread; none shown -> missed at retrieval
    assert by_method(rows, "note_taker").count("misread") == len(answerable)
    assert by_method(rows, "note_taker_blind").count("missed_retrieval") == len(answerable)
    for r in rows:
        if r["bucket"] == "no_evidence":
            continue
        assert r["verdict_judge"] == F1_VERDICT and r["evidence_items"] >= 1
        judged = r["method"] in ("never_writes", "note_taker", "note_taker_blind")
        assert r["written_by"] == ("judge" if judged else "provenance")
        assert r["evidence_written"] == (0.0 if r["method"] == "never_writes" else 1.0)
        assert len(r["stated_by"]) == r["evidence_items"]
    # the notes' ids come back from the judge's entry numbers: each evidence turn's own note
    note = next(r for r in rows if r["method"] == "note_taker" and r["bucket"] == "misread")
    assert all(len(ids) == 1 and ids[0].startswith("n") for ids in note["stated_by"])


def test_the_written_check_is_one_cached_call_per_question_and_method_and_the_plan_prices_it(run_cfg, fake_llm):
    def written_calls() -> int:
        return sum(1 for r in fake_llm.requests if r["path"] == "/v1/chat/completions"
                   and r["body"]["messages"][0]["content"] == WRITTEN_SYSTEM)

    cfg = config(run_cfg, ["note_taker", "never_writes"])
    priced = next(s for s in make_plan(cfg, lambda c: registry(c, PLUGINS)).stages if s.name == "diagnose").total()
    assert priced["calls"] > 0 and priced["prompt_tokens"] > 0 and fake_llm.count() == 0  # a dry run sends nothing
    fake_llm.responder = written_judge
    Runner(cfg, registry(cfg, PLUGINS)).run()
    # note_taker: one call per answerable question; never_writes' empty memory needs none
    assert written_calls() == 10
    sent = fake_llm.count()
    Runner(cfg, registry(cfg, PLUGINS)).run()
    assert fake_llm.count() == sent  # warm: nothing sent again


def test_the_verdict_is_the_named_judges_majority_over_its_runs(run_cfg, fake_llm):
    def judge(body: dict[str, Any]) -> str | None:
        user = body["messages"][-1]["content"]
        if body["messages"][0]["content"] == WRITTEN_SYSTEM or "Answer to grade:" not in user:
            return written_judge(body)
        # strict, three runs as samples (seed + run): the gold answer right in run 0 only, the wrong
        # answer right in runs 1 and 2, so only a majority over the runs gives each its verdict
        gold = re.search(r"Reference answer: (.*)", user).group(1)
        first_run = body.get("seed", 0) % 3 == 0
        return json.dumps({"correct": first_run == (f"Answer to grade: {gold}" in user)})

    cfg = run(run_cfg, fake_llm, ["gold_context_right", "gold_context_wrong"], "judge_answers.enabled=true",
              "judge_answers.correctness=[strict]", "judge_answers.score_0_100=false", "judge_answers.runs=3",
              responder=judge)
    rows = [r for r in buckets(cfg) if r["bucket"] != "no_evidence"]
    assert rows and {r["verdict_judge"] for r in rows} == {"strict"}
    assert set(by_method(rows, "gold_context_right")) == {"misread"}  # right in 1 run of 3
    assert set(by_method(rows, "gold_context_wrong")) == {"correct"}  # right in 2 runs of 3


def test_majority_and_bucket_rules():
    rows = [{"score": s, "error": None, "skipped": None} for s in (1.0, 0.0, 1.0)]
    assert majority(rows, "strict") is True
    assert majority(rows[:2], "strict") is True  # a tie is correct, as the panel counts it
    assert majority([{**rows[0], "error": "x"}, rows[1]], "strict") is False
    assert majority([], "strict") is None
    assert bucket_of(True, True, True) == "correct"
    assert bucket_of(True, False, False) == "correct_without_evidence"
    assert bucket_of(False, False, True) == "missed_write"
    assert bucket_of(False, True, False) == "missed_retrieval"
    assert bucket_of(False, True, True) == "misread"


def test_a_verdict_judge_the_run_does_not_hold_is_refused_before_the_run(run_cfg, fake_llm):
    cfg = run_cfg("methods=[full_history]", "diagnose.verdict_judge=lenient", "judge_answers.correctness=[strict]")
    with pytest.raises(ConfigError, match="verdict_judge"):
        registry(cfg)["diagnose"].check_inputs(cfg)


LOCOMO = Path(__file__).parent / "fixtures" / "corpora" / "locomo" / "locomo_mini.json"


def test_the_locomo_fixture_shows_the_buckets_in_the_report_and_the_export(run_cfg, fake_llm, tmp_path):
    from stages.predictions import export_predictions

    cfg = run(run_cfg, fake_llm, ["full_history", "rsum", "gold_context_right"], "corpus.format=locomo",
              f"corpus.path={LOCOMO}", "corpus.limit=null")
    rows = buckets(cfg)
    probes = [p for p in StageDir(cfg.run_dir, "probes").read_table("probes").to_pylist() if p["kind"] == "qa"]
    for m in ("full_history", "rsum", "gold_context_right"):
        assert len(by_method(rows, m)) == len(probes)
    adversarial = {p["probe_id"] for p in probes if p["category"] == "adversarial"}
    assert adversarial and {r["bucket"] for r in rows if r["probe_id"] in adversarial} == {"no_evidence"}
    assert {r["written_by"] for r in rows if r["method"] == "rsum" and r["bucket"] != "no_evidence"} == {"judge"}
    report = StageDir(cfg.run_dir, "report")
    table = report.read_table("diagnosis").to_pylist()
    overall = {r["method"]: r for r in table if r["category"] == "all" and r["dataset"] == "locomo"}
    assert set(overall) == {"full_history", "rsum", "gold_context_right"}
    assert all(r["probes"] == len(probes) for r in overall.values())
    folder = Path(report.final)
    assert (folder / "diagnosis.png").exists() and "Why answers fail" in (folder / "report.md").read_text()
    out = export_predictions(cfg, "locomo", None, tmp_path / "export")
    summary = json.loads((out / "predictions_summary.json").read_text())
    assert sum(summary["buckets"]["rsum"].values()) == len(probes)
