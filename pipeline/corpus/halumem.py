"""HaluMem (Chen et al. 2025, MemTensor/HaluMem; data on the Hugging Face hub, IAAR-Shanghai/HaluMem):
one user's months of conversations with an assistant, each session annotated with the memory points a
memory system should extract from it and followed by questions about what the user said so far.
Two versions read the same way: Halu-Medium (~160K tokens a user) and Halu-Long (~1M tokens a user: the
same sessions with unrelated question-answer pairs, math and ELI5, inserted into them and as sessions of
their own).

The corpus is a JSON Lines file (HaluMem-Medium.jsonl or HaluMem-Long.jsonl), one user a line:
{uuid, persona_info, sessions}. One user = one episode `halumem-<uuid>`; each session a session (numbered
from 1 in the file's order), its time the session's `start_time` ("Dec 15, 2025, 08:41:23", the
release's only date format; ISO 8601 is read too); each message of its `dialogue` a turn (source turn id
"D<session>:<message number from 1>"), spoken by the user, named as the release's eval scripts name them
from `persona_info` ("Name: <name>; Gender: ..."; "user" when it names none), or by "assistant".
`persona_info` is not kept as a persona: it is the user's profile the sessions were generated from, gold
no method of the official eval is shown.

Each session's `memory_points` are the episode's gold memory points (the `memory_points` table), id
"<episode id>-s<session>-m<index>": content, type, source (primary | secondary | interference, a
distractor the assistant states that must not be taken as fact | system), `is_update` (the release writes
"True"/"False" as strings; booleans are read too) with the memories it revises (`original_memories`),
importance and timestamp. Each of its `questions` is a QA row (id "<episode id>-s<session>-q<i>"): the
question, the gold answer, category = `question_type`, `difficulty` unused. Its evidence is memory points
({memory_content, memory_type}), not turns, and nothing in the release ties a point to the messages it
came from, so `evidence` is null; the evidence contents go to `judge_notes` (the judge reads them beside
the gold, no method sees them) and the sessions whose memory points hold them, among this session and the
ones before, to `evidence_sessions` ("D<session>", the session part of the turn ids). The official eval
asks a session's questions right after adding the session to memory, before the next session: the QA row
is `asked_after_session` its session (the probe then sees sessions 1..s and their memory) and
`asked_at` the session's `end_time`.

Sessions marked `is_generated_qa_session` (Halu-Long only: the release's stage6_3 script inserts them
between sessions, each a batch of the unrelated question-answer pairs, with no memory points and no
questions, its time a random moment between two sessions, so not always in order) are part of the history:
the official eval adds their dialogue to memory like any session's and only leaves them out of memory
scoring and questions. Here they are sessions like the others, marked by a session note of kind
`filler` (the episode's `notes`), so a scorer can leave them out as the official eval does; their memory
points and questions, which the release leaves empty, are not read, as the eval does not read them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime

from pipeline.corpus.reader import RawRecord
from pipeline.corpus.records import Checker, Episode, MemoryPoint, Note, QAItem, Session, Turn, join, parse_time, shown

DATASET = "halumem"
ASSISTANT = "assistant"
DEFAULT_USER = "user"
FILLER = "filler"  # the note kind of a generated question-answer session: history, outside memory scoring
ROLES = ("user", "assistant")
_NAME = re.compile(r"Name:\s*(.*?);\s*Gender:")  # how the release's eval scripts read the user's name
_TIME_FORMATS = ("%b %d, %Y, %H:%M:%S", "%B %d, %Y, %H:%M:%S")  # "Dec 15, 2025, 08:41:23"
_BOOL_TEXT = {"true": True, "false": False}


def user_name(persona_info: str | None) -> str:
    """The user's name as `persona_info` gives it ("Name: Martin Mark; Gender: ..."); "user" when none."""
    m = _NAME.search(persona_info or "")
    name = m[1].strip() if m else ""
    return name if name and name != ASSISTANT else DEFAULT_USER


def parse_session_time(text: str) -> datetime:
    """A HaluMem time ("Dec 15, 2025, 08:41:23") or what `parse_time` reads (ISO 8601); ValueError otherwise."""
    s = " ".join(text.split())
    for fmt in _TIME_FORMATS:
        try:
            return datetime.strptime(s, fmt)
        except ValueError:
            continue
    try:
        return parse_time(s)
    except ValueError:
        raise ValueError(f"unrecognised date/time {shown(text)} (expected like 'Dec 15, 2025, 08:41:23')") from None


