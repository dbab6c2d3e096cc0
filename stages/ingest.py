"""ingest: read a corpus in any supported format into the canonical episodes / turns / qa tables."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline.config import RunConfig
from pipeline.corpus import corpus_files, load_corpus
from pipeline.schemas import EPISODES, QA, TURNS
from pipeline.stage import GlobalStage, StageContext


class IngestStage(GlobalStage):
    name = "ingest"
    outputs = {"episodes": EPISODES, "turns": TURNS, "qa": QA}
    section = "corpus"

    def extra_fingerprint(self, cfg: RunConfig) -> dict[str, Any]:
        # The corpus content, so an edited input file re-runs ingest and everything after it.
        path = Path(cfg.corpus.path)
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

    async def run(self, ctx: StageContext, inputs: dict[str, pa.Table]) -> dict[str, pa.Table]:
        c = ctx.cfg.corpus
        return load_corpus(c.format, c.path, c.limit).tables()
