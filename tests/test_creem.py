"""CREEM's blend-and-refine memory with a fake LLM, and through the runner."""

from __future__ import annotations

import asyncio
import itertools
import re
from collections import Counter

import numpy as np
import pytest
from pydantic import ValidationError

from pipeline.testing.fake_chat import FakeChat
from stages.methods.base import EpisodeInput, MethodContext, ProbeInput, visible_memory
from stages.methods.creem import Creem, CreemNoPreblend, CreemNoPreblendSettings, CreemNoRefineSettings, CreemSettings
from stages.methods.creem.method import label_shares, replay


def mem(i: int, speaker: str = "Ann") -> dict:
    return {"memory_id": f"m{i}", "speaker": speaker, "text": f"{speaker} fact {i}", "session_idx": 1, "turn_idx": 0,
            "label": "New"}


def turns(n: int, session: int = 2) -> list[dict]:
    return [{"speaker": "Ann" if i % 2 == 0 else "Bob", "text": f"line {session}.{i}", "turn_idx": i}
            for i in range(n)]


def refined(label: str, removes: list[int]):
    def answer(messages, schema):
        if schema.__name__ == "Question":
            return {"question": "What changed for Ann?"}
        return {"insights": [{"text": "Ann moved to Rome", "label": label, "removes": removes},
                             {"text": "Ann likes cities", "label": "New", "removes": []}]}
    return answer


def step(memory, llm, settings=None, first=False, k=4, embed=None, session_turns=None):
    settings = settings or CreemSettings(k=k)
    return asyncio.run(Creem().step(llm, embed, settings, memory, "Ann", 2, session_turns or turns(3), first,
                                    (f"c{n}" for n in itertools.count(11))))


def test_an_updated_insight_removes_exactly_the_retrieved_memories_it_names():
    # Without an embedder the k (4) most recent pieces are retrieved: memory m3 and utterances 2.0-2.2.
    memory = {"Ann": [mem(1), mem(2), mem(3)], "Bob": [mem(4, "Bob")]}
    done = step(memory, FakeChat(responder=refined("Updated", [1])))
    assert [m["memory_id"] for m in memory["Ann"]] == ["m1", "m2", "c11", "c12"]  # m3 gone, m1 and m2 never shown
    rows = done.evolution_rows()
    assert rows[0]["removed_ids"] == ["m3"] and rows[0]["label"] == "Updated" and rows[1]["removed_ids"] == []
    assert rows[0]["retrieved_ids"] == ["m3"] and rows[0]["retrieved_turns"] == [0, 1, 2]
    assert [m["memory_id"] for m in done.removed] == ["m3"]
    assert memory["Bob"] == [mem(4, "Bob")]  # memory about the other speaker is untouched


def test_a_new_insight_removes_nothing_and_a_removal_outside_the_retrieved_is_re_asked():
    memory = {"Ann": [mem(1), mem(2), mem(3)]}
    step(memory, FakeChat(responder=refined("New", [1])))
    assert [m["memory_id"] for m in memory["Ann"]] == ["m1", "m2", "m3", "c11", "c12"]
    second = {"text": "y", "label": "New", "removes": []}
    answers = iter([{"insights": [{"text": "x", "label": "Redundant", "removes": [3]}, second]},
                    {"insights": [{"text": "x", "label": "Redundant", "removes": [1]}, second]}])
    llm = FakeChat(responder=lambda m, s: {"question": "q"} if s.__name__ == "Question" else next(answers))
    memory = {"Ann": [mem(1), mem(2), mem(3)]}
    step(memory, llm)
    refine_call = llm.calls[-1]
    assert refine_call["attempts"] == 2 and refine_call["errors"]  # "removes": [3] when only M1 was shown
    assert [m["memory_id"] for m in memory["Ann"]] == ["m1", "m2", "c11", "c12"]


