"""ingest: read a corpus in any supported format into the canonical episodes / turns / qa / memory_points
tables (memory_points: the gold memory points a corpus gives per session, HaluMem's; empty for the others)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline.config import CorpusConfig, CorpusSource, RunConfig, under_cwd
from pipeline.corpus import Corpus, format_files, iter_episodes
from pipeline.corpus.fetch import missing_corpus_hint
from pipeline.corpus.locomo_audit import add_counts, audit_files, audited_rows, fetch_hint, read_corrections
from pipeline.errors import ConfigError
from pipeline.schemas import EPISODES, MEMORY_POINTS, QA, TURNS
from pipeline.engine.stage import PART_STATS, GlobalStage, StageContext


class IngestStage(GlobalStage[CorpusConfig]):
    name = "ingest"
    outputs = {"episodes": EPISODES, "turns": TURNS, "qa": QA, "memory_points": MEMORY_POINTS}
    section = "corpus"  # run-level: the stage reads it, RunConfig owns it

    def extra_fingerprint(self, cfg: RunConfig) -> dict[str, Any]:
        # The corpus content, so an edited input file re-runs ingest and everything after it.
        first = _digests(Path(cfg.corpus.path), cfg.corpus.format)
        extra = [_digests(Path(s.path), s.format) for s in cfg.corpus.extra]
        out = {**first, "extra": extra} if extra else first
        # A file of episode ids: its content (the path alone is already in the section's settings).
        id_files = [_digests(Path(s.episode_ids)) if isinstance(s.episode_ids, str) else None
                    for s in cfg.corpus.sources()]
        out = {**out, "episode_id_files": id_files} if any(id_files) else out
        # The audited answer key's corrections (answer_key itself is in the section's settings).
        audits = [_file_digests(audit_files(s.audit_path)) if s.answer_key == "audited" else None
                  for s in cfg.corpus.sources()]
        return {**out, "answer_key_files": audits} if any(audits) else out

    # Parsed and written in parts of `ray.episodes_per_shard` episodes: the worker holds one part and
    # the ids seen, not the corpus (a 10k-episode corpus parsed whole took 700 MB).
    streams = True

    def check_inputs(self, cfg: RunConfig) -> None:
        for source in cfg.corpus.sources():
            _require_source(source)

    def run_parts(self, ctx: StageContext[CorpusConfig], inputs: dict[str, pa.Table],
                  episodes_per_part: int) -> Iterator[dict[str, Any]]:
        seen: dict[str, str] = {}  # episode_id -> the source it came from
        part = Corpus()
        stats: dict[str, Any] = {}  # what the audited answer key did, for the manifest (nested counts)
        for source in ctx.settings.sources():
            _require_source(source)  # again where it runs: a worker may not see what the driver saw
            corrections = read_corrections(source.audit_path) if source.answer_key == "audited" else None
            for rows in iter_episodes(source.format, source.path, source.limit, source.episode_ids, source.captions):
                eid = rows.episode["episode_id"]
                if eid in seen:
                    raise ConfigError(f"corpus.extra: episode {eid!r} of {source.path} is also in {seen[eid]}")
                seen[eid] = source.path
                if corrections is not None:
                    rows, counts = audited_rows(rows, corrections)
                    add_counts(stats, counts)
                part.add(rows)
                if len(part.episodes) == episodes_per_part:
                    yield {**part.tables(), PART_STATS: stats}
                    part, stats = Corpus(), {}
        if part.episodes:
            yield {**part.tables(), PART_STATS: stats}


def _require_source(source: CorpusSource) -> None:
    """A corpus source that is there, or an error with the fetch command for a corpus we know; with the
    audited answer key, its audit files too."""
    if not Path(source.path).exists():
        source.require_file(source.path, missing_corpus_hint(source.format, under_cwd(source.path)))
    if source.answer_key == "audited":
        for f in audit_files(source.audit_path):
            source.require_file(str(f), "the audited answer key (corpus.answer_key: audited) reads "
                                        f"dial481/locomo-audit's corrections: {fetch_hint(under_cwd(source.audit_path))}")


def _digests(path: Path, fmt: str = "") -> dict[str, Any]:
    """sha256 of the files a corpus of format `fmt` reads under `path` (a plain file: itself)."""
    if not path.exists():
        return {"missing": str(path)}
    return _file_digests(format_files(fmt, path), path)


def _file_digests(files: list[Path], root: Path | None = None) -> dict[str, Any]:
    """sha256 of each file by name; by its path under `root` where names repeat (BEAM's chat.json per
    conversation folder)."""
    digests: dict[str, str | None] = {}
    names = [f.name for f in files]
    nested = root is not None and root.is_dir() and len(set(names)) < len(names)
    for f in files:
        key = f.relative_to(root).as_posix() if nested and root is not None else f.name
        if not f.is_file():
            digests[key] = None  # missing: check_inputs names it
            continue
        h = hashlib.sha256()
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        digests[key] = h.hexdigest()
    return {"files": digests}
