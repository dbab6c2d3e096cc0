"""respond_<method>: one method answers every probe, from the memory built before the probe."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pyarrow as pa

from pipeline.failures import FAILURE_FIELDS, row_or_failure
from pipeline.engine.shard import EpisodeUsage
from pipeline.engine.stage import Rows, StageContext
from stages.method_stages import MethodStage, memory_stage_name, respond_stage_name
from stages.methods.base import Method, ProbeInput, S, point, visible_memory
from stages.dialogue import sessions_of
from stages.probes import probe_view

RESPONSES = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("probe_id", pa.string(), nullable=False),
        pa.field("method", pa.string(), nullable=False),
        pa.field("response", pa.string()),
        pa.field("rationale", pa.string()),
        pa.field("memory_ids", pa.list_(pa.string())),  # memory / unit ids that entered the context
        pa.field("context_tokens", pa.int32()),  # tokens (cl100k) of memory in the context: "# Tokens"
        pa.field("context_turns", pa.int32()),  # exchanges (user-agent interactions) of memory in the context: "# Turns"
        pa.field("memory_after_session", pa.int32()),  # the memory seen was built up to this session; null: none
        pa.field("details_json", pa.string()),  # method-specific record, e.g. timelines
        pa.field("model", pa.string()),
        # What answering this probe took: its calls' tokens, and the seconds they took when they were
        # sent, one after another or not (a cached call keeps the latency of its first sending)
        pa.field("prompt_tokens", pa.int64()),
        pa.field("completion_tokens", pa.int64()),
        pa.field("latency_s", pa.float64()),
        *FAILURE_FIELDS,
    ]
)

def probe_input(probe: dict[str, Any], episode: dict[str, Any], sessions: dict[int, Rows],
                upstream: dict[str, Rows]) -> ProbeInput:
    """What a method may see of the conversation at a probe: earlier sessions, and what it sees of its
    own session (`probe_view`)."""
    history = {k: v for k, v in sessions.items() if k < probe["session_idx"]}
    return ProbeInput(probe=probe, episode=episode, history=history, current=probe_view(probe, sessions),
                      upstream=upstream)


def memory_point(probe: dict[str, Any]) -> tuple[int, int | None]:
    """Where the memory a probe may see ends: before its turn; before its session when the session
    is not the corpus's own (TeaFarm's session N+1 must not see memory of the corpus's session N+1)."""
    if probe.get("context") is not None:
        return probe["session_idx"], 0
    return probe["session_idx"], probe["turn_idx"]


def needs_failed_build(probe: dict[str, Any], failures: Rows) -> str | None:
    """The reason a probe cannot be answered when its episode's memory build failed at a session the
    probe's memory would include (the memory of that session is missing), else None."""
    for f in failures:
        # The first memory the failed session would have written: at its first turn (memory kept by
        # turn) or at its end.
        first_key = point(f["session_idx"], 0 if f["within_session"] else None)
        session, turn = memory_point(probe)
        if point(session, None if turn is None else turn - 1) >= first_key:
            return f"memory build failed: {f['error']}"
    return None


class RespondStage(MethodStage[S]):
    outputs = {"responses": RESPONSES}

    def __init__(self, method: Method[S]) -> None:
        self.memory_stage = memory_stage_name(method.name) if method.memory else None  # its tables, if any
        inputs = ("ingest", "probes", *method.needs, *([self.memory_stage] if self.memory_stage else []))
        super().__init__(method, respond_stage_name(method.name), inputs, method.answer_role)

    async def process_episode(self, ctx: StageContext[S], episode_id: str, inputs: dict[str, Rows]) -> dict[str, Rows]:
        sessions = sessions_of(inputs["ingest.turns"])
        episode = inputs["ingest.episodes"][0]
        upstream = self.needed(inputs)
        memory = {t: inputs[f"{self.memory_stage}.{t}"] for t in self.method.memory} if self.memory_stage else {}
        build_failures = inputs.get(f"{self.memory_stage}.build_failures", []) if self.memory_stage else []
        method_ctx = self.method_context(ctx)

        async def one(probe: dict[str, Any]) -> dict[str, Any]:
            seen = {t: visible_memory(rows, *memory_point(probe), self.method.memory_kind) for t, rows in memory.items()}
            built = [r["snapshot_session"] for rows in seen.values() for r in rows]
            row = {"episode_id": episode_id, "probe_id": probe["probe_id"], "method": self.method.name,
                   "memory_after_session": max(built, default=None), "model": ctx.llm.cfg.model}
            missing = needs_failed_build(probe, build_failures)
            if missing:
                return {**row, "response": None, "error": missing, "raw": None}
            return await row_or_failure(row, answered(probe, seen), f"{self.name} probe {probe['probe_id']}")

        async def answered(probe: dict[str, Any], seen: dict[str, Rows]) -> dict[str, Any]:
            used = EpisodeUsage(method_ctx.llm)  # this probe's calls alone
            ans = await self.method.answer(replace(method_ctx, llm=used), probe_input(probe, episode, sessions, upstream),
                                           seen)
            return {"response": ans.text, "rationale": ans.rationale, "memory_ids": ans.used_ids,
                    "context_tokens": ans.context_tokens, "context_turns": ans.context_turns,
                    "details_json": json.dumps(ans.details) if ans.details is not None else None,
                    "model": ans.model or ctx.llm.cfg.model, "prompt_tokens": used.counts["prompt_tokens"],
                    "completion_tokens": used.counts["completion_tokens"], "latency_s": round(used.latency_s, 4)}

        return {"responses": list(await asyncio.gather(*(one(p) for p in inputs["probes.probes"])))}
