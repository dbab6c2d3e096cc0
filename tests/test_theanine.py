"""Theanine's Algorithms 1 and 2 on hand-built graphs, and its build and answer with a fake LLM."""

from __future__ import annotations

import asyncio
import json
import random

import numpy as np
import pytest

from pipeline.testing.fake_chat import FakeChat
from stages.methods.base import EpisodeInput, MethodContext, ProbeInput, visible_memory
from stages.methods.theanine import Theanine, TheanineAllSettings, TheanineNoRelationSettings, TheanineSettings
from stages.methods.theanine import graph as g


def graph(ages: list[str], edges: list[tuple[str, str]], relation: str = "Cause") -> g.Graph:
    gr = g.Graph()
    gr.add_memories({m: tuple(int(x) for x in m.split(":")) for m in ages})  # type: ignore[misc]
    gr.edges = [g.Edge(a, b, relation) for a, b in edges]
    return gr


# ------------------------------------------------------------------------- Algorithm 1

BEFORE = graph(["1:0", "1:1", "2:0", "2:1"], [("1:0", "2:0")])


def test_a_new_memory_links_only_to_the_most_recent_labelled_memory_of_each_component():
    labels = {"2:0": "Changed", "1:0": "SameTopic", "1:1": "Want"}
    edges = g.links_for("3:0", labels, BEFORE, BEFORE.components())
    # {1:0, 2:0} is one component: only its most recent labelled memory, 2:0; {1:1} is another.
    assert edges == [g.Edge("1:1", "3:0", "Want"), g.Edge("2:0", "3:0", "Changed")]


def test_none_gives_no_edge_and_edges_point_from_older_to_newer():
    edges = g.links_for("3:0", {"2:0": "None", "1:0": "Cause", "1:1": "None"}, BEFORE, BEFORE.components())
    assert edges == [g.Edge("1:0", "3:0", "Cause")]  # 2:0 said None, so 1:0 is its component's newest labelled
    assert g.links_for("3:0", {"2:1": "None"}, BEFORE, BEFORE.components()) == []


def test_within_a_session_the_memory_summarised_later_is_the_more_recent():
    joined = graph(["1:0", "2:0", "2:1"], [("1:0", "2:0"), ("1:0", "2:1")])
    edges = g.links_for("3:0", {"2:0": "Cause", "2:1": "Cause"}, joined, joined.components())
    assert edges == [g.Edge("2:1", "3:0", "Cause")]


def test_theanine_all_links_every_labelled_candidate_and_optionally_every_candidate():
    labels = {"2:0": "Changed", "1:0": "SameTopic", "1:1": "None"}
    every_labelled = g.links_for("3:0", labels, BEFORE, BEFORE.components(), "all_labelled")
    assert {e.source for e in every_labelled} == {"1:0", "2:0"}
    every = g.links_for("3:0", labels, BEFORE, BEFORE.components(), "all_candidates")
    assert {(e.source, e.relation) for e in every} == {("1:0", "SameTopic"), ("1:1", "None"), ("2:0", "Changed")}


def test_associative_memories_are_the_top_j_by_similarity():
    vecs = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.5, 0.5]], dtype=np.float32)
    assert g.top_similar(np.array([1, 0], dtype=np.float32), ["a", "b", "c", "d"], vecs, 2) == ["a", "b"]
    assert g.top_similar(np.array([1, 0], dtype=np.float32), [], np.zeros((0, 2)), 3) == []


# ------------------------------------------------------------------------- Algorithm 2

BRANCHING = graph(["1:0", "2:0", "3:0", "3:1", "4:0"], [("1:0", "2:0"), ("2:0", "3:0"), ("2:0", "3:1"), ("3:1", "4:0")])


def test_timelines_start_at_the_oldest_memory_and_run_through_the_retrieved_one_to_an_end():
    found = g.timelines_through("2:0", BRANCHING)
    assert found.start == "1:0" and not found.bound_hit
    assert sorted(found.paths) == [["1:0", "2:0", "3:0"], ["1:0", "2:0", "3:1", "4:0"]]
    assert g.timelines_through("3:0", BRANCHING).paths == [["1:0", "2:0", "3:0"]]


