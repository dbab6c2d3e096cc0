"""What the judge stages share: they read every `respond_<method>` stage of the run, call the
`judge` role, and record the judge model and prompt fingerprint on every row, so changing only the
judge re-runs only judging and the report."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from pydantic import Field

from pipeline.config import Section
from pipeline.failures import attempt, row_or_failure
from pipeline.hashing import prompt_fingerprint
from pipeline.stage import EpisodeStage, Rows, StageContext
from stages.method_stages import respond_stage_name

JUDGE_ROLE = "judge"


class JudgeSettings(Section):
    enabled: bool = True
    # None keeps the judge role's sampling; G-Eval's N samples need a temperature above 0.
    temperature: float | None = Field(default=None, ge=0)
    max_tokens: int = Field(default=160, ge=8)
    max_probes_per_episode: int | None = Field(default=None, ge=1)  # sampled, seeded; None = all
    seed: int = 0


class JudgeStage(EpisodeStage):
    """Base of the judge stages over the responses of `methods` (in the order `methods` lists)."""

    roles = (JUDGE_ROLE,)
    module_prompts: dict[str, str] = {}

    def __init__(self, methods: tuple[str, ...] = (), extra_inputs: tuple[str, ...] = ("probes",),
                 reads: Callable[[str], str] = respond_stage_name) -> None:
        self.methods = methods
        self.inputs = ("ingest", *extra_inputs, *(reads(m) for m in methods))
        self.prompts = dict(self.module_prompts)

    def responses(self, inputs: dict[str, Rows]) -> dict[str, dict[str, dict[str, Any]]]:
        """method -> probe_id -> response row."""
        return {m: {r["probe_id"]: r for r in inputs[f"{respond_stage_name(m)}.responses"]} for m in self.methods}

    def params(self, settings: JudgeSettings) -> dict[str, Any]:
        p: dict[str, Any] = {"max_tokens": settings.max_tokens}
        if settings.temperature is not None:
            p["temperature"] = settings.temperature
        return p

    def stamp(self, ctx: StageContext, episode: dict[str, Any]) -> dict[str, Any]:
        """Fields every judgment row carries."""
        return {"episode_id": episode["episode_id"], "dataset": episode["dataset"],
                "prompt_fingerprint": prompt_fingerprint(self.prompts), "judge_model": ctx.llm.cfg.model}


async def judged_row(row: dict[str, Any], fields: tuple[str, ...], judgment: Awaitable[tuple]) -> dict[str, Any]:
    """`row` with a judgment's values under `fields` (its last value is the model that answered), or
    with the failure columns when the judge could not answer."""
    async def filled() -> dict[str, Any]:
        *values, model = await judgment
        return {**dict(zip(fields, values)), "judge_model": model or row["judge_model"]}

    return await row_or_failure(row, filled())


async def judged_rows(rows: Rows, fields: tuple[str, ...], judgment: Awaitable[tuple]) -> Rows:
    """`rows`, one per criterion, filled from one call that judged every criterion: as `judged_row`,
    except that a value given as {criterion: value} goes to each row by its criterion (any other
    value is shared by all); when the judge could not answer, every row carries the failure columns."""
    result, failed = await attempt(judgment)
    if result is None:
        return [{**r, **failed} for r in rows]
    *values, model = result
    return [{**r, **{f: v[r["criterion"]] if isinstance(v, dict) else v for f, v in zip(fields, values)},
             "judge_model": model or r["judge_model"]} for r in rows]
