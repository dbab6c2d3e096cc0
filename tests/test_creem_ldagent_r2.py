"""Round-2 review items of LD-Agent (seed 003) and CREEM (seed 004): whose memory CREEM's step and
response work on, the first-session blend frequency, the stand-ins' reply frame and per-speaker
memory, Contriever's scoring, LD-Agent's persona start and the reference code's retrieval, and what
the two paper sheets hold."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

import stages
from pipeline.testing.fake_chat import FakeChat
from test_creem import counting_builder
from pipeline.reproduction import deviations
from stages.judging.judge_memory import speaker_lines
from stages.methods.base import EpisodeInput, MethodContext, ProbeInput, visible_memory
from stages.methods.creem import Creem, CreemSettings
from stages.methods.creem.method import step_speaker
from stages.methods.ld_agent import LDAgent, LDAgentSettings
from stages.methods.baselines.memory_baselines import AllMemories, MemorySettings
from stages.methods.shared.memory_response import creem_reply_messages

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
EPISODE = {"episode_id": "e1", "speakers": ["Ann", "Bob"], "dataset": "msc"}


def config(name: str):
    return stages.load_config(CONFIGS / f"{name}.yaml")


def turns(n: int, session: int) -> list[dict]:
    return [{"speaker": "Ann" if i % 2 == 0 else "Bob", "text": f"line {session}.{i}", "turn_idx": i,
             "session_idx": session} for i in range(n)]


def creem_llm(tag: str = "insight") -> FakeChat:
    return FakeChat(responder=counting_builder(tag))


def creem_build(sessions: dict, settings: CreemSettings) -> tuple[dict, FakeChat]:
    llm = creem_llm()
    out = asyncio.run(Creem().build(MethodContext(settings=settings, llm=llm),
                                    EpisodeInput(episode=EPISODE, sessions=sessions)))
    return out, llm


def probe_at(sessions: dict, s: int, t: int, kind: str = "next_response") -> ProbeInput:
    return ProbeInput(probe={"probe_id": f"nr:{s}:{t}", "kind": kind, "session_idx": s, "turn_idx": t,
                             "respondent": sessions[s][t]["speaker"], "request": sessions[s][t - 1]["text"]},
                      episode=EPISODE, history={k: v for k, v in sessions.items() if k < s},
                      current=sessions[s][:t])


# ------------------------------------------------------------------------------- CREEM: whose memory (N2)

def test_the_step_after_a_turn_is_about_its_speaker_or_with_next_speaker_whoever_speaks_next():
    session = turns(4, 2)
    assert [step_speaker(session, i, ["Ann", "Bob"], "next_speaker") for i in range(4)] == ["Bob", "Ann", "Bob", "Ann"]
    assert [step_speaker(session, i, ["Ann", "Bob"], "last_speaker") for i in range(4)] == ["Ann", "Bob", "Ann", "Bob"]
    sessions = {1: turns(2, 1), 2: turns(6, 2)}
    out, _ = creem_build(sessions, CreemSettings(k=10))
    about = {(r["snapshot_session"], r["snapshot_turn"]): r["speaker"] for r in out["evolution"]}
    # The step keyed at turn i (it read up to i) is about turn i's speaker (App. C Table 6: the last speaker).
    assert [about[2, i] for i in range(6)] == ["Ann", "Bob", "Ann", "Bob", "Ann", "Bob"]
    assert CreemSettings().step_about == "last_speaker"
    # The option: about turn i+1's speaker; after the last turn, the other one.
    out, _ = creem_build(sessions, CreemSettings(k=10, step_about="next_speaker"))
    about = {(r["snapshot_session"], r["snapshot_turn"]): r["speaker"] for r in out["evolution"]}
    assert [about[2, i] for i in range(6)] == ["Bob", "Ann", "Bob", "Ann", "Bob", "Ann"]
    assert [about[1, i] for i in range(2)] == ["Bob", "Ann"]


def test_the_response_sees_the_memory_of_the_partner_who_spoke_last_built_before_its_turn():
    sessions = {1: turns(2, 1), 2: turns(6, 2)}
    out, _ = creem_build(sessions, CreemSettings(k=10))
    seen = {t: visible_memory(rows, 2, 5, "log") for t, rows in out.items()}
    llm = creem_llm("answer-time")
    ctx = MethodContext(settings=CreemSettings(k=10), llm=llm)
    answer = asyncio.run(Creem().answer(ctx, probe_at(sessions, 2, 5), seen))
    assert [c["schema"] for c in llm.calls] == [None]  # build's step keyed at turn 4, about Ann, is reused
    user = llm.calls[0]["messages"][1]["content"]
    # Bob answers Ann's turn 4 with Ann's memory (App. C Table 6: B's reply recalls what A mentioned).
    assert "Memory of Ann:" in user and "Response of Bob" in user and answer.details["memory_of"] == "Ann"
    made_for_ann = {r["text"] for r in out["evolution"] if (r["snapshot_session"], r["snapshot_turn"]) == (2, 4)}
    assert made_for_ann and all(text in user for text in made_for_ann)
    about_bob_before = {r["text"] for r in out["evolution"] if (r["snapshot_session"], r["snapshot_turn"]) == (2, 3)}
    assert not any(text in user for text in about_bob_before)
    # The option: the responder's own memory.
    nxt = CreemSettings(k=10, step_about="next_speaker")
    out, _ = creem_build(sessions, nxt)
    seen = {t: visible_memory(rows, 2, 5, "log") for t, rows in out.items()}
    llm = creem_llm("answer-time")
    answer = asyncio.run(Creem().answer(MethodContext(settings=nxt, llm=llm), probe_at(sessions, 2, 5), seen))
    assert answer.details["memory_of"] == "Bob" and "Memory of Bob:" in llm.calls[-1]["messages"][1]["content"]


# ------------------------------------------------------------------------------- CREEM: first-session blend (N4)

def test_once_blends_the_whole_first_session_once_per_speaker():
    sessions = {1: turns(8, 1), 2: turns(2, 2)}
    once = CreemSettings(k=10, first_session="once", first_session_turns=2)
    out, llm = creem_build(sessions, once)
    first = [r for r in out["evolution"] if r["session_idx"] == 1]
    assert {r["speaker"] for r in first} == {"Ann", "Bob"} and len(first) == 4
    assert {r["snapshot_turn"] for r in first} == {7} and {r["label"] for r in first} == {"Blended"}
    blends = [c for c in llm.calls if c["schema"].__name__ == "Blended"]
    assert len(blends) == 2 and all("line 1.0" in c["messages"][1]["content"] for c in blends)  # the whole session
    per_turn, llm = creem_build(sessions, CreemSettings(k=10, first_session_turns=2))
    assert len([c for c in llm.calls if c["schema"].__name__ == "Blended"]) == 8  # one per turn
    assert CreemSettings().first_session == "per_turn"
    # Under `once`, a probe inside the first session finds nothing remembered yet.
    seen = {t: visible_memory(rows, 1, 5, "log") for t, rows in out.items()}
    reply = creem_llm()
    answer = asyncio.run(Creem().answer(MethodContext(settings=once, llm=reply), probe_at(sessions, 1, 5), seen))
    assert [c["schema"] for c in reply.calls] == [None] and answer.details["step"] == "first_session_once"
    assert "(nothing remembered)" in reply.calls[0]["messages"][1]["content"]


# ------------------------------------------------------------------------------- stand-ins (R-C5, N3)

def test_both_stand_ins_answer_in_creems_frame_with_the_whole_session():
    sessions = {1: turns(2, 1), 2: turns(40, 2)}
    probe = probe_at(sessions, 2, 39)
    creem = creem_llm()
    built, _ = creem_build(sessions, CreemSettings(k=10))
    seen = {t: visible_memory(rows, 2, 39, "log") for t, rows in built.items()}
    asyncio.run(Creem().answer(MethodContext(settings=CreemSettings(k=10), llm=creem), probe, seen))
    creem_system = creem.calls[-1]["messages"][0]["content"]

    memories = [{"memory_id": "m1", "episode_id": "e1", "session_idx": 1, "memory_idx": 0, "event": "Ann keeps bees",
                 "snapshot_session": 1, "snapshot_turn": None, "session_time": None, "session_gap_label": None,
                 "source_turn_ids": []}]
    llm = FakeChat(answers=["Bob: How are the bees?"])
    ctx = MethodContext(settings=MemorySettings(reply_frame="creem"), llm=llm)
    answer = asyncio.run(AllMemories().answer(ctx, probe, {"memories": memories}))
    system, user = (m["content"] for m in llm.calls[0]["messages"])
    assert system == creem_system and "Memory of both speakers:" in user and "Ann keeps bees" in user
    assert all(f"line 2.{i}" in user for i in range(39)) and answer.text == "How are the bees?"

    traits = [{"episode_id": "e1", "snapshot_session": 2, "snapshot_turn": t, "speaker": who, "session_idx": 2,
               "turn_idx": t, "trait": trait, "error": None, "raw": None}
              for t, who, trait in ((0, "Ann", "I keep bees."), (1, "Bob", "I fix clocks."))]
    llm = FakeChat(answers=["RESPONSE: Lovely!"])
    settings = LDAgentSettings(events=False, reply_frame="creem")
    asyncio.run(LDAgent().answer(MethodContext(settings=settings, llm=llm), probe, {"events": [], "personas": traits}))
    system, user = (m["content"] for m in llm.calls[0]["messages"])
    assert system == creem_system and "[Ann] I keep bees." in user and "[Bob] I fix clocks." in user
    assert all(f"line 2.{i}" in user for i in range(39))  # not LD-Agent's last 30 utterances
    assert "RESPONSE" not in user and "30 words" not in system + user
    cfg = config("creem_msc")
    assert cfg.method.all_memories.reply_frame == cfg.method.ld_agent.reply_frame == "creem"
    assert cfg.method.creem.response_words is None  # the frame's length: "a short, natural reply" for all three


def test_the_summem_stand_ins_memory_is_rated_one_speaker_at_a_time():
    traits = [{"speaker": who, "trait": trait} for who, trait in
              (("Speaker 1", "I grow tomatoes."), ("Speaker 2", "I drive a truck."), ("Speaker 1", "I have twins."))]
    episode = EpisodeInput(episode={"episode_id": "e1", "speakers": ["Speaker 1", "Speaker 2"]}, sessions={})
    view = LDAgent().memory_view(episode, {"events": [], "personas": traits}, LDAgentSettings())
    speakers = ["Speaker 1", "Speaker 2"]
    assert speaker_lines(view, "Speaker 1", speakers) == ["[Speaker 1] I grow tomatoes.", "[Speaker 1] I have twins."]
    assert speaker_lines(view, "Speaker 2", speakers) == ["[Speaker 2] I drive a truck."]


# ------------------------------------------------------------------------------- Contriever

def test_creem_retrieves_with_contriever_by_dot_product_as_the_sheet_says():
    cfg = config("creem_msc")
    assert cfg.embedding.model == "facebook/contriever" and cfg.embedding.normalize is False
    assert cfg.method.creem.similarity == "dot"
    assert all(cfg.paper.protocol[p].value == v for p, v in (
        ("embedding.model", "facebook/contriever"), ("method.creem.similarity", "dot")))

    async def embed(texts):  # "long" is a long vector in the query's direction, "near" a short one closer to it
        table = {"q": [1.0, 0.0], "long": [3.0, 3.0], "near": [1.0, 0.1]}
        return np.array([table[t.split(": ")[-1]] for t in texts], dtype=np.float32)

    pieces = [{"memory_id": "m1", "speaker": "Ann", "text": "long"}, {"memory_id": "m2", "speaker": "Ann", "text": "near"},
              {"memory_id": "m3", "speaker": "Ann", "text": "near"}]
    cosine, _ = asyncio.run(Creem().retrieve(embed, "q", pieces, [], 1))
    dot, _ = asyncio.run(Creem().retrieve(embed, "q", pieces, [], 1, "dot"))
    assert [m["memory_id"] for m in cosine] == ["m2"] and [m["memory_id"] for m in dot] == ["m1"]


# ------------------------------------------------------------------------------- CREEM sheet

def test_the_creem_sheet_states_each_reading_the_run_uses():
    cfg = config("creem_msc")
    protocol = cfg.paper.protocol
    for name in ("creem", "creem_no_refine", "creem_no_preblend"):
        assert protocol[f"method.{name}.step_about"].value == "last_speaker"
        assert protocol[f"method.{name}.first_session"].value == "per_turn"
        assert getattr(cfg.method, name).step_about == "last_speaker"
    source = protocol["method.creem.step_about"].source
    assert "Table 6" in source and "A.1" in source and "next_speaker" in source
    assert protocol["method.all_memories.reply_frame"].value == protocol["method.ld_agent.reply_frame"].value == "creem"
    assert deviations(cfg) == []


# ------------------------------------------------------------------------------- LD-Agent

VOCAB = ["dog", "park", "leash", "car"]


class VocabNouns(LDAgent):
    nouns = staticmethod(lambda text: [w for w in VOCAB if w in text.lower()])


class Embedder:
    """A bag of the vocabulary's words; records what it embeds."""

    def __init__(self) -> None:
        self.inputs: list[str] = []

    async def __call__(self, texts: list[str]) -> np.ndarray:
        self.inputs += texts
        return np.array([[float(w in t.lower()) for w in VOCAB] + [0.01] for t in texts], dtype=np.float32)


