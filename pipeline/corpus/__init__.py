"""Corpus loaders: read any supported format into canonical episodes / turns / qa / memory_points rows.

Everything requested is validated before anything is returned, so bad input publishes nothing. With a
limit only the first `limit` episodes are read (JSONL is streamed), so a smoke run on a large corpus
stays cheap; records after them are not checked. `episode_ids` keeps only the episodes named (and
stops reading once all are found); the limit then counts those."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pyarrow as pa

from pipeline.corpus import (beam, cc, dialseg, halumem, locomo, locomo_plus, longmemeval, longmtbench,
                             memoryagentbench, msc, sample)
from pipeline.corpus.reader import RawRecord, corpus_files, iter_records
from pipeline.corpus.records import Checker, Episode, Rows, build_rows, shown
from pipeline.errors import ConfigError, InputError
from pipeline.schemas import EPISODES, MEMORY_POINTS, QA, TURNS

_PARSERS: dict[str, Callable[[RawRecord, Checker], Episode]] = {
    "sample": sample.parse,
    "msc": msc.parse,
    "cc": cc.parse,
    "locomo": locomo.parse,
    "longmtbench": longmtbench.parse,
    "dialseg": dialseg.parse,
    "longmemeval": longmemeval.parse,
    "memoryagentbench": memoryagentbench.parse,
    "locomo_plus": locomo_plus.parse,
    "beam": beam.parse,
    "halumem": halumem.parse,
}
FORMATS = tuple(_PARSERS)  # the values `corpus.format` accepts

__all__ = ["FORMATS", "Corpus", "Rows", "load_corpus", "iter_episodes", "corpus_files", "format_files",
           "read_episode_ids"]


@dataclass
class Corpus:
    episodes: list[dict] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    qa: list[dict] = field(default_factory=list)
    memory_points: list[dict] = field(default_factory=list)  # empty for a corpus without gold memory points

    def add(self, rows: Rows) -> None:
        """One episode's rows."""
        self.episodes.append(rows.episode)
        self.turns.extend(rows.turns)
        self.qa.extend(rows.qa)
        self.memory_points.extend(rows.memory_points)

    def tables(self) -> dict[str, pa.Table]:
        return {
            "episodes": pa.Table.from_pylist(self.episodes, schema=EPISODES),
            "turns": pa.Table.from_pylist(self.turns, schema=TURNS),
            "qa": pa.Table.from_pylist(self.qa, schema=QA),
            "memory_points": pa.Table.from_pylist(self.memory_points, schema=MEMORY_POINTS),
        }


def read_episode_ids(spec: list[str] | str | Path | None) -> list[str] | None:
    """`corpus.episode_ids` as a list: the list as given, or the ids in a file (.json: a JSON list of
    strings; any other file: one id per line, blank lines and '#' comments skipped). None: no selection."""
    if spec is None or isinstance(spec, list):
        return None if spec is None else [str(i) for i in spec]
    p = Path(spec)
    if not p.is_file():
        raise ConfigError(f"corpus.episode_ids: no such file {str(p)!r}")
    if p.suffix == ".json":
        ids = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(ids, list) or not all(isinstance(i, (str, int)) for i in ids):
            raise ConfigError(f"corpus.episode_ids: {p} must hold a JSON list of ids")
        return [str(i) for i in ids]
    lines = (line.split("#", 1)[0].strip() for line in p.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line]


def _selected(episode: dict, wanted: set[str]) -> str | None:
    """The id of `wanted` that names this episode: its episode id, or the corpus's own id (the episode
    id without its "<dataset>-" prefix, e.g. CC's dataID); None when it is not wanted."""
    eid = episode["episode_id"]
    if eid in wanted:
        return eid
    prefix = f"{episode.get('dataset')}-"
    own = eid[len(prefix):] if eid.startswith(prefix) else None
    return own if own in wanted else None


def load_corpus(fmt: str, path: str | Path, limit: int | None = None,
                episode_ids: list[str] | str | None = None, captions: bool = True) -> Corpus:
    """Load the first `limit` episodes (all when None) of a file, or of every *.json/*.jsonl in a
    directory; with `episode_ids`, of the episodes they name."""
    corpus = Corpus()
    for rows in iter_episodes(fmt, path, limit, episode_ids, captions):
        corpus.add(rows)
    return corpus


def format_files(fmt: str, path: str | Path) -> list[Path]:
    """The files a corpus of format `fmt` reads under `path` (a BEAM corpus: nested conversation folders;
    any other: the file, or the directory's .json / .jsonl files); InputError when there are none."""
    return beam.corpus_files(path) if fmt == "beam" else corpus_files(path)


def iter_episodes(fmt: str, path: str | Path, limit: int | None = None,
                  episode_ids: list[str] | str | None = None, captions: bool = True) -> Iterator[Rows]:
    """The canonical rows of the first `limit` episodes (all when None), one episode at a time, so a
    reader holds one episode (one JSON file's records for .json) however big the corpus. With
    `episode_ids` (`read_episode_ids`) only the episodes they name, in the file's order; an id the
    corpus does not hold is an error (unless the limit is reached first). Raises on the first bad
    record or duplicate episode id; a caller that must publish nothing from bad input writes nothing
    final before the iterator is exhausted."""
    if fmt not in _PARSERS:
        raise ConfigError(f"corpus.format: unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    if limit is not None and limit < 0:
        raise ConfigError(f"corpus.limit: must be >= 0, got {limit}")
    ids = read_episode_ids(episode_ids)
    if ids is not None and not ids:
        raise ConfigError("corpus.episode_ids: empty (null reads every episode)")
    wanted = set(ids) if ids is not None else None
    found: set[str] = set()
    parse = _PARSERS[fmt]
    if fmt == "locomo" and not captions:  # `corpus.captions: false`: LoCoMo turns without photo captions
        parse = partial(locomo.parse, captions=False)
    seen: dict[str, str] = {}  # episode_id -> where it was first seen
    if limit == 0:  # still report a missing path
        format_files(fmt, path)
        return
    if fmt == "locomo_plus":  # two files read together: a cue item is stitched into a LoCoMo conversation
        records, parse = locomo_plus.reader(path, captions)
    elif fmt == "beam":  # a folder per conversation: its chat and its probing questions
        records = beam.reader(path)
    else:
        records = iter_records(path)
    if fmt == "memoryagentbench":  # a task's contexts numbered in the order read
        parse = memoryagentbench.counting_parser()
    count = 0
    try:
        for rec in records:
            chk = Checker(rec)
            episode = parse(rec, chk)
            rows = build_rows(episode, chk)
            eid = rows.episode["episode_id"]
            if eid in seen:
                # Named by the field the id came from (dataID, sample_id, ...); None when derived from
                # the file name and position.
                raise InputError(chk.file, chk.record, episode.id_field,
                                 f"duplicate episode id {shown(eid)} (first: {seen[eid]})")
            seen[eid] = f"{chk.file} {rec.locator}"
            if wanted is not None:
                key = _selected(rows.episode, wanted)
                if key is None:
                    continue
                found.add(key)
            yield rows
            count += 1
            if limit is not None and count >= limit:
                return
            if wanted is not None and found == wanted:
                return
    finally:
        records.close()  # releases the open JSONL file when a limit stops early
    if wanted is not None and found != wanted:
        missing = sorted(wanted - found)
        raise ConfigError(f"corpus.episode_ids: {len(missing)} of {len(wanted)} ids are not in {path}: "
                          f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
