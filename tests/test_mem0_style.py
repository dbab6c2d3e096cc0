"""mem0_style with a scripted fake LLM: facts extracted per speaker, each decided ADD / UPDATE /
DELETE / NONE against the most similar stored facts, the store kept as snapshots and the decisions
as a log."""

from __future__ import annotations

import asyncio
import json
import re

import numpy as np
import pytest

from pipeline.testing.fake_chat import FakeChat
from stages.methods import METHODS
from stages.methods.base import EpisodeInput, MethodContext, ProbeInput, visible_memory
from stages.methods.baselines.mem0_style import Decision, Mem0Settings, Mem0Style, apply_decision

WORDS = ["cello", "violin", "leeds", "york", "cat", "dog", "tea", "coffee"]


async def embed(texts: list[str]) -> np.ndarray:
    """A bag of the words above: facts about the same thing are near each other."""
    return np.array([[1.0 if w in t.lower() else 0.0 for w in WORDS] + [0.01] for t in texts], dtype=np.float32)


def episode(n: int) -> EpisodeInput:
    sessions = {s: [{"speaker": "Ann", "text": f"news {s}", "turn_idx": 0, "source_turn_id": f"D{s}:1"},
                    {"speaker": "Bob", "text": f"reply {s}", "turn_idx": 1, "source_turn_id": f"D{s}:2"}]
                for s in range(1, n + 1)}
    return EpisodeInput(episode={"episode_id": "e1", "speakers": ["Ann", "Bob"]}, sessions=sessions)


def scripted(facts: dict[tuple[int, str], list[str]], decisions: dict[str, dict]):
    """A responder: extraction answers by (session, speaker), decisions by candidate text (ADD
    when not scripted)."""
    def respond(messages, schema):
        text = messages[-1]["content"]
        if "List the facts about" in text:
            session = int(re.search(r"news (\d+)", text).group(1))
            speaker = re.search(r"List the facts about (\w+)", text).group(1)
            return {"facts": facts.get((session, speaker), [])}
        if "New fact:" in text:
            candidate = text.split("New fact: ")[1].split("\n")[0]
            return decisions.get(candidate, {"op": "ADD", "target": None, "text": None})
        return "fine"
    return respond


def build(llm: FakeChat, n: int, **settings) -> dict[str, list[dict]]:
    ctx = MethodContext(settings=Mem0Settings(**settings), llm=llm, embed=embed)
    return asyncio.run(Mem0Style().build(ctx, episode(n)))


def store_after(built: dict, session: int) -> list[dict]:
    """The facts a probe at the start of session + 1 sees."""
    return visible_memory(built["facts"], session + 1, 0, "snapshots")


def test_an_update_rewrites_the_fact_in_place_and_logs_old_and_new_text():
    llm = FakeChat(responder=scripted(
        {(1, "Ann"): ["Ann plays the cello."], (2, "Ann"): ["Ann plays the cello in an orchestra."]},
        {"Ann plays the cello in an orchestra.": {"op": "UPDATE", "target": 1,
                                                  "text": "Ann plays the cello in an orchestra."}}))
    built = build(llm, 2)
    assert [f["text"] for f in store_after(built, 2)] == ["Ann plays the cello in an orchestra."]
    assert store_after(built, 2)[0]["fact_id"] == "f1" and store_after(built, 2)[0]["updated_session"] == 2
    assert "Ann plays the cello." not in {f["text"] for f in store_after(built, 2)}
    update = [r for r in built["operations"] if r["op"] == "UPDATE"]
    assert len(update) == 1 and update[0]["fact_id"] == "f1" and update[0]["snapshot_session"] == 2
    assert (update[0]["old_text"], update[0]["new_text"]) == ("Ann plays the cello.",
                                                              "Ann plays the cello in an orchestra.")
    assert update[0]["similar_ids"] == ["f1"] and update[0]["decided"]


