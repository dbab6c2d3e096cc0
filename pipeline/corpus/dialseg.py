"""Dialogue topic-segmentation sets with gold boundaries.

A dialogue record is one episode with one session. DialSeg711 style gives "utterances" and
"segments" (segment lengths); TIAGE style gives "shift_labels" / "labels" (1 = a topic shift starts
at this utterance); SuperDialseg style gives "turns" of {"utterance", "role", "segmentation_label"}
(1 = the last utterance of a segment).

SuperDialseg's released files (its own data and its conversions of DialSeg711 and TIAGE) wrap the
dialogues as {"dial_data": {<dataset name>: [dialogue, ...]}}; such a file is read as is, as one
episode "dialseg-<dataset name>" with one session per dialogue, in file order (segmentation and its
scores are per session, so every dialogue is still segmented and scored on its own)."""

from __future__ import annotations

from pipeline.corpus.reader import RawRecord
from pipeline.corpus.records import Checker, Episode, Session, Turn, join, shown

DATASET = "dialseg"
ALTERNATING = ("A", "B")
WRAPPER = "dial_data"


def parse(rec: RawRecord, chk: Checker) -> Episode:
    d = chk.obj(rec.data, "")
    if d.get(WRAPPER) is not None:
        return _released(d, chk)
    source_id, id_field = _source_id(d, rec, chk)
    episode_id = f"{DATASET}-{source_id}"
    chk.name(episode_id)
    at = "turns" if d.get("utterances") is None and d.get("turns") is not None else "utterances"
    return Episode(episode_id=episode_id, dataset=DATASET, sessions=[Session(_turns(d, chk, ""), at)],
                   id_field=id_field)


def _released(d: dict, chk: Checker) -> Episode:
    """{"dial_data": {name: [dialogue, ...]}}: one episode, one session per dialogue."""
    wrapped = chk.obj(d[WRAPPER], WRAPPER)
    if len(wrapped) != 1:
        chk.fail(WRAPPER, f"expected one dataset name under {WRAPPER}, got {len(wrapped)}: {shown(sorted(wrapped))}")
    name = chk.text(next(iter(wrapped)), WRAPPER)  # a key, and the episode id
    episode_id = f"{DATASET}-{name}"
    chk.name(episode_id)
    at = join(WRAPPER, name)
    sessions = []
    for i, dialogue in enumerate(chk.req(wrapped, name, list, WRAPPER)):
        d_at = join(at, i)
        turns = _turns(chk.obj(dialogue, d_at), chk, d_at)
        sessions.append(Session(turns, d_at))
    return Episode(episode_id=episode_id, dataset=DATASET, sessions=sessions, sessions_path=at, id_field=WRAPPER)


def _turns(d: dict, chk: Checker, at: str) -> list[Turn]:
    """One dialogue's turns with `topic_start` set, in any of the three styles."""
    if d.get("utterances") is None and d.get("turns") is not None:
        return _superdialseg(d, chk, at)
    utterances = chk.req(d, "utterances", list, at)
    turns = []
    for i, raw in enumerate(utterances):
        u_at = join(join(at, "utterances"), i)
        if isinstance(raw, dict):
            turns.append(Turn(speaker=chk.req(raw, "speaker", str, u_at), text=chk.req(raw, "text", str, u_at), path=u_at))
        else:
            turns.append(Turn(speaker=ALTERNATING[i % 2], text=chk.check(raw, str, u_at), path=u_at))
    for i, start in enumerate(_boundaries(d, len(turns), chk, at)):
        turns[i].topic_start = start
    return turns


def _superdialseg(d: dict, chk: Checker, at: str) -> list[Turn]:
    turns = []
    ends: list[bool] = []
    for i, raw in enumerate(chk.req(d, "turns", list, at)):
        t_at = join(join(at, "turns"), i)
        t = chk.obj(raw, t_at)
        turns.append(Turn(speaker=chk.req(t, "role", str, t_at), text=chk.req(t, "utterance", str, t_at), path=t_at))
        label = chk.req(t, "segmentation_label", (int, bool), t_at)
        if label not in (0, 1):
            chk.fail(join(t_at, "segmentation_label"), f"label must be 0 or 1, got {label}")
        ends.append(bool(label))
    # A segment ends at a labelled utterance, so the next utterance starts one.
    for i, turn in enumerate(turns):
        turn.topic_start = i == 0 or ends[i - 1]
    return turns


def _source_id(d: dict, rec: RawRecord, chk: Checker) -> tuple[str, str | None]:
    """(id, the field it came from); without one the file name (and position) make it, field None."""
    for key in ("dial_id", "id"):
        if d.get(key) is not None:
            return chk.ident(d, key), key
    # One dialogue per file: the file names it.
    return (rec.file.stem if rec.single else f"{rec.file.stem}-{rec.index}"), None


def _boundaries(d: dict, n: int, chk: Checker, at: str = "") -> list[bool]:
    if d.get("segments") is not None:
        key = join(at, "segments")
        lengths = chk.req(d, "segments", list, at)
        for i, length in enumerate(lengths):
            chk.check(length, int, join(key, i))
            if length < 1:
                chk.fail(join(key, i), f"segment length must be at least 1, got {length}")
        if sum(lengths) != n:
            chk.fail(key, f"segment lengths sum to {sum(lengths)} but there are {n} utterances")
        starts = [False] * n
        pos = 0
        for length in lengths:
            starts[pos] = True
            pos += length
        return starts

    name = "shift_labels" if d.get("shift_labels") is not None else "labels"
    key = join(at, name)
    if d.get(name) is None:
        chk.fail(join(at, "segments"), "required field is missing (give segments, shift_labels or labels)")
    labels = chk.req(d, name, list, at)
    for i, label in enumerate(labels):
        chk.check(label, (int, bool), join(key, i))
        if label not in (0, 1):
            chk.fail(join(key, i), f"label must be 0 or 1, got {label}")
    if len(labels) != n:
        chk.fail(key, f"{len(labels)} labels for {n} utterances")
    # The first utterance always opens a segment.
    return [i == 0 or bool(label) for i, label in enumerate(labels)]
