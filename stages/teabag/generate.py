"""TeaBag generation (Theanine Sec. 5.1, App. B-C), as pure functions with the LLM injected.

Steps (2)-(5) of TeaFarm: the session summaries of step (1) (`session_memories`, shared with
the memory methods) go to the generator in chronological order so it knows the newest stage of
every event; it writes counterfactual questions from one speaker's side (spoken as if an outdated
or false thing were true) with the correct answer and the sessions it rests on; our optional check
asks whether each question really contradicts the summaries; then a new session is written in
which the two speakers talk naturally towards the question, which closes it verbatim.

All wording is ours; the paper's prompts are not reproduced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from pydantic import BaseModel, Field, create_model

from pipeline.llm.types import ChatLLM, LLMError, Messages
from stages.methods.session_memories import when

QUESTION_SYSTEM = (
    "You build a test of whether a chat partner really remembers a long relationship. Given notes of "
    "every past session in order, you write one question that {asker} could ask {answerer} at their next "
    "meeting and that quietly treats something as true which the notes show is false or no longer true: "
    "an event that has moved on (a plan that was dropped, a job that changed, a trip that already "
    "happened), or a detail the notes contradict. The question must sound natural, as if {asker} simply "
    "misremembered, and it must be about the latest state of that event, not an early one. A partner who "
    "remembers would correct it; one who does not would go along with it."
)
QUESTION_USER = (
    "Notes of the past sessions between {speakers}, oldest first:\n{notes}\n\n"
    "{avoid}{feedback}Write the question {asker} asks {answerer}. Reply in JSON with: \"question\" (what "
    "{asker} says, a single utterance), \"false_premise\" (what it wrongly takes for granted), \"answer\" "
    "(what a partner who remembers should say, in one sentence) and \"evidence_sessions\" (the session "
    "numbers whose notes show the truth)."
)
CHECK_SYSTEM = (
    "You review test questions for a memory benchmark. A valid question treats as true something that the "
    "session notes show is false or out of date by the latest session, and its stated answer matches what "
    "the notes say. A question that is merely open, that matches the notes, or whose premise the notes "
    "never mention is not valid."
)
CHECK_USER = (
    "Notes of the past sessions, oldest first:\n{notes}\n\nQuestion ({asker} to {answerer}): {question}\n"
    "What it takes for granted: {false_premise}\nStated correct answer: {answer}\n\n"
    "Is this a valid counterfactual question? Reply in JSON: {{\"counterfactual\": true | false, "
    "\"reason\": one short sentence}}."
)
SESSION_SYSTEM = (
    "You write the next session of a long conversation between two people. Keep their names, their way "
    "of talking and what they know of each other. The talk starts on something everyday and drifts, "
    "without hurry, towards a topic where {asker} will ask a question; you write only the turns before "
    "that question, and the last turn you write should make the question a natural next thing to say."
)
SESSION_USER = (
    "Notes of the past sessions, oldest first:\n{notes}\n\nHow they talked last time:\n{style}\n\n"
    "The question {asker} will ask right after your turns: {question}\n\nWrite about {turns} turns, the "
    "two speakers taking turns ({speakers}). Reply in JSON: {{\"turns\": [{{\"speaker\": name, \"text\": "
    "utterance}}, ...]}}."
)
PROMPTS = {"question.system": QUESTION_SYSTEM, "question.user": QUESTION_USER, "check.system": CHECK_SYSTEM,
           "check.user": CHECK_USER, "session.system": SESSION_SYSTEM, "session.user": SESSION_USER}


class Verdict(BaseModel):
    counterfactual: bool
    reason: str = Field(default="", max_length=400)


def question_schema(n_sessions: int) -> type[BaseModel]:
    """A question whose evidence can only name sessions that exist (1..n_sessions)."""
    session: Any = Literal[tuple(range(1, n_sessions + 1))]  # type: ignore[misc]
    return create_model("CounterfactualQuestion", question=(str, Field(min_length=1)),
                        false_premise=(str, ...), answer=(str, Field(min_length=1)),
                        evidence_sessions=(list[session], Field(default_factory=list, max_length=n_sessions)))


def session_schema(speakers: Sequence[str], max_turns: int) -> type[BaseModel]:
    """Session turns spoken only by the episode's two speakers."""
    who: Any = Literal[tuple(speakers)]  # type: ignore[misc]
    turn = create_model("SessionTurn", speaker=(who, ...), text=(str, Field(min_length=1)))
    return create_model("NewSession", turns=(list[turn], Field(min_length=1, max_length=max_turns)))  # type: ignore[valid-type]


@dataclass
class Summary:
    """Step (1): the notes of one past session."""

    session_idx: int
    time: str | None
    memories: list[str]


