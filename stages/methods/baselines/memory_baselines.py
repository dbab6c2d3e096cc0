"""The memory baselines of Theanine (Section 3.2, Table 1) over session memories:

- `all_memories`: every memory of earlier sessions, in time order, plus the current dialogue;
- `memory_retrieval`: the top-k (6, Section 3.3) memories by embedding similarity to the dialogue;
- `all_memories_update`, `memory_retrieval_update`: the same over a memory pool that an LLM
  updates at the end of each session against the new session's memories, with the operations of
  Bae et al. (2022): keep (the new memory adds nothing), replace (it supersedes pool item
  `target`), append (it is new), delete (it shows pool item `target` no longer holds; the item is
  removed and the new memory is not added). Every operation is recorded with what it touched.

`reply_frame: creem` answers in CREEM App. A.4's frame (`memory_response.creem_reply_messages`, the
whole current session) instead of the memory baselines' one: CREEM's stand-in for REBOT_CC.

Every session's summary call is logged in `build_log` (a failed one adds no memories and says
why), and the counts reach the memory stage's manifest. `memory_retrieval*` refuses to answer
without an embedder rather than silently showing every memory.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, Field

from pipeline.llm.types import ChatLLM, Messages
from pipeline.retrieval import dense_scores, top_k
from pipeline.failures import FAILURE_FIELDS, NO_FAILURE, attempt
from stages.methods.shared import memory_response
from stages.methods.base import (SNAPSHOT_FIELDS, Answer, Embed, EpisodeInput, Method, MethodContext, MethodSettings,
                                 ProbeInput, after_session)
from stages.methods.shared.session_memories import MEMORY_FIELDS, memory_lines, memory_rows, summarize_session
from stages.dialogue import format_unit

MEMORIES = pa.schema(MEMORY_FIELDS)
POOL = pa.schema(MEMORY_FIELDS)  # the whole pool after each session (a `snapshots` memory)
OPERATIONS = pa.schema([
    *SNAPSHOT_FIELDS,
    pa.field("new_id", pa.string(), nullable=False),  # the session's new memory
    pa.field("op", pa.string(), nullable=False),  # keep | replace | append | delete
    pa.field("target_id", pa.string()),  # the pool memory replaced or deleted
    pa.field("target_event", pa.string()),
    *FAILURE_FIELDS,  # the update call failed: every new memory appended
])
BUILD_LOG = pa.schema([
    *SNAPSHOT_FIELDS,
    pa.field("memories", pa.int32(), nullable=False),  # memories the session's summary gave
    *FAILURE_FIELDS,  # the session's summary call failed: no memories from it
])


class MemorySettings(MethodSettings):
    max_memories: int = Field(default=10, ge=1)  # memories summarised per session
    k: int | None = Field(default=None, ge=1)  # retrieved memories; None = all (in time order)
    # memory_baselines: the shared frame of memory_response.py; creem: CREEM's A.4 frame (its REBOT_CC stand-in)
    reply_frame: Literal["memory_baselines", "creem"] = "memory_baselines"


class RetrievalSettings(MemorySettings):
    k: int | None = Field(default=6, ge=1)


class Operation(BaseModel):
    new: int = Field(ge=1)  # the new memory, numbered from 1
    op: Literal["keep", "replace", "append", "delete"]
    # the pool memory, numbered from 1: required for replace and delete; for keep, the pool memory
    # that already says it (optional); ignored for append
    target: int | None = Field(default=None, ge=1)


class Operations(BaseModel):
    operations: list[Operation]


def check_operations(out: Operations, n_new: int, n_pool: int) -> None:
    """ValueError (so the call is re-asked) unless every new memory gets one operation, replace and
    delete name a target, every target given (whatever the op) is a pool memory, and no pool memory
    is replaced or deleted twice."""
    seen = sorted(o.new for o in out.operations)
    if seen != list(range(1, n_new + 1)):
        raise ValueError(f"give exactly one operation for each new memory 1..{n_new}; got {seen}")
    outside = [f"{o.op} of new memory {o.new} -> {o.target}" for o in out.operations
               if o.target is not None and o.target > n_pool]
    if outside:
        raise ValueError(f"every target must be a pool memory 1..{n_pool}; got {', '.join(outside)}")
    targets = [o.target for o in out.operations if o.op in ("replace", "delete")]
    if any(t is None for t in targets):
        raise ValueError(f"replace and delete need a target among the pool memories 1..{n_pool}")
    if len(set(targets)) != len(targets):
        raise ValueError("each pool memory can be replaced or deleted once")


def update_messages(pool: list[dict], new: list[dict]) -> Messages:
    numbered_pool = "\n".join(f"{i + 1}. {m['event']}" for i, m in enumerate(pool)) or "(empty)"
    numbered_new = "\n".join(f"{i + 1}. {m['event']}" for i, m in enumerate(new))
    system = ("You keep a memory pool about two people up to date. For each new memory choose one operation: "
              "keep (the pool already says it), replace (it supersedes pool memory `target`), append (it is new "
              "information), delete (it shows pool memory `target` no longer holds; the new memory is dropped).")
    user = (f"Memory pool:\n{numbered_pool}\n\nNew memories from the latest session:\n{numbered_new}\n\n"
            'Reply in JSON: {"operations": [{"new": 1, "op": "append", "target": null}, ...]}, one per new memory.')
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def apply_operations(pool: list[dict], new: list[dict], ops: list[Operation]) -> list[dict]:
    """The pool after the operations, in time order of the memories it holds."""
    replaced = {o.target - 1: new[o.new - 1] for o in ops if o.op == "replace" and o.target}
    deleted = {o.target - 1 for o in ops if o.op == "delete" and o.target}
    kept = [replaced.get(i, m) for i, m in enumerate(pool) if i not in deleted]
    return kept + [new[o.new - 1] for o in ops if o.op == "append"]


class SessionMemoryMethod(Method[MemorySettings]):
    """Memories summarised at the end of every session; the answer reads all or the top-k."""

    Settings: ClassVar[type[MethodSettings]] = MemorySettings
    memory = {"memories": MEMORIES, "build_log": BUILD_LOG}
    memory_kind: ClassVar[Literal["snapshots", "log"]] = "log"
    uses_embedder = True
    table = "memories"

    async def session_memories(self, ctx: MethodContext, eid: str, s: int, turns: list[dict],
                               log: list[dict]) -> list[dict]:
        """Session `s`'s memory rows; its summary call is logged (a failed one gives no memories)."""
        events, failed = await attempt(summarize_session(ctx.llm, turns, s, ctx.settings.max_memories))
        new = memory_rows(eid, s, turns, events or [])
        log.append({**after_session(eid, s), "memories": len(new), **failed})
        return new

    async def build(self, ctx: MethodContext[MemorySettings], episode: EpisodeInput) -> dict[str, list[dict]]:
        eid = episode.episode["episode_id"]
        out: dict[str, list[dict]] = {"memories": [], "build_log": []}
        for s, turns in episode.sessions.items():
            out["memories"] += await self.session_memories(ctx, eid, s, turns, out["build_log"])
        return out

    def build_stats(self, produced: dict[str, list[dict]]) -> dict[str, Any]:
        log = produced.get("build_log", [])
        if not log:
            return {}
        failed = sum(r["error"] is not None for r in log)
        stats = {"summary_calls": len(log), "failed_summaries": failed,
                 "failed_summaries_per_episode": {log[0]["episode_id"]: failed}}
        if "operations" in produced:  # sessions whose update call failed (their memories were appended)
            stats["failed_updates"] = len({r["snapshot_session"] for r in produced["operations"]
                                           if r["error"] is not None})
        return stats

    async def select(self, embed: Embed | None, probe: ProbeInput, memories: list[dict], k: int | None) -> list[dict]:
        if k is None:
            return memories
        if embed is None:  # all memories instead would quietly turn memory retrieval into all_memories
            raise RuntimeError(f"{self.name} retrieves the top {k} memories by embedding similarity but was "
                               "given no embedder")
        if len(memories) <= k:
            return memories
        query = format_unit(probe.current) if probe.current else probe.request
        vectors = np.asarray(await embed([m["event"] for m in memories] + [query]), dtype=np.float32)
        vectors, qvec = vectors[:-1], vectors[-1]
        return [memories[i] for i in top_k(dense_scores(qvec, vectors), k)]

    async def answer(self, ctx: MethodContext[MemorySettings], probe: ProbeInput, memory: dict[str, list[dict]]) -> Answer:
        llm, settings = ctx.llm, ctx.settings
        chosen = await self.select(ctx.embed, probe, memory.get(self.table, []), settings.k)
        snapshot = max((m["snapshot_session"] for m in memory.get(self.table, [])), default=None)
        turns = {t for m in chosen for t in (m.get("source_turn_ids") or [])}
        if settings.reply_frame == "creem":
            return await memory_response.answer_creem_frame(
                llm, probe, memory_lines(chosen).splitlines(), [m["memory_id"] for m in chosen],
                context_turns=len(turns), details={"memory_after_session": snapshot})
        return await memory_response.answer_from_memory(
            llm, probe, memory_lines(chosen), [m["memory_id"] for m in chosen], len(turns),
            details={"memory_after_session": snapshot})

    def memory_view(self, episode: EpisodeInput, memory: dict[str, list[dict]], settings: MemorySettings) -> str | None:
        return memory_lines(memory.get(self.table, [])) or None


