"""memory_<method>: a method builds its memory of every episode, session by session, and writes
its memory of the whole episode as text (`memory_view`, what the memory-quality judge rates).

A `build` that raises (a bug in the method or a library it calls, not an LLM error it handled
itself) fails that episode's memory from the session it failed at, not the stage: the longest run
of sessions that builds is kept (rebuilt from the LLM call cache, so no call is paid twice), the
failing session is a row of `build_failures`, and `respond_<method>` fails the probes that would need
it while it answers the earlier ones. No probe is answered from a memory that is missing a session."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from pipeline.errors import RunStopped
from pipeline.failures import failing_fast, row_failure
from pipeline.retrieval import count_tokens
from pipeline.engine.stage import Rows, StageContext
from stages.method_stages import MethodStage, memory_stage_name
from stages.methods.base import EpisodeInput, Method, S, visible_memory
from stages.dialogue import sessions_of

MEMORY_VIEW = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("method", pa.string(), nullable=False),
        pa.field("memory", pa.string(), nullable=False),
        pa.field("memory_tokens", pa.int32()),
    ]
)

# One row per episode whose build raised: the memory from `session_idx` on is missing.
BUILD_FAILURES = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("method", pa.string(), nullable=False),
        pa.field("session_idx", pa.int32(), nullable=False),  # the first session whose memory is missing
        pa.field("within_session", pa.bool_()),  # the method keys memory by turn inside a session
        pa.field("error", pa.string(), nullable=False),
    ]
)


def sessions_upto(episode: EpisodeInput, count: int) -> EpisodeInput:
    """The episode with only its first `count` sessions (what a build of that prefix sees)."""
    kept = sorted(episode.sessions)[:count]
    return EpisodeInput(episode=episode.episode, sessions={s: episode.sessions[s] for s in kept},
                        upstream=episode.upstream)


class MemoryStage(MethodStage[S]):
    def __init__(self, method: Method[S]) -> None:
        super().__init__(method, memory_stage_name(method.name), ("ingest", *method.needs), method.build_role)
        self.outputs = {**method.memory, "memory_view": MEMORY_VIEW, "build_failures": BUILD_FAILURES}

    async def process_episode(self, ctx: StageContext[S], episode_id: str, inputs: dict[str, Rows]) -> dict[str, Rows]:
        episode = EpisodeInput(episode=inputs["ingest.episodes"][0], sessions=sessions_of(inputs["ingest.turns"]),
                               upstream=self.needed(inputs))
        if not self.method.memory:
            return {"memory_view": self.memory_view(episode, {}, ctx.settings)}
        built, failed = await self.guarded_build(ctx, episode)
        # A memory missing sessions is never shown to the memory judge as the episode's memory.
        view = [] if failed else self.memory_view(episode, built, ctx.settings)
        return {**built, "memory_view": view, "build_failures": failed}

    async def guarded_build(self, ctx: StageContext[S], episode: EpisodeInput) -> tuple[dict[str, Rows], Rows]:
        """The method's memory of the episode and no failure; or, when `build` raises, the memory of
        the longest prefix of sessions that builds and the failure row of the session after it."""
        mctx = self.method_context(ctx)
        try:
            return await self.method.build(mctx, episode), []
        except Exception as e:  # noqa: BLE001 - the episode's failure, whatever raised it
            error = row_failure(e, f"{self.name} episode {episode.episode['episode_id']}")["error"]
        built: dict[str, Rows] = {}  # the memory of the longest prefix found to build (0 sessions: none)
        lo, hi = 0, len(episode.sessions) - 1  # that prefix's length lies in [lo, hi]
        while lo < hi:
            mid = (lo + hi + 1) // 2
            try:
                rows = await self.method.build(mctx, sessions_upto(episode, mid))
            except Exception as e:  # noqa: BLE001
                if isinstance(e, RunStopped) or failing_fast():
                    raise
                hi = mid - 1
                continue
            lo, built = mid, rows
        failed_session = sorted(episode.sessions)[lo] if episode.sessions else 0
        within = not built or any(r.get("snapshot_turn") is not None for rows in built.values() for r in rows)
        return built, [{"episode_id": episode.episode["episode_id"], "method": self.method.name,
                        "session_idx": failed_session, "within_session": within,
                        "error": f"memory build failed at session {failed_session}: {error}"}]

    def memory_view(self, episode: EpisodeInput, built: dict[str, Rows], settings: S) -> Rows:
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