def ld_responder(messages, schema):
    text = messages[-1]["content"]
    if text.endswith("SUMMARY:"):
        return "SUMMARY: They talked."
    if "personal traits of" in text:
        return "I like dogs." if "dog" in text.rsplit("\n", 1)[-1] else "NO_TRAIT"
    return "RESPONSE: Nice!"


def ld_episode(sessions: list[list[tuple[str, str]]]) -> EpisodeInput:
    return EpisodeInput(episode={"episode_id": "e1", "speakers": ["Ann", "Bob"]}, sessions={
        s: [{"speaker": who, "text": text, "turn_idx": i, "session_idx": s, "session_time": None,
             "session_gap_label": "3 days later" if s > 1 else None} for i, (who, text) in enumerate(turns)]
        for s, turns in enumerate(sessions, start=1)})


def test_persona_banks_start_in_the_session_the_setting_names():
    ep = ld_episode([[("Ann", "my dog"), ("Bob", "a dog too")], [("Ann", "my dog again"), ("Bob", "ok")]])
    llm = FakeChat(responder=ld_responder)
    ctx = MethodContext(settings=LDAgentSettings(persona_from_session=2), llm=llm, embed=Embedder())
    out = asyncio.run(VocabNouns().build(ctx, ep))
    assert {p["session_idx"] for p in out["personas"]} == {2} and len(out["personas"]) == 2
    assert LDAgentSettings().persona_from_session == 1  # the stand-in for SumMem_MSC reads session 1 too
    cfg = config("ldagent_msc")
    setting = cfg.paper.protocol["method.ld_agent.persona_from_session"]
    assert cfg.method.ld_agent.persona_from_session == setting.value == 2 and "memory_bank_init" in setting.source
    assert config("creem_msc").method.ld_agent.persona_from_session == 1


