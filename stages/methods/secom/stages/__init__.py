"""SeCom's memory units, built once per run for the turn-, session- and segment-level methods:
`guidance` learns a segmentation rubric (optional), `segment` cuts sessions into topical
segments, `compress` builds the units of every granularity and denoises them, `banks` embeds them
into Lance tables. The units themselves are defined in `stages/methods/secom/units.py`."""

from __future__ import annotations

from pipeline.engine.stage import Stage


def secom_stages() -> tuple[Stage, ...]:
    """SeCom's stages in pipeline order, as its methods bring them (`Method.stages`)."""
    from stages.methods.secom.stages.banks import BanksStage
    from stages.methods.secom.stages.compress import CompressStage
    from stages.methods.secom.stages.guidance import GuidanceStage
    from stages.methods.secom.stages.segment import SegmentStage

    return (GuidanceStage(), SegmentStage(), CompressStage(), BanksStage())
