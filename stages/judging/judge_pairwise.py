"""judge_pairwise: G-Eval head-to-head of a reference method against every other method on the
same probes (Theanine App. D; CREEM App. B.1).

Protocols:
- `both_orders` (ours, not a paper's): each pair judged with the reference shown first and shown
  second, to cancel position bias; ties allowed; the report gives win / tie / loss rates with a
  two-sided sign test per criterion, per session and per dataset.
- `creem` (CREEM's): consistency and memorability only, the raw past sessions shown too, N samples
  per item (paper: 19) and their majority vote.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import pyarrow as pa
from pydantic import Field

from pipeline.errors import ConfigError
from pipeline.retrieval import within_tokens
from pipeline.stage import Rows, StageContext
from pipeline.failures import FAILURE_FIELDS, NO_FAILURE
from stages.methods.dialogue import format_unit, last_turns, sessions_of
from stages.judging import pairwise
from stages.judging.base import JudgeSettings, JudgeStage, judged_row
from stages.probes import sample

Criterion = Literal["specificity", "memorability", "consistency"]
PROTOCOL_CRITERIA: dict[str, list[Criterion]] = {
    "both_orders": ["specificity", "memorability", "consistency"],
    "creem": ["consistency", "memorability"],
}
PROTOCOL_SAMPLES = {"both_orders": 1, "creem": 19}

PAIRWISE_JUDGMENTS = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("probe_id", pa.string(), nullable=False),
        pa.field("session_idx", pa.int32(), nullable=False),
        pa.field("criterion", pa.string(), nullable=False),
        pa.field("reference", pa.string(), nullable=False),
        pa.field("other", pa.string(), nullable=False),
        pa.field("protocol", pa.string(), nullable=False),
        pa.field("reference_first", pa.bool_(), nullable=False),  # the order shown to the judge
        pa.field("sample", pa.int32(), nullable=False),
        pa.field("preferred", pa.string()),  # reference | other | tie; null when the judgment failed
        pa.field("reason", pa.string()),
        pa.field("judge_model", pa.string()),
        pa.field("prompt_fingerprint", pa.string(), nullable=False),
        *FAILURE_FIELDS,
    ]
)


class JudgePairwiseSettings(JudgeSettings):
    explain: bool = True  # ask for a one-sentence reason with each verdict (kept in the table)
    reference: str | None = None  # the method every other is compared with; None = first of `methods`
    protocol: Literal["both_orders", "creem"] = "both_orders"
    criteria: list[Criterion] | None = None  # None = the protocol's
    samples: int | None = Field(default=None, ge=1)  # per order; None = the protocol's (creem: 19)
    kinds: list[str] = ["next_response"]  # probe kinds judged
    context_turns: int = Field(default=10, ge=0)  # turns of the current session shown
    past_session_tokens: int | None = Field(default=None, ge=1)  # creem: raw past sessions, cut to the most recent


def transcript(turns: list[dict]) -> str:
    return format_unit(turns) or "(nothing yet)"


def past_sessions_text(sessions: dict[int, Rows], before: int, budget: int | None) -> str:
    """Raw past sessions in order; with a budget, the most recent whole sessions within it (cl100k)."""
    blocks = [f"[Session {s}]\n{transcript(turns)}" for s, turns in sessions.items() if s < before]
    return "\n\n".join(within_tokens(blocks, budget))


class JudgePairwiseStage(JudgeStage):
    name = section = "judge_pairwise"
    settings = JudgePairwiseSettings
    outputs = {"pairwise_judgments": PAIRWISE_JUDGMENTS}
    module_prompts = pairwise.PROMPTS

    def pairing(self, settings: JudgePairwiseSettings) -> tuple[str, list[str]]:
        reference = settings.reference or (self.methods[0] if self.methods else "")
        if self.methods and reference not in self.methods:
            raise ConfigError(f"judge_pairwise.reference: {reference!r} is not one of methods {list(self.methods)}")
        return reference, [m for m in self.methods if m != reference]

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict[str, Rows]) -> dict[str, Rows]:
        settings: JudgePairwiseSettings = ctx.section
        reference, others = self.pairing(settings)
        if not settings.enabled or not others:
            return {"pairwise_judgments": []}
        episode = inputs["ingest.episodes"][0]
        sessions = sessions_of(inputs["ingest.turns"])
        responses = self.responses(inputs)
        probes = sample([p for p in inputs["probes.probes"] if p["kind"] in settings.kinds],
                        settings.max_probes_per_episode, settings.seed, episode_id)
        criteria = settings.criteria or PROTOCOL_CRITERIA[settings.protocol]
        samples = settings.samples or PROTOCOL_SAMPLES[settings.protocol]
        orders = (True, False) if settings.protocol == "both_orders" else (True,)
        stamp = self.stamp(ctx, episode)
        params = self.params(settings)

        async def one(probe: dict[str, Any], other: str, criterion: str, reference_first: bool, s: int) -> dict:
            row = {**stamp, "probe_id": probe["probe_id"], "session_idx": probe["session_idx"],
                   "criterion": criterion, "reference": reference, "other": other, "protocol": settings.protocol,
                   "reference_first": reference_first, "sample": s, "preferred": None, "reason": None, **NO_FAILURE}
            ref, oth = responses[reference].get(probe["probe_id"]), responses[other].get(probe["probe_id"])
            missing = [m for m, r in ((reference, ref), (other, oth)) if r is None or r["error"] is not None]
            if missing:
                return {**row, "error": f"no response from {', '.join(missing)}"}
            turns = sessions.get(probe["session_idx"], [])
            current = turns if probe["turn_idx"] is None else [t for t in turns if t["turn_idx"] < probe["turn_idx"]]
            dialogue = transcript(last_turns(current, settings.context_turns)) if current else f"(question) {probe['request']}"
            past = (past_sessions_text(sessions, probe["session_idx"], settings.past_session_tokens)
                    if settings.protocol == "creem" else None)
            return await judged_row(row, ("preferred", "reason"), pairwise.judge_pair(
                ctx.llm, criterion, dialogue, probe["respondent"], ref["response"], oth["response"],
                reference_first=reference_first, past_sessions=past, explain=settings.explain, sample=s, **params))

        jobs = [one(p, o, c, first, s) for p in probes for o in others for c in criteria
                for first in orders for s in range(samples)]
        return {"pairwise_judgments": list(await asyncio.gather(*jobs))}

    def shard_stats(self, produced: dict[str, Rows]) -> dict[str, Any]:
        rows = produced["pairwise_judgments"]
        return {"judgments": len(rows), "failed_judgments": sum(r["error"] is not None for r in rows)}
