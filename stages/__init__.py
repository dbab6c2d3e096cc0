"""The pipeline's stages, in pipeline order. Add a stage by adding it to REGISTRY."""

from __future__ import annotations

from pipeline.stage import Stage
from stages.banks import BanksStage
from stages.compress import CompressStage
from stages.guidance import GuidanceStage
from stages.ingest import IngestStage
from stages.probes import ProbesStage
from stages.report import ReportStage
from stages.respond import RespondStage
from stages.score import ScoreStage
from stages.segment import SegmentStage

REGISTRY: dict[str, Stage] = {
    s.name: s
    for s in [
        IngestStage(),
        GuidanceStage(),
        SegmentStage(),
        CompressStage(),
        BanksStage(),
        ProbesStage(),
        RespondStage(),
        ScoreStage(),
        ReportStage(),
    ]
}


def get_stage(name: str) -> Stage:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown stage {name!r}; known: {list(REGISTRY)}") from None
