"""segment: SeCom zero-shot (or reflection-guided) topical segmentation of every session."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from pydantic import Field

from pipeline.config import CorpusFormat, PathField, Section
from pipeline.stage import EpisodeStage, Rows, StageContext
from stages.common import sessions_of
from stages.methods.secom import segmentation
from stages.methods.secom.segmentation import SegmentationGuidance

GUIDANCE_FILE = "guidance.json"

SEGMENTS = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("session_idx", pa.int32(), nullable=False),
        pa.field("segment_idx", pa.int32(), nullable=False),
        pa.field("turn_start", pa.int32(), nullable=False),  # inclusive turn_idx
        pa.field("turn_end", pa.int32(), nullable=False),  # inclusive turn_idx
        pa.field("fallback", pa.bool_(), nullable=False),  # fixed-size chunks replaced the LLM answer
        pa.field("fallback_reason", pa.string()),
        pa.field("raw", pa.string()),  # last model output when the answer was rejected
        pa.field("model", pa.string()),
    ]
)


class ReflectionConfig(Section):
    """Reflection-learned segmentation guidance (SeCom Sec. 2.2, App. A.1)."""

    corpus_format: CorpusFormat = "dialseg"
    corpus_path: str | None = PathField()  # annotated corpus with gold boundaries; None = the run's corpus
    limit: int | None = 40  # sessions used for learning
    rounds: int = 2
    batch_size: int = 4
    hard_k: int = 8


class SegmentConfig(Section):
    mode: Literal["zero_shot", "reflection"] = "zero_shot"
    guidance_path: str | None = PathField()  # reuse a stored guidance.json instead of learning one
    reflection: ReflectionConfig = Field(default_factory=ReflectionConfig)
    max_turns_per_call: int = Field(default=40, ge=4)
    fallback_size: int = Field(default=4, ge=1)


class SegmentStage(EpisodeStage):
    name = "segment"
    inputs = ("ingest", "guidance")
    outputs = {"segments": SEGMENTS}
    section = "segment"
    settings = SegmentConfig
    roles = ("segmenter",)
    code = (segmentation,)

    def extra_fingerprint(self, cfg: Any) -> dict[str, Any]:
        path = cfg.segment.guidance_path
        return {"guidance": Path(path).read_text() if path and Path(path).exists() else None}

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict[str, Rows]) -> dict[str, Rows]:
        cfg = ctx.section
        guidance = load_guidance(ctx)
        sessions = sessions_of(inputs["ingest.turns"])

        async def one(session_idx: int, turns: Rows) -> Rows:
            result = await segmentation.segment_session(
                ctx.llm, turns, guidance=guidance,
                max_turns_per_call=cfg.max_turns_per_call, fallback_size=cfg.fallback_size,
            )
            return [
                {
                    "episode_id": episode_id, "session_idx": session_idx, "segment_idx": i,
                    "turn_start": turns[start]["turn_idx"], "turn_end": turns[end]["turn_idx"],
                    "fallback": result.fallback, "fallback_reason": result.reason, "raw": result.raw,
                    "model": ctx.llm.cfg.model,
                }
                for i, (start, end) in enumerate(result.segments)
            ]

        parts = await asyncio.gather(*(one(s, ts) for s, ts in sessions.items()))
        return {"segments": [row for part in parts for row in part]}

    def shard_stats(self, produced: dict[str, Rows]) -> dict[str, Any]:
        sessions = {(r["episode_id"], r["session_idx"]): r["fallback"] for r in produced.get("segments", [])}
        return {"sessions": len(sessions), "fallback_sessions": sum(sessions.values())}


def load_guidance(ctx: StageContext) -> SegmentationGuidance | None:
    """Reflection guidance: a stored file, or the one the guidance stage learned."""
    cfg = ctx.section
    if cfg.mode != "reflection":
        return None
    path = Path(cfg.guidance_path) if cfg.guidance_path else ctx.upstream_dirs.get("guidance", Path("-")) / GUIDANCE_FILE
    if not path.exists():
        return None
    return SegmentationGuidance.from_dict(json.loads(path.read_text()))
