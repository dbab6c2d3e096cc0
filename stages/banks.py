"""banks: turn-, session- and segment-level memory banks per episode, as Lance tables with vectors.

The Parquet table `memory_units` holds the same rows (and vectors) for the pipeline; the Lance
tables under `<run>/banks/lance/` are for users to open and query (`lancedb.connect(...)`).
"""

from __future__ import annotations

from typing import Any

from pipeline.lance_store import write_bank
from pipeline.schemas import MEMORY_UNITS
from pipeline.stage import EpisodeStage, Rows, StageContext

LANCE_DIR = "lance"


def bank_name(episode_id: str, granularity: str) -> str:
    return f"{episode_id}__{granularity}"


def retrieval_key(unit: dict[str, Any]) -> str:
    """The compressed text when denoising produced one, else the original."""
    return unit.get("compressed_text") or unit["text"]


class BanksStage(EpisodeStage):
    name = "banks"
    inputs = ("compress",)
    outputs = {"memory_units": MEMORY_UNITS}
    section = "banks"
    uses_embedder = True

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict[str, Rows]) -> dict[str, Rows]:
        wanted = set(ctx.section.granularities)
        units = [u for u in inputs["units"] if u["granularity"] in wanted]
        if not units:
            return {"memory_units": []}
        keys = ctx.embedder.encode([retrieval_key(u) for u in units])
        originals = ctx.embedder.encode([u["text"] for u in units])
        rows: Rows = []
        for unit, vec, raw_vec in zip(units, keys, originals):
            row = {k: unit[k] for k in MEMORY_UNITS.names if k in unit}
            row.update(vector=vec.tolist(), text_vector=raw_vec.tolist(), lance_table=bank_name(episode_id, unit["granularity"]))
            rows.append(row)
        for granularity in sorted(wanted):
            bank = [r for r in rows if r["granularity"] == granularity]
            if bank:
                write_bank(ctx.out_dir / LANCE_DIR, bank_name(episode_id, granularity), bank, len(bank[0]["vector"]))
        return {"memory_units": rows}
