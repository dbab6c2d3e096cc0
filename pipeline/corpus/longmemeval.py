"""LongMemEval (Wu et al. 2024; longmemeval_s / _m / _oracle JSON): a list of questions, each asked
after its own haystack of chat sessions between a user and an assistant.

One record = one episode: the haystack sessions (`haystack_sessions`, dated by `haystack_dates`,
named by `haystack_session_ids`) sorted by date, a stable sort as LongMemEval's reader sorts them
(the release's own order is not always by date: `_oracle` is not), speakers `user` and `assistant`,
and the question as its one QA row, asked at `question_date`, with category = `question_type`. A
turn's source id is "<haystack session id>:<turn number from 1>" (LoCoMo's "D3:7" with the dataset's
own session names; the number is the turn's place in its session as released), so the evidence
recall of the score stage works unchanged. The question's evidence is the user turns marked
`has_answer`, as LongMemEval's retrieval metric counts it (run_retrieval.py indexes user turns only;
a single-session-assistant question, whose marked turns are the assistant's, has none), and none
for an abstention question (left out of the metric there). `answer_session_ids` is kept as the
question's `evidence_sessions` (the gold of the session-level metric). Abstention questions
(question_id ending in "_abs") are flagged `abstention`; their `answer` explains why the history
cannot answer them.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime
from typing import cast

from pipeline.corpus.reader import RawRecord
from pipeline.corpus.records import (
    Checker,
    Episode,
    QAItem,
    Session,
    Turn,
    join,
    parse_time,
    shown,
)

log = logging.getLogger(__name__)

DATASET = "longmemeval"
SPEAKERS = ["user", "assistant"]
QUESTION_TYPES = ("single-session-user", "single-session-assistant", "single-session-preference",
                  "multi-session", "temporal-reasoning", "knowledge-update")
ABSTENTION_SUFFIX = "_abs"
# "2023/05/20 (Sat) 02:21", as the release writes every date
_DATE = re.compile(r"^\s*(\d{4})/(\d{1,2})/(\d{1,2})\s*(?:\(\w+\))?\s*(\d{1,2}):(\d{2})\s*$")
# Evidence ids are split on these by the judges (LoCoMo packs several in one string), so a session
# id holding one could not be named in evidence.
_ID_BREAKS = re.compile(r"[;,\s]")


def is_abstention(question_id: str) -> bool:
    """LongMemEval marks a question the history cannot answer by the suffix of its id."""
    return question_id.endswith(ABSTENTION_SUFFIX)


def parse_date(text: str) -> datetime:
    """A LongMemEval date ("2023/05/20 (Sat) 02:21"; the weekday is not checked) or what
    `parse_time` reads (ISO 8601) -> naive datetime; ValueError otherwise."""
    m = _DATE.match(text)
    if m is None:
        return parse_time(text)
    year, month, day, hour, minute = (int(g) for g in m.groups())
    return datetime(year, month, day, hour, minute)


def _date(value: object, path: str, chk: Checker) -> datetime:
    text = chk.check(value, str, path)
    try:
        return parse_date(text)
    except ValueError:
        chk.fail(path, f"unrecognised date {shown(text)} (expected like '2023/05/20 (Sat) 02:21' or ISO 8601)")


def _check_session_ids(ids: list, chk: Checker) -> None:
    """Every haystack session id non-empty, usable in evidence ids, and given once."""
    seen: dict[str, int] = {}
    for i, sid in enumerate(ids):
        at = join("haystack_session_ids", i)
        sid = str(chk.check(sid, (str, int), at))
        if not sid.strip() or _ID_BREAKS.search(sid):
            chk.fail(at, f"session id {shown(sid)} must be non-empty, without spaces, ';' or ','")
        if sid in seen:
            chk.fail(at, f"session id {shown(sid)} is given twice (also at haystack_session_ids[{seen[sid]}])")
        seen[sid] = i


def _session_turns(raw: object, at: str, sid: str, chk: Checker) -> tuple[list[Turn], list[str]]:
    """One haystack session's turns, and the ids of its user turns marked `has_answer`."""
    turns: list[Turn] = []
    evidence: list[str] = []
    for j, item in enumerate(chk.check(raw, list, at)):
        t_at = join(at, j)
        t = chk.obj(item, t_at)
        role = chk.req(t, "role", str, t_at)
        if role not in SPEAKERS:
            chk.fail(join(t_at, "role"), f"role {shown(role)} is not one of {SPEAKERS}")
        turn_id = f"{sid}:{j + 1}"
        if chk.opt(t, "has_answer", bool, t_at, default=False) and role == "user":
            evidence.append(turn_id)
        turns.append(Turn(speaker=role, text=chk.req(t, "content", str, t_at), path=t_at, source_turn_id=turn_id))
    return turns, evidence


