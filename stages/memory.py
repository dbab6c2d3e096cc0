"""memory_<method>: a method builds its memory of every episode, session by session."""

from __future__ import annotations

import sys
from typing import Any

from pipeline.stage import EpisodeStage, Rows, StageContext
from stages.common import sessions_of
from stages.methods import base
from stages.methods.base import BuildContext, EpisodeInput, Method


def memory_stage_name(method: str) -> str:
    return f"memory_{method}"


def method_settings(cfg: Any, method: str) -> Any:
    return getattr(cfg.method, method)


class MemoryStage(EpisodeStage):
    def __init__(self, method: Method) -> None:
        self.method = method
        self.name = memory_stage_name(method.name)
        self.inputs = ("ingest", *method.needs)
        self.outputs = dict(method.memory)
        self.roles = (method.build_role,)
        self.uses_embedder = method.uses_embedder
        self.code = (base, sys.modules[type(method).__module__], *method.code)
        self.prompts = dict(method.prompts)

    def settings_of(self, cfg: Any) -> Any:
        return method_settings(cfg, self.method.name)

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict[str, Rows]) -> dict[str, Rows]:
        episode = EpisodeInput(
            episode=inputs["ingest.episodes"][0], sessions=sessions_of(inputs["ingest.turns"]),
            upstream={k: v for k, v in inputs.items() if k.split(".")[0] in self.method.needs},
        )
        build = BuildContext(llm=ctx.llm, settings=ctx.section,
                             embed=ctx.embedder.encode if self.method.uses_embedder else None)
        return await self.method.build(build, episode)
