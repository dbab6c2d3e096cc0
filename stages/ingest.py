"""ingest: read a corpus in any supported format into the canonical episodes / turns / qa tables."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline.config import RunConfig
from pipeline.corpus import Corpus, corpus_files, load_corpus
from pipeline.errors import ConfigError
from pipeline.schemas import EPISODES, QA, TURNS
from pipeline.stage import GlobalStage, StageContext


class IngestStage(GlobalStage):
    name = "ingest"
    outputs = {"episodes": EPISODES, "turns": TURNS, "qa": QA}
    section = "corpus"

    def extra_fingerprint(self, cfg: RunConfig) -> dict[str, Any]:
        # The corpus content, so an edited input file re-runs ingest and everything after it.
        first = _digests(Path(cfg.corpus.path))
        extra = [_digests(Path(s.path)) for s in cfg.corpus.extra]
        return {**first, "extra": extra} if extra else first

    async def run(self, ctx: StageContext, inputs: dict[str, pa.Table]) -> dict[str, pa.Table]:
        corpora = [(s, load_corpus(s.format, s.path, s.limit)) for s in ctx.cfg.corpus.sources()]
        merged, seen = Corpus(), {}  # episode_id -> the source it came from
        for source, corpus in corpora:
            for e in corpus.episodes:
                if e["episode_id"] in seen:
                    raise ConfigError(f"corpus.extra: episode {e['episode_id']!r} of {source.path} is also in "
                                      f"{seen[e['episode_id']]}")
                seen[e["episode_id"]] = source.path
            merged.episodes += corpus.episodes
            merged.turns += corpus.turns
            merged.qa += corpus.qa
        return merged.tables()


def _digests(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"missing": str(path)}
    digests = {}
    for f in corpus_files(path):
        h = hashlib.sha256()
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        digests[f.name] = h.hexdigest()
    return {"files": digests}
