"""Corpus loaders: read any supported format into canonical episodes / turns / qa rows.

Everything requested is validated before anything is returned, so bad input publishes nothing. With a
limit only the first `limit` episodes are read (JSONL is streamed), so a smoke run on a large corpus
stays cheap; records after them are not checked."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from pipeline.corpus import cc, dialseg, locomo, longmemeval, longmtbench, msc, sample
from pipeline.corpus.reader import RawRecord, corpus_files, iter_records
from pipeline.corpus.records import Checker, Episode, Rows, build_rows, shown
from pipeline.errors import ConfigError, InputError
from pipeline.schemas import EPISODES, QA, TURNS

_PARSERS: dict[str, Callable[[RawRecord, Checker], Episode]] = {
    "sample": sample.parse,
    "msc": msc.parse,
    "cc": cc.parse,
    "locomo": locomo.parse,
    "longmtbench": longmtbench.parse,
    "dialseg": dialseg.parse,
    "longmemeval": longmemeval.parse,
}
FORMATS = tuple(_PARSERS)  # the values `corpus.format` accepts

__all__ = ["FORMATS", "Corpus", "Rows", "load_corpus", "iter_episodes", "corpus_files"]


@dataclass
class Corpus:
    episodes: list[dict] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    qa: list[dict] = field(default_factory=list)

    def tables(self) -> dict[str, pa.Table]:
        return {
            "episodes": pa.Table.from_pylist(self.episodes, schema=EPISODES),
            "turns": pa.Table.from_pylist(self.turns, schema=TURNS),
            "qa": pa.Table.from_pylist(self.qa, schema=QA),
        }


def load_corpus(fmt: str, path: str | Path, limit: int | None = None) -> Corpus:
    """Load the first `limit` episodes (all when None) of a file, or of every *.json/*.jsonl in a directory."""
    corpus = Corpus()
    for rows in iter_episodes(fmt, path, limit):
        corpus.episodes.append(rows.episode)
        corpus.turns.extend(rows.turns)
        corpus.qa.extend(rows.qa)
    return corpus


def iter_episodes(fmt: str, path: str | Path, limit: int | None = None) -> Iterator[Rows]:
    """The canonical rows of the first `limit` episodes (all when None), one episode at a time, so a
    reader holds one episode (one JSON file's records for .json) however big the corpus. Raises on the
    first bad record or duplicate episode id; a caller that must publish nothing from bad input writes
    nothing final before the iterator is exhausted."""
    if fmt not in _PARSERS:
        raise ConfigError(f"corpus.format: unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    if limit is not None and limit < 0:
        raise ConfigError(f"corpus.limit: must be >= 0, got {limit}")
    parse = _PARSERS[fmt]
    seen: dict[str, str] = {}  # episode_id -> where it was first seen
    if limit == 0:
        corpus_files(path)  # still report a missing path
        return
    records = iter_records(path)
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
            yield rows
            count += 1
            if limit is not None and count >= limit:
                break
    finally:
        records.close()  # releases the open JSONL file when a limit stops early
