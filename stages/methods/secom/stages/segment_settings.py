"""The `segment` config section, read by both `guidance` (which learns the rubric) and `segment`
(which applies it): SeCom's segmentation settings (Sec. 2.2, App. A.1)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pipeline.config import CorpusFormat, PathField, Section
from stages.methods.secom.segmentation import AnswerFormat, Unit


class ReflectionConfig(Section):
    """Reflection-learned segmentation guidance (SeCom Sec. 2.2, App. A.1); defaults are the paper's."""

    corpus_format: CorpusFormat = "dialseg"
    corpus_path: str | None = PathField(lookup=True)  # annotated corpus with gold boundaries; None = the run's corpus
    limit: int | None = Field(default=None, ge=1)  # annotated sessions to learn from; None = all
    rounds: int = Field(default=1, ge=1)
    hard_k: int = Field(default=100, ge=1)  # the worst sessions by WindowDiff
    mini_batches: int = Field(default=10, ge=1)  # one reflection call and one worked example each
    max_rubric_items: int = Field(default=10, ge=1)


class SegmentConfig(Section):
    mode: Literal["zero_shot", "reflection"] = "zero_shot"
    guidance_path: str | None = PathField(lookup=True)  # reuse a stored guidance.json instead of learning one
    reflection: ReflectionConfig = Field(default_factory=ReflectionConfig)
    unit: Unit = "exchange"  # what the model numbers: exchanges (paper), or single turns
    # spans (1-based ranges with a short summary), counted (the official answer's shape: numbered from
    # 0, segment ids, per-segment counts, summaries of up to 100 words) or starts (valid by construction)
    answer_format: AnswerFormat = "spans"
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
