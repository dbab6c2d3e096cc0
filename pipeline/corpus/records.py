"""Shared by every loader: typed field access that names file/record/field on failure, the
format-neutral episode structure, and its conversion to canonical episodes / turns / qa / memory_points rows."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NoReturn

from pipeline.corpus.reader import RawRecord
from pipeline.errors import InputError

log = logging.getLogger(__name__)

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "a list", dict: "an object"}


def _describe(types: tuple[type, ...]) -> str:
    return " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "object"}.get(
        type(value), type(value).__name__
    )


def shown(value: Any, limit: int = 60) -> str:
    """A value from the corpus as an error message quotes it: repr (so one line), cut to `limit`."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def join(at: str, key: str | int) -> str:
    """Field path: join("sessions[0]", "turns") -> "sessions[0].turns"; join("turns", 2) -> "turns[2]"."""
    if isinstance(key, int):
        return f"{at}[{key}]"
    return f"{at}.{key}" if at else key


class Checker:
    """Typed access to one raw record. Every failure is an InputError naming file, record and field."""

    def __init__(self, rec: RawRecord) -> None:
        self.file = str(rec.file)
        self.locator = rec.locator
        self.record = rec.locator

    def name(self, episode_id: str) -> None:
        """Once the episode id is known, errors name it next to the line / item number (quoted when
        it holds a line break or is very long, so the error stays one line)."""
        plain = episode_id.isprintable() and len(episode_id) <= 80
        self.record = f"{episode_id if plain else shown(episode_id, 80)} ({self.locator})"

    def fail(self, path: str | None, message: str) -> NoReturn:
        raise InputError(self.file, self.record, path or None, message)

    def check(self, value: Any, types: type | tuple[type, ...], path: str) -> Any:
        types = types if isinstance(types, tuple) else (types,)
        # bool is an int subclass in Python but not a number in JSON.
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok:
            self.fail(path, f"expected {_describe(types)}, got {_json_type(value)}")
        if isinstance(value, str):
            self.text(value, path)
        return value

    def text(self, value: str, path: str) -> str:
        """A string Arrow can store: JSON's "\\ud800" escapes decode to lone surrogates, which
        UTF-8 cannot encode (invalid UTF-8 written as an escape)."""
        if value.isascii():  # the common case, and cheap
            return value
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            self.fail(path, f"not valid Unicode: a lone surrogate \\u{ord(value[e.start]):04x} at character "
                            f"{e.start + 1} (invalid UTF-8 written as a JSON escape)")
        return value

    def obj(self, value: Any, path: str) -> dict:
        return self.check(value, dict, path)

    def req(self, obj: Mapping, key: str, types: type | tuple[type, ...], at: str = "") -> Any:
        path = join(at, key)
        if key not in obj or obj[key] is None:
            self.fail(path, "required field is missing or null")
        return self.check(obj[key], types, path)

    def opt(self, obj: Mapping, key: str, types: type | tuple[type, ...], at: str = "", default: Any = None) -> Any:
        if obj.get(key) is None:
            return default
        return self.check(obj[key], types, join(at, key))

    def str_list(self, value: Any, path: str) -> list[str]:
        self.check(value, list, path)
        for i, item in enumerate(value):
            self.check(item, str, join(path, i))
        return value

    def ident(self, obj: Mapping, key: str, at: str = "") -> str:
        """An id field: a non-empty string, or an integer (kept as its decimal string)."""
        value = self.req(obj, key, (str, int), at)
        if isinstance(value, str) and not value.strip():
            self.fail(join(at, key), "must not be empty")
        return str(value)

    def time(self, value: Any, path: str) -> datetime | None:
        if value is None:
            return None
        self.check(value, str, path)
        try:
            return parse_time(value)
        except ValueError as e:
            self.fail(path, f"{e} (expected ISO 8601 or like '1:56 pm on 8 May, 2023')")


_LOCOMO_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%I:%M %p on %d %B %Y", "%I:%M %p on %d %b %Y")


def parse_time(text: str) -> datetime:
    """ISO 8601 or a LoCoMo date ("1:56 pm on 8 May, 2023") -> naive datetime to the second (UTC if zoned)."""
    s = " ".join(text.split())
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        for fmt in _LOCOMO_FORMATS:
            try:
                dt = datetime.strptime(s, fmt)
                break
            except ValueError:
                continue
        else:
            raise ValueError(f"unrecognised date/time {shown(text)}") from None
    if dt.tzinfo is not None:
        try:
            dt = dt.astimezone(timezone.utc).replace(tzinfo=None)
        except OverflowError:  # e.g. 0001-01-01T00:00+05:00 is in year 0 in UTC
            raise ValueError(f"date/time {shown(text)} is out of range in UTC") from None
    return dt.replace(microsecond=0)


