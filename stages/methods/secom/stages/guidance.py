"""guidance: SeCom's reflection-learned segmentation guidance (Sec. 2.2, App. A.1), as an artifact.

Runs only with `segment.mode: reflection` and no `segment.guidance_path`. It learns a rubric and
few-shot examples from sessions with gold boundaries and writes `guidance.json`, which the
segment stage reads; copy that file anywhere and point `segment.guidance_path` at it to reuse it.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from pipeline.config import RunConfig
from pipeline.corpus import load_corpus
from pipeline.errors import PipelineError
from pipeline.engine.stage import GlobalStage, StageContext
from stages.dialogue import sessions_of
from stages.methods.secom import reflection
from stages.methods.secom.stages.segment_settings import SegmentConfig

GUIDANCE_FILE = "guidance.json"  # the learned guidance, read by `segment`

GUIDANCE = pa.schema(
    [
        pa.field("rubric", pa.string()),
        pa.field("examples_json", pa.string()),
        pa.field("history_json", pa.string()),  # per reflection round: mean WindowDiff, ...
        pa.field("sessions_used", pa.int64()),
        pa.field("model", pa.string()),
    ]
)


def scoring_convention(cfg: RunConfig) -> str:
    """The Pk / WindowDiff convention results are scored in (`score.segmentation_convention`), by
    which reflection ranks its hard examples too."""
    score = getattr(cfg, "score", None)
    return getattr(score, "segmentation_convention", "superdialseg")


def annotated_sessions(turns: list[dict[str, Any]], limit: int | None) -> list[list[dict[str, Any]]]:
    by_episode: dict[str, list[dict[str, Any]]] = {}
    for t in turns:
        by_episode.setdefault(t["episode_id"], []).append(t)
    sessions = [
        s for ep in by_episode.values() for s in sessions_of(ep).values()
        if all(t["gold_topic_boundary"] is not None for t in s)
    ]
    return sessions[:limit] if limit else sessions


class GuidanceStage(GlobalStage[SegmentConfig]):
    name = "guidance"
    inputs = ("ingest",)
    outputs = {"guidance": GUIDANCE}
    section = "segment"
    roles = ("segmenter",)

    def active(self, cfg: RunConfig) -> bool:
        settings = self.settings_of(cfg)
        return settings.mode == "reflection" and not settings.guidance_path

    def extra_fingerprint(self, cfg: RunConfig) -> dict[str, Any]:
        return {"active": self.active(cfg), "convention": scoring_convention(cfg)}

    def check_inputs(self, cfg: RunConfig) -> None:
        if self.active(cfg):
            rcfg = self.settings_of(cfg).reflection
            if rcfg.corpus_path:
                rcfg.require_file(rcfg.corpus_path)

    async def run(self, ctx: StageContext[SegmentConfig], inputs: dict[str, pa.Table]) -> dict[str, pa.Table]:
        if not self.active(ctx.cfg):
            return {"guidance": GUIDANCE.empty_table()}
        rcfg = ctx.settings.reflection
        if rcfg.corpus_path:
            rcfg.require_file(rcfg.corpus_path)
            turns = load_corpus(rcfg.corpus_format, rcfg.corpus_path).turns
        else:
            turns = inputs["ingest.turns"].to_pylist()
        sessions = annotated_sessions(turns, rcfg.limit)
        if not sessions:
            raise PipelineError("segment.mode=reflection needs sessions with gold topic boundaries "
                                "(set segment.reflection.corpus_path to an annotated corpus)")
        options = ctx.settings.options()
        learned = await reflection.learn_guidance(
            ctx.llm, sessions, rounds=rcfg.rounds, hard_k=rcfg.hard_k, mini_batches=rcfg.mini_batches,
            max_rubric_items=rcfg.max_rubric_items, unit=options.pop("unit"), segment_options=options,
            convention=scoring_convention(ctx.cfg),
        )
        ctx.out_dir.mkdir(parents=True, exist_ok=True)
        data = learned.to_dict()
        (ctx.out_dir / GUIDANCE_FILE).write_text(json.dumps(data, indent=2))
        row = {"rubric": learned.rubric, "examples_json": json.dumps(data["examples"]),
               "history_json": json.dumps(data["history"]), "sessions_used": len(sessions),
               "model": ctx.llm.cfg.model}
        return {"guidance": pa.Table.from_pylist([row], GUIDANCE)}
