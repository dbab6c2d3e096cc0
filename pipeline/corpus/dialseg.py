"""Dialogue topic-segmentation sets with gold boundaries: one dialogue = one episode with one session.

DialSeg711 style gives "utterances" and "segments" (segment lengths); TIAGE style gives
"shift_labels" / "labels" (1 = a topic shift starts at this utterance); SuperDialseg style gives
"turns" of {"utterance", "role", "segmentation_label"} (1 = the last utterance of a segment; give
the list under its `dial_data.<name>` as a JSON array or JSON Lines)."""

from __future__ import annotations

from pipeline.corpus.reader import RawRecord
from pipeline.corpus.records import Checker, Episode, Session, Turn, join

DATASET = "dialseg"
ALTERNATING = ("A", "B")


def parse(rec: RawRecord, chk: Checker) -> Episode:
    d = chk.obj(rec.data, "")
    episode_id = f"{DATASET}-{_source_id(d, rec, chk)}"
    chk.name(episode_id)

    if d.get("utterances") is None and d.get("turns") is not None:
        return _superdialseg(d, episode_id, chk)
    utterances = chk.req(d, "utterances", list)
    turns = []
    for i, raw in enumerate(utterances):
        at = join("utterances", i)
        if isinstance(raw, dict):
            turns.append(Turn(speaker=chk.req(raw, "speaker", str, at), text=chk.req(raw, "text", str, at), path=at))
        else:
            turns.append(Turn(speaker=ALTERNATING[i % 2], text=chk.check(raw, str, at), path=at))

    for i, start in enumerate(_boundaries(d, len(turns), chk)):
        turns[i].topic_start = start
    return Episode(episode_id=episode_id, dataset=DATASET, sessions=[Session(turns, "utterances")])


def _superdialseg(d: dict, episode_id: str, chk: Checker) -> Episode:
    turns = []
    ends: list[bool] = []
    for i, raw in enumerate(chk.req(d, "turns", list)):
        at = join("turns", i)
        t = chk.obj(raw, at)
        turns.append(Turn(speaker=chk.req(t, "role", str, at), text=chk.req(t, "utterance", str, at), path=at))
        label = chk.req(t, "segmentation_label", (int, bool), at)
        if label not in (0, 1):
            chk.fail(join(at, "segmentation_label"), f"label must be 0 or 1, got {label}")
        ends.append(bool(label))
    # A segment ends at a labelled utterance, so the next utterance starts one.
    for i, turn in enumerate(turns):
        turn.topic_start = i == 0 or ends[i - 1]
    return Episode(episode_id=episode_id, dataset=DATASET, sessions=[Session(turns, "turns")])


def _source_id(d: dict, rec: RawRecord, chk: Checker) -> str:
    for key in ("dial_id", "id"):
        if d.get(key) is not None:
            return chk.ident(d, key)
    # One dialogue per file: the file names it.
    return rec.file.stem if rec.single else f"{rec.file.stem}-{rec.index}"


def _boundaries(d: dict, n: int, chk: Checker) -> list[bool]:
    if d.get("segments") is not None:
        lengths = chk.req(d, "segments", list)
        for i, length in enumerate(lengths):
            chk.check(length, int, join("segments", i))
            if length < 1:
                chk.fail(join("segments", i), f"segment length must be at least 1, got {length}")
        if sum(lengths) != n:
            chk.fail("segments", f"segment lengths sum to {sum(lengths)} but there are {n} utterances")
        starts = [False] * n
        pos = 0
        for length in lengths:
            starts[pos] = True
            pos += length
        return starts

    key = "shift_labels" if d.get("shift_labels") is not None else "labels"
    if d.get(key) is None:
        chk.fail("segments", "required field is missing (give segments, shift_labels or labels)")
    labels = chk.req(d, key, list)
    for i, label in enumerate(labels):
        chk.check(label, (int, bool), join(key, i))
        if label not in (0, 1):
            chk.fail(join(key, i), f"label must be 0 or 1, got {label}")
    if len(labels) != n:
        chk.fail(key, f"{len(labels)} labels for {n} utterances")
    # The first utterance always opens a segment.
    return [i == 0 or bool(label) for i, label in enumerate(labels)]
