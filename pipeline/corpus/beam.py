"""BEAM (Tavakoli et al., ICLR 2026, "Beyond a Million Tokens"; mohammadtavakoli78/BEAM): conversations of
one user with an assistant at 128K, 500K, 1M and 10M tokens (20 / 35 / 35 / 10), each probed by questions
over ten memory abilities.

The corpus is a directory in the release's `chats/` layout: `<size>/<conversation id>/` holding the chat
and `probing_questions/probing_questions.json`. The size level is optional (a size's folder, such as
`data/beam/100K`, or one conversation's folder loads too); sizes are read 100K, 500K, 1M, 10M (others by
name), conversations in the order of their numeric ids. The chat is `chat_trunecated.json` where the
folder has one, else `chat.json`, as the release's answer_generation.py picks it: the truncated chat is
the conversation cut to its size's token budget, and the probing questions cite only its messages.

A chat is a list of batches {batch_number, time_anchor, turns}, each turn a list of messages {role, id,
content, index?, question_type?, time_anchor?}. A 10M chat is a list of {"plan-<k>": [batch, ...]}, the
plans' batches in order (the release's combine_10m_chats numbers the messages of all plans in one
sequence). One conversation = one episode `beam-<size>-<id>`; each batch a session, each message a turn of
its role (`user` or `assistant`), its source turn id the message's `id`, its text the content as published
(the user's "->-> b,n" plan markers kept: the release's readers keep them). A batch's session time is its
`time_anchor`, else the first time anchor one of its messages carries (the release writes the batch's
anchor on its first message and leaves the batch's own null), read as "March-15-2024" (a month's full or
short name) or ISO 8601; any other text is an error naming the field.

Each probing question is a QA row of its ability (the category: abstention, contradiction_resolution, ...),
its answer the ideal text the release gives for that ability (`ANSWER_FIELDS`), its `rubric` items in
`judge_notes` (the release's judge scores a response against each item; no method sees them), and its
evidence the message ids of `source_chat_ids` (a list, or an object of lists such as {first_statement,
second_statement}), which the release's question generator took from the "chat_id" it showed beside each
message: the messages' `id`s. Ids that name no message of the chat are dropped with a warning. Abstention
questions are flagged `abstention` (the chat cannot answer them).

Files are read one conversation at a time, so a reader holds one chat (a 10M one is ~20,900 messages).
"""

from __future__ import annotations

import json
import re
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pipeline.corpus.reader import RawRecord
from pipeline.corpus.records import Checker, Episode, QAItem, Session, Turn, join, parse_time, shown
from pipeline.errors import InputError

DATASET = "beam"
SIZES = ("100K", "500K", "1M", "10M")  # the release's chats/ folders, in the order read
CHAT_FILES = ("chat_trunecated.json", "chat.json")  # the first present is read (the release's spelling)
QUESTIONS_FILE = Path("probing_questions") / "probing_questions.json"
SPEAKERS = ("user", "assistant")
# Each ability's ideal response, as the release names it in probing_questions.json
ANSWER_FIELDS = {
    "abstention": "ideal_response",
    "contradiction_resolution": "ideal_answer",
    "event_ordering": "answer",
    "information_extraction": "answer",
    "instruction_following": "expected_compliance",
    "knowledge_update": "answer",
    "multi_session_reasoning": "answer",
    "preference_following": "expected_compliance",
    "summarization": "ideal_summary",
    "temporal_reasoning": "answer",
}
ABSTENTION = "abstention"
_PLAN_KEY = re.compile(r"^plan-\d+$")
_ANCHOR_FORMATS = ("%B-%d-%Y", "%b-%d-%Y")


@dataclass(frozen=True)
class Conversation:
    """One conversation's folder, as the reader found it, with its chat read."""

    size: str
    conversation_id: str
    chat: object  # the chat file's JSON
    questions_file: Path

    @property
    def episode_id(self) -> str:
        return f"{DATASET}-{self.size}-{self.conversation_id}"


def parse(rec: RawRecord, chk: Checker) -> Episode:
    """A record read alone: BEAM is read through `reader`, a conversation's chat with its questions."""
    if not isinstance(rec.data, Conversation):
        chk.fail(None, f"BEAM is read as a directory of <size>/<conversation id>/ folders, each holding "
                       f"{' or '.join(CHAT_FILES)} and {QUESTIONS_FILE.as_posix()}")
    return parse_conversation(rec.data, chk)


