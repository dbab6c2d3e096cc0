"""memory_<method>: a method builds its memory of every episode, session by session, and writes
its memory of the whole episode as text (`memory_view`, what the memory-quality judge rates)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from pipeline.retrieval import count_tokens
from pipeline.stage import Rows, StageContext
from stages.method_stages import MethodStage, memory_stage_name
from stages.methods.base import EpisodeInput, Method, MethodSettings, visible_memory
from stages.methods.shared.dialogue import sessions_of

MEMORY_VIEW = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("method", pa.string(), nullable=False),
        pa.field("memory", pa.string(), nullable=False),
        pa.field("memory_tokens", pa.int32()),
    ]
)


class MemoryStage(MethodStage):
    def __init__(self, method: Method) -> None:
        super().__init__(method, memory_stage_name(method.name), ("ingest", *method.needs), method.build_role)
        self.outputs = {**method.memory, "memory_view": MEMORY_VIEW}

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict[str, Rows]) -> dict[str, Rows]:
        episode = EpisodeInput(episode=inputs["ingest.episodes"][0], sessions=sessions_of(inputs["ingest.turns"]),
                               upstream=self.needed(inputs))
        built: dict[str, Rows] = {}
        if self.method.memory:
            built = await self.method.build(self.method_context(ctx), episode)
        return {**built, "memory_view": self.memory_view(episode, built, ctx.section)}

    def memory_view(self, episode: EpisodeInput, built: dict[str, Rows], settings: MethodSettings) -> Rows:
        """The memory visible after the episode's last session, as the method shows it."""
        after_last = max(episode.sessions, default=0) + 1
        final = {t: visible_memory(rows, after_last, None, self.method.memory_kind) for t, rows in built.items()}
        text = self.method.memory_view(episode, final, settings)
        if not text:
            return []
        return [{"episode_id": episode.episode["episode_id"], "method": self.method.name, "memory": text,
                 "memory_tokens": count_tokens(text)}]

    def shard_stats(self, produced: dict[str, Rows]) -> dict[str, Any]:
        return self.method.build_stats(produced)