def notes_text(summaries: Sequence[Summary]) -> str:
    """Step (2): every session's notes in chronological order, whatever order they came in."""
    blocks = []
    for s in sorted(summaries, key=lambda x: x.session_idx):
        lines = "\n".join(f"- {m}" for m in s.memories) or "- (nothing noted)"
        blocks.append(f"[{when(s.session_idx, s.time)}]\n{lines}")
    return "\n".join(blocks)


@dataclass
class Attempt:
    """One generated question, kept whether it was accepted or rejected."""

    attempt: int
    question: str
    false_premise: str
    answer: str
    evidence_sessions: list[int]
    accepted: bool | None = None  # None: not checked
    reason: str | None = None


@dataclass
class Generated:
    """One question slot: the accepted question (None when every attempt was rejected) and the rejects."""

    accepted: Attempt | None
    rejects: list[Attempt] = field(default_factory=list)


def question_messages(notes: str, speakers: Sequence[str], asker: str, answerer: str, avoid: Sequence[str],
                      feedback: str | None) -> Messages:
    names = {"asker": asker, "answerer": answerer}
    avoid_text = ("Do not repeat these questions:\n" + "\n".join(f"- {q}" for q in avoid) + "\n\n") if avoid else ""
    feedback_text = f"A reviewer rejected the previous try: {feedback}\n\n" if feedback else ""
    user = QUESTION_USER.format(speakers=" and ".join(speakers), notes=notes, avoid=avoid_text,
                                feedback=feedback_text, **names)
    return [{"role": "system", "content": QUESTION_SYSTEM.format(**names)}, {"role": "user", "content": user}]


def check_messages(notes: str, asker: str, answerer: str, a: Attempt) -> Messages:
    user = CHECK_USER.format(notes=notes, asker=asker, answerer=answerer, question=a.question,
                             false_premise=a.false_premise, answer=a.answer)
    return [{"role": "system", "content": CHECK_SYSTEM}, {"role": "user", "content": user}]


async def generate_question(llm: ChatLLM, summaries: Sequence[Summary], speakers: Sequence[str], asker: str,
                            answerer: str, *, avoid: Sequence[str] = (), check: bool = True,
                            max_attempts: int = 3, checker: ChatLLM | None = None,
                            params: dict[str, Any] | None = None) -> Generated:
    """Steps (2)-(3) for one question slot, with our counterfactual check when `check`: a rejected
    question is regenerated (told why) up to `max_attempts` tries, and every reject is kept.

    Raises LLMError when the generator fails outright."""
    notes = notes_text(summaries)
    n_sessions = max((s.session_idx for s in summaries), default=1)
    schema = question_schema(n_sessions)
    rejects: list[Attempt] = []
    feedback = None
    for attempt in range(max_attempts if check else 1):
        result = await llm.chat(question_messages(notes, speakers, asker, answerer, avoid, feedback), schema=schema,
                                sample=attempt, **(params or {}))
        p = result.parsed
        a = Attempt(attempt, p.question.strip(), p.false_premise.strip(), p.answer.strip(),
                    sorted(set(p.evidence_sessions)))
        if not check:
            return Generated(a)
        verdict = (await (checker or llm).chat(check_messages(notes, asker, answerer, a), schema=Verdict,
                                               temperature=0.0)).parsed
        a.accepted, a.reason = verdict.counterfactual, verdict.reason.strip() or None
        if a.accepted:
            return Generated(a, rejects)
        rejects.append(a)
        feedback = a.reason or "the question does not contradict the notes"
    return Generated(None, rejects)


def style_sample(turns: Sequence[dict], n: int) -> str:
    """The last `n` turns of the latest past session: how these two talk."""
    return "\n".join(f"{t['speaker']}: {t['text']}" for t in list(turns)[-n:]) or "(no earlier turns)"


async def synthesize_session(llm: ChatLLM, summaries: Sequence[Summary], speakers: Sequence[str], asker: str,
                             question: str, last_session: Sequence[dict], *, turns: int = 8, style_turns: int = 6,
                             params: dict[str, Any] | None = None) -> list[dict[str, str]]:
    """Steps (4)-(5): the new session's turns, ending with `question` spoken verbatim by `asker`."""
    system = SESSION_SYSTEM.format(asker=asker)
    user = SESSION_USER.format(notes=notes_text(summaries), style=style_sample(last_session, style_turns),
                               asker=asker, question=question, turns=turns, speakers=" and ".join(speakers))
    result = await llm.chat([{"role": "system", "content": system}, {"role": "user", "content": user}],
                            schema=session_schema(speakers, 2 * turns), **(params or {}))
    lines = [{"speaker": t.speaker, "text": t.text.strip()} for t in result.parsed.turns if t.text.strip()]
    if not lines:
        raise LLMError("the new session has no turns")
    return [*lines, {"speaker": asker, "text": question}]
