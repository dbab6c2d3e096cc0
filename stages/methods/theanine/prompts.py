"""Theanine's prompts, in our own words (session memories come from `session_memories`): relation
labelling (Phase I-2, with the relation definitions of App. A.1), timelines as text (each edge read
from the earlier memory to the later one, as A.1 defines it), timeline refinement (Phase II-2) and
the timeline-augmented chain-of-thought response (Phase III). The refinement, and the response when
it reads raw timelines, get the same definitions. Builders return messages; parsers return typed
models."""

from __future__ import annotations

from typing import Literal, Sequence

from pydantic import BaseModel, Field

from pipeline.llm.types import Messages
from stages.methods.shared.session_memories import memory_when
from stages.methods.theanine.graph import RELATIONS

# What each relation means for an edge from an earlier memory {a} to a later memory {b} (App. A.1,
# in our own words). The labeller reads them with {a}="A", {b}="B"; timelines with the memories' numbers.
RELATION_DEFINITIONS = {
    "Changed": "what {a} describes turned into what {b} describes (a state, plan or fact was updated)",
    "Cause": "what happened in {a} brought about what happened in {b}",
    "Reason": "what happened in {a} happened because of what {b} describes",
    "HinderedBy": "what {b} describes could be hindered by what {a} describes, or the other way round",
    "React": "as a result of {a}, the person feels what {b} describes",
    "Want": "as a result of {a}, the person wants what {b} describes to happen",
    "SameTopic": "{a} and {b} talk about the same specific topic",
}
assert set(RELATION_DEFINITIONS) == set(RELATIONS)


def relation_meaning(relation: str, a: str = "A", b: str = "B") -> str | None:
    """What `relation` says about an edge from the earlier memory `a` to the later memory `b`; None
    for a label that is no relation (the no-relation ablation's SIMILAR, or "None")."""
    text = RELATION_DEFINITIONS.get(relation)
    return text.format(a=a, b=b) if text else None


def relation_guide(relation_aware: bool) -> str:
    """How to read `timeline_text`: the link lines, and (relation-aware) what each relation means."""
    order = ('Memories are numbered oldest first. A line "memory X -> memory Y: later" only says that '
             "memory Y came after memory X.")
    if not relation_aware:
        return "How to read a timeline: " + order
    definitions = "\n".join(f"- {name}: {relation_meaning(name)}" for name in RELATION_DEFINITIONS)
    return ("How to read a timeline: " + order + ' A line "memory X -> memory Y (Relation): ..." links the '
            "earlier memory X to the later memory Y and says what the relation means for them. The relations, "
            f"with A the earlier and B the later memory:\n{definitions}")


Relation = Literal["Changed", "Cause", "Reason", "HinderedBy", "React", "Want", "SameTopic", "None"]


class RelationLabel(BaseModel):
    # The explanation comes first, so the label is written after the reasoning (Fig. 16's order). Its
    # default only spares a caller that sends the label alone; the endpoint is held to both fields
    # (strict mode makes every property required).
    explanation: str = Field(default="", description="why the relation holds, or why none does, in a sentence or two")
    relation: Relation


class Refined(BaseModel):
    information: str


class ReasonedResponse(BaseModel):
    rationale: str
    response: str


