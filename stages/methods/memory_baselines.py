"""The memory baselines of Theanine (Section 3.2, Table 1) over session memories:

- `all_memories`: every memory of earlier sessions, in time order, plus the current dialogue;
- `memory_retrieval`: the top-k (6, Section 3.3) memories by embedding similarity to the dialogue;
- `all_memories_update`, `memory_retrieval_update`: the same over a memory pool that an LLM
  updates at the end of each session against the new session's memories, with the operations of
  Bae et al. (2022): keep (the new memory adds nothing), replace (it supersedes pool item
  `target`), append (it is new), delete (it shows pool item `target` no longer holds; the item is
  removed and the new memory is not added). Every operation is recorded with what it touched.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, Field

from pipeline.llm.types import ChatLLM, Messages
from pipeline.retrieval import dense_scores, top_k
from pipeline.failures import FAILURE_FIELDS, NO_FAILURE, attempt
from stages.methods import memory_response
from stages.methods.base import (SNAPSHOT_FIELDS, after_session, Answer, BuildContext, EpisodeInput, Method,
                                 MethodSettings, ProbeInput)
from stages.methods.session_memories import MEMORY_FIELDS, memory_lines, memory_rows, summarize_session
from stages.methods.dialogue import format_unit

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


class MemorySettings(MethodSettings):
    max_memories: int = Field(default=10, ge=1)  # memories summarised per session
    k: int | None = Field(default=None, ge=1)  # retrieved memories; None = all (in time order)


class RetrievalSettings(MemorySettings):
    k: int | None = Field(default=6, ge=1)


class Operation(BaseModel):
    new: int = Field(ge=1)  # the new memory, numbered from 1
    op: Literal["keep", "replace", "append", "delete"]
    target: int | None = Field(default=None, ge=1)  # the pool memory, numbered from 1 (replace, delete)


class Operations(BaseModel):
    operations: list[Operation]


def check_operations(out: Operations, n_new: int, n_pool: int) -> None:
    """ValueError unless every new memory gets one operation and targets exist, each used once."""
    seen = sorted(o.new for o in out.operations)
    if seen != list(range(1, n_new + 1)):
        raise ValueError(f"give exactly one operation for each new memory 1..{n_new}; got {seen}")
    targets = [o.target for o in out.operations if o.op in ("replace", "delete")]
    if any(t is None or t > n_pool for t in targets):
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


class SessionMemoryMethod(Method):
    """Memories summarised at the end of every session; the answer reads all or the top-k."""

    Settings: ClassVar[type[MethodSettings]] = MemorySettings
    memory = {"memories": MEMORIES}
    memory_kind = "log"
    uses_embedder = True
    table = "memories"

    async def build(self, ctx: BuildContext, episode: EpisodeInput) -> dict[str, list[dict]]:
        eid = episode.episode["episode_id"]
        out: dict[str, list[dict]] = {"memories": []}
        for s, turns in episode.sessions.items():
            # A failed summary adds no memories from this session; the failure is in the manifest's usage.
            events, _ = await attempt(summarize_session(ctx.llm, turns, s, ctx.settings.max_memories))
            out["memories"] += memory_rows(eid, s, turns, events or [])
        return out

    def select(self, probe: ProbeInput, memories: list[dict], k: int | None) -> list[dict]:
        if k is None or len(memories) <= k or probe.embed is None:
            return memories
        query = format_unit(probe.current) if probe.current else probe.request
        vectors = np.asarray(probe.embed([m["event"] for m in memories]), dtype=np.float32)
        qvec = np.asarray(probe.embed([query])[0], dtype=np.float32)
        return [memories[i] for i in top_k(dense_scores(qvec, vectors), k)]

    async def answer(self, llm: ChatLLM, probe: ProbeInput, memory: dict[str, list[dict]], settings: Any) -> Answer:
        chosen = self.select(probe, memory.get(self.table, []), settings.k)
        snapshot = max((m["snapshot_session"] for m in memory.get(self.table, [])), default=None)
        turns = {t for m in chosen for t in (m.get("source_turn_ids") or [])}
        return await memory_response.answer_from_memory(
            llm, probe, memory_lines(chosen), [m["memory_id"] for m in chosen], len(turns),
            details={"memory_after_session": snapshot})

    def memory_view(self, episode: EpisodeInput, memory: dict[str, list[dict]], settings: Any) -> str | None:
        return memory_lines(memory.get(self.table, [])) or None


class AllMemories(SessionMemoryMethod):
    name = "all_memories"


class MemoryRetrieval(SessionMemoryMethod):
    name = "memory_retrieval"
    Settings = RetrievalSettings


class UpdatedMemoryMethod(SessionMemoryMethod):
    """The pool evolves: session 1's memories start it; each later session's memories update it."""

    memory = {"pool": POOL, "operations": OPERATIONS}
    memory_kind = "snapshots"
    table = "pool"

    async def build(self, ctx: BuildContext, episode: EpisodeInput) -> dict[str, list[dict]]:
        eid = episode.episode["episode_id"]
        out: dict[str, list[dict]] = {"pool": [], "operations": []}
        pool: list[dict] = []
        for s, turns in episode.sessions.items():
            key = after_session(eid, s)
            events, _ = await attempt(summarize_session(ctx.llm, turns, s, ctx.settings.max_memories))
            new = memory_rows(eid, s, turns, events or [])
            ops, failed = await self.operations(ctx.llm, pool, new)
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
        return sorted(result.parsed.operations, key=lambda o: o.new), failed


class AllMemoriesUpdate(UpdatedMemoryMethod):
    name = "all_memories_update"


class MemoryRetrievalUpdate(UpdatedMemoryMethod):
    name = "memory_retrieval_update"
    Settings = RetrievalSettings
