"""Long-MT-Bench+ (SeCom App. A.7): five merged MT-Bench+ sessions per conversation plus long-range
questions after them.

Two record shapes:
- as released (`panzs19/Long-MT-Bench-Plus`, test split, exported with `datasets` to JSON Lines or
  a JSON array, as microsoft/SeCom's experiment/download_data.py writes it): `conversation_id`,
  `sessions` (a list of sessions, each a list of strings, one string per exchange:
  "[human]: ...\\n[bot]: ...", sometimes prefixed "<Turn k>: "), `questions`, `answers`, and `turns`;
- role/content: `id` (optional), `sessions` of {"role": "user"|"assistant", "content"} turns,
  `questions`, `answers`.
An exchange string becomes two turns, `user` and `assistant`, that share one source turn id
("S<session>:<exchange>"), because the dataset counts an exchange as one turn ("# Turns").

The release gives no evidence per question. Its `turns` is the conversation's turn-level memory
units, a list of lists of exchange strings (SeCom's experiment/compress.py and retrieve.py read it as
the `turn` granularity's units, one exchange each: Table 1's Turn-Level rows retrieve top-3 and report
3.00 "# Turns"); it is not read, and every question's evidence is null (unknown), so a judge that
needs evidence (MemoChat's) falls back to the whole past and says so. A converted file may give
evidence in `turns` instead: one entry per question of exchange numbers (flattened over the
conversation, counted from 0) or of "S:k" ids (not the release's shape, which never matches them).
"""

from __future__ import annotations

import re
from typing import Any

from pipeline.corpus.reader import RawRecord
from pipeline.corpus.records import Checker, Episode, QAItem, Session, Turn, join, shown

DATASET = "longmtbench"
SPEAKERS = ["user", "assistant"]
ROLES = {"human": "user", "user": "user", "bot": "assistant", "assistant": "assistant", "gpt": "assistant"}
_TURN_PREFIX = re.compile(r"^\s*<\s*Turn\s*\d+\s*>\s*:?\s*", re.IGNORECASE)
_TAG = re.compile(r"^\[(\w+)\]:\s?", re.MULTILINE)


def parse(rec: RawRecord, chk: Checker) -> Episode:
    d = chk.obj(rec.data, "")
    key = "conversation_id" if d.get("conversation_id") is not None else "id"
    has_id = d.get(key) is not None
    source_id = chk.ident(d, key) if has_id else f"{rec.file.stem}-{rec.index}"
    episode_id = f"{DATASET}-{source_id}"
    chk.name(episode_id)

    sessions: list[Session] = []
    exchange_ids: list[str] = []  # flattened over the conversation, for `turns` evidence
    for i, raw in enumerate(chk.req(d, "sessions", list)):
        at = join("sessions", i)
        turns: list[Turn] = []
        for j, item in enumerate(chk.check(raw, list, at)):
            t_at = join(at, j)
            if isinstance(item, str):
                exchange_id = f"S{i + 1}:{j + 1}"
                exchange_ids.append(exchange_id)
                turns += _exchange_turns(chk.check(item, str, t_at), t_at, exchange_id, chk)
            else:
                t = chk.obj(item, t_at)
                role = chk.req(t, "role", str, t_at)
                if role not in SPEAKERS:
                    chk.fail(join(t_at, "role"), f"role {shown(role)} is not one of {SPEAKERS}")
                turns.append(Turn(speaker=role, text=chk.req(t, "content", str, t_at), path=t_at))
        sessions.append(Session(turns, at))

    questions = chk.str_list(chk.req(d, "questions", list), "questions")
    answers = chk.req(d, "answers", list)
    for i, a in enumerate(answers):
        chk.check(a, (str, int, float), join("answers", i))
    if len(answers) != len(questions):
        chk.fail("answers", f"{len(answers)} answers for {len(questions)} questions")
    evidence = _evidence(d.get("turns"), len(questions), exchange_ids)
    qa = [QAItem(f"{episode_id}-q{i}", q, str(a), evidence[i], None, join("questions", i))
          for i, (q, a) in enumerate(zip(questions, answers))]
    return Episode(episode_id=episode_id, dataset=DATASET, sessions=sessions, speakers=SPEAKERS, qa=qa,
                   id_field=key if has_id else None)


def _exchange_turns(text: str, at: str, exchange_id: str, chk: Checker) -> list[Turn]:
    """"[human]: question\\n[bot]: answer" -> a user turn and an assistant turn (answers may span
    lines; a tag starts a new turn only at the beginning of a line)."""
    body = _TURN_PREFIX.sub("", text, count=1)
    tags = list(_TAG.finditer(body))
    if not tags:
        chk.fail(at, "an exchange must start with a speaker tag like \"[human]:\"")
    turns = []
    for k, m in enumerate(tags):
        role = ROLES.get(m.group(1).lower())
        if role is None:
            chk.fail(at, f"unknown speaker tag {shown('[' + m.group(1) + ']')} (expected [human] or [bot])")
        end = tags[k + 1].start() if k + 1 < len(tags) else len(body)
        turns.append(Turn(speaker=role, text=body[m.end():end].strip(), path=at, source_turn_id=exchange_id))
    return turns


def _evidence(turns: Any, n_questions: int, exchange_ids: list[str]) -> list[list[str] | None]:
    """Per-question evidence from a converted file's `turns` (exchange numbers or "S:k" ids per
    question); None (unknown) for any other shape, the release's `turns` (lists of exchange strings,
    which name no exchange id) included."""
    if not isinstance(turns, list) or len(turns) != n_questions:
        return [None] * n_questions
    out: list[list[str] | None] = []
    for refs in turns:
        refs = refs if isinstance(refs, list) else [refs]
        ids = []
        for r in refs:
            if isinstance(r, int) and not isinstance(r, bool) and 0 <= r < len(exchange_ids):
                ids.append(exchange_ids[r])
            elif isinstance(r, str) and r in exchange_ids:
                ids.append(r)
        out.append(ids or None)
    return out
