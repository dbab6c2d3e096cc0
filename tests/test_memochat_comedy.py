"""MemoChat's topic memos and memo choice, COMEDY's session summaries compressed into profiles,
relationship and events: their core steps with a scripted fake LLM, then both through the runner
against the fake server."""

from __future__ import annotations

import asyncio
import re

from pipeline.testing.fake_chat import FakeChat
from pipeline.llm.types import LLMError
from stages.methods.base import EpisodeInput, MethodContext, ProbeInput, visible_memory
from stages.methods.baselines.comedy import Comedy, ComedySettings
from stages.methods.baselines.memochat import MemoChat, MemoChatSettings, Topic, topic_spans

CAMPING = ["I went camping last weekend.", "Where did you camp?", "By the lake, it rained all night."]
JOB = ["Also, I start a new job on Monday.", "Congrats! What job?", "Teaching maths at the high school."]


def turns(session: int, texts: list[str]) -> list[dict]:
    return [{"speaker": "Ann" if i % 2 == 0 else "Bob", "text": t, "turn_idx": i, "session_idx": session,
             "source_turn_id": f"D{session}:{i}"} for i, t in enumerate(texts)]


def episode(sessions: dict[int, list[str]]) -> EpisodeInput:
    return EpisodeInput(episode={"episode_id": "e1", "speakers": ["Ann", "Bob"]},
                        sessions={s: turns(s, texts) for s, texts in sessions.items()})


def probe(session: int, turn: int | None, current: list[dict], request: str, kind: str = "next_response") -> ProbeInput:
    row = {"probe_id": f"p{session}", "kind": kind, "session_idx": session, "turn_idx": turn, "respondent": "Bob",
           "request": request}
    return ProbeInput(probe=row, episode={"episode_id": "e1", "speakers": ["Ann", "Bob"]}, history={},
                      current=current)


def lines(prompt: str) -> dict[int, str]:
    """The numbered dialogue lines of a memorization prompt."""
    return {int(n): text for n, text in re.findall(r"^\((\d+)\) (.*)$", prompt, re.MULTILINE)}


# ------------------------------------------------------------------------------- MemoChat

def memo_writer(messages, schema):
    """Reads the numbered lines and answers one topic per subject, starting where it starts."""
    shown = lines(messages[-1]["content"])
    topics = []
    for n, text in sorted(shown.items()):
        subject = "camping" if any(w in text for w in ("camp", "lake")) else "new job"
        if not topics or topics[-1]["topic"] != subject:
            topics.append({"topic": subject, "summary": f"{subject} from line {n}", "start": n})
    return {"topics": topics}


def test_a_topic_shift_writes_a_memo_of_the_finished_topic_with_its_span():
    llm = FakeChat(responder=memo_writer)
    out = asyncio.run(MemoChat().build(MethodContext(settings=MemoChatSettings(write_every=4), llm=llm),
                                       episode({1: CAMPING + JOB})))
    memos, writes = out["memos"], out["writes"]
    # After 4 turns the talk has moved from camping to the job: camping (turns 0-2) is written, keyed
    # by the turn memorization read up to; the job is still going on and stays pending.
    assert [(w["snapshot_turn"], w["turn_start"], w["turn_end"], w["memos"], w["pending_from"]) for w in writes] == [
        (3, 0, 3, 1, 3), (None, 3, 5, 1, None)]
    camping, job = memos
    assert (camping["topic"], camping["turn_start"], camping["turn_end"], camping["snapshot_turn"]) == (
        "camping", 0, 2, 3)
    assert camping["dialogue"].splitlines() == [f"{t['speaker']}: {t['text']}" for t in turns(1, CAMPING)]
    # The second memorization reads the pending job talk only, and the session's end closes it.
    assert lines(llm.calls[1]["messages"][-1]["content"]) == {1: "Bob: " + JOB[0], 2: "Ann: " + JOB[1],
                                                             3: "Bob: " + JOB[2]}
    assert (job["topic"], job["turn_start"], job["turn_end"], job["snapshot_turn"]) == ("new job", 3, 5, None)
    assert job["source_turn_ids"] == ["D1:3", "D1:4", "D1:5"]
    # A probe at turn 4 sees the camping memo only; one after the session sees both.
    assert [m["memo_id"] for m in visible_memory(memos, 1, 4, "log")] == ["1:0"]
    assert [m["memo_id"] for m in visible_memory(memos, 2, 0, "log")] == ["1:0", "1:3"]
    assert MemoChat().memory_view(episode({1: CAMPING + JOB}), {"memos": memos}, MemoChatSettings()).splitlines() == [
        "[session 1, turns 0-2] camping: camping from line 1", "[session 1, turns 3-5] new job: new job from line 1"]


def test_without_a_topic_shift_nothing_is_written_until_the_session_ends():
    llm = FakeChat(responder=memo_writer)
    out = asyncio.run(MemoChat().build(MethodContext(settings=MemoChatSettings(write_every=2), llm=llm),
                                       episode({1: CAMPING})))
    assert [w["memos"] for w in out["writes"]] == [0, 1]
    assert [(m["turn_start"], m["turn_end"], m["snapshot_turn"]) for m in out["memos"]] == [(0, 2, None)]