def test_a_blend_must_give_exactly_n_insights_else_it_is_re_asked_and_then_logged_as_failed():
    one = {"insights": [{"text": "x", "label": "New", "removes": []}]}
    two = {"insights": [{"text": "x", "label": "New", "removes": []}, {"text": "y", "label": "New", "removes": []}]}
    answers = iter([one, two])
    llm = FakeChat(responder=lambda m, s: {"question": "q"} if s.__name__ == "Question" else next(answers))
    memory = {"Ann": [mem(1)]}
    done = step(memory, llm)
    assert llm.calls[-1]["attempts"] == 2 and "exactly 2 insights" in llm.calls[-1]["errors"][0]
    assert len(done.added) == 2
    llm = FakeChat(responder=lambda m, s: {"question": "q"} if s.__name__ == "Question" else one)
    memory = {"Ann": [mem(1)]}
    done = step(memory, llm)
    rows = done.evolution_rows()
    assert memory["Ann"] == [mem(1)] and len(rows) == 1 and rows[0]["memory_id"] is None
    assert "exactly 2 insights" in rows[0]["error"] and rows[0]["question"] == "q"


def test_the_first_session_blends_without_refining():
    llm = FakeChat(responder=lambda m, s: {"insights": [{"text": "Ann likes tea"}, {"text": "Ann is a nurse"}]})
    memory: dict = {}
    done = step(memory, llm, first=True)
    assert [r["label"] for r in done.evolution_rows()] == ["Blended", "Blended"] and len(llm.calls) == 1
    assert llm.calls[0]["schema"].__name__ == "Blended"
    assert "line 2.2" in llm.calls[0]["messages"][1]["content"]  # its statements: the session's utterances


def test_without_refinement_insights_are_new_and_nothing_is_removed():
    memory = {"Ann": [mem(1), mem(2), mem(3)]}
    llm = FakeChat(responder=lambda m, s: {"question": "q"} if s.__name__ == "Question"
                   else {"insights": [{"text": "Ann moved"}, {"text": "Ann packs"}]})
    done = step(memory, llm, settings=CreemNoRefineSettings(k=3))
    assert [r["label"] for r in done.evolution_rows()] == ["New", "New"] and len(memory["Ann"]) == 5
    assert "Redundant" not in llm.calls[-1]["messages"][0]["content"]


# ------------------------------------------------------------------------------- dense retrieval

VOCAB = ["dog", "jazz", "nurse", "tomato", "rome", "tea", "night"]