def event(eid: str, nouns: list[str], age: float) -> dict:
    return {"episode_id": "e1", "snapshot_session": 1, "snapshot_turn": 0, "event_id": eid, "session_idx": 1,
            "summary": f"about {' and '.join(nouns)}", "time_s": -age, "time_source": "fixed_gap", "nouns": nouns,
            "vector": [float(w in nouns) for w in VOCAB] + [0.01], "turns": 2, "error": None, "raw": None}


def ask(events: list[dict], request: str, **settings):
    ep = ld_episode([[("Ann", request), ("Bob", "sure")]])
    turns = ep.sessions[1]
    embed = Embedder()
    probe = ProbeInput(probe={"probe_id": "nr:1:1", "kind": "next_response", "session_idx": 1, "turn_idx": 1,
                              "respondent": "Bob", "request": request},
                       episode=ep.episode, history={}, current=turns[:1])
    ctx = MethodContext(settings=LDAgentSettings(turn_gap_s=0.0, scoring="reference_code", **settings),
                        llm=FakeChat(responder=ld_responder), embed=embed)
    answered = asyncio.run(VocabNouns().answer(ctx, probe, {"events": events, "personas": []}))
    return answered, embed


def test_reference_code_retrieval_keeps_the_nearest_noun_key_only_if_it_shares_a_noun():
    # Query key "dog,park". Nearest: A (dog, park; old), then B (dog, leash; recent), C (car) farthest.
    events = [event("A", ["dog", "park"], 1e7), event("B", ["dog", "leash"], 3600), event("C", ["car"], 60)]
    answered, embed = ask(events, "my dog loves the park")
    assert embed.inputs == ["dog,park"]  # the query's nouns, as the reference code embeds them
    assert answered.used_ids == ["A"]  # top-1 nearest, shared nouns: decay never changes the choice
    # With more candidates the best decay x overlap among them is kept, still a single event.
    answered, _ = ask(events, "my dog loves the park", top_n=3)
    assert answered.used_ids == ["B"]
    # The nearest event shares no noun: nothing, though a farther one would share one.
    near = {**event("X", ["leash"], 60), "vector": [1.0, 1.0, 0.0, 0.0, 0.01]}
    far = {**event("Y", ["dog"], 60), "vector": [0.0, 0.0, 0.0, 1.0, 0.01]}
    answered, _ = ask([near, far], "my dog loves the park")
    assert answered.used_ids == [] and answered.details["no_relevant_memory"]