@dataclass
class Turn:
    speaker: str
    text: str
    path: str  # where the turn sits in the record, for error messages
    source_turn_id: str | None = None
    topic_start: bool | None = None


@dataclass
class Note:
    """An annotation of a session the corpus carries (LoCoMo's session summary and observations):
    gold memory for the methods that use it."""

    kind: str  # summary | observation
    text: str
    speaker: str | None = None


@dataclass
class Session:
    turns: list[Turn]
    path: str
    time: datetime | None = None
    gap: str | None = None
    notes: list[Note] = field(default_factory=list)


@dataclass
class QAItem:
    qa_id: str
    question: str
    answer: str | None
    evidence: list[str] | None
    category: str | None
    path: str
    adversarial_answer: str | None = None  # LoCoMo category 5: the tempting wrong answer
    asked_at: datetime | None = None  # when the question is asked (LongMemEval's question_date)
    abstention: bool | None = None  # the history cannot answer it (LongMemEval "_abs"); None: not said
    evidence_sessions: list[str] | None = None  # the dataset's ids of the sessions holding the answer
    judge_notes: list[str] | None = None  # for the judge only (a question type, a summary's key points)
    asked_after_session: int | None = None  # 1-based: asked right after this session (HaluMem); None: at the end


@dataclass
class MemoryPoint:
    """A gold memory point the corpus gives for a session (HaluMem): what a memory system should have
    extracted from it."""

    session_idx: int  # 1-based position of its session in `Episode.sessions`
    index: str  # the corpus's own number of the point within its session (the point id's last part)
    content: str
    path: str  # where the point sits in the record, for error messages
    memory_type: str | None = None
    memory_source: str | None = None  # primary | secondary | interference | system (HaluMem)
    is_update: bool | None = None
    original_memories: list[str] | None = None
    importance: float | None = None
    timestamp: str | None = None


@dataclass
class Episode:
    """One conversation, format-neutral. speakers=None: derive them from the turns in order of appearance;
    given: every turn's speaker must be in it."""

    episode_id: str
    dataset: str
    sessions: list[Session]
    speakers: list[str] | None = None
    personas: dict[str, list[str]] | None = None
    relationship: str | None = None
    qa: list[QAItem] = field(default_factory=list)
    memory_points: list[MemoryPoint] = field(default_factory=list)  # gold memory, where the corpus has it
    sessions_path: str = "sessions"  # the field an "episode has no sessions" error names
    id_field: str | None = "episode_id"  # the field the id came from (None: derived from file and position)


@dataclass
class Rows:
    episode: dict
    turns: list[dict]
    qa: list[dict]
    memory_points: list[dict] = field(default_factory=list)


def build_rows(ep: Episode, chk: Checker) -> Rows:
    """Validate the format-neutral episode and turn it into canonical rows."""
    if not ep.sessions:
        chk.fail(ep.sessions_path, "episode has no sessions")
    speakers = _speakers(ep, chk)
    personas = _personas(ep, speakers, chk)
    turns = _turn_rows(ep, chk)
    qa = _qa_rows(ep, {t["source_turn_id"] for t in turns}, chk)
    return Rows(_episode_row(ep, speakers, personas, chk), turns, qa, _memory_point_rows(ep, chk))


def _memory_point_rows(ep: Episode, chk: Checker) -> list[dict]:
    """The episode's gold memory points, each id "<episode_id>-s<session_idx>-m<index>" (unique)."""
    rows: list[dict] = []
    seen: set[str] = set()
    for m in ep.memory_points:
        if not 1 <= m.session_idx <= len(ep.sessions):
            chk.fail(m.path, f"memory point of session {m.session_idx}, but the episode has {len(ep.sessions)}")
        point_id = f"{ep.episode_id}-s{m.session_idx}-m{m.index}"
        if point_id in seen:
            chk.fail(m.path, f"duplicate memory point {shown(point_id)} in the episode")
        seen.add(point_id)
        rows.append({"episode_id": ep.episode_id, "session_idx": m.session_idx, "point_id": point_id,
                     "content": m.content, "memory_type": m.memory_type, "memory_source": m.memory_source,
                     "is_update": m.is_update, "original_memories": m.original_memories,
                     "importance": m.importance, "timestamp": m.timestamp})
    return rows


def _personas(ep: Episode, speakers: list[str], chk: Checker) -> list[list[str]] | None:
    """Each speaker's persona lines, in the order of `speakers` (None: the corpus gives none)."""
    if ep.personas is None:
        return None
    for name in ep.personas:
        if name not in speakers:
            chk.fail("personas", f"persona given for {shown(name)}, who is not a speaker of the episode "
                                 f"{shown(speakers)}")
    return [list(ep.personas.get(s, [])) for s in speakers]


