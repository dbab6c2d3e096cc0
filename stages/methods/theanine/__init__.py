"""Theanine: a relation-aware memory graph, timelines retrieved through it and refined for the
conversation (the paper's phases are mapped in `method.py`; the graph's algorithms in `graph.py`, the
prompts in `prompts.py`, the report's figure in `figure.py`)."""

from stages.methods.theanine.method import (BUILD_LOG, EDGES, LINK_LABELS, MEMORIES, Theanine, TheanineAll,
                                            TheanineAllSettings, TheanineNoRefine, TheanineNoRefineSettings,
                                            TheanineNoRelation, TheanineNoRelationSettings, TheanineSettings)

__all__ = ["BUILD_LOG", "EDGES", "LINK_LABELS", "MEMORIES", "Theanine", "TheanineAll", "TheanineAllSettings",
           "TheanineNoRefine", "TheanineNoRefineSettings", "TheanineNoRelation", "TheanineNoRelationSettings",
           "TheanineSettings"]
