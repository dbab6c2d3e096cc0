"""Theanine's timelines as the LLM reads them (issue 26): relations in their direction (App. A.1),
the no-relation ablation without relations, memory time with the corpus's gaps, one copy of each
timeline, and no answer without an embedder."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest
from pipeline.testing.fake_chat import FakeChat

from pipeline.errors import ConfigError
from stages.methods.base import EpisodeInput, MethodContext, ProbeInput
from stages.methods.shared.session_memories import (
    gap_phrase,
    memory_lines,
    memory_rows,
    memory_when,
    when,
)
from stages.methods.theanine import (
    Theanine,
    TheanineNoRelationSettings,
    TheanineSettings,
    prompts,
)
from stages.methods.theanine import graph as g


def memory(mid: str, event: str, gap: str | None = None, vector: list[float] | None = None) -> dict:
    session, idx = (int(x) for x in mid.split(":"))
    return {"episode_id": "e1", "memory_id": mid, "session_idx": session, "memory_idx": idx, "event": event,
            "session_time": None, "session_gap": gap, "source_turn_ids": [f"D{session}:1"],
            "vector": vector or [0.0, 0.0, 1.0]}


PUPPY = [memory("1:0", "Ann adopted a puppy."),
         memory("2:0", "The puppy chewed Ann's shoes.", "3 days later"),
         memory("3:0", "Ann learned the puppy was teething.", "2 weeks later")]


# ------------------------------------------------------------------------- relations, in their direction

def test_a_timeline_reads_each_relation_from_the_earlier_memory_to_the_later_one():
    # Edges 1:0 -Cause-> 2:0 -Reason-> 3:0: "1 caused 2" and "2 is due to 3", never the reverse.
    assert prompts.timeline_text(PUPPY, ["Cause", "Reason"]) == (
        "1. [session 1] Ann adopted a puppy.\n"
        "   memory 1 -> memory 2 (Cause): what happened in memory 1 brought about what happened in memory 2\n"
        "2. [session 2 (3 days after session 1)] The puppy chewed Ann's shoes.\n"
        "   memory 2 -> memory 3 (Reason): what happened in memory 2 happened because of what memory 3 describes\n"
        "3. [session 3 (2 weeks after session 2)] Ann learned the puppy was teething.")


def test_hindered_by_and_changed_say_which_memory_does_what():
    text = prompts.timeline_text(PUPPY, ["Changed", "HinderedBy"])
    assert ("memory 1 -> memory 2 (Changed): what memory 1 describes turned into what memory 2 describes"
            in text)
    assert ("memory 2 -> memory 3 (HinderedBy): what memory 3 describes could be hindered by what memory 2 "
            "describes, or the other way round" in text)


def test_every_relation_has_a_definition_and_the_labeller_reads_them_from_a_to_b():
    assert set(prompts.RELATION_DEFINITIONS) == set(g.RELATIONS)
    msgs = prompts.relation_messages(PUPPY[1], PUPPY[2], "Ann: my shoes!", "Ann: he is teething")
    assert "- Reason: what happened in A happened because of what B describes" in msgs[0]["content"]
    assert "Memory A [session 2 (3 days after session 1)]: The puppy chewed" in msgs[1]["content"]
    assert "Memory B [session 3 (2 weeks after session 2)]: Ann learned" in msgs[1]["content"]


def test_the_refinement_and_the_raw_timeline_response_carry_the_relation_definitions():
    raw = prompts.timeline_text(PUPPY, ["Cause", "Reason"])
    refine = prompts.refine_messages("Ann: my puppy is better now", raw)
    response = prompts.response_messages("Ann: my puppy is better now", [raw], "Bob", False, raw=True)
    for msgs in (refine, response):
        text = "\n".join(m["content"] for m in msgs)
        for name in g.RELATIONS:
            assert f"- {name}: {prompts.relation_meaning(name)}" in text
        assert "with A the earlier and B the later memory" in text
    assert "Timeline 1:\n1. [session 1] Ann adopted a puppy." in response[1]["content"]
    # The refined timelines are prepared text: no guide for them.
    refined = prompts.response_messages("Ann: hi", ["Ann's puppy is teething."], "Bob", False)
    assert "- Ann's puppy is teething." in refined[1]["content"] and "Cause" not in refined[1]["content"]


# ------------------------------------------------------------------------- the no-relation ablation

def test_the_no_relation_ablation_shows_only_chronological_order():
    text = prompts.timeline_text(PUPPY, [g.SIMILAR, g.SIMILAR])
    assert text == ("1. [session 1] Ann adopted a puppy.\n"
                    "   memory 1 -> memory 2: later\n"
                    "2. [session 2 (3 days after session 1)] The puppy chewed Ann's shoes.\n"
                    "   memory 2 -> memory 3: later\n"
                    "3. [session 3 (2 weeks after session 2)] Ann learned the puppy was teething.")
    guide = prompts.relation_guide(relation_aware=False)
    refine = "\n".join(m["content"] for m in prompts.refine_messages("Ann: hi", text, relation_aware=False))
    for name in g.RELATIONS:
        assert name not in text and name not in guide and name not in refine
    assert "None" not in text  # an all-candidates "None" edge reads the same way
    assert prompts.timeline_text(PUPPY[:2], [g.NO_RELATION]).splitlines()[1] == "   memory 1 -> memory 2: later"


def test_the_no_relation_ablation_answers_with_timelines_that_name_no_relation():
    edges = [{"source": "1:0", "target": "2:0", "relation": g.SIMILAR},
             {"source": "2:0", "target": "3:0", "relation": g.SIMILAR}]
    llm = FakeChat(responder=respond)
    answer = asyncio.run(Theanine().answer(context(TheanineNoRelationSettings(k=1), llm), probe_input(),
                                           {"memories": PUPPY, "edges": edges}))
    assert answer.details["raw_timelines"] and "memory 1 -> memory 2: later" in answer.details["raw_timelines"][0]
    prompts_seen = "\n".join(m["content"] for c in llm.calls for m in c["messages"])
    assert not [name for name in g.RELATIONS if name in prompts_seen]


# ------------------------------------------------------------------------- memory time with the gaps

def test_a_memory_of_session_3_after_a_two_week_gap_carries_the_gap():
    turns = [{"speaker": "Ann", "text": "hi again", "turn_idx": 0, "source_turn_id": "D3:1",
              "session_time": None, "session_gap_label": "2 weeks later"}]
    row = memory_rows("e1", 3, turns, ["Ann started a new job."])[0]
    assert row["session_gap"] == "2 weeks later"
    assert memory_when(row) == "session 3 (2 weeks after session 2)"
    assert memory_lines([row]) == "[session 3 (2 weeks after session 2)] Ann started a new job."
    assert "[session 3 (2 weeks after session 2)] Ann started" in prompts.timeline_text([row], [])


def test_gap_labels_of_msc_and_conversation_chronicles_read_as_time_since_the_previous_session():
    assert gap_phrase("a few months later", 4) == "a few months after session 3"
    assert gap_phrase("A few hours after", 2) == "a few hours after session 1"
    assert gap_phrase("1 weeks after", 5) == "1 week after session 4"
    assert gap_phrase("the next morning", 2) == "the next morning since session 1"
    assert when(2, "2023-01-02", "1 day later") == "session 2 (2023-01-02; 1 day after session 1)"
    assert when(2, "2023-01-02") == "session 2 (2023-01-02)" and when(1, None, "2 weeks later") == "session 1"
    assert memory_when({"session_idx": 2, "memory_idx": 0}) == "session 2"  # rows from before the gap column


def test_the_labeller_sees_the_gap_of_each_memory_when_building():
    sessions = {s: [{"speaker": "Ann", "text": f"about my dog {s}", "turn_idx": 0, "source_turn_id": f"D{s}:1",
                     "session_time": None, "session_gap_label": None if s == 1 else "2 weeks later"}]
                for s in (1, 2, 3)}
    llm = FakeChat(responder=respond)
    out = asyncio.run(Theanine().build(MethodContext(settings=TheanineSettings(), llm=llm, embed=embed_all),
                                       EpisodeInput(episode={"episode_id": "e1"}, sessions=sessions)))
    assert [m["session_gap"] for m in out["memories"]] == [None, "2 weeks later", "2 weeks later"]
    labels = [c["messages"][1]["content"] for c in llm.calls if c["schema"].__name__ == "RelationLabel"]
    assert any("Memory B [session 3 (2 weeks after session 2)]" in text for text in labels)


# ------------------------------------------------------------------------- one copy of each timeline

CHAIN = [memory("1:0", "Ann adopted a puppy.", vector=[1.0, 0.0, 0.0]),
         memory("2:0", "The puppy chewed Ann's shoes.", "3 days later", vector=[0.9, 0.1, 0.0]),
         memory("3:0", "Ann learned the puppy was teething.", "2 weeks later", vector=[0.0, 1.0, 0.0])]
CHAIN_EDGES = [{"source": "1:0", "target": "2:0", "relation": "Cause"},
               {"source": "2:0", "target": "3:0", "relation": "Reason"}]


@pytest.mark.parametrize("dedupe", [True, False])
def test_two_retrieved_memories_on_one_chain_give_one_timeline(dedupe):
    llm = FakeChat(responder=respond)
    answer = asyncio.run(Theanine().answer(context(TheanineSettings(k=2, dedupe_timelines=dedupe), llm), probe_input(),
                                           {"memories": CHAIN, "edges": CHAIN_EDGES}))
    d = answer.details
    assert d["retrieved"] == ["1:0", "2:0"]  # both on the chain 1:0 -> 2:0 -> 3:0
    if dedupe:
        assert d["timelines"] == [["1:0", "2:0", "3:0"]] and d["dropped"] == 1
    else:
        assert d["timelines"] == [["1:0", "2:0", "3:0"]] * 2 and d["dropped"] == 0
    assert len([c for c in llm.calls if c["schema"].__name__ == "Refined"]) == len(d["timelines"])


def test_a_memory_whose_only_path_is_taken_adds_no_timeline_and_is_counted():
    used = {("1:0", "2:0", "3:0")}
    found = g.timelines_through("2:0", g.Graph({"1:0": (1, 0), "2:0": (2, 0), "3:0": (3, 0)},
                                               [g.Edge("1:0", "2:0", "Cause"), g.Edge("2:0", "3:0", "Reason")]))
    assert g.sample_timelines(found, 1, random.Random(0), used) == [] and len(used) == 1


# ------------------------------------------------------------------------- no silent fallback

def test_answering_without_an_embedder_is_an_error_not_an_answer_without_retrieval():
    llm = FakeChat(responder=respond)
    with pytest.raises(ConfigError, match="embedding"):
        asyncio.run(Theanine().answer(context(TheanineSettings(), llm, embed=None), probe_input(),
                                      {"memories": CHAIN, "edges": CHAIN_EDGES}))
    assert llm.calls == []
    with pytest.raises(ConfigError, match="embedding"):
        asyncio.run(Theanine().build(MethodContext(settings=TheanineSettings(), llm=llm, embed=None),
                                     EpisodeInput(episode={"episode_id": "e1"}, sessions={})))


# ------------------------------------------------------------------------- helpers

async def embed_all(texts: list[str]) -> np.ndarray:
    """The query "puppy" is closest to 1:0, then 2:0; any other text is one more direction."""
    return np.array([[1.0, 0.0, 0.0] if "puppy" in t else [0.5, 0.5, 0.0] for t in texts], dtype=np.float32)


def context(settings: TheanineSettings, llm: FakeChat, embed=embed_all) -> MethodContext[TheanineSettings]:
    """What Theanine's answer gets: these settings and LLM, and `embed_all` unless told otherwise."""
    return MethodContext(settings=settings, llm=llm, embed=embed)


def probe_input() -> ProbeInput:
    probe = {"probe_id": "nr:4:1", "kind": "next_response", "session_idx": 4, "turn_idx": 1, "respondent": "Bob",
             "request": "my puppy"}
    current = [{"speaker": "Ann", "text": "my puppy is better now", "turn_idx": 0}]
    return ProbeInput(probe=probe, episode={"speakers": ["Ann", "Bob"]}, history={}, current=current)


def respond(messages, schema):
    if schema.__name__ == "SessionMemories":
        return {"memories": ["Ann talked about her dog"]}
    if schema.__name__ == "RelationLabel":
        return {"relation": "Cause"}
    if schema.__name__ == "Refined":
        return {"information": "Ann's puppy is teething."}
    return {"rationale": "she worries about the puppy", "response": "Is he sleeping better?"}
