"""banks: turn-, session- and segment-level memory banks per episode, as Lance tables with vectors.

The Parquet table `memory_units` holds the same rows (and vectors) for the pipeline; the Lance
tables under `<run>/banks/lance/` are for users to open and query (`lancedb.connect(...)`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pyarrow as pa
from pydantic import Field

from pipeline.config import Section
from pipeline.embeddings import aencode
from pipeline.lance_store import write_bank
from pipeline.retrieval import count_tokens
from pipeline.engine.stage import EpisodeStage, Rows, StageContext
from stages.methods.secom.stages.compress import Granularity
from stages.methods.secom.units import UNIT_FIELDS, bank_schema

LANCE_DIR = "lance"

MEMORY_UNITS = pa.schema(
    [
        *UNIT_FIELDS,
        pa.field("vector", pa.list_(pa.float32())),  # embedding of the retrieval key (compressed text)
        pa.field("text_vector", pa.list_(pa.float32())),  # embedding of the original text (ablation)
        # cl100k tokens of the original text, what a retrieval budget counts: counted once here, not
        # by every respond shard that indexes the bank
        pa.field("text_tokens", pa.int32()),
        pa.field("lance_table", pa.string()),
    ]
)


class BanksConfig(Section):
    granularities: list[Granularity] = ["turn", "session", "segment"]  # (pydantic copies a list default)


def bank_name(episode_id: str, granularity: str) -> str:
    return f"{episode_id}__{granularity}"


def retrieval_key(unit: dict[str, Any]) -> str:
    """The compressed text when denoising produced one, else the original."""
    return unit.get("compressed_text") or unit["text"]


class BanksStage(EpisodeStage[BanksConfig]):
    name = "banks"
    inputs = ("compress",)
    outputs = {"memory_units": MEMORY_UNITS}
    section = "banks"
    uses_embedder = True

    async def process_episode(self, ctx: StageContext[BanksConfig], episode_id: str,
                              inputs: dict[str, Rows]) -> dict[str, Rows]:
        wanted = set(ctx.settings.granularities)
        units = [u for u in inputs["compress.units"] if u["granularity"] in wanted]
        if not units:
            return {"memory_units": []}
        # One call: where a unit's key is its own text (no compression), it is embedded once.
        # Awaited, so the worker's other episodes keep their requests in flight meanwhile.
        both = await aencode(ctx.embedder, [retrieval_key(u) for u in units] + [u["text"] for u in units])
        keys, originals = both[:len(units)], both[len(units):]
        rows: Rows = []
        for unit, vec, raw_vec in zip(units, keys, originals):
            row = {k: unit[k] for k in MEMORY_UNITS.names if k in unit}
            row.update(vector=vec, text_vector=raw_vec, text_tokens=count_tokens(unit["text"]),
                       lance_table=bank_name(episode_id, unit["granularity"]))
            rows.append(row)
        # In a thread: the Lance writes would otherwise hold up the loop's embedding requests.
        await asyncio.to_thread(_write_banks, ctx, episode_id, sorted(wanted), rows)
        return {"memory_units": rows}


def _write_banks(ctx: StageContext, episode_id: str, granularities: list[str], rows: Rows) -> None:
    for granularity in granularities:
        bank = [r for r in rows if r["granularity"] == granularity]
        if bank:
            write_bank(ctx.out_dir / LANCE_DIR, bank_name(episode_id, granularity), bank,
                       bank_schema(len(bank[0]["vector"])))
