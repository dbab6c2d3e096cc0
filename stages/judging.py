"""What the judge stages share: they read every `respond_<method>` stage of the run, call the
`judge` role, and record the judge model and prompt fingerprint on every row, so changing only the
judge re-runs only judging and the report."""

from __future__ import annotations

import sys
from typing import Any

from pydantic import Field

from pipeline.config import Section
from pipeline.stage import EpisodeStage, Rows, StageContext
from stages import judges
from stages.method_stage import respond_stage_name

JUDGE_ROLE = "judge"


class JudgeSettings(Section):
    enabled: bool = True
    # None keeps the judge role's sampling; G-Eval's N samples need a temperature above 0.
    temperature: float | None = Field(default=None, ge=0)
    max_tokens: int = Field(default=160, ge=8)
    max_probes_per_episode: int | None = Field(default=None, ge=1)  # sampled, seeded; None = all
    seed: int = 0


class JudgeStage(EpisodeStage):
    """Base of the judge stages over the responses of `methods` (in the order `methods` lists)."""

    roles = (JUDGE_ROLE,)
    module_prompts: dict[str, str] = {}

    def __init__(self, methods: tuple[str, ...] = (), extra_inputs: tuple[str, ...] = ("probes",)) -> None:
        self.methods = methods
        self.inputs = ("ingest", *extra_inputs, *(respond_stage_name(m) for m in methods))
        self.prompts = dict(self.module_prompts)
        self.code = (judges, sys.modules[type(self).__module__], *self.code)

    def responses(self, inputs: dict[str, Rows]) -> dict[str, dict[str, dict[str, Any]]]:
        """method -> probe_id -> response row."""
        return {m: {r["probe_id"]: r for r in inputs[f"{respond_stage_name(m)}.responses"]} for m in self.methods}

    def params(self, settings: JudgeSettings) -> dict[str, Any]:
        p: dict[str, Any] = {"max_tokens": settings.max_tokens}
        if settings.temperature is not None:
            p["temperature"] = settings.temperature
        return p

    def stamp(self, ctx: StageContext, episode: dict[str, Any]) -> dict[str, Any]:
        """Fields every judgment row carries."""
        return {"episode_id": episode["episode_id"], "dataset": episode["dataset"],
                "prompt_fingerprint": judges.prompt_fingerprint(self.prompts), "judge_model": ctx.llm.cfg.model}
