"""LoCoMo-Plus (Li et al. 2026, xjtuleeyf/Locomo-Plus): LoCoMo's ten conversations with their five QA
categories as published, plus a sixth, "cognitive": a cue dialogue stitched into a LoCoMo conversation
and, later, a trigger query whose good reply must show the cue is remembered. There is no reference answer.

The corpus is a directory holding the release's two files: `locomo10.json` (LoCoMo, read as the `locomo`
format reads it) and `locomo_plus.json` (a list of {cue_dialogue, trigger_query, time_gap, relation_type,
...}). As the release's data/unified_input.py does, cue item i is stitched into conversation i mod 10:
the trigger is asked 7 days after the conversation's last session, the cue session is placed `time_gap`
before it (data/build_conv.py's reading of the gap: a number word or digits before week/month/year;
anything else, "several months", reads as 0 days), after every session at or before that time. "A:" is
the conversation's speaker_a, "B:" its speaker_b. The trigger is not a session: it is the question, asked
at the query time; the cue turns (ids C1:1, C1:2, ...) are its evidence. Cognitive episodes come first
(`locomo_plus-c<i>`), then LoCoMo's ten (their own ids), so a small `corpus.limit` reads the new category.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator
from datetime import datetime, timedelta
from pathlib import Path

from pipeline.corpus import locomo
from pipeline.corpus.reader import RawRecord, corpus_files, iter_records
from pipeline.corpus.records import Checker, Episode, QAItem, Session, Turn
from pipeline.errors import InputError

DATASET = "locomo_plus"
CATEGORY = "cognitive"
BASE_FILE = "locomo10.json"
PLUS_FILE = "locomo_plus.json"
QUERY_AFTER = timedelta(days=7)  # build_conv.compute_insertion: the trigger comes a week after the last session
_UNIT_DAYS = {"week": 7, "month": 30, "year": 365}
_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
            "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a": 1, "an": 1}
_GAP = re.compile(r"\b(\d+|" + "|".join(_NUMBERS) + r")\b\s*(week|month|year)s?\b")
_LINE = re.compile(r"^([AB]):")

Parser = Callable[[RawRecord, Checker], Episode]


def gap_days(time_gap: str) -> int:
    """Days between cue and trigger as the release reads `time_gap` ("two weeks later" -> 14, "about one
    year later" -> 365, "several months later" -> 0: no number before the unit)."""
    m = _GAP.search(time_gap.lower().strip())
    if not m:
        return 0
    num, unit = m.groups()
    count = int(num) if num.isdigit() else _NUMBERS[num]
    return count * _UNIT_DAYS[unit]


def parse(rec: RawRecord, chk: Checker) -> Episode:
    """A record read alone: a cue item needs its LoCoMo conversation, so the format reads through `reader`."""
    chk.fail(None, f"LoCoMo-Plus is read as a directory holding {PLUS_FILE} and {BASE_FILE}")


def reader(path: str | Path, captions: bool = True) -> tuple[Generator[RawRecord, None, None], Parser]:
    """The records of a LoCoMo-Plus directory (the cue items, then LoCoMo's samples) and the parser that
    reads them: a cue item is stitched into the LoCoMo sample its position names."""
    files = {f.name: f for f in corpus_files(path)}
    for name in (PLUS_FILE, BASE_FILE):
        if name not in files:
            raise InputError(str(path), None, None, f"a LoCoMo-Plus directory holds {PLUS_FILE} and {BASE_FILE}; "
                                                    f"{name} is missing")
    bases = list(iter_records(files[BASE_FILE]))
    parsed: dict[int, Episode] = {}

    def base(i: int) -> Episode:
        if i not in parsed:
            rec = bases[i]
            parsed[i] = locomo.parse(rec, Checker(rec), captions=captions)
        return parsed[i]

    def parse(rec: RawRecord, chk: Checker) -> Episode:
        if rec.file.name == BASE_FILE:
            return locomo.parse(rec, chk, captions=captions)
        if not bases:
            chk.fail(None, f"{BASE_FILE} holds no conversations to stitch the cue into")
        return parse_cue(rec, chk, base(rec.index % len(bases)))

    def records() -> Generator[RawRecord, None, None]:
        yield from iter_records(files[PLUS_FILE])
        yield from bases

    return records(), parse


def _dialogue(text: str, field: str, speakers: list[str], chk: Checker) -> list[Turn]:
    """"A: ..."/"B: ..." lines as turns of speaker_a/speaker_b (other lines are skipped, as the release does)."""
    turns = []
    for line in text.split("\n"):
        m = _LINE.match(line.strip())
        if m:
            turns.append(Turn(speaker=speakers[m[1] == "B"], text=line.strip()[2:].strip(), path=field))
    if not turns:
        chk.fail(field, 'holds no "A:" or "B:" line')
    return turns


def parse_cue(rec: RawRecord, chk: Checker, base: Episode) -> Episode:
    """One cognitive item stitched into `base` (a parsed LoCoMo sample): base's sessions with the cue
    session placed by time, one question (the trigger) asked a week after the last session."""
    d = chk.obj(rec.data, "")
    speakers = base.speakers or []
    cue = _dialogue(chk.req(d, "cue_dialogue", str), "cue_dialogue", speakers, chk)
    trigger = _dialogue(chk.req(d, "trigger_query", str), "trigger_query", speakers, chk)
    time_gap = chk.req(d, "time_gap", str)
    chk.opt(d, "relation_type", str)  # causal | state | goal | value: checked, not kept (no score uses it)
    times: list[datetime] = []
    for s in base.sessions:
        if s.time is None:
            chk.fail("time_gap", f"the conversation it is stitched into ({base.episode_id}) has a session without "
                                 f"a date ({s.path}_date_time), so the cue cannot be placed")
        times.append(s.time)
    asked_at = times[-1] + QUERY_AFTER
    cue_time = asked_at - timedelta(days=gap_days(time_gap))
    for n, t in enumerate(cue, start=1):
        t.source_turn_id = f"C1:{n}"
    at = sum(1 for t in times if t <= cue_time)  # the release sorts stably: the cue follows a session at its time
    sessions = [*base.sessions[:at], Session(cue, "cue_dialogue", time=cue_time), *base.sessions[at:]]
    episode_id = f"{DATASET}-c{rec.index}"
    chk.name(episode_id)
    question = "\n".join(f"{t.speaker}: {t.text}" for t in trigger)
    qa = QAItem(qa_id=f"{episode_id}-q0", question=question, answer=None,
                evidence=[t.source_turn_id for t in cue if t.source_turn_id], category=CATEGORY,
                path="trigger_query", asked_at=asked_at)
    return Episode(episode_id=episode_id, dataset=DATASET, sessions=sessions, speakers=speakers, qa=[qa],
                   sessions_path="cue_dialogue", id_field=None)
