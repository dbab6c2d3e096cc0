"""Conversation Chronicles (and the Theanine-style MSC release that shares its schema).

A record holds "<ordinal>_session_dialogue" / "<ordinal>_session_speakers" pairs (first, second, ...;
"session_<n>_dialogue" also accepted), "time_interval" (one gap label per session after the first),
"relationship" and "dataID"."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pipeline.corpus.reader import RawRecord
from pipeline.corpus.records import Checker, Episode, Session, Turn, join

DATASET = "cc"

ORDINALS = (
    "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth",
    "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth", "seventeenth",
    "eighteenth", "nineteenth", "twentieth",
)  # fmt: skip
_ORDINAL_NUM = {name: i for i, name in enumerate(ORDINALS, start=1)}
_KEY_RE = re.compile(r"^(?:(?P<ordinal>[a-z]+)_session|session_(?P<num>\d+))_dialogue$")


def is_cc_record(d: Mapping[str, Any]) -> bool:
    return "dataID" in d or any(_KEY_RE.match(k) for k in d)


def _session_keys(d: Mapping[str, Any], chk: Checker) -> dict[int, str]:
    """Session number -> its dialogue key, sorted numerically."""
    found: dict[int, str] = {}
    for key in d:
        m = _KEY_RE.match(key)
        if not m:
            continue
        if m["ordinal"] is not None:
            if m["ordinal"] not in _ORDINAL_NUM:
                chk.fail(key, f"unknown session ordinal {m['ordinal']!r} (known: first .. {ORDINALS[-1]})")
            n = _ORDINAL_NUM[m["ordinal"]]
        else:
            n = int(m["num"])
            if n < 1:
                chk.fail(key, "session numbers start at 1")
        if n in found:
            chk.fail(key, f"session {n} is given twice (also as {found[n]!r})")
        found[n] = key
    return dict(sorted(found.items()))


def _is_empty(value: Any) -> bool:
    return value is None or value == []


def parse(rec: RawRecord, chk: Checker, dataset: str = DATASET) -> Episode:
    d = chk.obj(rec.data, "")
    episode_id = f"{dataset}-{chk.ident(d, 'dataID')}"
    chk.name(episode_id)

    keys = _session_keys(d, chk)
    # Releases pad every record to a fixed session count with empty trailing sessions; those are absent,
    # an empty session followed by a real one is an error.
    last = max((n for n, k in keys.items() if not _is_empty(d[k])), default=0)
    if last == 0:
        chk.fail("first_session_dialogue", "record has no sessions")
    sessions = []
    for n in range(1, last + 1):
        if n not in keys:
            chk.fail(_dialogue_key(n), f"session {n} is missing but session {last} exists")
        key = keys[n]
        speakers_key = key[: -len("dialogue")] + "speakers"
        utterances = chk.str_list(d[key] if d[key] is not None else [], key)
        if speakers_key not in d or d[speakers_key] is None:
            chk.fail(speakers_key, "required field is missing")
        names = chk.str_list(d[speakers_key], speakers_key)
        if len(names) != len(utterances):
            chk.fail(speakers_key, f"has {len(names)} speakers for {len(utterances)} utterances in {key}")
        turns = [Turn(speaker=s, text=u, path=join(key, i)) for i, (s, u) in enumerate(zip(names, utterances))]
        sessions.append(Session(turns, key))

    intervals = chk.opt(d, "time_interval", list, default=[])
    for i, label in enumerate(intervals):
        if label is not None:
            chk.check(label, str, join("time_interval", i))
        # Entry i is the gap before session i + 2; entries for dropped padding sessions are ignored.
        if i + 1 < len(sessions):
            sessions[i + 1].gap = label

    return Episode(
        episode_id=episode_id,
        dataset=dataset,
        sessions=sessions,
        relationship=chk.opt(d, "relationship", str),
        sessions_path="first_session_dialogue",
        id_field="dataID",
    )


def _dialogue_key(n: int) -> str:
    return f"{ORDINALS[n - 1]}_session_dialogue" if n <= len(ORDINALS) else f"session_{n}_dialogue"
