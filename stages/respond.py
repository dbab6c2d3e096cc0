"""respond: every configured method answers every probe."""

from __future__ import annotations

import asyncio
from typing import Any

from pipeline.config import RunConfig
from pipeline.errors import ConfigError
from pipeline.llm.types import LLMError
from pipeline.schemas import RESPONSES
from pipeline.stage import EpisodeStage, Rows, StageContext
from stages.common import failure_reason, sessions_of
from stages.methods import base, secom


class RespondStage(EpisodeStage):
    name = "respond"
    inputs = ("ingest", "probes", "banks")
    outputs = {"responses": RESPONSES}
    section = "respond"
    config_keys = ("methods",)
    uses_llm = True
    uses_embedder = True
    code = (base, secom)

    def extra_fingerprint(self, cfg: RunConfig) -> dict[str, Any]:
        unknown = [m for m in cfg.methods if m not in base.METHODS]
        if unknown:
            raise ConfigError(f"methods: unknown method(s) {unknown}; available: {sorted(base.METHODS)}")
        return {}

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict[str, Rows]) -> dict[str, Rows]:
        cfg = ctx.section
        sessions = sessions_of(inputs["turns"])
        embed = ctx.embedder.encode if cfg.retriever != "bm25" else None

        async def one(probe: dict[str, Any], method_name: str) -> dict[str, Any]:
            s = probe["session_idx"]
            current = [t for t in sessions.get(s, []) if probe["turn_idx"] is not None and t["turn_idx"] < probe["turn_idx"]]
            pctx = base.ProbeContext(
                probe=probe, history={k: v for k, v in sessions.items() if k < s}, current=current,
                memory_units=inputs["memory_units"], embed=embed,
            )
            row = {"episode_id": episode_id, "probe_id": probe["probe_id"], "method": method_name}
            try:
                ans = await base.METHODS[method_name].answer(ctx.llm, pctx, cfg)
            except LLMError as e:  # one failed probe is a row with a reason, never a dead stage
                return {**row, "response": None, "retrieved_unit_ids": None, "context_tokens": None,
                        "model": ctx.cfg.llm.model, "error": failure_reason(e)}
            return {**row, "response": ans.result.text.strip(), "retrieved_unit_ids": ans.retrieved_unit_ids,
                    "context_tokens": ans.context_tokens, "model": ans.result.model or ctx.cfg.llm.model, "error": None}

        jobs = [one(p, m) for p in inputs["probes"] for m in ctx.cfg.methods]
        return {"responses": list(await asyncio.gather(*jobs))}
