"""Theanine's prompts, in our own words (session memories come from `session_memories`): relation labelling (Phase I-2, with the
relation definitions of App. A.1), timeline refinement (Phase II-2) and the timeline-augmented
chain-of-thought response (Phase III). Builders return messages; parsers return typed models."""

from __future__ import annotations

from typing import Literal, Sequence

from pydantic import BaseModel

from pipeline.llm.types import Messages
from stages.methods.session_memories import when

RELATION_DEFINITIONS = {
    "Changed": "what A describes turned into what B describes (a state, plan or fact was updated)",
    "Cause": "what happened in A brought about what happened in B",
    "Reason": "what happened in A happened because of what B describes",
    "HinderedBy": "what B describes could be hindered by what A describes, or the other way round",
    "React": "as a result of A, the person feels what B describes",
    "Want": "as a result of A, the person wants what B describes to happen",
    "SameTopic": "A and B talk about the same specific topic",
}

Relation = Literal["Changed", "Cause", "Reason", "HinderedBy", "React", "Want", "SameTopic", "None"]


class RelationLabel(BaseModel):
    relation: Relation


class Refined(BaseModel):
    information: str


class ReasonedResponse(BaseModel):
    rationale: str
    response: str


def relation_messages(older: dict, newer: dict, older_dialogue: str, newer_dialogue: str) -> Messages:
    definitions = "\n".join(f"- {name}: {text}" for name, text in RELATION_DEFINITIONS.items())
    system = ("You connect memories of a long conversation. Memory A was formed before memory B. Pick the "
              "relation that holds from A to B, or None when they share words but no real relation.\n"
              f"Relations:\n{definitions}\n- None: no relation beyond surface similarity")
    user = (f"Memory A ({when(older['session_idx'], older.get('session_time'))}): {older['event']}\n"
            f"Where A comes from:\n{older_dialogue}\n\n"
            f"Memory B ({when(newer['session_idx'], newer.get('session_time'))}): {newer['event']}\n"
            f"Where B comes from:\n{newer_dialogue}\n\n"
            'Reply in JSON: {"relation": one of ' + ", ".join([*RELATION_DEFINITIONS, "None"]) + "}.")
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def timeline_text(timeline: Sequence[dict], relations: Sequence[str | None]) -> str:
    """Memories oldest first, each with its time and the relation that links it to the previous one."""
    lines = []
    for i, m in enumerate(timeline):
        link = f" [{relations[i - 1]} of the previous]" if i and relations[i - 1] else ""
        lines.append(f"{i + 1}. ({when(m['session_idx'], m.get('session_time'))}){link} {m['event']}")
    return "\n".join(lines)


def refine_messages(dialogue: str, timeline: str) -> Messages:
    system = ("You prepare background for a reply in an ongoing conversation. Given a timeline of how "
              "related past events developed, write what in it matters for the next reply right now: keep "
              "the facts that apply, note what changed and what is current, drop what does not help.")
    user = (f"Current conversation:\n{dialogue}\n\nTimeline of past events:\n{timeline}\n\n"
            'Reply in JSON: {"information": "..."}.')
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def response_messages(dialogue: str, refined: Sequence[str], respondent: str, question: bool) -> Messages:
    background = "\n".join(f"- {r}" for r in refined) or "- (nothing relevant remembered)"
    task = ("answer the question in a short phrase" if question
            else f"write {respondent}'s next utterance: a short, natural reply without a speaker label")
    system = (f"You are {respondent}, in a conversation with someone you have talked with before. Think first: "
              "what is the other person after, and which remembered facts help? Then reply.")
    user = (f"What you remember, prepared for this moment:\n{background}\n\nCurrent conversation:\n{dialogue}\n\n"
            f"First give your reasoning in one or two sentences, then {task}. Reply in JSON: "
            '{"rationale": "...", "response": "..."}.')
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]
