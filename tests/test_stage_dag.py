"""The run as one DAG (Ray executor): stages whose inputs are done run at the same time under the
run's one concurrency cap; a stage that crashes leaves the others' finished rows and a resumable
run; a budget stop stops every running stage."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from pipeline.artifacts import StageDir
from pipeline.errors import PipelineError
from pipeline.llm.ledger import BudgetExceeded
from pipeline.engine.runner import Runner
from pipeline.engine.stage import Rows
from stages import registry
from stages.methods import METHODS
from stages.methods.base import EpisodeInput, MethodSettings
from toy_methods import SessionNotes

# memory_rsum, respond_full_history and respond_zero_history read only ingest and probes.
INDEPENDENT = ["methods=[rsum,full_history,zero_history]", "corpus.limit=1",
               "stages=[ingest,probes,memory_rsum,respond_rsum,respond_full_history,respond_zero_history]"]


def _span(run_dir, stage: str) -> tuple[datetime, datetime]:
    t = StageDir(run_dir, stage).manifest().timings
    start = datetime.fromisoformat(t.started_at)
    return start, start + timedelta(seconds=t.wall_s)


@pytest.mark.session_ray
def test_independent_stages_overlap_under_one_concurrency_cap(run_cfg, fake_llm):
    fake_llm.latency_s = 0.15
    cfg = run_cfg(*INDEPENDENT, "llm.max_concurrency=2", executor="ray")
    fake_llm.reset()
    out = Runner(cfg, registry(cfg)).run()
    assert set(out.values()) == {"ran"}
    spans = {s: _span(cfg.run_dir, s) for s in ("memory_rsum", "respond_full_history", "respond_zero_history")}
    # Both read only ingest and probes: they start together once probes is done.
    (a0, a1), (b0, b1) = spans["respond_full_history"], spans["respond_zero_history"]
    assert a0 < b1 and b0 < a1, f"respond_full_history and respond_zero_history ran one after the other: {spans}"
    assert fake_llm.max_in_flight == 2  # the cap was reached and held across the stages running at once


class CrashingNotes(SessionNotes):
    """SessionNotes whose memory stage crashes (outside any row: its memory view) while `crash` is set."""

    name = "crashing_notes"
    crash = True
    after: str = ""  # a folder whose appearance the crash waits for (the stage that runs beside it)

    def memory_view(self, episode: EpisodeInput, memory: dict[str, Rows], settings: MethodSettings) -> str | None:
        if self.crash:
            deadline = time.monotonic() + 60
            while self.after and not Path(self.after).exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            raise RuntimeError("the memory view crashed")
        return None


@pytest.mark.session_ray
def test_a_crashing_stage_leaves_the_others_rows_and_a_resumable_run(run_cfg, fake_llm):
    method = CrashingNotes()
    methods = {**METHODS, method.name: method}
    sets = ["methods=[crashing_notes,full_history]", "corpus.limit=2",
            "stages=[ingest,probes,memory_crashing_notes,respond_crashing_notes,respond_full_history]"]
    cfg = run_cfg(*sets, methods=methods, executor="ray")
    method.after = str(StageDir(cfg.run_dir, "respond_full_history").partial)  # it crashes once that one runs
    with pytest.raises(PipelineError, match="the memory view crashed"):
        Runner(cfg, registry(cfg, methods)).run()
    assert StageDir(cfg.run_dir, "respond_full_history").manifest() is not None  # ran beside it, kept
    assert StageDir(cfg.run_dir, "memory_crashing_notes").manifest() is None
    assert StageDir(cfg.run_dir, "respond_crashing_notes").manifest() is None  # never started
    method.crash = False
    again = Runner(cfg, registry(cfg, methods)).run()
    assert again["respond_full_history"] == "skipped" and again["respond_crashing_notes"] == "ran"


@pytest.mark.session_ray
def test_a_budget_stop_stops_every_running_stage_and_resumes(run_cfg, fake_llm):
    fake_llm.latency_s = 0.05
    paid = ["llm.model=fake-model", "llm.prices={fake-model: {input: 1000.0, output: 1000.0}}"]
    cfg = run_cfg(*INDEPENDENT, *paid, "llm.max_cost_usd=0.5", executor="ray")
    with pytest.raises(BudgetExceeded):
        Runner(cfg, registry(cfg)).run()
    unpublished = [s for s in ("memory_rsum", "respond_full_history", "respond_zero_history")
                   if StageDir(cfg.run_dir, s).manifest() is None]
    assert len(unpublished) >= 2  # the stop reached the stages running beside the one that hit it
    more = run_cfg(*INDEPENDENT, *paid, "llm.max_cost_usd=1000", executor="ray")
    out = Runner(more, registry(more)).run()
    assert all(out[s] == "ran" for s in unpublished)


@pytest.mark.session_ray
def test_answers_stream_from_a_memory_stage_still_building_and_equal_a_stage_by_stage_run(run_cfg, fake_llm):
    fake_llm.latency_s = 0.4  # each episode's memory is a chain of calls: seconds, longer than probes takes
    sets = ["methods=[rsum]", "corpus.limit=3", "stages=[ingest,probes,memory_rsum,respond_rsum]"]
    cfg = run_cfg(*sets, executor="ray")
    Runner(cfg, registry(cfg)).run()
    (m0, m1), (r0, r1) = _span(cfg.run_dir, "memory_rsum"), _span(cfg.run_dir, "respond_rsum")
    assert r0 < m1, "respond_rsum waited for the whole of memory_rsum"
    one_by_one = run_cfg(*sets, "ray.parallel_stages=false", "run_name=staged", executor="ray")
    Runner(one_by_one, registry(one_by_one)).run()
    (m0, m1), (r0, r1) = _span(one_by_one.run_dir, "memory_rsum"), _span(one_by_one.run_dir, "respond_rsum")
    assert r0 >= m1

    def answers(run_dir) -> list[tuple]:
        rows = StageDir(run_dir, "respond_rsum").read_table("responses").to_pylist()
        return sorted((r["probe_id"], r["response"], r["memory_after_session"], r["error"]) for r in rows)

    assert answers(cfg.run_dir) == answers(one_by_one.run_dir) and len(answers(cfg.run_dir)) >= 3