def test_without_a_directed_path_from_the_oldest_the_timeline_starts_at_the_oldest_ancestor():
    # 1:0 -> 3:0 <- 2:0 <- 1:1: weakly one component, but 1:0 does not lead to 2:0.
    weak = graph(["1:0", "1:1", "2:0", "3:0"], [("1:0", "3:0"), ("1:1", "2:0"), ("2:0", "3:0")])
    found = g.timelines_through("2:0", weak)
    assert found.start == "1:1" and found.paths == [["1:1", "2:0", "3:0"]]
    no_ancestor = graph(["1:0", "2:0", "3:0"], [("1:0", "3:0"), ("2:0", "3:0")])
    assert g.timelines_through("2:0", no_ancestor).paths == [["2:0", "3:0"]]


def test_an_isolated_memory_is_a_one_memory_timeline():
    assert g.timelines_through("2:1", graph(["1:0", "2:1"], [])).paths == [["2:1"]]


def test_timeline_sampling_is_seeded_and_enumeration_is_bounded():
    star = graph(["1:0", *[f"2:{i}" for i in range(10)]], [("1:0", f"2:{i}") for i in range(10)])
    found = g.timelines_through("1:0", star)
    assert len(found.paths) == 10
    picks = [g.sample_timelines(found, 2, random.Random("seed")) for _ in range(2)]
    assert picks[0] == picks[1] and len(picks[0]) == 2
    assert g.sample_timelines(found, 20, random.Random(0)) == found.paths
    bounded = g.timelines_through("1:0", star, max_paths=3)
    assert len(bounded.paths) == 3 and bounded.bound_hit


def test_one_retrieved_memory_per_component_when_asked():
    assert g.group_by_component(["3:0", "2:0", "4:0"], BRANCHING) == ["3:0"]


# ------------------------------------------------------------------------- build and answer

TOPICS = {"dog": [1, 0, 0], "job": [0, 1, 0], "trip": [0, 0, 1]}


async def embed(texts: list[str]) -> np.ndarray:
    return np.array([[v + 0.01 * i for v in next(vec for k, vec in TOPICS.items() if k in t)]
                     for i, t in enumerate(texts)], dtype=np.float32)


def episode(n_sessions: int) -> EpisodeInput:
    topics = list(TOPICS)
    sessions = {s: [{"speaker": "Ann", "text": f"about my {topics[(s - 1) % 3]}", "turn_idx": 0,
                     "source_turn_id": f"D{s}:1"},
                    {"speaker": "Bob", "text": "tell me more", "turn_idx": 1, "source_turn_id": f"D{s}:2"}]
                for s in range(1, n_sessions + 1)}
    return EpisodeInput(episode={"episode_id": "e1", "speakers": ["Ann", "Bob"]}, sessions=sessions)


def responder(label: str = "SameTopic"):
    def answer(messages, schema):
        text = messages[-1]["content"]
        if schema.__name__ == "SessionMemories":
            topic = next(k for k in TOPICS if f"my {k}" in text)
            return {"memories": [f"Ann talked about her {topic}", f"Ann's {topic} and the dog"]}
        if schema.__name__ == "RelationLabel":
            return {"relation": label}
        if schema.__name__ == "Refined":
            return {"information": "refined: " + text.split("Timeline of past events:\n")[1][:40]}
        return {"rationale": "she cares about it", "response": "Bob: How is it going?"}
    return answer


def build(n_sessions: int, settings, label: str = "SameTopic") -> tuple[dict, FakeChat]:
    llm = FakeChat(responder=responder(label))
    out = asyncio.run(Theanine().build(MethodContext(settings=settings, llm=llm, embed=embed), episode(n_sessions)))
    return out, llm


def test_every_sessions_summary_is_asked_at_once_and_the_links_still_follow_the_graph_in_order():
    """A session's memories come from its own turns alone: all summaries are asked before any link;
    the links of a session still see only the memories of the sessions before it."""
    order: list[str] = []

    class Slow(FakeChat):  # each answer takes a while, so calls that can overlap do
        async def chat(self, messages, *, schema=None, **kw):
            order.append(schema.__name__)
            await asyncio.sleep(0.01)
            return await super().chat(messages, schema=schema, **kw)

    llm = Slow(responder=responder())
    out = asyncio.run(Theanine().build(MethodContext(settings=TheanineSettings(j=2), llm=llm, embed=embed),
                                       episode(4)))
    assert order[:4] == ["SessionMemories"] * 4 and order.count("SessionMemories") == 4
    sequential, _ = build(4, TheanineSettings(j=2))
    assert out == sequential  # the same graph whatever order the answers come back in


