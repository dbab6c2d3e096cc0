"""memory_<method>: a method builds its memory of every episode, session by session."""

from __future__ import annotations

from typing import Any

from pipeline.stage import Rows, StageContext
from stages.common import sessions_of
from stages.method_stage import MethodStage, memory_stage_name
from stages.methods.base import BuildContext, EpisodeInput, Method


class MemoryStage(MethodStage):
    def __init__(self, method: Method) -> None:
        super().__init__(method, memory_stage_name(method.name), ("ingest", *method.needs), method.build_role)
        self.outputs = dict(method.memory)

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict[str, Rows]) -> dict[str, Rows]:
        episode = EpisodeInput(episode=inputs["ingest.episodes"][0], sessions=sessions_of(inputs["ingest.turns"]),
                               upstream=self.needed(inputs))
        build = BuildContext(llm=ctx.llm, settings=ctx.section,
                             embed=ctx.lazy_embed() if self.method.uses_embedder else None)
        return await self.method.build(build, episode)

    def shard_stats(self, produced: dict[str, Rows]) -> dict[str, Any]:
        return self.method.build_stats(produced)