class AllMemories(SessionMemoryMethod):
    name = "all_memories"
    whole_memory_in_context = True


class MemoryRetrieval(SessionMemoryMethod):
    name = "memory_retrieval"
    Settings = RetrievalSettings


class UpdatedMemoryMethod(SessionMemoryMethod):
    """The pool evolves: session 1's memories start it; each later session's memories update it."""

    memory = {"pool": POOL, "operations": OPERATIONS, "build_log": BUILD_LOG}
    memory_kind = "snapshots"
    table = "pool"

    async def build(self, ctx: MethodContext[MemorySettings], episode: EpisodeInput) -> dict[str, list[dict]]:
        eid = episode.episode["episode_id"]
        out: dict[str, list[dict]] = {"pool": [], "operations": [], "build_log": []}
        pool: list[dict] = []
        for s, turns in episode.sessions.items():
            key = after_session(eid, s)
            new = await self.session_memories(ctx, eid, s, turns, out["build_log"])
            ops, failed = await self.operations(ctx.llm, pool, new)
            # check_operations keeps every target inside the pool; an append's target means nothing.
            out["operations"] += [{**key, "new_id": new[o.new - 1]["memory_id"], "op": o.op,
                                   "target_id": pool[o.target - 1]["memory_id"] if o.target else None,
                                   "target_event": pool[o.target - 1]["event"] if o.target else None,
                                   **failed} for o in ops]
            pool = apply_operations(pool, new, ops)
            out["pool"] += [{**m, **key} for m in pool]
        return out

    async def operations(self, llm: ChatLLM, pool: list[dict], new: list[dict]
                         ) -> tuple[list[Operation], dict[str, Any]]:
        """The update operations and the failure columns of their rows."""
        appended = [Operation(new=i + 1, op="append") for i in range(len(new))]
        if not pool or not new:
            return appended, dict(NO_FAILURE)
        result, failed = await attempt(llm.chat(update_messages(pool, new), schema=Operations,
                                                validate=lambda out: check_operations(out, len(new), len(pool))))
        if result is None:  # the pool still grows: every new memory appended, the failure recorded
            return appended, failed
        ops = [o.model_copy(update={"target": None}) if o.op == "append" else o for o in result.parsed.operations]
        return sorted(ops, key=lambda o: o.new), failed


class AllMemoriesUpdate(UpdatedMemoryMethod):
    name = "all_memories_update"
    whole_memory_in_context = True


class MemoryRetrievalUpdate(UpdatedMemoryMethod):
    name = "memory_retrieval_update"
    Settings = RetrievalSettings