def test_building_labels_at_most_j_candidates_from_earlier_sessions_per_new_memory():
    out, llm = build(4, TheanineSettings(j=2))
    ages = {m["memory_id"]: m["session_idx"] for m in out["memories"]}
    assert len(out["memories"]) == 8 and all(m["snapshot_session"] == m["session_idx"] for m in out["memories"])
    for row in out["link_labels"]:
        assert ages[row["candidate_id"]] < ages[row["new_id"]]  # never a memory of the same session
    per_new = {}
    for row in out["link_labels"]:
        per_new[row["new_id"]] = per_new.get(row["new_id"], 0) + 1
    assert set(per_new.values()) == {2} and not any(k.startswith("1:") for k in per_new)
    label_calls = [c for c in llm.calls if c["schema"].__name__ == "RelationLabel"]
    assert len(label_calls) == sum(r["link_calls"] for r in out["build_log"]) == 6 * 2
    assert all(ages[e["source"]] < ages[e["target"]] for e in out["edges"])
    stats = Theanine().build_stats(out)
    assert stats["link_calls_per_episode"] == {"e1": 12}
    # The label prompt defines the relations and shows both memories with their times and dialogues.
    prompt = label_calls[0]["messages"]
    assert "Changed" in prompt[0]["content"] and "HinderedBy" in prompt[0]["content"]
    assert "Memory A [session 1]:" in prompt[1]["content"] and "Ann: about my" in prompt[1]["content"]


def test_without_relation_labelling_no_llm_links_and_edges_follow_similarity():
    out, llm = build(3, TheanineNoRelationSettings(j=2))
    assert not [c for c in llm.calls if c["schema"].__name__ == "RelationLabel"]
    assert out["edges"] and {e["relation"] for e in out["edges"]} == {g.SIMILAR}
    assert {r["relation"] for r in out["link_labels"]} == {g.SIMILAR} and g.SIMILAR not in g.RELATIONS
    every, _ = build(3, TheanineNoRelationSettings(j=2, per_component=False))
    assert len(every["edges"]) == len(every["link_labels"]) > len(out["edges"])


def test_theanine_all_links_more_than_theanine():
    one, _ = build(4, TheanineSettings(j=3))
    every, _ = build(4, TheanineAllSettings(j=3))
    assert len(every["edges"]) > len(one["edges"])


def test_an_episode_with_twelve_sessions_builds_and_answers():
    settings = TheanineSettings()
    out, _ = build(13, settings)
    assert {m["session_idx"] for m in out["memories"]} == set(range(1, 14))
    probe = {"probe_id": "nr:13:1", "kind": "next_response", "session_idx": 13, "turn_idx": 1, "respondent": "Bob",
             "request": "about my dog"}
    memory = {t: visible_memory(rows, 13, 1, "log") for t, rows in out.items()}
    assert max(m["session_idx"] for m in memory["memories"]) == 12
    llm = FakeChat(responder=responder())
    ep = episode(13)
    answer = asyncio.run(Theanine().answer(MethodContext(settings=settings, llm=llm, embed=embed),
                                           ProbeInput(probe=probe, episode=ep.episode, history={},
                                                      current=ep.sessions[13][:1]), memory))
    assert answer.text == "How is it going?" and answer.rationale == "she cares about it"
    d = answer.details
    n = len(d["timelines"])
    assert len(d["retrieved"]) == 3 and n + d["dropped"] == 3 and d["timelines_per"] == "memory"
    assert len({tuple(p) for p in d["timelines"]}) == n  # each timeline once
    assert all(p[-1] in answer.used_ids for p in d["timelines"])
    assert len(d["refined_timelines"]) == n and all(r.startswith("refined: 1.") for r in d["refined_timelines"])
    refine_calls = [c for c in llm.calls if c["schema"].__name__ == "Refined"]
    assert len(refine_calls) == n and "Ann: about my dog" in refine_calls[0]["messages"][1]["content"]
    json.dumps(d)  # details go to the responses table as JSON