def relation_messages(older: dict, newer: dict, older_dialogue: str, newer_dialogue: str) -> Messages:
    """The labelling call for one (older, newer) memory pair: both events, their times (with the
    corpus's gaps) and their origin dialogues; the answer is a RelationLabel from A to B, its
    explanation first. Fig. 16's protocol in our words: the six specific relations are tried first,
    SameTopic / None only when none fits; a relation needs clear support (else None, no reading
    beyond the memories); who each memory is about matters."""
    named = [n for n in RELATION_DEFINITIONS if n != "SameTopic"]
    step1 = "\n".join(f"- {name}: {relation_meaning(name)}" for name in named)
    system = ("You connect memories of a long conversation. Memory A was formed before memory B. Decide "
              "which relation, if any, holds from A to B. Work in two steps.\n"
              "Step 1. Go through the six specific relations and check each against the two memories:\n"
              f"{step1}\n"
              "Step 2. Only when none of the six fits, choose one of the two remaining labels:\n"
              f"- SameTopic: {relation_meaning('SameTopic')}\n"
              "- None: the memories are unrelated, or share words but nothing more\n"
              "Rules:\n"
              "- Give a relation (SameTopic included) only when the memories and their dialogues plainly "
              "support it; when in doubt, answer None. Do not infer more than the memories and their "
              "dialogues say.\n"
              "- Check who each memory is about. The two memories may concern different speakers: a relation "
              "must hold between those people as stated, not between events you attach to the wrong person.")
    user = (f"Memory A [{memory_when(older)}]: {older['event']}\n"
            f"Where A comes from:\n{older_dialogue}\n\n"
            f"Memory B [{memory_when(newer)}]: {newer['event']}\n"
            f"Where B comes from:\n{newer_dialogue}\n\n"
            "First explain in one or two sentences how the memories relate (or why they do not), then give "
            'the label. Reply in JSON, the fields in this order: {"explanation": "...", "relation": one of '
            + ", ".join([*RELATION_DEFINITIONS, "None"]) + "}.")
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def timeline_text(timeline: Sequence[dict], relations: Sequence[str | None]) -> str:
    """A timeline as text: its memories oldest first, numbered, each with its time, and between two
    memories the edge that joins them read in its direction (earlier -> later). `relations[i]` is the
    label of the edge from memory i+1 to memory i+2; a label outside the relation set (the
    no-relation ablation's, or "None") shows the order only."""
    lines = []
    for i, m in enumerate(timeline):
        if i and relations[i - 1]:
            a, b = f"memory {i}", f"memory {i + 1}"
            meaning = relation_meaning(relations[i - 1], a, b)  # type: ignore[arg-type]
            lines.append(f"   {a} -> {b} ({relations[i - 1]}): {meaning}" if meaning else f"   {a} -> {b}: later")
        lines.append(f"{i + 1}. [{memory_when(m)}] {m['event']}")
    return "\n".join(lines)


def refine_messages(dialogue: str, timeline: str, relation_aware: bool = True) -> Messages:
    """The refinement call for one raw timeline (`timeline_text`) given the current dialogue; the
    answer is Refined. The system message explains the timeline's links (`relation_guide`)."""
    # Fig. 17's fallback, in our words: a label that does not suit its link is dropped, not forced.
    misfit = (" When the relation on a link does not fit the two events it joins, leave the label out and "
              "connect the events in plain words as they naturally follow." if relation_aware else "")
    system = ("You prepare background for a reply in an ongoing conversation. Given a timeline of how "
              "related past events developed, write what in it matters for the next reply right now: keep "
              "the facts that apply, note what changed and what is current, drop what does not help."
              + misfit + "\n\n" + relation_guide(relation_aware))
    user = (f"Current conversation:\n{dialogue}\n\nTimeline of past events:\n{timeline}\n\n"
            'Reply in JSON: {"information": "..."}.')
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def response_messages(dialogue: str, background: Sequence[str], respondent: str, question: bool,
                      raw: bool = False, relation_aware: bool = True) -> Messages:
    """The chain-of-thought response call (answer: ReasonedResponse). `background`: the refined
    timelines, or with `raw` the raw `timeline_text`s (Theanine without refinement), which then
    come with `relation_guide`."""
    if raw:
        timelines = "\n\n".join(f"Timeline {i + 1}:\n{t}" for i, t in enumerate(background))
        remembered = ("What you remember, as timelines of past events.\n" + relation_guide(relation_aware)
                      + "\n\n" + (timelines or "(nothing relevant remembered)"))
    else:
        remembered = ("What you remember, prepared for this moment:\n"
                      + ("\n".join(f"- {r}" for r in background) or "- (nothing relevant remembered)"))
    task = ("answer the question in a short phrase" if question
            else f"write {respondent}'s next utterance: a short, natural reply in the manner of the conversation "
                 "so far (its tone, wording and length of turns), without a speaker label")
    # Fig. 18's cautions, in our words: memory is optional, and misleading memory is left out.
    system = (f"You are {respondent}, in a conversation with someone you have talked with before. Think first: "
              "what is the other person after, and which remembered facts help? Then reply. Use what you "
              "remember only where it helps: leave out any remembered detail that would lead the reply astray "
              "(outdated, beside the point, or at odds with the conversation).")
    user = (f"{remembered}\n\nCurrent conversation:\n{dialogue}\n\n"
            f"First give your reasoning in one or two sentences, then {task}. Reply in JSON: "
            '{"rationale": "...", "response": "..."}.')
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]
