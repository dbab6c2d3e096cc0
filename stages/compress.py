"""compress: SeCom's compression-based denoising (Sec. 2.3) of every memory unit.

The compressed text becomes the retrieval key; the original text is what retrieval returns.
"""

from __future__ import annotations

from typing import Any

from pipeline import compression
from pipeline.compression import Compressor
from pipeline.schemas import UNITS
from pipeline.stage import EpisodeStage, Rows, StageContext
from stages.common import failure_reason, sessions_of
from stages import units
from stages.units import build_units

_COMPRESSORS: dict[tuple[Any, ...], Compressor] = {}


def compressor_for(cfg: Any, cache_dir: str) -> Compressor:
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
    code = (units, compression)

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict[str, Rows]) -> dict[str, Rows]:
        cfg = ctx.section
        sessions = sessions_of(inputs["turns"])
        compressor = compressor_for(cfg, ctx.cfg.embedding.cache_dir)
        label = "none" if cfg.method == "none" else f"{cfg.method}@{cfg.rate}"
        # The compressor works line by line, and every utterance sits in one unit of each
        # granularity: compress each line once and reassemble units from the results.
        lines: dict[str, str] = {}

        def compress_unit(text: str) -> str:
            out = []
            for line in text.split("\n"):
                if line not in lines:
                    lines[line] = compressor.compress(line)
                out.append(lines[line])
            return "\n".join(out)

        rows: Rows = []
        for granularity in cfg.granularities:
            for unit in build_units(episode_id, sessions, inputs["segments"], granularity):
                try:
                    unit["compressed_text"], unit["error"] = compress_unit(unit["text"]), None
                except Exception as e:  # one bad unit keeps its original text as key and is marked
                    unit["compressed_text"], unit["error"] = None, failure_reason(e)
                unit["compression"] = label
                rows.append(unit)
        return {"units": rows}
