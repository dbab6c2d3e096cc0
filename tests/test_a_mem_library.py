"""`a_mem`: the A-MEM fork on PyPI (a-mem 0.2.6), unchanged, as a method: its note analysis and evolution
calls through the gateway to the fake server (counted, cached, budgeted), its embeddings by the
packaged MiniLM, nothing off this machine, its failures failed rows."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from library_methods import (OVER_BUDGET, assert_answers_name_stored, assert_only_episode_failed, library_calls,
                             off_machine, record_connections)
from pipeline.errors import RunStopped
from stages.methods import METHODS, a_mem_library  # before the library itself: litellm's cost map local
from stages.testing import run_method

pytest.importorskip("agentic_memory", reason="a-mem (the A-MEM fork) is part of the test install")

SETS = ["probes.max_qa_per_episode=2", "probes.max_per_episode=1"]
# Each run has the library build ChromaDB stores with MiniLM embeddings on the CPU (~0.5 s a note on
# two busy cores) and imports litellm, transformers and ChromaDB (~20 s): scheduled among the first.
pytestmark = pytest.mark.heavy(seconds=60)


def schema_of(body: dict[str, Any]) -> dict[str, Any]:
    rf = body.get("response_format") or {}
    return (rf.get("json_schema") or {}).get("schema") or {} if rf.get("type") == "json_schema" else {}


def amem_answers(body: dict[str, Any]) -> str | None:
    """A-MEM's two JSON answers, scripted: the analysis names the note's words; evolution links the new
    note to its nearest neighbour and retags it."""
    props = schema_of(body).get("properties") or {}
    prompt = body["messages"][-1]["content"]
    if "should_evolve" in props:
        neighbours = re.findall(r"memory_id:(\S+)\t", prompt)
        return json.dumps({"should_evolve": bool(neighbours), "actions": ["strengthen"],
                           "suggested_connections": neighbours[:1], "tags_to_update": ["linked"],
                           "new_context_neighborhood": [], "new_tags_neighborhood": []})
    if "keywords" in props:
        words = re.findall(r"[a-z]{4,}", prompt.rsplit("\n", 1)[-1].lower())[:3] or ["chat"]
        return json.dumps({"keywords": words, "context": f"talk about {words[0]}", "tags": ["conversation"]})
    return None


def amem_run(fake: Any, work: Path, *sets: str) -> dict[str, Any]:
    fake.responder = amem_answers
    return run_method(METHODS["a_mem"], fake.base_url, work, sets=[*SETS, *sets])


def test_a_mem_builds_notes_by_session_answers_from_its_search_counts_every_call_and_reruns_from_cache(
        fake_llm, tmp_path, monkeypatch):
    """One run of two episodes (each run builds ChromaDB stores with MiniLM on the CPU, the slow part):
    the first built and answered, the second failed by a library exception, then rerun from the cache."""
    add = a_mem_library._add_session

    def failing(system: Any, notes: list) -> None:
        if notes and notes[0][0].startswith("sample-02:"):
            raise RuntimeError("chroma went away")
        add(system, notes)

    monkeypatch.setattr(a_mem_library, "_add_session", failing)
    seen = record_connections(monkeypatch)
    tables = amem_run(fake_llm, tmp_path / "a", "corpus.limit=2")
    remote = off_machine(seen)
    assert seen and not remote  # nothing left the machine (no hub, no telemetry, no cost map)
    # a library exception on one episode is that episode's failure, its answers failed rows
    assert_only_episode_failed(tables, "a_mem", "sample-02", "chroma went away")
    responses = tables["respond_a_mem.responses"].to_pylist()
    notes = tables["memory_a_mem.notes"].to_pylist()
    assert {n["episode_id"] for n in notes} == {"sample-01"}
    by_session: dict[int, set[str]] = {}
    for n in notes:
        by_session.setdefault(n["snapshot_session"], set()).add(n["note_id"])
    sessions = sorted(by_session)
    assert len(sessions) > 1 and all(by_session[a] < by_session[b] for a, b in zip(sessions, sessions[1:]))  # grows
    assert all(n["keywords"] and n["context"].startswith("talk about") and n["timestamp"] for n in notes)
    assert all(n["content"].split(": ", 1)[0] == n["speaker"] for n in notes)
    # evolution ran: later notes link to notes that exist, and carry the tags it gave them
    last = [n for n in notes if n["snapshot_session"] == sessions[-1]]
    linked = [n for n in last if n["links"]]
    assert linked and all(set(n["links"]) <= by_session[sessions[-1]] for n in linked)
    assert all(n["tags"] == ["linked"] for n in linked)
    answers = [r for r in responses if r["probe_id"].startswith("qa:") and r["episode_id"] == "sample-01"]
    assert_answers_name_stored(answers, {n["note_id"] for n in notes})
    # every request the library made is in the memory stage's manifest, under its method
    sent = fake_llm.count()
    readers = sum(1 for r in responses if r["error"] is None)
    assert library_calls(tmp_path / "a" / "artifacts" / "test-a_mem", "a_mem") + readers == sent
    assert not any(r["path"] == "/v1/embeddings" for r in fake_llm.requests)  # MiniLM in ChromaDB embeds
    # a warm rerun, in a fresh run folder on the same call cache: the library's prompts repeat exactly
    import shutil
    shutil.copytree(tmp_path / "a" / "llm-cache", tmp_path / "b" / "llm-cache")
    again = amem_run(fake_llm, tmp_path / "b", "corpus.limit=2")
    assert fake_llm.count() == sent
    assert again["memory_a_mem.notes"].to_pylist() == notes


def test_an_error_the_library_swallows_fails_the_episode(fake_llm, tmp_path):
    fake_llm.reject_formats = {"json_schema"}  # every analysis / evolution call refused; the library goes on
    tables = run_method(METHODS["a_mem"], fake_llm.base_url, tmp_path, sets=SETS)
    failures = tables["memory_a_mem.build_failures"].to_pylist()
    assert failures and "gateway error" in failures[0]["error"]


def test_a_budget_stops_it_like_any_stage(fake_llm, tmp_path):
    with pytest.raises(RunStopped):
        amem_run(fake_llm, tmp_path, *OVER_BUDGET)
