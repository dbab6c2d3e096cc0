"""segment: SeCom zero-shot (or reflection-guided) topical segmentation of every session."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from pipeline.schemas import SEGMENTS
from pipeline.stage import EpisodeStage, Rows, StageContext
from stages.common import sessions_of
from stages.methods import secom

GUIDANCE_FILE = "guidance.json"


class SegmentStage(EpisodeStage):
    name = "segment"
    inputs = ("ingest", "guidance")
    outputs = {"segments": SEGMENTS}
    section = "segment"
    uses_llm = True
    code = (secom,)

    def extra_fingerprint(self, cfg: Any) -> dict[str, Any]:
        path = cfg.segment.guidance_path
        return {"guidance": Path(path).read_text() if path and Path(path).exists() else None}

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict[str, Rows]) -> dict[str, Rows]:
        cfg = ctx.section
        guidance = load_guidance(ctx)
        sessions = sessions_of(inputs["turns"])

        async def one(session_idx: int, turns: Rows) -> Rows:
            result = await secom.segment_session(
                ctx.llm, turns, guidance=guidance,
                max_turns_per_call=cfg.max_turns_per_call, fallback_size=cfg.fallback_size,
            )
            return [
                {
                    "episode_id": episode_id, "session_idx": session_idx, "segment_idx": i,
                    "turn_start": turns[start]["turn_idx"], "turn_end": turns[end]["turn_idx"],
                    "fallback": result.fallback, "fallback_reason": result.reason, "raw": result.raw,
                    "model": ctx.cfg.llm.model,
                }
                for i, (start, end) in enumerate(result.segments)
            ]

        parts = await asyncio.gather(*(one(s, ts) for s, ts in sessions.items()))
        return {"segments": [row for part in parts for row in part]}

    def manifest_extra(self, out_dir: Path) -> dict[str, Any]:
        files = sorted((out_dir / "segments").glob("part-*.parquet"))
        if not files:
            return {"fallback_sessions": 0, "sessions": 0}
        table = pq.ParquetDataset([str(f) for f in files]).read(columns=["episode_id", "session_idx", "fallback"])
        sessions = {(r["episode_id"], r["session_idx"]): r["fallback"] for r in table.to_pylist()}
        return {"sessions": len(sessions), "fallback_sessions": sum(sessions.values())}


def load_guidance(ctx: StageContext) -> "secom.SegmentationGuidance | None":
    """Reflection guidance: a stored file, or the one the segment_guidance stage learned."""
    cfg = ctx.section
    if cfg.mode != "reflection":
        return None
    path = Path(cfg.guidance_path) if cfg.guidance_path else ctx.upstream_dirs.get("guidance", Path("-")) / GUIDANCE_FILE
    if not path.exists():
        return None
    return secom.SegmentationGuidance.from_dict(json.loads(path.read_text()))