def reader(path: str | Path) -> Generator[RawRecord, None, None]:
    """One record per conversation under `path` (the release's chats/ folder, one size's folder, or one
    conversation's), its chat read only when the record is reached."""
    for i, (size, folder) in enumerate(conversation_folders(path)):
        chat_file = next((folder / name for name in CHAT_FILES if (folder / name).is_file()), None)
        if chat_file is None:
            raise InputError(str(folder), None, None, f"a BEAM conversation folder holds {' or '.join(CHAT_FILES)}; "
                                                      "neither is there")
        questions = folder / QUESTIONS_FILE
        if not questions.is_file():
            raise InputError(str(folder), None, None, f"a BEAM conversation folder holds {QUESTIONS_FILE.as_posix()}; "
                                                      "it is missing")
        conversation = Conversation(size, folder.name, _read_json(chat_file), questions)
        yield RawRecord(chat_file, f"conversation {size}/{folder.name}", i, conversation)


def corpus_files(path: str | Path) -> list[Path]:
    """The files a BEAM corpus reads: per conversation the chat the reader takes and its questions."""
    files = []
    for _, folder in conversation_folders(path):
        chat = next((folder / name for name in CHAT_FILES if (folder / name).is_file()), None)
        files += [f for f in (chat, folder / QUESTIONS_FILE) if f is not None]
    return files


def conversation_folders(path: str | Path) -> Iterator[tuple[str, Path]]:
    """(size, folder) of every conversation under `path`, sizes in `SIZES` order, ids in numeric order."""
    p = Path(path)
    if not p.is_dir():
        raise InputError(str(p), None, None, "no such directory" if not p.exists() else
                         "BEAM is read as a directory of <size>/<conversation id>/ folders, not a file")
    if _is_conversation(p):
        yield p.parent.name, p
        return
    own = _numbered(p)
    if own:
        for folder in own:
            yield p.name, folder
        return
    sizes = sorted((d for d in p.iterdir() if d.is_dir() and _numbered(d)),
                   key=lambda d: (SIZES.index(d.name) if d.name in SIZES else len(SIZES), d.name))
    if not sizes:
        raise InputError(str(p), None, None, "holds no BEAM conversations (<size>/<conversation id>/ folders "
                                             f"with {' or '.join(CHAT_FILES)})")
    for size in sizes:
        for folder in _numbered(size):
            yield size.name, folder


def _is_conversation(folder: Path) -> bool:
    return (folder / QUESTIONS_FILE).is_file() or any((folder / name).is_file() for name in CHAT_FILES)


def _numbered(folder: Path) -> list[Path]:
    """The conversation folders in `folder`: those named by a number (as the release lists them), in order."""
    return sorted((d for d in folder.iterdir() if d.is_dir() and d.name.isdigit()), key=lambda d: int(d.name))


def _read_json(path: Path) -> object:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise InputError(str(path), None, None, f"cannot read: {e.strerror}") from None
    try:
        return json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise InputError(str(path), f"line {line}", None, f"not UTF-8 text: {e.reason}") from None
    except json.JSONDecodeError as e:
        raise InputError(str(path), f"line {e.lineno}", None, f"invalid JSON: {e.msg} (column {e.colno})") from None
    except (ValueError, RecursionError) as e:
        raise InputError(str(path), None, None, f"invalid JSON: {type(e).__name__}") from None


def anchor_time(text: str) -> datetime:
    """A time anchor ("March-15-2024", "Mar-15-2024", or ISO 8601) as a naive datetime."""
    for fmt in _ANCHOR_FORMATS:
        try:
            return datetime.strptime(text.strip(), fmt)
        except ValueError:
            continue
    try:
        return parse_time(text)
    except ValueError:
        raise ValueError(f"unrecognised time anchor {shown(text)} (expected like 'March-15-2024')") from None


def parse_conversation(conv: Conversation, chk: Checker) -> Episode:
    """One conversation: its batches as sessions, its probing questions as QA rows."""
    chk.name(conv.episode_id)
    sessions = _sessions(conv.chat, chk)
    qa = _questions(conv, chk)
    return Episode(episode_id=conv.episode_id, dataset=DATASET, sessions=sessions, speakers=list(SPEAKERS), qa=qa,
                   sessions_path="", id_field=None)


