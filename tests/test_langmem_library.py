"""`langmem`: the LangMem library, unchanged, as a method: its tool-calling extraction scripted through
the fake server, every call through the gateway (counted, cached, budgeted), nothing off this machine,
its failures failed rows."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from library_methods import (OVER_BUDGET, assert_answers_name_stored, assert_only_episode_failed, library_calls,
                             off_machine, record_connections)
from pipeline.errors import RunStopped
from stages.methods import METHODS, langmem_library
from stages.testing import run_method

pytest.importorskip("langmem", reason="langmem is part of the test install")

SETS = ["probes.max_qa_per_episode=2", "probes.max_per_episode=1"]
# Each run has the library build a store (langgraph, trustcall, ~15 calls): scheduled among the first.
pytestmark = pytest.mark.heavy(seconds=10)


def extractor(body: dict[str, Any]) -> dict[str, Any] | None:
    """LangMem's extraction, scripted: when its `Memory` tool is offered, one `Memory` call per message
    of the conversation it is shown (the text after "date | Name: ")."""
    if "Memory" not in {t["function"]["name"] for t in body.get("tools") or []}:
        return None
    said = re.findall(r"^[^|\n]* \| [^:\n]+: (.+)$", body["messages"][-1]["content"], re.M)
    return {"tool_calls": [{"name": "Memory", "arguments": {"content": s}} for s in said]}


def langmem_run(fake: Any, work: Path, *sets: str) -> dict[str, Any]:
    fake.responder = extractor
    return run_method(METHODS["langmem"], fake.base_url, work, sets=[*SETS, *sets])


def test_langmem_builds_its_store_by_session_answers_from_its_search_and_nothing_leaves(fake_llm, tmp_path,
                                                                                     monkeypatch):
    seen = record_connections(monkeypatch)
    tables = langmem_run(fake_llm, tmp_path)
    remote = off_machine(seen)
    assert seen and not remote

    memories = tables["memory_langmem.memories"].to_pylist()
    by_session: dict[int, int] = {}
    for m in memories:
        by_session[m["snapshot_session"]] = by_session.get(m["snapshot_session"], 0) + 1
    sessions = sorted(by_session)
    assert len(sessions) > 1 and all(by_session[a] < by_session[b] for a, b in zip(sessions, sessions[1:]))
    assert {m["speaker"] for m in memories} == {"Mina", "Joon"}
    assert all(m["namespace"] == f"memories/{m['speaker']}" and m["kind"] == "Memory" for m in memories)
    # the scripted extraction's memories are the speakers' own lines, each dated by its session
    first = [m for m in memories if m["snapshot_session"] == sessions[0]]
    assert any("Riverside Half Marathon" in m["text"] and m["speaker"] == "Mina" for m in first)
    assert all(m["session_date"] for m in memories)
    later = {m["memory_id"]: m["session_date"] for m in memories if m["snapshot_session"] == sessions[-1]}
    assert len(set(later.values())) > 1  # memories from several sessions, each with its own date

    answers = [r for r in tables["respond_langmem.responses"].to_pylist() if r["probe_id"].startswith("qa:")]
    assert_answers_name_stored(answers, {m["memory_id"] for m in memories})
    # every request the library made is in the memory stage's manifest, under its method
    chats = sum(1 for r in fake_llm.requests if r["path"] == "/v1/chat/completions")
    assert library_calls(tmp_path / "artifacts" / "test-langmem", "langmem") + 3 == chats  # + the three answers' reader calls


def test_a_warm_rerun_sends_nothing_even_from_a_fresh_run_folder(fake_llm, tmp_path):
    first = langmem_run(fake_llm, tmp_path / "a")
    sent = fake_llm.count()
    assert sent > 3
    langmem_run(fake_llm, tmp_path / "a")
    assert fake_llm.count() == sent
    # a fresh run folder on the same call cache: the library's memory names are the same, so its
    # prompts (which show them) are too
    shutil.copytree(tmp_path / "a" / "llm-cache", tmp_path / "b" / "llm-cache")
    again = langmem_run(fake_llm, tmp_path / "b")
    assert fake_llm.count() == sent
    assert again["memory_langmem.memories"].to_pylist() == first["memory_langmem.memories"].to_pylist()


def test_a_library_exception_on_one_episode_is_that_episodes_failure(fake_llm, tmp_path, monkeypatch):
    extract = langmem_library._extract

    def failing(manager: Any, messages: list, speaker: str, seed: str) -> None:
        if seed.startswith("sample-02:"):
            raise RuntimeError("the store went away")
        extract(manager, messages, speaker, seed)

    monkeypatch.setattr(langmem_library, "_extract", failing)
    tables = langmem_run(fake_llm, tmp_path, "corpus.limit=2")
    assert_only_episode_failed(tables, "langmem", "sample-02", "the store went away")


def test_a_budget_stops_it_like_any_stage(fake_llm, tmp_path):
    with pytest.raises(RunStopped):
        langmem_run(fake_llm, tmp_path, *OVER_BUDGET)


def test_tracing_is_off_and_new_names_are_random_outside_a_pinned_seed():
    import os
    import uuid

    assert all(os.environ[v] == "false" for v in ("LANGCHAIN_TRACING_V2", "LANGSMITH_TRACING"))
    assert langmem_library._UUID.uuid4() != langmem_library._UUID.uuid4()
    assert langmem_library._UUID.uuid5 is uuid.uuid5