def parse(rec: RawRecord, chk: Checker) -> Episode:
    """One user's line: its sessions, turns, questions and gold memory points."""
    d = chk.obj(rec.data, "")
    uuid = chk.ident(d, "uuid")
    episode_id = f"{DATASET}-{uuid}"
    chk.name(episode_id)
    user = user_name(chk.opt(d, "persona_info", str))
    raw_sessions = chk.req(d, "sessions", list)
    sessions: list[Session] = []
    points: list[MemoryPoint] = []
    qa: list[QAItem] = []
    for i, raw in enumerate(raw_sessions):
        at = join("sessions", i)
        s_idx = i + 1
        sd = chk.obj(raw, at)
        generated = chk.opt(sd, "is_generated_qa_session", bool, at, default=False)
        start = _time(sd, "start_time", at, chk, required=not generated)
        session = Session(_turns(sd, at, s_idx, user, chk), at, time=start)
        sessions.append(session)
        if generated:  # history only: no memory points or questions, as the official eval reads them
            title = chk.opt(sd, "title", str, at)
            named = f" ({title})" if title else ""
            session.notes.append(Note(kind=FILLER, text=f"generated question-answer session{named}: unrelated to the "
                                                        "user, outside memory scoring"))
            continue
        points += _points(sd, at, s_idx, chk)
        questions = chk.opt(sd, "questions", list, at, default=[])
        if not questions:
            continue
        end = _time(sd, "end_time", at, chk, required=True)
        for q_i, raw_q in enumerate(questions):
            qa.append(_question(raw_q, join(join(at, "questions"), q_i), f"{episode_id}-s{s_idx}-q{q_i}", s_idx, end,
                                points, chk))
    return Episode(episode_id=episode_id, dataset=DATASET, sessions=sessions, speakers=[user, ASSISTANT], qa=qa,
                   memory_points=points, id_field="uuid")


def _time(d: Mapping, key: str, at: str, chk: Checker, *, required: bool) -> datetime | None:
    value = chk.req(d, key, str, at) if required else chk.opt(d, key, str, at)
    if value is None:
        return None
    try:
        return parse_session_time(value)
    except ValueError as e:
        chk.fail(join(at, key), str(e))


def _turns(sd: Mapping, at: str, s_idx: int, user: str, chk: Checker) -> list[Turn]:
    """The session's messages in order, the user's named `user`."""
    path = join(at, "dialogue")
    turns = []
    for n, raw in enumerate(chk.req(sd, "dialogue", list, at)):
        m_at = join(path, n)
        m = chk.obj(raw, m_at)
        role = chk.req(m, "role", str, m_at)
        if role not in ROLES:
            chk.fail(join(m_at, "role"), f"expected one of {', '.join(ROLES)}, got {shown(role)}")
        turns.append(Turn(speaker=user if role == "user" else ASSISTANT, text=chk.req(m, "content", str, m_at),
                          path=m_at, source_turn_id=f"D{s_idx}:{n + 1}"))
    return turns


def _flag(value: object, path: str, chk: Checker) -> bool | None:
    """`is_update`: the release's "True"/"False" strings, or a JSON boolean."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _BOOL_TEXT:
        return _BOOL_TEXT[value.strip().lower()]
    chk.fail(path, f'expected "True", "False" or a boolean, got {shown(value)}')


def _points(sd: Mapping, at: str, s_idx: int, chk: Checker) -> list[MemoryPoint]:
    path = join(at, "memory_points")
    points = []
    for n, raw in enumerate(chk.opt(sd, "memory_points", list, at, default=[])):
        p_at = join(path, n)
        p = chk.obj(raw, p_at)
        originals = chk.opt(p, "original_memories", list, p_at)
        if originals is not None:
            originals = list(chk.str_list(originals, join(p_at, "original_memories")))
        importance = chk.opt(p, "importance", (int, float), p_at)
        points.append(MemoryPoint(
            session_idx=s_idx, index=chk.ident(p, "index", p_at), content=chk.req(p, "memory_content", str, p_at),
            path=p_at, memory_type=chk.opt(p, "memory_type", str, p_at),
            memory_source=chk.opt(p, "memory_source", str, p_at),
            is_update=_flag(p.get("is_update"), join(p_at, "is_update"), chk),
            original_memories=originals,
            importance=None if importance is None else float(importance), timestamp=chk.opt(p, "timestamp", str, p_at)))
    return points


def _question(raw: object, at: str, qa_id: str, s_idx: int, asked_at: datetime | None,
              points: list[MemoryPoint], chk: Checker) -> QAItem:
    """One question of session `s_idx`, asked right after it; `points`: the memory points read so far."""
    q = chk.obj(raw, at)
    question = chk.req(q, "question", str, at)
    answer = chk.req(q, "answer", (str, int, float), at)
    contents: list[str] = []
    for n, ev in enumerate(chk.opt(q, "evidence", list, at, default=[])):
        e_at = join(join(at, "evidence"), n)
        contents.append(chk.req(chk.obj(ev, e_at), "memory_content", str, e_at))
        chk.opt(ev, "memory_type", str, e_at)
    chk.opt(q, "difficulty", str, at)  # easy | medium | hard: checked, not kept (no score reads it)
    wanted = {c.strip() for c in contents}
    held = sorted({p.session_idx for p in points if p.content.strip() in wanted})
    return QAItem(qa_id=qa_id, question=question, answer=str(answer), evidence=None,
                  category=chk.opt(q, "question_type", str, at), path=at, asked_at=asked_at,
                  evidence_sessions=[f"D{s}" for s in held] or None, judge_notes=contents or None,
                  asked_after_session=s_idx)