def _batches(chat: object, chk: Checker) -> Iterator[tuple[dict, str]]:
    """(batch, its field path) in order: the chat's own, or a 10M chat's plans' one after another."""
    entries: list = chk.check(chat, list, "")
    if not entries:
        chk.fail(None, "holds no batches (an empty list)")
    for i, item in enumerate(entries):
        at = join("", i)
        item = chk.obj(item, at)
        plans = [k for k in item if _PLAN_KEY.match(k)]
        if "turns" in item or not plans:
            yield item, at
            continue
        if len(item) != 1:
            chk.fail(at, f"a 10M chat's entry holds one plan, got keys {shown(sorted(item))}")
        plan_at = join(at, plans[0])
        batches = chk.req(item, plans[0], list, at)
        for j, batch in enumerate(batches):
            yield chk.obj(batch, join(plan_at, j)), join(plan_at, j)


def _sessions(chat: object, chk: Checker) -> list[Session]:
    sessions = []
    seen: dict[str, str] = {}  # message id -> where it was first seen
    for batch, at in _batches(chat, chk):
        chk.opt(batch, "batch_number", int, at)
        anchor = chk.opt(batch, "time_anchor", str, at)
        anchor_at = join(at, "time_anchor")
        turns = []
        for t_idx, turn in enumerate(chk.req(batch, "turns", list, at)):
            turn_at = join(join(at, "turns"), t_idx)
            for m_idx, message in enumerate(chk.check(turn, list, turn_at)):
                m_at = join(turn_at, m_idx)
                message = chk.obj(message, m_at)
                role = chk.req(message, "role", str, m_at)
                if role not in SPEAKERS:
                    chk.fail(join(m_at, "role"), f"expected 'user' or 'assistant', got {shown(role)}")
                mid = chk.ident(message, "id", m_at)
                if mid in seen:
                    chk.fail(join(m_at, "id"), f"duplicate message id {shown(mid)} (first: {seen[mid]})")
                seen[mid] = m_at
                own_anchor = chk.opt(message, "time_anchor", str, m_at)
                if anchor is None and own_anchor is not None:
                    anchor, anchor_at = own_anchor, join(m_at, "time_anchor")
                turns.append(Turn(speaker=role, text=chk.req(message, "content", str, m_at), path=m_at,
                                  source_turn_id=mid))
        time = None
        if anchor is not None:
            try:
                time = anchor_time(anchor)
            except ValueError as e:
                chk.fail(anchor_at, str(e))
        sessions.append(Session(turns, join(at, "turns"), time=time))
    return sessions


def _questions(conv: Conversation, chat_chk: Checker) -> list[QAItem]:
    chk = Checker(RawRecord(conv.questions_file, chat_chk.locator, 0, None))
    chk.name(conv.episode_id)
    data = chk.obj(_read_json(conv.questions_file), "")
    qa = []
    for ability, questions in data.items():
        if ability not in ANSWER_FIELDS:
            chk.fail(ability, f"unknown ability {shown(ability)} (known: {', '.join(ANSWER_FIELDS)})")
        for i, q in enumerate(chk.check(questions, list, ability)):
            at = join(ability, i)
            q = chk.obj(q, at)
            qa.append(QAItem(
                qa_id=f"{conv.episode_id}-{ability}-{i}", question=chk.req(q, "question", str, at),
                answer=chk.req(q, ANSWER_FIELDS[ability], str, at), evidence=_evidence(q, at, chk),
                category=ability, path=at, abstention=ability == ABSTENTION,
                judge_notes=list(chk.str_list(chk.req(q, "rubric", list, at), join(at, "rubric")))))
    return qa


def _evidence(q: dict, at: str, chk: Checker) -> list[str] | None:
    """The message ids `source_chat_ids` names (a list, or an object of lists), in order, once each."""
    value = chk.opt(q, "source_chat_ids", (list, dict), at)
    if value is None:
        return None
    at = join(at, "source_chat_ids")
    groups = [(at, value)] if isinstance(value, list) else [(join(at, k), v) for k, v in value.items()]
    ids: list[str] = []
    for group_at, group in groups:
        for n, mid in enumerate(chk.check(group, list, group_at)):
            ids.append(str(chk.check(mid, (int, str), join(group_at, n))))
    return list(dict.fromkeys(ids)) or None
