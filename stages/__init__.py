"""The pipeline's stages, in pipeline order. Add a stage by adding it to REGISTRY."""

from __future__ import annotations

from pipeline.stage import Stage
from stages.ingest import IngestStage

REGISTRY: dict[str, Stage] = {s.name: s for s in [IngestStage()]}


def get_stage(name: str) -> Stage:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown stage {name!r}; known: {list(REGISTRY)}") from None
