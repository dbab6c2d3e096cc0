"""`mem0`: the mem0ai library, unchanged, as a method: every call through the gateway to the fake
server (counted, cached, budgeted), nothing off this machine, its failures failed rows."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from library_methods import (OVER_BUDGET, assert_answers_name_stored, assert_only_episode_failed, library_calls,
                             off_machine, record_connections)
from pipeline.errors import RunStopped
from stages.methods import METHODS, mem0_library  # before mem0 itself: its telemetry off
from stages.testing import run_method

pytest.importorskip("mem0", reason="the [mem0] extra (mem0ai) is part of the test install")

SETS = ["probes.max_qa_per_episode=2", "probes.max_per_episode=1"]
# Each run has the library build a store (spaCy, Qdrant, ~60 calls): scheduled among the first.
pytestmark = pytest.mark.heavy(seconds=10)


def extractor(body: dict[str, Any]) -> str | None:
    """mem0's extraction, scripted: every new user message becomes a memory (its text after "Name: ")."""
    if (body.get("response_format") or {}).get("type") != "json_object":
        return None
    user = body["messages"][-1]["content"]
    new = user.split("New Messages", 1)[-1]
    facts = re.findall(r"^user: [^:\n]+: (.+)$", new, re.M)
    return json.dumps({"memory": [{"text": f} for f in facts]})


def mem0_run(fake: Any, work: Path, *sets: str) -> dict[str, Any]:
    fake.responder = extractor
    return run_method(METHODS["mem0"], fake.base_url, work, sets=[*SETS, *sets])


def test_mem0_builds_its_store_by_session_answers_from_its_search_and_every_call_is_counted(fake_llm, tmp_path):
    tables = mem0_run(fake_llm, tmp_path)
    memories = tables["memory_mem0.memories"].to_pylist()
    by_session: dict[int, int] = {}
    for m in memories:
        by_session[m["snapshot_session"]] = by_session.get(m["snapshot_session"], 0) + 1
    sessions = sorted(by_session)
    assert sessions and all(by_session[a] <= by_session[b] for a, b in zip(sessions, sessions[1:]))  # it grows
    assert {m["speaker"] for m in memories} == {"Mina", "Joon"}
    assert all(m["session_date"] for m in memories)  # each kept with its session's date
    answers = [r for r in tables["respond_mem0.responses"].to_pylist() if r["probe_id"].startswith("qa:")]
    assert_answers_name_stored(answers, {m["memory_id"] for m in memories})
    # every request the library made is in the memory stage's manifest, under its method
    chats = sum(1 for r in fake_llm.requests if r["path"] == "/v1/chat/completions")
    assert library_calls(tmp_path / "artifacts" / "test-mem0", "mem0") + 3 == chats  # + the three answers' reader calls


def test_a_warm_rerun_sends_nothing_even_on_another_day(fake_llm, tmp_path, monkeypatch):
    mem0_run(fake_llm, tmp_path / "a")
    sent = fake_llm.count()
    mem0_run(fake_llm, tmp_path / "a")
    assert fake_llm.count() == sent
    # a fresh run folder on the same call cache, the machine's clock a few years on
    import shutil
    shutil.copytree(tmp_path / "a" / "llm-cache", tmp_path / "b" / "llm-cache")
    later = mem0_library.datetime(2031, 1, 1, tzinfo=mem0_library.timezone.utc)
    monkeypatch.setattr(mem0_library._SessionClock, "now", classmethod(
        lambda cls, tz=None: getattr(mem0_library._clock, "date", None) or later))
    mem0_run(fake_llm, tmp_path / "b")
    assert fake_llm.count() == sent


def test_nothing_leaves_the_machine(fake_llm, tmp_path, monkeypatch):
    seen = record_connections(monkeypatch)
    mem0_run(fake_llm, tmp_path)
    remote = off_machine(seen)
    assert seen and not remote


def test_a_library_exception_on_one_episode_is_that_episodes_failure(fake_llm, tmp_path, monkeypatch):
    add = mem0_library._add

    def failing(store: Any, messages: list, uid: str, *rest: Any) -> None:
        if uid.startswith("sample-02") and "Session" not in str(messages):
            raise RuntimeError("qdrant went away")
        add(store, messages, uid, *rest)

    monkeypatch.setattr(mem0_library, "_add", failing)
    tables = mem0_run(fake_llm, tmp_path, "corpus.limit=2")
    assert_only_episode_failed(tables, "mem0", "sample-02", "qdrant went away")


def test_a_budget_stops_it_like_any_stage(fake_llm, tmp_path):
    with pytest.raises(RunStopped):
        mem0_run(fake_llm, tmp_path, *OVER_BUDGET)


def test_plan_leaves_a_librarys_calls_to_a_calibration(run_cfg, fake_llm):
    from pipeline.plan import make_plan
    from pipeline.plan.make import NOT_ESTIMATED
    from stages import registry

    cfg = run_cfg("methods=[mem0,rsum]", "corpus.limit=1", "judge_pairwise.enabled=false", "judge_memory.enabled=false",
                  "judge_answers.enabled=false", "diagnose.enabled=false")
    plan = make_plan(cfg, registry)
    stages = {s.name: s for s in plan.stages}
    assert NOT_ESTIMATED in stages["memory_mem0"].why and stages["memory_mem0"].total()["calls"] == 0
    assert stages["memory_rsum"].total()["calls"] > 0 and NOT_ESTIMATED not in stages["memory_rsum"].why
    assert fake_llm.count() == 0
