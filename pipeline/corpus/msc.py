"""Multi-Session Chat. ParlAI JSONL: "previous_dialogs" are sessions 1..n-1, "dialog" is session n.
Records in the Theanine / Conversation Chronicles schema are detected per record and read by cc.

Persona summaries: `previous_dialogs[k].personas` (one list per speaker) become "persona" notes of
session k+1, so gold memory can show a probe only the summaries of sessions before it; the
record's top-level `personas` (the summaries as of its last session) stay the episode personas."""

from __future__ import annotations

from typing import Any

from pipeline.corpus import cc
from pipeline.corpus.reader import RawRecord
from pipeline.corpus.records import Checker, Episode, Note, Session, Turn, join

DATASET = "msc"
SPEAKERS = ("Speaker 1", "Speaker 2")  # ParlAI's ids; turns without an id alternate, Speaker 1 first


def parse(rec: RawRecord, chk: Checker) -> Episode:
    d = chk.obj(rec.data, "")
    if cc.is_cc_record(d):
        return cc.parse(rec, chk, dataset=DATASET)

    source_id, id_field = _source_id(d, rec, chk)
    episode_id = f"{DATASET}-{source_id}"
    chk.name(episode_id)

    previous = chk.opt(d, "previous_dialogs", list, default=[])
    speakers = list(SPEAKERS)
    sessions = []
    for k, raw in enumerate(previous):
        at = join("previous_dialogs", k)
        prev = chk.obj(raw, at)
        notes = [Note("persona", line, speaker)
                 for speaker, lines in (_persona_lists(prev, "personas", at, chk) or {}).items() for line in lines]
        sessions.append(Session(_turns(chk.req(prev, "dialog", list, at), join(at, "dialog"), speakers, chk), at,
                                notes=notes))
    sessions.append(Session(_turns(chk.req(d, "dialog", list), "dialog", speakers, chk), "dialog"))

    # previous_dialogs[k].time_num / time_unit is the time that passed after session k+1, before the next one.
    for k, raw in enumerate(previous):
        at = join("previous_dialogs", k)
        num = chk.opt(raw, "time_num", (int, float), at)
        unit = chk.opt(raw, "time_unit", str, at)
        if num is not None and unit is not None:
            sessions[k + 1].gap = gap_label(num, unit)

    return Episode(
        episode_id=episode_id,
        dataset=DATASET,
        sessions=sessions,
        speakers=speakers,
        personas=_personas(d, chk),
        id_field=id_field,
    )


def _source_id(d: dict, rec: RawRecord, chk: Checker) -> tuple[str, str | None]:
    """(id, the field it came from); no id in the record: file stem + position, field None."""
    metadata = chk.opt(d, "metadata", dict, default={})
    if metadata.get("initial_data_id") is not None:
        return chk.ident(metadata, "initial_data_id", "metadata"), "metadata.initial_data_id"
    if d.get("initial_data_id") is not None:
        return chk.ident(d, "initial_data_id"), "initial_data_id"
    return f"{rec.file.stem}-{rec.index}", None


def _turns(raw_turns: list, at: str, speakers: list[str], chk: Checker) -> list[Turn]:
    turns = []
    for i, raw in enumerate(raw_turns):
        t_at = join(at, i)
        t = chk.obj(raw, t_at)
        speaker = chk.opt(t, "id", str, t_at) or SPEAKERS[i % 2]
        if speaker not in speakers:
            speakers.append(speaker)
        turns.append(Turn(speaker=speaker, text=chk.req(t, "text", str, t_at), path=t_at))
    return turns


def _personas(d: dict, chk: Checker) -> dict[str, list[str]] | None:
    return _persona_lists(d, "personas" if d.get("personas") is not None else "init_personas", "", chk)


def _persona_lists(d: dict, key: str, at: str, chk: Checker) -> dict[str, list[str]] | None:
    """{speaker: persona lines} from a list of one list per speaker (ParlAI order); None when absent."""
    raw = chk.opt(d, key, list, at)
    if raw is None:
        return None
    path = join(at, key)
    if len(raw) > len(SPEAKERS):
        chk.fail(path, f"expected one persona list per speaker ({len(SPEAKERS)}), got {len(raw)}")
    return {SPEAKERS[i]: chk.str_list(lines, join(path, i)) for i, lines in enumerate(raw)}


def gap_label(num: Any, unit: str) -> str:
    """(3, "days") -> "3 days later"; (1, "days") -> "1 day later"."""
    n = int(num) if isinstance(num, float) and num.is_integer() else num
    unit = unit.strip()
    if n == 1 and unit.endswith("s"):
        unit = unit[:-1]
    return f"{n} {unit} later"
