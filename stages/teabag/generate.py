"""TeaBag generation (Theanine Sec. 5.1, App. B-C), as pure functions with the LLM injected.

Step (1) of TeaFarm summarises each past session with TeaBag's own prompt (not the memory methods'
session-memory prompt, so even on the same model the notes are not the tested methods' memories).
Steps (2)-(5): the summaries go to the generator in chronological order so it knows the newest stage of every event; it writes counterfactual questions from one
speaker's side (spoken as if an outdated or false thing were true) with the correct answer and the
sessions it rests on; our optional check asks whether each question really contradicts the
summaries; then a new session is written in which the two speakers, in strict turn, talk naturally
towards the question, which closes it verbatim. The session is told to keep the truth out of the
talk, and our optional leak check rejects (and keeps) a session that gives it away anyway.

All wording is ours; the paper's prompts are not reproduced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from pydantic import BaseModel, Field, create_model

from pipeline.llm.types import ChatLLM, Messages
from stages.dialogue import format_unit
from stages.methods.shared.session_memories import when

SUMMARY_SYSTEM = (
    "You take notes on one session of a conversation between two people: events, plans, decisions, changes "
    "and facts about each speaker, and where anything they spoke of before now stands. One short sentence "
    "per note, naming the speaker; only what this session says."
)
SUMMARY_USER = (
    "Conversation ({when}):\n{dialogue}\n\nList at most {max_notes} notes. Reply in JSON: "
    "{{\"notes\": [\"...\", \"...\"]}}."
)
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
    "of talking and what they know of each other. {asker} opens with something everyday and the talk "
    "drifts, without hurry, towards a topic where {asker} will ask a question. You write only the turns "
    "before that question: the two speak strictly in turn, {asker} first, and the last turn you write is "
    "{answerer}'s, after which the question is a natural next thing for {asker} to say. The session must "
    "not give the answer away: nobody states, hints at or confirms the correct answer or the true current "
    "state of the event the question is about, and nobody corrects the mistaken belief it rests on, "
    "because the question tests whether {answerer} remembers that from earlier sessions."
)
SESSION_USER = (
    "Notes of the past sessions, oldest first:\n{notes}\n\nHow they talked last time:\n{style}\n\n"
    "The question {asker} will ask right after your turns: {question}\n"
    "What it wrongly takes for granted: {false_premise}\n"
    "The truth, which must stay out of this session: {answer}\n\n"
    "{feedback}Write about {exchanges} exchanges, each {asker} speaking and then {answerer} replying. "
    "Reply in JSON: {{\"exchanges\": [{{\"asker\": what {asker} says, \"answerer\": what {answerer} "
    "replies}}, ...]}}."
)
LEAK_SYSTEM = (
    "You review conversations written for a memory test. Right after the conversation, one speaker asks "
    "the other a question built on a mistaken belief, and the test is whether the other remembers the "
    "truth from earlier sessions. A conversation gives the truth away when any turn states, hints at or "
    "confirms the correct answer or the true current state of the event, or corrects the mistaken "
    "belief, so that the truth could be found in this conversation alone. Otherwise it keeps the truth "
    "hidden; talk near the topic that reveals nothing about its current state is fine."
)
LEAK_USER = (
    "The conversation:\n{session}\n\nThe question that follows ({asker} to {answerer}): {question}\n"
    "The mistaken belief: {false_premise}\nThe truth: {answer}\n\n"
    "Does the conversation keep the truth hidden? Reply in JSON: {{\"hidden\": true | false, "
    "\"reason\": one short sentence}}."
)
PROMPTS = {"summary.system": SUMMARY_SYSTEM, "summary.user": SUMMARY_USER, "question.system": QUESTION_SYSTEM, "question.user": QUESTION_USER, "check.system": CHECK_SYSTEM,
           "check.user": CHECK_USER, "session.system": SESSION_SYSTEM, "session.user": SESSION_USER,
           "leak.system": LEAK_SYSTEM, "leak.user": LEAK_USER}


class SessionNotes(BaseModel):
    notes: list[str] = Field(description="short notes about the speakers from this session, one per item")


class Verdict(BaseModel):
    counterfactual: bool
    reason: str = Field(default="", max_length=400)


class LeakVerdict(BaseModel):
    hidden: bool  # true: the session keeps the truth out of the talk
    reason: str = Field(default="", max_length=400)


def question_schema(n_sessions: int) -> type[BaseModel]:
    """A question whose evidence can only name sessions that exist (1..n_sessions)."""
    session: Any = Literal[tuple(range(1, n_sessions + 1))]
    return create_model("CounterfactualQuestion", question=(str, Field(min_length=1)),
                        false_premise=(str, ...), answer=(str, Field(min_length=1)),
                        evidence_sessions=(list[session], Field(default_factory=list, max_length=n_sessions)))


def session_schema(max_exchanges: int) -> type[BaseModel]:
    """Session N+1 as exchanges, the asker speaking and then the answerer: the turns alternate and the
    answerer speaks last before the asker's question, by construction."""
    exchange = create_model("Exchange", asker=(str, Field(min_length=1)), answerer=(str, Field(min_length=1)))
    return create_model("NewSession", exchanges=(list[exchange], Field(min_length=1, max_length=max_exchanges)))