def test_reference_code_events_are_keyed_by_their_noun_string():
    ep = ld_episode([[("Ann", "my dog at the park"), ("Bob", "nice")], [("Ann", "hello"), ("Bob", "hi")]])
    embed = Embedder()
    ctx = MethodContext(settings=LDAgentSettings(scoring="reference_code"), llm=FakeChat(responder=ld_responder),
                        embed=embed)
    out = asyncio.run(VocabNouns().build(ctx, ep))
    assert "dog,park" in embed.inputs and "They talked." not in embed.inputs
    paper = Embedder()
    asyncio.run(VocabNouns().build(MethodContext(settings=LDAgentSettings(), llm=FakeChat(responder=ld_responder),
                                                 embed=paper), ep))
    assert "They talked." in paper.inputs and out["events"][0]["nouns"] == ["dog", "park"]


def test_ldagent_prompt_sections_are_reworded_with_every_element():
    from stages.methods.ld_agent.prompts import AGENT_TRAITS, MEMORY, USER_TRAITS, reply_messages

    system, user = (m["content"] for m in reply_messages("Bob", "Ann", ["I fix clocks."], ["I keep bees."],
                                                         ["(3 days ago) they met"], [], "hi", 30))
    assert "<USER TRAITS>" in user and "Ann" in user.split("<USER TRAITS>")[1] and "- I keep bees." in user
    assert "personal traits" in USER_TRAITS.lower() and "recent" in USER_TRAITS and "noticed" not in USER_TRAITS
    assert "<MEMORY>" in MEMORY and "(3 days ago) they met" in user and "linked" not in MEMORY
    assert "personal traits" in AGENT_TRAITS.lower() and "- I fix clocks." in system and "Here are" not in AGENT_TRAITS


def test_the_ldagent_sheet_cites_what_the_reference_code_settles_and_marks_the_suspect_row():
    cfg = config("ldagent_msc")
    protocol = cfg.paper.protocol
    for name in ("ld_agent", "ld_agent_base"):
        setting = protocol[f"method.{name}.short_term_turns"]
        assert setting.value == 30 and "context_memory_number" in setting.source
    assert "DefaultEmbeddingFunction" in protocol["embedding.model"].source
    # Table 4 implicates zero-shot ChatGLM's Table 1 Session 3 row (not on the sheet), not ChatGPT's.
    session_3 = [r for r in cfg.paper.results if r.name.startswith("ChatGPT, MSC Session 3")]
    assert len(session_3) == 3 and all(r.source.startswith("most likely genuine") and "ChatGLM's Table 1 Session 3"
                                       in r.source and "5.59/1.49/16.47" in r.source for r in session_3)
    assert not any(r.source.startswith("SUSPECT") for r in cfg.paper.results)
    assert deviations(cfg) == []