def test_without_refinement_the_raw_timelines_reach_the_response():
    out, _ = build(3, TheanineSettings())
    memory = {t: visible_memory(rows, 3, 1, "log") for t, rows in out.items()}
    llm = FakeChat(responder=responder())
    probe = {"probe_id": "qa:1", "kind": "qa", "session_idx": 4, "turn_idx": None, "respondent": "Bob",
             "request": "What pet does Ann have? dog"}
    settings = TheanineSettings(refine=False)
    answer = asyncio.run(Theanine().answer(MethodContext(settings=settings, llm=llm, embed=embed),
                                           ProbeInput(probe=probe, episode={"speakers": []}, history={}, current=[]),
                                           memory))
    assert not [c for c in llm.calls if c["schema"].__name__ == "Refined"]
    assert answer.details["refined_timelines"] == answer.details["raw_timelines"]
    assert "short phrase" in llm.calls[-1]["messages"][1]["content"]


@pytest.mark.parametrize("per", ["memory", "component"])
def test_k_times_n_or_one_set_per_component_is_a_recorded_choice(per):
    out, _ = build(4, TheanineSettings())
    memory = {t: visible_memory(rows, 5, None, "log") for t, rows in out.items()}
    settings = TheanineSettings(timelines_per=per, refine=False)
    probe = {"probe_id": "qa:2", "kind": "qa", "session_idx": 5, "turn_idx": None, "respondent": "Bob",
             "request": "the dog"}
    ctx = MethodContext(settings=settings, llm=FakeChat(responder=responder()), embed=embed)
    answer = asyncio.run(Theanine().answer(ctx, ProbeInput(probe=probe, episode={"speakers": []}, history={},
                                                            current=[]), memory))
    assert answer.details["timelines_per"] == per
    n = len(answer.details["timelines"])
    assert n + answer.details["dropped"] == 3 if per == "memory" else 1 <= n <= 3


# ------------------------------------------------------------------------- through the runner

def test_on_the_sample_corpus_every_probe_gets_timelines_refinements_rationale_and_response(run_cfg, fake_llm,
                                                                                             tmp_path):
    from pipeline.artifacts import StageDir
    from stages.cli import main
    from pipeline.engine.runner import Runner
    from stages import registry

    cfg = run_cfg("corpus.limit=1", "compress.method=none", "methods=[theanine,full_history]",
                  "probes.max_per_episode=3", "method.theanine.j=2", "judge_memory.enabled=false",
                  "judge_pairwise.enabled=false", "judge_answers.enabled=false")
    assert set(Runner(cfg, registry(cfg)).run().values()) == {"ran"}
    memory = StageDir(cfg.run_dir, "memory_theanine")
    memories = memory.read_table("memories").to_pylist()
    labels = memory.read_table("link_labels").to_pylist()
    per_new = {}
    for row in labels:
        per_new[row["new_id"]] = per_new.get(row["new_id"], 0) + 1
    assert memories and max(per_new.values()) <= 2
    manifest = memory.manifest()
    assert manifest.stats["link_calls_per_episode"] == {"sample-01": len(labels)} == {"sample-01": manifest.stats["link_calls"]}
    responses = StageDir(cfg.run_dir, "respond_theanine").read_table("responses").to_pylist()
    assert len(responses) == StageDir(cfg.run_dir, "probes").manifest().rows
    for r in responses:
        assert r["error"] is None and r["response"] is not None and r["rationale"] is not None
        details = json.loads(r["details_json"])
        assert details["timelines"] and len(details["refined_timelines"]) == len(details["timelines"])
    # The graph exports as Parquet nodes and edges, and the report draws it.
    out = tmp_path / "graph"
    assert main(["export", "memory_theanine", "--out", str(out), "--set", f"artifacts_dir={cfg.artifacts_dir}"]) == 0
    assert (out / "memories.parquet").is_file() and (out / "edges.parquet").is_file()
    assert (cfg.run_dir / "report" / "panel_theanine.png").is_file()
    assert "panel_theanine.png" in (cfg.run_dir / "report" / "report.html").read_text()
