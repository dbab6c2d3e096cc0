"""compress: SeCom's compression-based denoising (Sec. 2.3) of every memory unit.

The compressed text becomes the retrieval key; the original text is what retrieval returns.
"""

from __future__ import annotations

from typing import Any, Literal

import pyarrow as pa
from pydantic import Field

from pipeline.compression import CompressMethod, Compressor
from pipeline.config import Section
from pipeline.stage import EpisodeStage, Rows, StageContext
from pipeline.failures import failure_reason
from stages.methods.dialogue import sessions_of
from stages.methods.secom.units import UNIT_FIELDS, build_units

Granularity = Literal["turn", "session", "segment"]
UNITS = pa.schema([*UNIT_FIELDS, pa.field("error", pa.string())])


class CompressConfig(Section):
    method: CompressMethod = "llmlingua"
    # llmlingua2: a token-classification model name/folder; llmlingua: a causal LM; None = default
    model: str | None = None
    rate: float = Field(default=0.75, gt=0, le=1)  # kept share: 0.75 (paper); the official code's default is 0.9
    granularities: list[Granularity] = Field(default_factory=lambda: ["turn", "session", "segment"])


_COMPRESSORS: dict[tuple[Any, ...], Compressor] = {}


def compressor_for(cfg: CompressConfig, cache_dir: str) -> Compressor:
    """One compressor per worker process: loading the scorer model is the slow part."""
    key = (cfg.method, cfg.model, cfg.rate, cache_dir)
    if key not in _COMPRESSORS:
        _COMPRESSORS[key] = Compressor(method=cfg.method, model=cfg.model, rate=cfg.rate, cache_dir=cache_dir)
    return _COMPRESSORS[key]


class CompressStage(EpisodeStage):
    name = "compress"
    inputs = ("ingest", "segment")
    outputs = {"units": UNITS}
    section = "compress"
    settings = CompressConfig

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict[str, Rows]) -> dict[str, Rows]:
        cfg = ctx.section
        sessions = sessions_of(inputs["ingest.turns"])
        compressor = compressor_for(cfg, ctx.cfg.embedding.cache_dir)
        label = "none" if cfg.method == "none" else f"{cfg.method}@{cfg.rate}"
        # A per-line compressor (LLMLingua with a small scorer) sees each utterance alone, and every
        # utterance sits in one unit of each granularity: compress each line once and reassemble
        # units. LLMLingua-2 compresses whole units (turn-level units are exchanges).
        lines: dict[str, str] = {}

        def compress_unit(text: str) -> str:
            if not compressor.per_line:
                return compressor.compress(text)
            out = []
            for line in text.split("\n"):
                if line not in lines:
                    lines[line] = compressor.compress(line)
                out.append(lines[line])
            return "\n".join(out)

        rows: Rows = []
        for granularity in cfg.granularities:
            for unit in build_units(sessions, inputs["segment.segments"], granularity):
                try:
                    unit["compressed_text"], unit["error"] = compress_unit(unit["text"]), None
                except Exception as e:  # one bad unit keeps its original text as key and is marked
                    unit["compressed_text"], unit["error"] = None, failure_reason(e)
                unit["compression"] = label
                rows.append(unit)
        return {"units": rows}