def test_a_probe_before_the_update_sees_the_old_fact():
    llm = FakeChat(responder=scripted(
        {(1, "Ann"): ["Ann plays the cello."], (2, "Ann"): ["Ann plays the cello in an orchestra."]},
        {"Ann plays the cello in an orchestra.": {"op": "UPDATE", "target": 1, "text": "Ann plays cello, orchestra."}}))
    built = build(llm, 2)
    # a probe at turn 1 of session 2 reads the store after session 1: the update is made at its end
    seen = visible_memory(built["facts"], 2, 1, "snapshots")
    assert [f["text"] for f in seen] == ["Ann plays the cello."]
    probe = ProbeInput(probe={"probe_id": "p", "kind": "next_response", "session_idx": 2, "turn_idx": 1,
                              "respondent": "Bob", "request": "news 2"},
                       episode=episode(2).episode, history={}, current=episode(2).sessions[2][:1])
    answer_llm = FakeChat(answers=["Good to hear"])
    ans = asyncio.run(Mem0Style().answer(MethodContext(settings=Mem0Settings(), llm=answer_llm, embed=embed), probe,
                                         {"facts": seen}))
    assert "Ann plays the cello." in answer_llm.calls[0]["messages"][-1]["content"]
    assert "orchestra" not in answer_llm.calls[0]["messages"][-1]["content"]
    assert ans.used_ids == ["f1"] and ans.details["memory_after_session"] == 1


def test_a_delete_removes_the_fact_and_does_not_store_the_candidate():
    llm = FakeChat(responder=scripted(
        {(1, "Ann"): ["Ann lives in Leeds.", "Ann has a cat."], (2, "Ann"): ["Ann moved away from Leeds."]},
        {"Ann moved away from Leeds.": {"op": "DELETE", "target": 1, "text": None}}))
    built = build(llm, 2)
    assert [f["text"] for f in store_after(built, 1)] == ["Ann lives in Leeds.", "Ann has a cat."]
    assert [f["text"] for f in store_after(built, 2)] == ["Ann has a cat."]
    delete = [r for r in built["operations"] if r["op"] == "DELETE"]
    assert len(delete) == 1 and delete[0]["fact_id"] == "f1" and delete[0]["old_text"] == "Ann lives in Leeds."
    assert delete[0]["new_text"] is None


def test_none_changes_nothing_and_writes_no_new_snapshot():
    llm = FakeChat(responder=scripted(
        {(1, "Ann"): ["Ann drinks tea."], (2, "Ann"): ["Ann likes tea."]},
        {"Ann likes tea.": {"op": "NONE", "target": 1, "text": None}}))
    built = build(llm, 2)
    assert [f["text"] for f in store_after(built, 2)] == ["Ann drinks tea."]
    assert {f["snapshot_session"] for f in built["facts"]} == {1}  # the store did not change in session 2
    none = [r for r in built["operations"] if r["op"] == "NONE"]
    assert len(none) == 1 and none[0]["fact_id"] == "f1" and none[0]["old_text"] is None


def test_facts_are_kept_per_speaker_and_compared_only_with_that_speakers_facts():
    llm = FakeChat(responder=scripted(
        {(1, "Ann"): ["Ann has a dog."], (1, "Bob"): ["Bob has a dog."]}, {}))
    built = build(llm, 1)
    # Bob's candidate meets an empty store of Bob's facts: added without a decision call
    assert [(f["speaker"], f["text"]) for f in store_after(built, 1)] == [("Ann", "Ann has a dog."),
                                                                          ("Bob", "Bob has a dog.")]
    assert all(not r["decided"] and r["op"] == "ADD" for r in built["operations"])
    assert not any("New fact:" in c["messages"][-1]["content"] for c in llm.calls)


