"""judge_memory: each method's memory of an episode rated 1-5 on CREEM's seven criteria (App.
B.2), about each speaker, N samples per rating (paper: 20) averaged in the report. Methods that
keep no memory of their own (full / zero history) have nothing to rate."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import pyarrow as pa
from pydantic import Field

from pipeline.retrieval import within_tokens
from pipeline.stage import Rows, StageContext
from pipeline.failures import FAILURE_FIELDS, NO_FAILURE
from stages.judging import memory_quality
from stages.judging.base import JudgeSettings, JudgeStage, judged_row
from stages.method_stages import memory_stage_name

MemoryCriterion = Literal["integration", "consistency", "sophistication", "conciseness", "relevance",
                          "concreteness", "diversity"]

MEMORY_JUDGMENTS = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("method", pa.string(), nullable=False),
        pa.field("speaker", pa.string(), nullable=False),
        pa.field("criterion", pa.string(), nullable=False),
        pa.field("group", pa.string(), nullable=False),  # evolutionary | fundamental
        pa.field("sample", pa.int32(), nullable=False),
        pa.field("score", pa.int32()),  # 1-5; null when the rating failed
        pa.field("judge_model", pa.string()),
        pa.field("prompt_fingerprint", pa.string(), nullable=False),
        *FAILURE_FIELDS,
    ]
)


class JudgeMemorySettings(JudgeSettings):
    criteria: list[MemoryCriterion] = list(memory_quality.CRITERIA)  # type: ignore[assignment]
    samples: int = Field(default=20, ge=1)  # ratings per (memory, speaker, criterion), averaged
    temperature: float | None = Field(default=1.0, ge=0)  # samples differ only above 0
    max_tokens: int = Field(default=24, ge=8)
    max_memory_tokens: int | None = Field(default=3000, ge=1)  # memory shown, cut from the oldest end
    episodes: list[str] | None = None  # episode ids to rate; None = every episode (sizes the default job)


class JudgeMemoryStage(JudgeStage):
    name = section = "judge_memory"
    settings = JudgeMemorySettings
    outputs = {"memory_judgments": MEMORY_JUDGMENTS}
    module_prompts = memory_quality.PROMPTS

    def __init__(self, methods: tuple[str, ...] = ()) -> None:
        super().__init__(methods, extra_inputs=(), reads=memory_stage_name)

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict[str, Rows]) -> dict[str, Rows]:
        settings: JudgeMemorySettings = ctx.section
        episode = inputs["ingest.episodes"][0]
        if not settings.enabled or (settings.episodes is not None and episode_id not in settings.episodes):
            return {"memory_judgments": []}
        views = {m: r["memory"] for m in self.methods for r in inputs[f"{memory_stage_name(m)}.memory_view"]}
        stamp = self.stamp(ctx, episode)
        params = self.params(settings)

        async def one(method: str, speaker: str, criterion: str, s: int) -> dict[str, Any]:
            row = {**stamp, "method": method, "speaker": speaker, "criterion": criterion,
                   "group": memory_quality.CRITERIA[criterion][0], "sample": s, "score": None, **NO_FAILURE}
            shown = "\n".join(within_tokens(views[method].splitlines(), settings.max_memory_tokens))
            return await judged_row(row, ("score",), memory_quality.rate_memory(
                ctx.llm, criterion, speaker, shown, sample=s, **params))

        jobs = [one(m, sp, c, s) for m in views for sp in episode["speakers"] for c in settings.criteria
                for s in range(settings.samples)]
        return {"memory_judgments": list(await asyncio.gather(*jobs))}