def _turn_rows(ep: Episode, chk: Checker) -> list[dict]:
    """The episode's turn rows, sessions numbered from 1 and turns from 0."""
    has_topics = any(t.topic_start is not None for s in ep.sessions for t in s.turns)
    turns: list[dict] = []
    for s_idx, session in enumerate(ep.sessions, start=1):
        if not session.turns:
            chk.fail(session.path, "empty session (no turns)")
        for t_idx, t in enumerate(session.turns):
            turns.append(
                {
                    "episode_id": ep.episode_id,
                    "session_idx": s_idx,
                    "turn_idx": t_idx,
                    "speaker": t.speaker,
                    "text": t.text,
                    "session_time": session.time,
                    "session_gap_label": session.gap,
                    "source_turn_id": t.source_turn_id or f"D{s_idx}:{t_idx + 1}",
                    "gold_topic_boundary": bool(t.topic_start) if has_topics else None,
                }
            )
    return turns


def _qa_rows(ep: Episode, turn_ids: set[str], chk: Checker) -> list[dict]:
    """The episode's question rows, each question's evidence kept to the turns `turn_ids` names."""
    # Evidence that names no turn of the episode (a typo, a turn the release dropped) is dropped and
    # the question kept: no retrieval could ever find it, so it would only cap recall. Evidence left
    # empty that way becomes null (unknown), as Long-MT-Bench+ evidence of an unknown shape; a warning
    # counts what was dropped.
    dropped: list[str] = []
    qa: list[dict] = []
    seen: set[str] = set()
    for q in ep.qa:
        if q.qa_id in seen:
            chk.fail(join(q.path, "qa_id"), f"duplicate qa_id {shown(q.qa_id)} in the episode")
        seen.add(q.qa_id)
        if q.asked_after_session is not None and not 1 <= q.asked_after_session <= len(ep.sessions):
            chk.fail(q.path, f"asked after session {q.asked_after_session}, but the episode has {len(ep.sessions)}")
        evidence = q.evidence
        if evidence:
            kept = [e for e in evidence if e in turn_ids]
            dropped += [f"{join(q.path, 'evidence')} {shown(e)}" for e in evidence if e not in turn_ids]
            evidence = kept or None
        qa.append(
            {
                "episode_id": ep.episode_id,
                "qa_id": q.qa_id,
                "question": q.question,
                "answer": q.answer,
                "evidence": None if evidence is None else list(evidence),
                "category": q.category,
                "adversarial_answer": q.adversarial_answer,
                "asked_at": q.asked_at,
                "asked_after_session": q.asked_after_session,
                "abstention": q.abstention,
                "evidence_sessions": q.evidence_sessions,
                "judge_notes": q.judge_notes,
                "source": "dataset",
                # the dataset's own key; the audited LoCoMo key rewrites answer and evidence (locomo_audit.py)
                "answer_key": "original",
                "gold_original": q.answer,
                "evidence_original": None if evidence is None else list(evidence),
                "answer_key_class": None,
            }
        )

    if dropped:
        log.warning("file %s, record %s: dropped %d evidence id(s) that name no turn: %s", chk.file, chk.record,
                    len(dropped), "; ".join(dropped[:5]) + ("; ..." if len(dropped) > 5 else ""))
    return qa


def _episode_row(ep: Episode, speakers: list[str], personas: list[list[str]] | None, chk: Checker) -> dict:
    """The episode's own row: its speakers, personas and the notes of its sessions."""
    notes = [{"session_idx": s_idx, "kind": n.kind, "speaker": n.speaker, "text": n.text}
             for s_idx, session in enumerate(ep.sessions, start=1) for n in session.notes]
    episode = {
        "episode_id": ep.episode_id,
        "dataset": ep.dataset,
        "speakers": speakers,
        "personas": personas,
        "notes": notes or None,
        "relationship": ep.relationship,
        "n_sessions": len(ep.sessions),
        "source_file": chk.file,
    }
    return episode


def _speakers(ep: Episode, chk: Checker) -> list[str]:
    if ep.speakers is None:
        return list(dict.fromkeys(t.speaker for s in ep.sessions for t in s.turns))
    for s in ep.sessions:
        for t in s.turns:
            if t.speaker not in ep.speakers:
                chk.fail(join(t.path, "speaker"),
                         f"speaker {shown(t.speaker)} is not one of the episode's speakers {shown(ep.speakers)}")
    return list(ep.speakers)