class TopicEmbedder:
    """Distinct vectors: one dimension per topic word, plus a small constant so none is zero."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def __call__(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return np.array([[float(w in t.lower()) for w in VOCAB] + [0.1] for t in texts], dtype=np.float32)


def test_retrieval_ranks_memories_and_utterances_together_by_similarity_to_the_question():
    memories = [{**mem(1), "text": "Ann has an old dog"}, {**mem(2), "text": "Ann plays jazz"},
                {**mem(3), "text": "Ann works as a nurse"}, {**mem(4), "text": "Ann grows tomatoes"}]
    said = [{"speaker": "Ann", "text": "My dog is sick", "turn_idx": 0},
            {"speaker": "Bob", "text": "Sorry to hear, want some tea?", "turn_idx": 1},
            {"speaker": "Ann", "text": "I worked nights all week", "turn_idx": 2}]
    embed = TopicEmbedder()
    mems, utts = asyncio.run(Creem().retrieve(embed, "How is Ann's dog?", memories, said, 2))
    assert [m["memory_id"] for m in mems] == ["m1"] and [u["turn_idx"] for u in utts] == [0]
    assert asyncio.run(Creem().retrieve(None, "How is Ann's dog?", memories, said, 2)) == ([], said[1:])  # recency differs
    # In a step the query is the generated question alone, and the blend sees only what was retrieved.
    llm = FakeChat(responder=lambda m, s: {"question": "What is wrong with Ann's dog?"} if s.__name__ == "Question"
                   else {"insights": [{"text": "Ann worries", "label": "New", "removes": []},
                                      {"text": "Ann loves her dog", "label": "Redundant", "removes": [1]}]})
    memory = {"Ann": memories}
    done = step(memory, llm, k=2, embed=embed, session_turns=said)
    assert embed.calls[-1][-1] == "What is wrong with Ann's dog?"  # the pieces, then the query
    blend = llm.calls[-1]["messages"][1]["content"]
    assert "[M1] Ann has an old dog" in blend and "My dog is sick" in blend
    assert "jazz" not in blend and "tea" not in blend and "nights" not in blend
    assert [m["memory_id"] for m in done.removed] == ["m1"]
    assert [m["text"] for m in memory["Ann"]][-2:] == ["Ann worries", "Ann loves her dog"]


# ------------------------------------------------------------------------------- in-session memory

def counting_builder(tag: str = "insight"):
    """Blend answers numbered in call order (every insight New), questions, then a reply."""
    made = itertools.count(1)

    def answer(messages, schema):
        name = schema.__name__ if schema else None
        if name == "Question":
            return {"question": "What is new?"}
        if name == "Blended":
            return {"insights": [{"text": f"{tag} {next(made)}"}, {"text": f"{tag} {next(made)}"}]}
        if name == "BlendedAndRefined":
            return {"insights": [{"text": f"{tag} {next(made)}", "label": "New", "removes": []},
                                 {"text": f"{tag} {next(made)}", "label": "New", "removes": []}]}
        return "Bob: I remember!"
    return answer


EPISODE = {"episode_id": "e1", "speakers": ["Ann", "Bob"], "dataset": "sample"}


def built(sessions: dict, settings: CreemSettings) -> dict:
    episode = EpisodeInput(episode=EPISODE, sessions=sessions)
    return asyncio.run(Creem().build(MethodContext(settings=settings, llm=FakeChat(responder=counting_builder())),
                                     episode))


def probe_at(sessions: dict, s: int, t: int) -> ProbeInput:
    respondent = sessions[s][t]["speaker"]
    return ProbeInput(probe={"probe_id": f"nr:{s}:{t}", "kind": "next_response", "session_idx": s, "turn_idx": t,
                             "respondent": respondent, "request": sessions[s][t - 1]["text"]},
                      episode=EPISODE, history={k: v for k, v in sessions.items() if k < s},
                      current=sessions[s][:t])


def answering(settings: CreemSettings, llm: FakeChat) -> MethodContext:
    """The context an answer gets: these settings and LLM, and the topic embedder."""
    return MethodContext(settings=settings, llm=llm, embed=TopicEmbedder())


def made_at(out: dict, session: int, turn: int) -> set[str]:
    return {r["text"] for r in out["evolution"] if (r["snapshot_session"], r["snapshot_turn"]) == (session, turn)}


def test_a_probe_sees_the_same_session_insights_made_before_its_turn_and_none_made_at_or_after_it():
    # The options that let in-session insights reach a reply: retrieved (`all`) and shown when kept.
    options = CreemSettings(k=10, step_about="next_speaker", retrieve_from="all", reply_memory="kept_and_added")
    sessions = {1: turns(2, 1), 2: turns(6, 2)}
    out = built(sessions, options)  # k covers every piece: each step retrieves all it may
    seen = {t: visible_memory(rows, 2, 4, "log") for t, rows in out.items()}
    before, own, at_turn, after = made_at(out, 2, 1), made_at(out, 2, 3), made_at(out, 2, 4), made_at(out, 2, 5)
    assert before and own and at_turn and after
    visible = {m["text"] for ms in replay(seen["memories"]).values() for m in ms}
    assert before | own <= visible and not (at_turn | after) & visible
    llm = FakeChat(responder=counting_builder("answer-time"))
    answer = asyncio.run(Creem().answer(answering(options, llm), probe_at(sessions, 2, 4), seen))
    # Build already ran the step that read up to turn 3 (Algorithm 1's step for turn 4): only the reply is asked.
    assert [c["schema"] for c in llm.calls] == [None] and answer.details["step"] == "build"
    prompt = llm.calls[0]["messages"][1]["content"]
    assert all(text in prompt for text in before | own)  # an earlier in-session insight, retrieved and kept
    assert not any(text in prompt for text in at_turn | after)
    # Ann responds at turn 4: under `next_speaker` the step is about her, her own memory in the prompt.
    assert answer.text == "I remember!" and answer.details["memory_of"] == "Ann"
    assert set(answer.used_ids) >= {r["memory_id"] for r in out["evolution"] if r["text"] in own}


def test_where_build_skipped_the_turn_the_answer_runs_the_step_on_the_visible_memory():
    sessions = {1: turns(3, 1), 2: turns(6, 2)}  # session 1's one step (after its last turn) is about Ann
    settings = CreemSettings(k=10, update_every=3)  # session 2: steps after turns 2 (about Ann, last) and 5
    out = built(sessions, settings)
    earlier = made_at(out, 2, 2)
    assert earlier and not made_at(out, 2, 4)
    past = {r["text"] for r in out["evolution"] if r["session_idx"] == 1 and r["speaker"] == "Ann"}
    seen = {t: visible_memory(rows, 2, 5, "log") for t, rows in out.items()}
    llm = FakeChat(responder=counting_builder("answer-time"))
    answer = asyncio.run(Creem().answer(answering(settings, llm), probe_at(sessions, 2, 5), seen))
    assert [c["schema"].__name__ if c["schema"] else None for c in llm.calls] == ["Question", "BlendedAndRefined",
                                                                                    None]
    assert answer.details["step"] == "answer" and answer.details["insights"] == ["answer-time 1", "answer-time 2"]
    blend, reply = llm.calls[1]["messages"][1]["content"], llm.calls[-1]["messages"][1]["content"]
    # Ann spoke turn 4: the step is about her; it retrieves her past sessions' memory, not this session's insights,
    # and the reply sees the step's two new insights only.
    assert past and all(text in blend for text in past) and not any(text in blend for text in earlier)
    assert "Memory of Ann" in reply and "answer-time 1" in reply and "answer-time 2" in reply
    assert not any(text in reply for text in past | earlier)
    assert answer.used_ids == []  # the answer-time insights are not in the tables
    # The options: this session's insights retrieved too, and the kept ones shown with the new.
    options = settings.model_copy(update={"retrieve_from": "all", "reply_memory": "kept_and_added"})
    llm = FakeChat(responder=counting_builder("answer-time"))
    answer = asyncio.run(Creem().answer(answering(options, llm), probe_at(sessions, 2, 5), seen))
    blend, reply = llm.calls[1]["messages"][1]["content"], llm.calls[-1]["messages"][1]["content"]
    assert all(text in blend and text in reply for text in earlier)  # Ann's in-session memory, retrieved and kept
    assert answer.used_ids and not any(i.startswith("a") for i in answer.used_ids)  # not in the tables


def test_without_the_pre_response_blend_only_the_past_sessions_memory_reaches_the_response():
    sessions = {1: turns(2, 1), 2: turns(6, 2)}
    out = built(sessions, CreemNoPreblendSettings(k=10))
    seen = {t: visible_memory(rows, 2, 4, "log") for t, rows in out.items()}
    llm = FakeChat(responder=counting_builder("answer-time"))
    ctx = answering(CreemNoPreblendSettings(k=10), llm)
    answer = asyncio.run(CreemNoPreblend().answer(ctx, probe_at(sessions, 2, 4), seen))
    assert [c["schema"].__name__ if c["schema"] else None for c in llm.calls] == ["Question", None]
    prompt = llm.calls[-1]["messages"][1]["content"]
    # Ann responds at turn 4 to Bob's turn 3: Bob's memory from the past session, all of it retrieved and shown.
    first_session_about_bob = {r["text"] for r in out["evolution"] if r["session_idx"] == 1 and r["speaker"] == "Bob"}
    assert first_session_about_bob and all(text in prompt for text in first_session_about_bob)
    assert "Memory of Bob" in prompt and answer.details["memory_of"] == "Bob"
    in_session = {r["text"] for r in out["evolution"] if r["session_idx"] == 2}
    assert not any(text in prompt for text in in_session) and answer.details["step"] == "past_sessions"


def test_the_response_prompt_carries_a4_and_the_whole_current_session_with_the_baselines_length():
    from stages.methods.shared.memory_response import memory_messages

    sessions = {1: turns(2, 1), 2: turns(10, 2)}
    out = built(sessions, CreemSettings(k=10))
    seen = {t: visible_memory(rows, 2, 9, "log") for t, rows in out.items()}
    llm = FakeChat(responder=counting_builder())
    asyncio.run(Creem().answer(answering(CreemSettings(k=10), llm), probe_at(sessions, 2, 9), seen))
    system, user = (m["content"] for m in llm.calls[-1]["messages"])
    assert all(f"line 2.{i}" in user for i in range(9)) and "line 2.9" not in user  # D^s_[1,t-1], all of it
    assert "Memory of Ann" in user and "Conversation:" in user and user.rstrip().endswith("no speaker label):")
    assert "Response of Bob" in user and "last utterance" in system and "memory" in system
    assert "do not make it long" in system and "name of any speaker" in system and "let the memory show" in system
    baseline = memory_messages("m", sessions[2][:9], "line 2.8", "Bob", False)[1]["content"]
    assert "a short, natural reply" in baseline and "a short, natural reply" in system
    llm = FakeChat(responder=counting_builder())
    asyncio.run(Creem().answer(answering(CreemSettings(k=10, response_words=30), llm), probe_at(sessions, 2, 9), seen))
    assert "at most 30 words" in llm.calls[-1]["messages"][0]["content"]


def test_a_question_asked_after_the_history_runs_the_step_about_the_asker_and_asks_it_after_the_memory():
    sessions = {1: turns(2, 1), 2: turns(4, 2)}
    # the asker's memory (next_speaker: Bob's), every retrieved memory shown
    last_speaker = CreemSettings(k=10, step_about="last_speaker", reply_memory="kept_and_added")
    out = built(sessions, last_speaker)
    seen = {t: visible_memory(rows, 3, None, "log") for t, rows in out.items()}
    probe = ProbeInput(probe={"probe_id": "qa:1", "kind": "qa", "session_idx": 3, "turn_idx": None,
                              "respondent": "Bob", "request": "Where does Ann work?"},
                       episode=EPISODE, history=sessions, current=[])
    llm = FakeChat(responder=counting_builder("answer-time"))
    answer = asyncio.run(Creem().answer(answering(last_speaker, llm), probe, seen))
    assert answer.details["step"] == "answer" and answer.details["memory_of"] == "Ann"
    assert "Where does Ann work?" in llm.calls[0]["messages"][1]["content"]  # the question is the query's last line
    user = llm.calls[-1]["messages"][1]["content"]
    about_ann = {r["text"] for r in out["evolution"] if r["speaker"] == "Ann"}
    assert all(text in user for text in about_ann) and user.rstrip().endswith("Answer of Bob:")
    assert "Question: Where does Ann work?" in user and "short phrase" in llm.calls[-1]["messages"][0]["content"]


def test_the_query_and_blend_prompts_carry_every_instruction_of_a1_to_a3_and_end_in_json():
    from stages.methods.creem.prompts import blend_messages, first_session_messages, question_messages

    q = " ".join(m["content"] for m in question_messages("Ann", "Ann: hi"))
    assert all(w in q for w in ("high-level", "matters most", "lets us answer", "about Ann", "final line"))
    refine = " ".join(m["content"] for m in blend_messages("Ann", [mem(1)], [], 2, True))
    assert all(w in refine for w in ("insights about Ann", "New", "Redundant", "Updated", "deleted",
                                     "deletes nothing", "both steps 2 times", "[M1] Ann fact 1"))
    first = " ".join(m["content"] for m in first_session_messages("Ann", "Ann: hi", 2))
    assert "exactly 2 high-level insights about Ann" in first
    for messages in (question_messages("Ann", "x"), blend_messages("Ann", [], [], 2, False),
                     first_session_messages("Ann", "x", 2)):
        assert "Answer in JSON only" in messages[-1]["content"].splitlines()[-1]


# ------------------------------------------------------------------------------- the log and Table 5

def test_the_memory_log_replays_to_the_memory_and_grows_by_its_changes_only():
    sessions = {1: turns(2, 1), 2: turns(4, 2)}
    answers = iter([{"insights": [{"text": "a"}, {"text": "b"}]}, {"insights": [{"text": "c"}, {"text": "d"}]}])

    def llm_answer(messages, schema):
        if schema.__name__ == "Question":
            return {"question": "q"}
        if schema.__name__ == "Blended":
            return next(answers)
        return {"insights": [{"text": "e", "label": "Updated", "removes": [1]},
                             {"text": "f", "label": "New", "removes": []}]}

    episode = EpisodeInput(episode=EPISODE, sessions=sessions)
    method = Creem()
    out = asyncio.run(method.build(MethodContext(settings=CreemSettings(k=10), llm=FakeChat(responder=llm_answer)),
                                   episode))
    adds = [r for r in out["memories"] if r["op"] == "add"]
    removes = [r for r in out["memories"] if r["op"] == "remove"]
    assert len(adds) == 12 and len(removes) == 4  # 6 steps x 2 insights; each session-2 step removes its M1
    final = replay(out["memories"])
    assert sum(len(ms) for ms in final.values()) == 8
    view = method.memory_view(episode, {"memories": out["memories"]}, CreemSettings())
    assert view.splitlines() == [f"[{m['speaker']}] {m['text']}" for ms in final.values() for m in ms]
    assert method.build_stats(out) == {"insights": {"Blended": 4, "Updated": 4, "New": 4}, "failed_steps": 0,
                                       "removed": 4}


def test_label_shares_are_over_new_redundant_and_updated_with_blended_reported_apart():
    labels = ["Blended"] * 4 + ["New"] * 2 + ["Redundant", "Updated"] + [None]
    rows = label_shares("creem", [{"dataset": "msc", "label": label} for label in labels])
    by = {r["label"]: r for r in rows}
    assert [r["label"] for r in rows] == ["New", "Redundant", "Updated", "Blended"]
    assert (by["New"]["share"], by["Redundant"]["share"], by["Updated"]["share"]) == (0.5, 0.25, 0.25)
    assert by["Blended"]["insights"] == 4 and by["Blended"]["share"] is None


def test_on_the_sample_corpus_creem_answers_every_probe_and_logs_its_evolution(run_cfg, fake_llm):
    from pipeline.artifacts import StageDir
    from pipeline.engine.runner import Runner
    from stages import registry

    methods = ["creem", "creem_no_refine", "creem_no_preblend"]
    cfg = run_cfg("corpus.limit=1", f"methods=[{','.join(methods)}]", "method.creem.update_every=4",
                  "method.creem_no_refine.update_every=4", "method.creem_no_preblend.update_every=4",
                  "judge_memory.enabled=false", "judge_pairwise.enabled=false", "judge_answers.enabled=false")
    Runner(cfg, registry(cfg)).run()
    n_probes = StageDir(cfg.run_dir, "probes").manifest().rows
    for m in methods:
        rows = StageDir(cfg.run_dir, f"respond_{m}").read_table("responses").to_pylist()
        assert len(rows) == n_probes and all(r["error"] is None for r in rows), m
        sd = StageDir(cfg.run_dir, f"memory_{m}")
        assert sd.read_table("memories").num_rows > 0 and sd.read_table("evolution").num_rows > 0
    manifest = StageDir(cfg.run_dir, "memory_creem").manifest()
    logged = StageDir(cfg.run_dir, "memory_creem").read_table("evolution").to_pylist()
    assert manifest.stats["insights"] == dict(Counter(r["label"] for r in logged if r["label"])) != {}
    evolution = StageDir(cfg.run_dir, "report").read_table("evolution_summary").to_pylist()
    assert {r["method"] for r in evolution} == set(methods)
    for m in methods:
        shares = [r["share"] for r in evolution if r["method"] == m and r["label"] != "Blended"]
        assert abs(sum(shares) - 1.0) < 1e-9, m
        assert all(r["share"] is None for r in evolution if r["method"] == m and r["label"] == "Blended")


def test_every_question_is_asked_before_the_blends_and_each_step_keeps_its_own_question():
    """GQ reads only the dialogue: the build asks every step's question at once, then blends one step
    after another (each on the memory the step before wrote); each step's row carries the question of
    its own turn, and each blend sees the memories of the steps before it."""
    order: list[str] = []
    blend = counting_builder()

    def answer(messages, schema):
        if schema.__name__ == "Question":  # names the last turn of the dialogue it was shown
            return {"question": "After " + re.findall(r"\w+: line \d+\.\d+", messages[-1]["content"])[-1] + "?"}
        return blend(messages, schema)

    class Slow(FakeChat):  # each answer takes a while, so calls that can overlap do
        async def chat(self, messages, *, schema=None, **kw):
            order.append(schema.__name__)
            await asyncio.sleep(0.01)
            return await super().chat(messages, schema=schema, **kw)

    sessions = {1: turns(4, 1), 2: turns(4, 2), 3: turns(4, 3)}
    llm = Slow(responder=answer)
    out = asyncio.run(Creem().build(MethodContext(settings=CreemSettings(update_every=2, k=10), llm=llm),
                                    EpisodeInput(episode=EPISODE, sessions=sessions)))
    assert order.count("Question") == 4  # sessions 2 and 3, after turns 2 and 4
    # Asked while the first session's first blend is answered: all before any later blend.
    assert order[:5].count("Question") == 4
    asked = {(r["snapshot_session"], r["snapshot_turn"]): r["question"] for r in out["evolution"] if r["question"]}
    assert asked == {(s, t): f"After {sessions[s][t]['speaker']}: line {s}.{t}?" for s in (2, 3) for t in (1, 3)}
    blends = [c["messages"][-1]["content"] for c in llm.calls if c["schema"].__name__ != "Question"]
    seen = [b.count("insight ") for b in blends]
    # Session 2 sees session 1's four insights; session 3 (past sessions only) those and session 2's.
    assert seen[:5] == [0, 0, 4, 4, 8]


def test_the_refine_schema_lets_removals_name_only_the_memories_shown():
    from stages.methods.creem.method import blend_refine_schema

    schema = blend_refine_schema(2)
    assert schema.model_validate({"insights": [{"text": "x", "label": "Updated", "removes": [2]}]})
    for bad in ([3], [0], [1, 2, 1]):
        with pytest.raises(ValidationError):
            schema.model_validate({"insights": [{"text": "x", "label": "Updated", "removes": bad}]})
    assert blend_refine_schema(0).model_validate({"insights": [{"text": "x", "label": "New"}]})
    # With only utterances retrieved there is nothing to remove: a stray removal is ignored, not re-asked.
    nothing = blend_refine_schema(0).model_validate({"insights": [{"text": "x", "label": "Redundant", "removes": [1]}]})
    assert not hasattr(nothing.insights[0], "removes")
