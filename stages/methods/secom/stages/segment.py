"""segment: SeCom zero-shot (or reflection-guided) topical segmentation of every session."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline.artifacts import read_text
from pipeline.errors import ConfigError, PipelineError
from pipeline.storage import join
from pipeline.engine.stage import EpisodeStage, Rows, StageContext
from stages.dialogue import sessions_of
from stages.methods.secom import segmentation
from stages.methods.secom.stages.guidance import GUIDANCE_FILE
from stages.methods.secom.stages.segment_settings import SegmentConfig
from stages.methods.secom.segmentation import SegmentationGuidance

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


class SegmentStage(EpisodeStage[SegmentConfig]):
    name = "segment"
    inputs = ("ingest", "guidance")
    outputs = {"segments": SEGMENTS}
    section = "segment"
    roles = ("segmenter",)

    def extra_fingerprint(self, cfg: Any) -> dict[str, Any]:
        path = stored_guidance(cfg.segment)  # checked when the run is planned, before any call
        return {"guidance": path.read_text() if path else None, "segment_units": segment_units(cfg)}

    async def process_episode(self, ctx: StageContext[SegmentConfig], episode_id: str,
                              inputs: dict[str, Rows]) -> dict[str, Rows]:
        cfg = ctx.settings
        sessions = sessions_of(inputs["ingest.turns"])
        if not segment_units(ctx.cfg):
            # Segments feed segment-level units and the scores against gold topic boundaries; with
            # neither (LongMemEval: rounds and sessions only) no session is worth a segmenter call.
            sessions = {s: ts for s, ts in sessions.items() if any(t["gold_topic_boundary"] is not None for t in ts)}
        guidance = load_guidance(ctx)

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
        """Sessions segmented by the model as answered, after normalisation, and by fallback; of the
        model's, the degenerate answers: a session of more than two turns left whole
        (`one_segment_sessions`) or cut into one-turn segments only (`one_turn_segment_sessions`)."""
        rows = produced.get("segments", [])
        sessions = {(r["episode_id"], r["session_idx"]): (r["fallback"], r["normalised"]) for r in rows}
        fallback = sum(f for f, _ in sessions.values())
        normalised = sum(n and not f for f, n in sessions.values())
        sizes: dict[tuple[str, int], list[int]] = {}
        for r in rows:
            if not r["fallback"]:
                sizes.setdefault((r["episode_id"], r["session_idx"]), []).append(r["turn_end"] - r["turn_start"] + 1)
        whole = sum(len(v) == 1 and v[0] > 2 for v in sizes.values())
        split = sum(len(v) > 2 and max(v) == 1 for v in sizes.values())
        return {"sessions": len(sessions), "model_sessions": len(sessions) - fallback - normalised,
                "normalised_sessions": normalised, "fallback_sessions": fallback,
                "one_segment_sessions": whole, "one_turn_segment_sessions": split}


def segment_units(cfg: Any) -> bool:
    """Whether the run builds segment-level memory units (`compress.granularities`)."""
    return "segment" in cfg.compress.granularities


def stored_guidance(cfg: SegmentConfig) -> Path | None:
    """The guidance file `segment.guidance_path` names, when segmentation uses one (mode reflection).
    ConfigError when it does not exist: segmenting zero-shot instead would go unnoticed."""
    if cfg.mode != "reflection" or not cfg.guidance_path:
        return None
    path = Path(cfg.guidance_path)
    if not path.is_file():
        raise ConfigError(f"segment.guidance_path: {path} does not exist{cfg.looked_in(path)} (segment.mode is "
                          "reflection; drop guidance_path to learn the guidance in this run)")
    return path


def load_guidance(ctx: StageContext[SegmentConfig]) -> SegmentationGuidance | None:
    """Reflection guidance: a stored file, or the one the guidance stage learned; None in zero-shot
    mode. A file that should be there and is not is an error, never a silent zero-shot run."""
    cfg = ctx.settings
    if cfg.mode != "reflection":
        return None
    path = stored_guidance(cfg) or join(ctx.upstream_dirs.get("guidance", Path("-")), GUIDANCE_FILE)
    try:
        return SegmentationGuidance.from_dict(json.loads(read_text(path)))
    except (FileNotFoundError, IsADirectoryError):
        raise PipelineError(f"segment.mode is reflection but the guidance stage left no {GUIDANCE_FILE} "
                            f"(looked for {path})") from None