def _sessions(raw_sessions: list, dates: list, ids: list, chk: Checker) -> tuple[list[Session], list[str]]:
    """The haystack sessions sorted by date (empty ones skipped), and the user turns marked has_answer."""
    sessions: list[Session] = []
    evidence: list[str] = []  # user turns marked has_answer
    for i, raw in enumerate(raw_sessions):
        at = join("haystack_sessions", i)
        when = _date(dates[i], join("haystack_dates", i), chk)
        turns, marked = _session_turns(raw, at, str(ids[i]), chk)
        evidence += marked
        if not turns:
            # A haystack filler session with nothing in it holds nothing to remember; dropping it
            # keeps the other sessions (their turn ids carry their own session ids).
            log.warning("file %s, record %s: %s is empty and was skipped", chk.file, chk.record, at)
            continue
        sessions.append(Session(turns, at, time=when))
    sessions.sort(key=lambda session: session.time or datetime.min)  # every one has a date here; stable: sessions of one date keep their order
    return sessions, evidence


def parse(rec: RawRecord, chk: Checker) -> Episode:
    d = chk.obj(rec.data, "")
    question_id = chk.ident(d, "question_id")
    episode_id = f"{DATASET}-{question_id}"
    chk.name(episode_id)
    qtype = chk.req(d, "question_type", str)
    if qtype not in QUESTION_TYPES:
        chk.fail("question_type", f"unknown question type {shown(qtype)} (known: {', '.join(QUESTION_TYPES)})")

    raw_sessions = chk.req(d, "haystack_sessions", list)
    dates = chk.req(d, "haystack_dates", list)
    ids = chk.req(d, "haystack_session_ids", list)
    for key, values in (("haystack_dates", dates), ("haystack_session_ids", ids)):
        if len(values) != len(raw_sessions):
            chk.fail(key, f"{len(values)} entries for {len(raw_sessions)} haystack sessions")
    _check_session_ids(ids, chk)
    sessions, evidence = _sessions(raw_sessions, dates, ids, chk)

    answer_sessions = d.get("answer_session_ids")
    if answer_sessions is not None:
        answer_sessions = [str(s) for s in _id_list(answer_sessions, "answer_session_ids", chk)]
    answer = chk.req(d, "answer", (str, int, float))
    asked_at = None if d.get("question_date") is None else _date(d["question_date"], "question_date", chk)
    abstention = is_abstention(question_id)
    qa = QAItem(
        qa_id=question_id,  # the dataset's id, "_abs" suffix included
        question=chk.req(d, "question", str),
        answer=str(answer),
        # none marked on the user side, or an abstention question: unknown, not "no evidence"
        evidence=None if abstention else evidence or None,
        category=qtype,
        path="",
        asked_at=asked_at,
        abstention=abstention,
        evidence_sessions=answer_sessions,
    )
    return Episode(episode_id=episode_id, dataset=DATASET, sessions=sessions, speakers=SPEAKERS, qa=[qa],
                   sessions_path="haystack_sessions", id_field="question_id")


def _id_list(value: object, path: str, chk: Checker) -> list[str | int]:
    chk.check(value, list, path)
    for i, item in enumerate(cast(list[object], value)):
        chk.check(item, (str, int), join(path, i))
    return value  # type: ignore[return-value]