def test_the_decision_sees_the_top_s_most_similar_facts_first():
    llm = FakeChat(responder=scripted(
        {(1, "Ann"): ["Ann has a cat.", "Ann drinks coffee.", "Ann plays violin."],
         (2, "Ann"): ["Ann drinks coffee daily."]},
        {"Ann drinks coffee daily.": {"op": "NONE", "target": 1, "text": None}}))
    built = build(llm, 2, top_s=2)
    op = [r for r in built["operations"] if r["candidate"] == "Ann drinks coffee daily."][0]
    assert op["similar_ids"][0] == "f2" and len(op["similar_ids"]) == 2


def test_a_decision_naming_a_fact_not_shown_is_re_asked_then_added_and_recorded():
    llm = FakeChat(responder=scripted(
        {(1, "Ann"): ["Ann has a cat."], (2, "Ann"): ["Ann has two cats."]},
        {"Ann has two cats.": {"op": "DELETE", "target": 7, "text": None}}))
    built = build(llm, 2)
    op = [r for r in built["operations"] if r["candidate"] == "Ann has two cats."][0]
    assert op["op"] == "ADD" and not op["decided"] and op["error"]
    assert [f["text"] for f in store_after(built, 2)] == ["Ann has a cat.", "Ann has two cats."]


def test_turn_mode_extracts_each_utterance_and_keys_snapshots_by_turn():
    def respond(messages, schema):
        text = messages[-1]["content"]
        if "List the facts about" in text:
            line = text.split("Read the facts from this line:\n")[1].split("\n")[0]
            return {"facts": {"Ann: news 1": ["Ann has a cat."]}.get(line, [])}
        return "fine"
    built = build(FakeChat(responder=respond), 1, extract_every="turn")
    assert [(r["snapshot_turn"], r["speaker"]) for r in built["extractions"]] == [(0, "Ann"), (1, "Bob")]
    assert [(f["snapshot_turn"], f["text"]) for f in built["facts"]] == [(0, "Ann has a cat.")]
    assert visible_memory(built["facts"], 1, 0, "snapshots") == []  # a probe at turn 0 has seen nothing
    assert len(visible_memory(built["facts"], 1, 1, "snapshots")) == 1


def test_apply_decision_keeps_the_id_on_update():
    store = [{"fact_id": "f1", "speaker": "Ann", "text": "old", "session_idx": 1, "turn_idx": None,
              "updated_session": None}]
    new = {"fact_id": "", "speaker": "Ann", "text": "cand", "session_idx": 3, "turn_idx": None,
           "updated_session": None}
    after, fields = apply_decision(store, store, Decision(op="UPDATE", target=1, text="new"), new)
    assert after == [{**store[0], "text": "new", "updated_session": 3}]
    assert fields == {"op": "UPDATE", "fact_id": "f1", "old_text": "old", "new_text": "new"}


def test_mem0_style_is_registered_with_its_settings():
    assert isinstance(METHODS["mem0_style"], Mem0Style)
    s = Mem0Settings()
    assert (s.top_s, s.top_k, s.extract_every) == (10, 10, "session")
    with pytest.raises(ValueError):
        Mem0Settings(extract_every="hour")


def test_answer_without_an_embedder_refuses_rather_than_showing_arbitrary_facts():
    facts = [{"fact_id": "f1", "speaker": "Ann", "text": "Ann has a cat.", "snapshot_session": 1,
              "snapshot_turn": None}]
    probe = ProbeInput(probe={"probe_id": "p", "kind": "next_response", "session_idx": 2, "turn_idx": 1,
                              "respondent": "Bob", "request": "hi"}, episode=episode(2).episode, history={},
                       current=[])
    ctx = MethodContext(settings=Mem0Settings(), llm=FakeChat(answers=["x"]), embed=None)
    with pytest.raises(RuntimeError):
        asyncio.run(Mem0Style().answer(ctx, probe, {"facts": facts}))


def test_prompts_are_in_the_fingerprint_inputs():
    assert set(Mem0Style.prompts) == {"extract_session", "extract_turn", "extract_pair", "decide", "answer_mem0",
                                      "answer_mem0_show_work"}
    assert json.dumps(Mem0Style.prompts)  # plain strings
