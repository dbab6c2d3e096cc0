"""judge_answers: every method's answer to a probe with a reference answer, judged alone:
0-100 (SeCom's GPT4Score), correct / incorrect in a strict and a lenient wording, and TeaFarm
correctness for TeaFarm's counterfactual questions (Theanine Table 3)."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import pyarrow as pa

from pipeline.stage import Rows, StageContext
from pipeline.failures import FAILURE_FIELDS, NO_FAILURE
from stages.judging import answers
from stages.judging.base import JudgeSettings, JudgeStage, judged_row
from stages.probes import PROBE_KEY_FIELDS, sample

ANSWER_JUDGMENTS = pa.schema(
    [
        *PROBE_KEY_FIELDS,
        pa.field("judge", pa.string(), nullable=False),  # gpt4score | strict | lenient | teafarm
        pa.field("score", pa.float64()),  # 0-100 for gpt4score; 1 correct / 0 incorrect otherwise
        pa.field("reason", pa.string()),
        pa.field("judge_model", pa.string()),
        pa.field("prompt_fingerprint", pa.string(), nullable=False),
        *FAILURE_FIELDS,
    ]
)


class JudgeAnswersSettings(JudgeSettings):
    explain: bool = True  # ask for a one-sentence reason with each verdict (kept in the table)
    kinds: list[str] = ["qa", "teafarm"]  # probe kinds with a reference answer that are judged
    score_0_100: bool = True  # SeCom's GPT4Score
    correctness: list[Literal["strict", "lenient"]] = ["strict", "lenient"]


class JudgeAnswersStage(JudgeStage):
    name = section = "judge_answers"
    settings = JudgeAnswersSettings
    outputs = {"answer_judgments": ANSWER_JUDGMENTS}
    module_prompts = answers.PROMPTS

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict[str, Rows]) -> dict[str, Rows]:
        settings: JudgeAnswersSettings = ctx.section
        if not settings.enabled:
            return {"answer_judgments": []}
        episode = inputs["ingest.episodes"][0]
        responses = self.responses(inputs)
        probes = sample([p for p in inputs["probes.probes"] if p["kind"] in settings.kinds and p["gold"] is not None],
                        settings.max_probes_per_episode, settings.seed, episode_id)
        stamp = self.stamp(ctx, episode)
        params = self.params(settings)

        async def one(probe: dict[str, Any], method: str, judge: str) -> dict[str, Any]:
            row = {**stamp, "probe_id": probe["probe_id"], "kind": probe["kind"], "category": probe["category"],
                   "method": method, "judge": judge, "score": None, "reason": None, **NO_FAILURE}
            resp = responses[method].get(probe["probe_id"])
            if resp is None or resp["error"] is not None:
                return {**row, "error": f"no response from {method}"}
            return await judged_row(row, ("score", "reason"), answers.judge_answer(
                ctx.llm, judge, probe["request"], probe["gold"], resp["response"], explain=settings.explain, **params))

        jobs = [one(p, m, j) for p in probes for m in self.methods
                for j in answers.judges_for(p["kind"], settings.correctness, settings.score_0_100)]
        return {"answer_judgments": list(await asyncio.gather(*jobs))}

    def shard_stats(self, produced: dict[str, Rows]) -> dict[str, Any]:
        rows = produced["answer_judgments"]
        return {"judgments": len(rows), "failed_judgments": sum(r["error"] is not None for r in rows)}
