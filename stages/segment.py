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
from stages import units
from stages.common import sessions_of
from stages.methods.secom import segmentation
from stages.methods.secom.segmentation import AnswerFormat, SegmentationGuidance, Unit

GUIDANCE_FILE = "guidance.json"

SEGMENTS = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("session_idx", pa.int32(), nullable=False),
        pa.field("segment_idx", pa.int32(), nullable=False),
        pa.field("turn_start", pa.int32(), nullable=False),  # inclusive turn_idx
        pa.field("turn_end", pa.int32(), nullable=False),  # inclusive turn_idx
        pa.field("summary", pa.string()),  # the model's one-line summary (spans format)
        pa.field("fallback", pa.bool_(), nullable=False),  # fixed-size chunks replaced the LLM answer
        pa.field("normalised", pa.bool_(), nullable=False),  # a starts answer was cleaned to be valid
        pa.field("fallback_reason", pa.string()),
        pa.field("raw", pa.string()),  # last model output when the answer was rejected
        pa.field("model", pa.string()),
    ]
)


class ReflectionConfig(Section):
    """Reflection-learned segmentation guidance (SeCom Sec. 2.2, App. A.1); defaults are the paper's."""

    corpus_format: CorpusFormat = "dialseg"
    corpus_path: str | None = PathField()  # annotated corpus with gold boundaries; None = the run's corpus
    limit: int | None = Field(default=None, ge=1)  # annotated sessions to learn from; None = all
    rounds: int = Field(default=1, ge=1)
    hard_k: int = Field(default=100, ge=1)  # the worst sessions by WindowDiff
    mini_batches: int = Field(default=10, ge=1)  # one reflection call and one worked example each
    max_rubric_items: int = Field(default=10, ge=1)


class SegmentConfig(Section):
    mode: Literal["zero_shot", "reflection"] = "zero_shot"
    guidance_path: str | None = PathField()  # reuse a stored guidance.json instead of learning one
    reflection: ReflectionConfig = Field(default_factory=ReflectionConfig)
    unit: Unit = "exchange"  # what the model numbers: exchanges (paper), or single turns
    answer_format: AnswerFormat = "spans"  # spans (paper) or starts (valid by construction)
    max_units_per_call: int = Field(default=30, ge=2)  # longer sessions are segmented in windows
    fallback_size: int = Field(default=3, ge=1)  # units per fallback chunk (official code: 3 exchanges)
    # Sampling of the segmenter (official code: 0.7 / 1 / 42); null = the segmenter role's own.
    temperature: float | None = 0.7
    top_p: float | None = 1.0
    seed: int | None = 42

    def options(self) -> dict[str, Any]:
        """Keyword arguments of `segment_session` (besides the guidance)."""
        params = {k: v for k, v in (("temperature", self.temperature), ("top_p", self.top_p),
                                    ("seed", self.seed)) if v is not None}
        return {"unit": self.unit, "answer_format": self.answer_format, "params": params,
                "max_units_per_call": self.max_units_per_call, "fallback_size": self.fallback_size}


class SegmentStage(EpisodeStage):
    name = "segment"
    inputs = ("ingest", "guidance")
    outputs = {"segments": SEGMENTS}
    section = "segment"
    settings = SegmentConfig
    roles = ("segmenter",)
    code = (segmentation, units)

    def extra_fingerprint(self, cfg: Any) -> dict[str, Any]:
        path = cfg.segment.guidance_path
        return {"guidance": Path(path).read_text() if path and Path(path).exists() else None}

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict[str, Rows]) -> dict[str, Rows]:
        cfg = ctx.section
        guidance = load_guidance(ctx)
        sessions = sessions_of(inputs["ingest.turns"])

        async def one(session_idx: int, turns: Rows) -> Rows:
            result = await segmentation.segment_session(ctx.llm, turns, guidance=guidance, **cfg.options())
            return [
                {
                    "episode_id": episode_id, "session_idx": session_idx, "segment_idx": i,
                    "turn_start": turns[start]["turn_idx"], "turn_end": turns[end]["turn_idx"],
                    "summary": summary, "fallback": result.fallback, "normalised": result.normalised,
                    "fallback_reason": result.reason, "raw": result.raw, "model": ctx.llm.cfg.model,
                }
                for i, ((start, end), summary) in enumerate(zip(result.segments, result.summaries))
            ]

        parts = await asyncio.gather(*(one(s, ts) for s, ts in sessions.items()))
        return {"segments": [row for part in parts for row in part]}

    def shard_stats(self, produced: dict[str, Rows]) -> dict[str, Any]:
        """Sessions segmented by the model as answered, after normalisation, and by fallback."""
        sessions = {(r["episode_id"], r["session_idx"]): (r["fallback"], r["normalised"])
                    for r in produced.get("segments", [])}
        fallback = sum(f for f, _ in sessions.values())
        normalised = sum(n and not f for f, n in sessions.values())
        return {"sessions": len(sessions), "model_sessions": len(sessions) - fallback - normalised,
                "normalised_sessions": normalised, "fallback_sessions": fallback}


def load_guidance(ctx: StageContext) -> SegmentationGuidance | None:
    """Reflection guidance: a stored file, or the one the guidance stage learned."""
    cfg = ctx.section
    if cfg.mode != "reflection":
        return None
    path = Path(cfg.guidance_path) if cfg.guidance_path else ctx.upstream_dirs.get("guidance", Path("-")) / GUIDANCE_FILE
    if not path.exists():
        return None
    return SegmentationGuidance.from_dict(json.loads(path.read_text()))
