"""`graphiti`: graphiti-core, unchanged, as a method on an embedded Kuzu graph: every call through the
gateway to the fake server (its structured answers scripted), counted, cached and budgeted, nothing
off this machine, a graph snapshot per session, its failures failed rows."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from library_methods import (OVER_BUDGET, assert_answers_name_stored, assert_only_episode_failed, library_calls,
                             off_machine, record_connections)
from pipeline.errors import RunStopped
from stages.methods import METHODS, graphiti_library  # before graphiti itself: its telemetry off
from stages.testing import run_method

pytest.importorskip("graphiti_core", reason="graphiti-core is part of the test install")
pytest.importorskip("kuzu", reason="kuzu is part of the test install")

# A session as one episode: the default (a message each, as the evaluation) costs ~270 calls on this corpus.
SETS = ["probes.max_qa_per_episode=2", "probes.max_per_episode=1", "method.graphiti.episode_unit=session"]
# Each run has the library build a Kuzu graph message by message (~5 calls a message).
pytestmark = pytest.mark.heavy(seconds=10)


def _message(body: dict[str, Any]) -> tuple[str, str] | None:
    """(speaker, text) of the message a Graphiti extraction prompt is about, from its
    CURRENT MESSAGE block (spelled with a space or an underscore by different prompts)."""
    prompt = "\n".join(str(m.get("content") or "") for m in body.get("messages") or [])
    found = re.search(r"<CURRENT[ _]MESSAGE>\s*(.*?)\s*</CURRENT[ _]MESSAGE>", prompt, re.S)
    said = re.match(r"([^:\n]+): (.+)", found.group(1).strip(), re.S) if found else None
    return (said.group(1).strip(), said.group(2).strip()) if said else None


def _topic(text: str) -> str:
    """The message's longest word: the thing the scripted extraction says it is about."""
    return max(re.findall(r"[A-Za-z]+", text) or ["something"], key=len).lower()


def graph_script(body: dict[str, Any]) -> str | None:
    """Graphiti's structured answers, scripted by their schema's name: each message gives two
    entities (its speaker, its longest word) and one fact (the message), nothing is a duplicate,
    nothing is contradicted, no summaries; every other request gets the fake's default answer."""
    schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("name")
    said = _message(body)
    if schema == "ExtractedEntities" and said:
        return json.dumps({"extracted_entities": [{"name": said[0], "entity_type_id": 0},
                                                  {"name": _topic(said[1]), "entity_type_id": 0}]})
    if schema == "ExtractedEdges" and said:
        return json.dumps({"edges": [{"source_entity_name": said[0], "target_entity_name": _topic(said[1]),
                                      "relation_type": "TALKS_ABOUT", "fact": f"{said[0]} said: {said[1]}"}]})
    canned = {"EdgeTimestamps": {"valid_at": None, "invalid_at": None}, "SummarizedEntities": {"summaries": []},
              "EdgeDuplicate": {"duplicate_facts": [], "contradicted_facts": []},
              "NodeResolutions": {"entity_resolutions": []}}
    return json.dumps(canned[schema]) if schema in canned else None


def graphiti_run(fake: Any, work: Path, *sets: str) -> dict[str, Any]:
    fake.responder = graph_script
    return run_method(METHODS["graphiti"], fake.base_url, work, sets=[*SETS, *sets])


def test_graphiti_builds_its_graph_by_session_answers_from_its_search_counts_every_call_and_keeps_it_here(
        fake_llm, tmp_path, monkeypatch):
    # One run (each costs ~25 s on this corpus) shows it all: the graph, the answers, the counts,
    # no connection off the machine, a library exception on one episode failing that episode only.
    add = graphiti_library._add_episode

    async def failing(graph: Any, group_id: str, *rest: Any) -> None:
        if group_id.startswith("sample-02"):
            raise RuntimeError("kuzu went away")
        await add(graph, group_id, *rest)

    seen = record_connections(monkeypatch)
    monkeypatch.setattr(graphiti_library, "_add_episode", failing)
    monkeypatch.setenv("GRAPHITI_TELEMETRY_ENABLED", "true")  # the adapter turns it off again
    tables = graphiti_run(fake_llm, tmp_path, "corpus.limit=2")

    rows = tables["memory_graphiti.graph"].to_pylist()
    assert rows and {r["episode_id"] for r in rows} == {"sample-01"}
    facts: dict[int, set[str]] = {}
    for r in rows:
        if r["kind"] == "fact":
            facts.setdefault(r["snapshot_session"], set()).add(r["uuid"])
    sessions = sorted(facts)
    assert len(sessions) > 1 and all(facts[a] < facts[b] for a, b in zip(sessions, sessions[1:]))  # it grows
    names = {json.loads(r["record"])["name"] for r in rows if r["kind"] == "entity"}
    assert {"Mina", "Joon"} <= names  # the scripted extraction's entities, deduplicated by the library
    assert any(r["valid_at"] for r in rows if r["kind"] == "fact")  # dated from the session's reference time
    assert all(json.loads(r["record"]).get("fact_embedding" if r["kind"] == "fact" else "name_embedding")
               for r in rows)  # embeddings kept: a snapshot is searched without embedding it again
    answers = tables["respond_graphiti.responses"].to_pylist()
    ours = [r for r in answers if r["episode_id"] == "sample-01" and r["probe_id"].startswith("qa:")]
    assert_answers_name_stored(ours, {m["uuid"] for m in rows})
    assert_only_episode_failed(tables, "graphiti", "sample-02", "kuzu went away")
    # the library spoke /v1/responses (structured output) and its reranker chat with logprobs
    assert any(r["path"] == "/v1/responses" for r in fake_llm.requests)
    # every request the library made while building is in the memory stage's manifest, under its method
    built = sum(1 for r in fake_llm.requests if r["path"] == "/v1/responses")
    assert library_calls(tmp_path / "artifacts" / "test-graphiti", "graphiti") == built
    remote = off_machine(seen)
    assert seen and not remote
    assert graphiti_library.os.environ["GRAPHITI_TELEMETRY_ENABLED"] == "false"

    sent = fake_llm.count()  # a warm rerun: nothing sent
    graphiti_run(fake_llm, tmp_path, "corpus.limit=2")
    assert fake_llm.count() == sent


def test_a_budget_stops_it_like_any_stage(fake_llm, tmp_path):
    with pytest.raises(RunStopped):
        graphiti_run(fake_llm, tmp_path, "corpus.limit=1", *OVER_BUDGET)