def summary_messages(turns: Sequence[dict], session_idx: int, time: str | None, max_notes: int) -> Messages:
    user = SUMMARY_USER.format(when=when(session_idx, time), dialogue=format_unit(turns), max_notes=max_notes)
    return [{"role": "system", "content": SUMMARY_SYSTEM}, {"role": "user", "content": user}]


async def summarize_session(llm: ChatLLM, turns: Sequence[dict], session_idx: int, time: str | None,
                            max_notes: int) -> list[str]:
    """Step (1) for one session: at most `max_notes` notes, blanks dropped."""
    result = await llm.chat(summary_messages(turns, session_idx, time, max_notes), schema=SessionNotes)
    return [n.strip() for n in result.parsed.notes if n.strip()][:max_notes]


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


@dataclass(frozen=True)
class Review:
    """Our check of each try (the counterfactual check of a question, the leak check of a session):
    `check` whether to run it, `max_attempts` tries in all, `checker` the LLM that reviews (None: the
    generator's)."""

    check: bool = True
    max_attempts: int = 3
    checker: ChatLLM | None = None

    @property
    def tries(self) -> int:
        return self.max_attempts if self.check else 1


async def generate_question(llm: ChatLLM, summaries: Sequence[Summary], speakers: Sequence[str], asker: str,
                            answerer: str, *, avoid: Sequence[str] = (), review: Review = Review(),
                            params: dict[str, Any] | None = None) -> Generated:
    """Steps (2)-(3) for one question slot, with our counterfactual check when `review.check`: a rejected
    question is regenerated (told why) up to `review.max_attempts` tries, and every reject is kept.

    Raises LLMError when the generator fails outright."""
    notes = notes_text(summaries)
    n_sessions = max((s.session_idx for s in summaries), default=1)
    schema = question_schema(n_sessions)
    rejects: list[Attempt] = []
    feedback = None
    for attempt in range(review.tries):
        result = await llm.chat(question_messages(notes, speakers, asker, answerer, avoid, feedback), schema=schema,
                                sample=attempt, **(params or {}))
        p = result.parsed
        a = Attempt(attempt, p.question.strip(), p.false_premise.strip(), p.answer.strip(),
                    sorted(set(p.evidence_sessions)))
        if not review.check:
            return Generated(a)
        verdict = (await (review.checker or llm).chat(check_messages(notes, asker, answerer, a), schema=Verdict,
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


@dataclass(frozen=True)
class SessionBrief:
    """What session N+1 is written from: the notes of sessions 1..N, who asks and who answers, the
    accepted question, and session N's turns (how these two talk)."""

    summaries: Sequence[Summary]
    asker: str
    answerer: str
    question: Attempt
    last_session: Sequence[dict]


@dataclass(frozen=True)
class SessionShape:
    """Session N+1's length: about `turns` turns before the question, `style_turns` of session N shown."""

    turns: int = 8
    style_turns: int = 6


@dataclass
class SessionAttempt:
    """One written session N+1 (its turns end with the question), kept whether it was used or not."""

    attempt: int
    turns: list[dict[str, str]]
    hidden: bool | None = None  # the leak check's verdict; None: not checked
    reason: str | None = None


@dataclass
class WrittenSession:
    """One question's session N+1: the session used (None when every attempt leaked) and the rejects."""

    accepted: SessionAttempt | None
    rejects: list[SessionAttempt] = field(default_factory=list)


def exchanges(turns: int) -> int:
    """The exchanges (the asker's turn and the answerer's reply) of a session N+1 of about `turns`
    turns before the question: what the prompt asks for and the most the reply may hold."""
    return max(1, turns // 2)


def session_messages(notes: str, style: str, asker: str, answerer: str, q: Attempt, turns: int,
                     feedback: str | None) -> Messages:
    names = {"asker": asker, "answerer": answerer}
    feedback_text = f"A reviewer rejected the previous try: {feedback}\n\n" if feedback else ""
    user = SESSION_USER.format(notes=notes, style=style, question=q.question, false_premise=q.false_premise,
                               answer=q.answer, feedback=feedback_text, exchanges=exchanges(turns), **names)
    return [{"role": "system", "content": SESSION_SYSTEM.format(**names)}, {"role": "user", "content": user}]


def leak_messages(asker: str, answerer: str, q: Attempt, turns: Sequence[dict]) -> Messages:
    """The leak check sees the turns before the question, the question, its false premise and the truth."""
    session = "\n".join(f"{t['speaker']}: {t['text']}" for t in turns) or "(no turns)"
    user = LEAK_USER.format(session=session, asker=asker, answerer=answerer, question=q.question,
                            false_premise=q.false_premise, answer=q.answer)
    return [{"role": "system", "content": LEAK_SYSTEM}, {"role": "user", "content": user}]


def _no_blank_turns(parsed: Any) -> None:
    if any(not e.asker.strip() or not e.answerer.strip() for e in parsed.exchanges):
        raise ValueError("every turn needs words; a blank turn would break the alternation")


async def synthesize_session(llm: ChatLLM, brief: SessionBrief, shape: SessionShape = SessionShape(), *,
                             sample: int = 0, feedback: str | None = None,
                             params: dict[str, Any] | None = None) -> list[dict[str, str]]:
    """Steps (4)-(5): the new session's turns, the brief's asker and answerer in strict turn from the
    asker, ending with its question spoken verbatim by the asker. `sample` and `feedback` make a retry a
    new call."""
    asker, answerer, q, turns = brief.asker, brief.answerer, brief.question, shape.turns
    messages = session_messages(notes_text(brief.summaries), style_sample(brief.last_session, shape.style_turns),
                                asker, answerer, q, turns, feedback)
    # The schema allows the exchanges the prompt asks for (`turns // 2`), never more.
    result = await llm.chat(messages, schema=session_schema(exchanges(turns)), validate=_no_blank_turns,
                            sample=sample, **(params or {}))
    lines = [line for e in result.parsed.exchanges
             for line in ({"speaker": asker, "text": e.asker.strip()}, {"speaker": answerer, "text": e.answerer.strip()})]
    return [*lines, {"speaker": asker, "text": q.question}]


async def write_session(llm: ChatLLM, brief: SessionBrief, shape: SessionShape = SessionShape(), *,
                        review: Review = Review(), params: dict[str, Any] | None = None) -> WrittenSession:
    """Steps (4)-(5) with our leak check when `review.check`: a session whose turns give the truth away is
    written again (sample `attempt`, told why) up to `review.max_attempts` tries, and every leaking one is
    kept.
    The check runs at temperature 0 with the same sample index as the session it reviews.

    Raises LLMError when the generator or the checker fails outright."""
    rejects: list[SessionAttempt] = []
    feedback = None
    for attempt in range(review.tries):
        lines = await synthesize_session(llm, brief, shape, sample=attempt, feedback=feedback, params=params)
        s = SessionAttempt(attempt, lines)
        if not review.check:
            return WrittenSession(s)
        verdict = (await (review.checker or llm).chat(leak_messages(brief.asker, brief.answerer, brief.question,
                                                                    lines[:-1]),
                                                      schema=LeakVerdict, sample=attempt, temperature=0.0)).parsed
        s.hidden, s.reason = verdict.hidden, verdict.reason.strip() or None
        if s.hidden:
            return WrittenSession(s, rejects)
        rejects.append(s)
        feedback = (f"it gave the truth away ({s.reason})" if s.reason else "it gave the truth away")
    return WrittenSession(None, rejects)
