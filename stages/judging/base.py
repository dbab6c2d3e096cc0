"""What the judge stages share: they read every `respond_<method>` stage of the run, call the
`judge` role, and record the judge model and prompt fingerprint on every row, so changing only the
judge re-runs only judging and the report."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Sequence, TypeVar

from pydantic import Field

from pipeline.config import Section
from pipeline.failures import failure, guarded
from pipeline.hashing import prompt_fingerprint
from pipeline.engine.stage import EpisodeStage, Rows, StageContext
from stages.judging.calls import RunRequests
from stages.method_stages import respond_stage_name

JUDGE_ROLE = "judge"


class JudgeSettings(Section):
    enabled: bool = True
    # None keeps the judge role's sampling; G-Eval's N samples need a temperature above 0.
    temperature: float | None = Field(default=None, ge=0)
    max_tokens: int = Field(default=160, ge=8)
    max_probes_per_episode: int | None = Field(default=None, ge=1)  # sampled, seeded; None = all
    seed: int = 0
    # How a judge's repeated runs (`runs`) go out: samples: as samples of one prompt, one request with
    # `n` where the endpoint takes it (billed for the prompt once); requests: one request per run (the
    # runs then differ as independent requests do). Each run keeps its own sample index either way.
    run_requests: RunRequests = "samples"


JS = TypeVar("JS", bound=JudgeSettings)


class JudgeStage(EpisodeStage[JS]):
    """Base of the judge stages over the responses of `methods` (in the order `methods` lists); `JS`
    is its settings model."""

    roles = (JUDGE_ROLE,)
    module_prompts: dict[str, str] = {}

    def __init__(self, methods: tuple[str, ...] = (), extra_inputs: tuple[str, ...] = ("probes",),
                 reads: Callable[[str], str] = respond_stage_name) -> None:
        self.methods = methods
        self.inputs = ("ingest", *extra_inputs, *(reads(m) for m in methods))
        self.prompts = dict(self.module_prompts)

    # The probe kinds it judges, when its settings do not say (`kinds`); empty: it judges no probe.
    judged_kinds: tuple[str, ...] = ()

    def selected_by(self, cfg: Any, present: set[str]) -> str | None:
        """In the run when enabled, with answers of a kind it judges (`probes`, `teabag` settings)."""
        settings = self.settings_of(cfg)
        kinds = set(getattr(settings, "kinds", self.judged_kinds)) & run_probe_kinds(cfg)
        if not settings.enabled or not self.methods or not kinds:
            return None
        return f"judges the {', '.join(sorted(kinds))} answers ({self.section}.enabled, .kinds)"

    def responses(self, inputs: dict[str, Rows]) -> dict[str, dict[str, dict[str, Any]]]:
        """method -> probe_id -> response row."""
        return {m: {r["probe_id"]: r for r in inputs[f"{respond_stage_name(m)}.responses"]} for m in self.methods}

    def params(self, settings: JudgeSettings) -> dict[str, Any]:
        return judge_params(settings)

    def stamp(self, ctx: StageContext, episode: dict[str, Any]) -> dict[str, Any]:
        """Fields every judgment row carries."""
        return {"episode_id": episode["episode_id"], "dataset": episode["dataset"],
                "prompt_fingerprint": prompt_fingerprint(self.prompts), "judge_model": ctx.llm.cfg.model}


def judge_params(settings: JudgeSettings) -> dict[str, Any]:
    """A judge's sampling: its `max_tokens`, and its `temperature` where set (else the role's)."""
    p: dict[str, Any] = {"max_tokens": settings.max_tokens}
    if settings.temperature is not None:
        p["temperature"] = settings.temperature
    return p


def run_probe_kinds(cfg: Any) -> set[str]:
    """The kinds of probe a run makes (stages/probes.py): next responses, questions, TeaFarm's."""
    return ({"next_response"} if cfg.probes.next_response else set()) | ({"qa"} if cfg.probes.qa else set()) | (
        {"teafarm"} if cfg.teabag.enabled else set())


async def rows_or_failed(blank: Rows, work: Awaitable[Rows], where: str) -> Rows:
    """The rows `work` makes, or `blank` (the same rows, unjudged) each failed with why, when it
    raised: an exception in a judge on one item fails that item's rows, never the stage."""
    rows, failed = await guarded(work, where)
    return rows if rows is not None else [{**r, **failed} for r in blank]


def sampled_rows(rows: Rows, fields: tuple[str, ...], judgments: Sequence[tuple | Exception]) -> Rows:
    """`rows` (one per sample) each filled from its sample's judgment (its values under `fields`, the judge model last), or with
    the failure columns where that sample failed."""
    return [{**row, **failure(j)} if isinstance(j, Exception) else _filled(row, fields, j)
            for row, j in zip(rows, judgments, strict=True)]


def sampled_criteria_rows(rows_per_sample: Sequence[Rows], fields: tuple[str, ...],
                          judgments: Sequence[tuple | Exception]) -> Rows:
    """One group of rows (one per criterion) per sample, each group filled from its sample's one
    judgment of every criterion: a value given as {criterion: value} goes to each row by its
    criterion (any other value is shared by all); a failed sample fails each row of its group."""
    out: Rows = []
    for rows, j in zip(rows_per_sample, judgments, strict=True):
        out += [{**r, **failure(j)} for r in rows] if isinstance(j, Exception) else _filled_criteria(rows, fields, j)
    return out


def _filled(row: dict[str, Any], fields: tuple[str, ...], judgment: tuple) -> dict[str, Any]:
    *values, model = judgment
    return {**row, **dict(zip(fields, values)), "judge_model": model or row["judge_model"]}


def _filled_criteria(rows: Rows, fields: tuple[str, ...], judgment: tuple) -> Rows:
    *values, model = judgment
    return [{**r, **{f: v[r["criterion"]] if isinstance(v, dict) else v for f, v in zip(fields, values)},
             "judge_model": model or r["judge_model"]} for r in rows]