def test_a_failed_memorization_keeps_its_turns_for_the_next_one():
    llm = FakeChat([LLMError("down", "garbled"), memo_writer])
    out = asyncio.run(MemoChat().build(MethodContext(settings=MemoChatSettings(write_every=4), llm=llm),
                                       episode({1: CAMPING + JOB})))
    failed, _ = out["writes"]
    assert failed["error"] == "down" and failed["raw"] == "garbled" and failed["pending_from"] == 0
    assert [(m["topic"], m["turn_start"], m["turn_end"]) for m in out["memos"]] == [("camping", 0, 2), ("new job", 3, 5)]
    assert MemoChat().build_stats(out) == {"memo_writes": 2, "failed_writes": 1, "memos": 2,
                                           "memos_per_episode": {"e1": 2}}


def test_topic_spans_cover_the_lines_whatever_the_starts():
    t = [Topic(topic=n, summary="", start=s) for n, s in [("b", 4), ("a", 2), ("dup", 4), ("far", 99)]]
    assert [(x.topic, lo, hi) for x, lo, hi in topic_spans(t, 6)] == [("a", 0, 2), ("b", 3, 4), ("far", 5, 5)]


def memo(session: int, start: int, end: int, topic: str) -> dict:
    return {"episode_id": "e1", "snapshot_session": session, "snapshot_turn": None, "memo_id": f"{session}:{start}",
            "topic": topic, "summary": f"about {topic}", "session_idx": session, "turn_start": start,
            "turn_end": end, "dialogue": f"Ann: {topic} talk", "source_turn_ids": []}


def test_retrieval_chooses_memos_by_number_and_only_those_reach_the_response():
    memos = [memo(1, 0, 2, "camping"), memo(1, 3, 5, "new job"), memo(2, 0, 1, "the dog")]
    llm = FakeChat([{"chosen": [2]}, "Bob: How is teaching going?"])
    current = turns(3, ["How are you?", "Good!", "My students are loud."])
    answer = asyncio.run(MemoChat().answer(MethodContext(settings=MemoChatSettings(), llm=llm),
                                           probe(3, 3, current, "My students are loud."), {"memos": memos}))
    retrieval, reply = (c["messages"][-1]["content"] for c in llm.calls)
    # The choice is among every memo by number (topic and summary); the dialogue is shown.
    assert "[1] camping: about camping" in retrieval and "[3] the dog: about the dog" in retrieval
    assert "My students are loud." in retrieval
    # The response reads the chosen memo's topic, summary and dialogue, and no other memo.
    assert "Topic: new job (session 1, turns 3-5)" in reply and "Ann: new job talk" in reply
    assert "camping" not in reply and "the dog" not in reply
    assert answer.text == "How is teaching going?" and answer.used_ids == ["1:3"]
    assert answer.context_turns == 3 and answer.details["chosen"] == ["1:3"]


def test_choosing_none_or_a_failed_choice_answers_from_the_dialogue_alone():
    memos = [memo(1, 0, 2, "camping")]
    for first in ({"chosen": []}, LLMError("timeout")):
        llm = FakeChat([first, "ok"])
        answer = asyncio.run(MemoChat().answer(MethodContext(settings=MemoChatSettings(), llm=llm),
                                               probe(2, 1, [], "hi"), {"memos": memos}))
        assert answer.used_ids == [] and "(no memo is related)" in llm.calls[-1]["messages"][-1]["content"]
    assert answer.details["error"] == "timeout"
    # A number outside the memos shown is re-asked; more than max_retrieved are cut.
    llm = FakeChat([{"chosen": [5]}, {"chosen": [1, 1]}, "ok"])
    answer = asyncio.run(MemoChat().answer(MethodContext(settings=MemoChatSettings(), llm=llm),
                                           probe(2, 1, [], "hi"), {"memos": memos}))
    assert llm.calls[0]["attempts"] == 2 and answer.used_ids == ["1:0"]


# ------------------------------------------------------------------------------- COMEDY

def comedy_responder(messages, schema):
    prompt = messages[-1]["content"]
    if prompt.startswith("Session ("):  # session-level memory: which session it read
        session = re.search(r"Ann: news (\d+)", prompt).group(1)
        return f"S{session} happened."
    if schema is not None:  # compression: what it was given, in each part
        seen = re.findall(r"S(\d+) happened", prompt)
        return {"profiles": [f"Ann after {','.join(seen)}", f"Bob after {','.join(seen)}"],
                "relationship": f"friends since S{seen[0]}", "events": [f"event {s}" for s in seen]}
    return "Bob: Nice to hear!"


def news(n: int) -> dict[int, list[str]]:
    return {s: [f"news {s}", f"reply {s}"] for s in range(1, n + 1)}


def test_comedy_compresses_every_summary_so_far_into_profiles_relationship_and_events():
    llm = FakeChat(responder=comedy_responder)
    out = asyncio.run(Comedy().build(MethodContext(settings=ComedySettings(), llm=llm), episode(news(3))))
    assert [(r["snapshot_session"], r["summary"]) for r in out["summaries"]] == [
        (1, "S1 happened."), (2, "S2 happened."), (3, "S3 happened.")]
    third = out["compressed"][2]
    assert third["sessions"] == [1, 2, 3]
    assert third["profiles"] == [{"speaker": "Ann", "profile": "Ann after 1,2,3"},
                                 {"speaker": "Bob", "profile": "Bob after 1,2,3"}]
    assert third["relationship"] == "friends since S1" and third["events"] == ["event 1", "event 2", "event 3"]
    assert "Relationship: friends since S1" in third["memory"] and "- Bob: Bob after 1,2,3" in third["memory"]
    # Each summary reads its own session only; one model (the generator role) does it all.
    assert "news 2" in llm.calls[2]["messages"][-1]["content"] and "news 1" not in llm.calls[2]["messages"][-1]["content"]
    assert Comedy.build_role == Comedy.answer_role == "generator"


def test_a_comedy_probe_sees_only_the_memory_built_before_its_session():
    ctx = MethodContext(settings=ComedySettings(), llm=FakeChat(responder=comedy_responder))
    built = asyncio.run(Comedy().build(ctx, episode(news(3))))
    seen = {t: visible_memory(rows, 3, 1, "log") for t, rows in built.items()}
    llm = FakeChat(responder=comedy_responder)
    answer = asyncio.run(Comedy().answer(MethodContext(settings=ComedySettings(), llm=llm),
                                         probe(3, 1, turns(3, ["news 3"]), "news 3"), seen))
    prompt = llm.calls[0]["messages"][-1]["content"]
    assert "Ann after 1,2" in prompt and "event 2" in prompt and "event 3" not in prompt
    assert answer.text == "Nice to hear!" and answer.used_ids == ["compressed:2"]
    assert answer.details == {"memory_after_session": 2, "sessions": [1, 2]}
    first = FakeChat(responder=comedy_responder)
    asyncio.run(Comedy().answer(MethodContext(settings=ComedySettings(), llm=first), probe(1, 1, [], "news 1"),
                                {t: visible_memory(r, 1, 1, "log") for t, r in built.items()}))
    assert "(empty: this is your first conversation)" in first.calls[0]["messages"][-1]["content"]


def test_a_failed_compression_leaves_the_previous_memory_in_force():
    def responder(messages, schema):
        if schema is not None and "S2 happened" in messages[-1]["content"] and "S3" not in messages[-1]["content"]:
            return LLMError("refused", "no json")
        return comedy_responder(messages, schema)

    built = asyncio.run(Comedy().build(MethodContext(settings=ComedySettings(), llm=FakeChat(responder=responder)),
                                       episode(news(2))))
    assert [r["error"] for r in built["compressed"]] == [None, "refused"]
    seen = {t: visible_memory(rows, 3, 0, "log") for t, rows in built.items()}
    llm = FakeChat(responder=comedy_responder)
    answer = asyncio.run(Comedy().answer(MethodContext(settings=ComedySettings(), llm=llm), probe(3, 0, [], "hi"),
                                         seen))
    assert answer.used_ids == ["compressed:1"] and "Ann after 1" in llm.calls[0]["messages"][-1]["content"]
    assert Comedy().memory_view(episode(news(2)), seen, ComedySettings()).startswith("Profiles:\n- Ann: Ann after 1")


# ------------------------------------------------------------------------------- through the runner

def test_on_the_sample_corpus_memochat_and_comedy_answer_every_probe(run_cfg, fake_llm):
    from pipeline.artifacts import StageDir
    from pipeline.engine.runner import Runner
    from stages import registry

    cfg = run_cfg("corpus.limit=1", "methods=[memochat,comedy]", "method.memochat.write_every=6",
                  "stages=[ingest,probes,memory_memochat,memory_comedy,respond_memochat,respond_comedy]")
    assert set(Runner(cfg, registry(cfg)).run().values()) == {"ran"}
    n_probes = StageDir(cfg.run_dir, "probes").manifest().rows
    for m, tables in {"memochat": ["memos", "writes"], "comedy": ["summaries", "compressed"]}.items():
        rows = StageDir(cfg.run_dir, f"respond_{m}").read_table("responses").to_pylist()
        assert len(rows) == n_probes and all(r["error"] is None and r["response"] for r in rows), m
        sd = StageDir(cfg.run_dir, f"memory_{m}")
        assert all(sd.read_table(t).num_rows > 0 for t in tables), m
        assert sd.read_table("memory_view").num_rows == 1, m
    # The fake server's memos: some were chosen and reached responses.
    memochat = StageDir(cfg.run_dir, "respond_memochat").read_table("responses").to_pylist()
    assert any(r["memory_ids"] for r in memochat)
    assert set(StageDir(cfg.run_dir, "memory_comedy").manifest().llm_usage) == {"generator"}
