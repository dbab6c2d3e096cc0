"""judge_memory: each method's memory of an episode rated 1-5 on CREEM's seven criteria (App.
B.2), about each speaker, N samples per rating (paper: 20) averaged in the report. As in B.2 the
judge looks at the dialogue (every session, cut to `max_dialogue_tokens`, oldest sessions dropped
first) and the memory; it sees only the rated speaker's memory lines (`speaker_lines`), cut to
`max_memory_tokens` with the oldest lines dropped first. Each row records what was cut. Methods
that keep no memory of their own (full / zero history) have nothing to rate.

`per_call: criterion` is B.2's protocol, one prompt per criterion; `per_call: all` (ours, for small
runs) rates every criterion of a (memory, speaker, sample) in one call, the same rows coming out
(a failed call fails each of its criteria's rows).

`runs` repeats every rating (all its samples; `run` in the table): run r asks sample indexes r*N ..
r*N+N-1 of each prompt (N: `samples`), so run 0 is exactly the single run and no two runs share a
cache key. The report averages each (episode, speaker)'s samples within a run, then over its runs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal, Sequence, cast

import pyarrow as pa
from pydantic import Field

from pipeline.retrieval import within_tokens
from pipeline.engine.stage import Rows, StageContext
from pipeline.failures import FAILURE_FIELDS, NO_FAILURE
from stages.judging import memory_quality
from pipeline.llm.usage import billed_to
from stages.judging.base import JudgeSettings, JudgeStage, rows_or_failed, sampled_criteria_rows, sampled_rows
from stages.judging.calls import RunSamples
from stages.method_stages import memory_stage_name
from stages.dialogue import format_unit, sessions_of

MemoryCriterion = Literal["integration", "consistency", "sophistication", "conciseness", "relevance",
                          "concreteness", "diversity"]

MEMORY_JUDGMENTS = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("method", pa.string(), nullable=False),
        pa.field("speaker", pa.string(), nullable=False),
        pa.field("criterion", pa.string(), nullable=False),
        pa.field("group", pa.string(), nullable=False),  # evolutionary | fundamental
        pa.field("run", pa.int32(), nullable=False),  # which of the judge's independent runs (`runs`), from 0
        pa.field("sample", pa.int32(), nullable=False),  # within its run; its request's sample index: run * N + sample
        pa.field("score", pa.int32()),  # 1-5; null when the rating failed
        pa.field("memory_lines", pa.int32()),  # lines of the view kept for this speaker
        pa.field("memory_lines_shown", pa.int32()),  # ... of which shown (the newest within the budget)
        pa.field("memory_truncated", pa.bool_()),
        pa.field("dialogue_sessions_shown", pa.int32()),  # whole sessions of the dialogue shown
        pa.field("dialogue_truncated", pa.bool_()),  # some session not shown in full
        pa.field("judge_model", pa.string()),
        pa.field("prompt_fingerprint", pa.string(), nullable=False),
        *FAILURE_FIELDS,
    ]
)


class JudgeMemorySettings(JudgeSettings):
    criteria: list[MemoryCriterion] = cast("list[MemoryCriterion]", list(memory_quality.CRITERIA))  # its keys
    samples: int = Field(default=20, ge=1)  # ratings per (memory, speaker, criterion), averaged
    temperature: float | None = Field(default=1.0, ge=0)  # samples differ only above 0
    max_tokens: int = Field(default=24, ge=8)
    max_memory_tokens: int | None = Field(default=3000, ge=1)  # the speaker's memory shown, oldest lines cut first
    max_dialogue_tokens: int | None = Field(default=6000, ge=1)  # the dialogue shown, oldest sessions cut first
    episodes: list[str] | None = None  # episode ids to rate; None = every episode (sizes the default job)
    max_speakers: int | None = Field(default=None, ge=1)  # the first N speakers of an episode; None = all (B.2)
    # criterion: one prompt per criterion with its own steps (B.2); all: one call rates every criterion
    # (ours: a seventh of the calls; max_tokens then holds per criterion)
    per_call: Literal["criterion", "all"] = "criterion"
    # Independent runs of every rating (its `samples` each): one row group per run (`run`); the report
    # averages each item over its runs (memory_summary `runs`, `run_sd`). Sent as `run_requests` says.
    runs: int = Field(default=1, ge=1)


def speaker_lines(view: str, speaker: str, speakers: Sequence[str]) -> list[str]:
    """The lines of a memory view that may be about `speaker`: a line that opens with another
    speaker's tag (`[Bob] ...`, as CREEM's view writes) is dropped; every other non-blank line is
    kept, since untagged lines (session summaries, events, dialogue units) may concern either."""
    others = [f"[{s}]" for s in speakers if s != speaker]
    return [line for line in view.splitlines() if line.strip() and not line.lstrip().startswith(tuple(others))]


@dataclass
class Dialogue:
    text: str
    sessions_shown: int  # whole sessions shown
    truncated: bool  # some session not shown in full


def dialogue_within(sessions: dict[int, Rows], budget: int | None) -> Dialogue:
    """Every session in order; with a budget (cl100k), the most recent whole sessions that fit, or,
    when not even the last one does, the last turns of it that fit."""
    kept = [s for s, turns in sessions.items() if turns]
    blocks = [f"[Session {s}]\n{format_unit(sessions[s])}" for s in kept]
    shown = within_tokens(blocks, budget)
    if shown or not kept:
        return Dialogue("\n\n".join(shown), len(shown), len(shown) < len(kept))
    last = kept[-1]
    tail = within_tokens(format_unit(sessions[last]).splitlines(), budget)
    return Dialogue(f"[Session {last}, its last turns]\n" + "\n".join(tail) if tail else "", 0, True)


class JudgeMemoryStage(JudgeStage[JudgeMemorySettings]):
    name = section = "judge_memory"
    outputs = {"memory_judgments": MEMORY_JUDGMENTS}
    module_prompts = memory_quality.PROMPTS

    def __init__(self, methods: tuple[str, ...] = ()) -> None:
        super().__init__(methods, extra_inputs=(), reads=memory_stage_name)

    def selected_by(self, cfg: Any, present: set[str]) -> str | None:
        """In the run when enabled and a method keeps a memory to rate."""
        if not self.settings_of(cfg).enabled or not self.methods:
            return None
        return "rates the methods' memories (judge_memory.enabled)"

    async def process_episode(self, ctx: StageContext[JudgeMemorySettings], episode_id: str,
                              inputs: dict[str, Rows]) -> dict[str, Rows]:
        settings = ctx.settings
        episode = inputs["ingest.episodes"][0]
        if not settings.enabled or (settings.episodes is not None and episode_id not in settings.episodes):
            return {"memory_judgments": []}
        views = {m: r["memory"] for m in self.methods for r in inputs[f"{memory_stage_name(m)}.memory_view"]}
        dialogue = dialogue_within(sessions_of(inputs["ingest.turns"]), settings.max_dialogue_tokens)
        speakers = episode["speakers"][:settings.max_speakers]
        stamp = self.stamp(ctx, episode)
        params = self.params(settings)
        memories: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        for m, view in views.items():
            for sp in speakers:
                lines = speaker_lines(view, sp, speakers)
                shown = within_tokens(lines, settings.max_memory_tokens)
                memories[m, sp] = ("\n".join(shown), {
                    "memory_lines": len(lines), "memory_lines_shown": len(shown),
                    "memory_truncated": len(shown) < len(lines),
                    "dialogue_sessions_shown": dialogue.sessions_shown, "dialogue_truncated": dialogue.truncated})

        def blank(method: str, speaker: str, criterion: str, run: int, s: int) -> dict[str, Any]:
            return {**stamp, "method": method, "speaker": speaker, "criterion": criterion,
                    "group": memory_quality.CRITERIA[criterion][0], "run": run, "sample": s, "score": None,
                    **memories[method, speaker][1], **NO_FAILURE}

        slots = [(run, s) for run in range(settings.runs) for s in range(settings.samples)]  # in the table's order
        # every run's samples, grouped by run, as `run_requests` sends them
        asked = RunSamples.of(settings.runs, settings.samples, settings.run_requests)

        # B.2's N ratings of one prompt are N samples of it: one request with `n` (pipeline.llm.client).
        async def rated(method: str, speaker: str, criterion: str) -> Rows:
            with billed_to(method):
                judgments = await memory_quality.rate_memory(
                    ctx.llm, criterion, speaker, memories[method, speaker][0], dialogue.text, samples=asked, **params)
            return sampled_rows([blank(method, speaker, criterion, *slot) for slot in slots], ("score",), judgments)

        async def rated_all(method: str, speaker: str) -> Rows:
            with billed_to(method):
                judgments = await memory_quality.rate_memory_all(
                    ctx.llm, settings.criteria, speaker, memories[method, speaker][0], dialogue.text,
                    samples=asked, **{**params, "max_tokens": settings.max_tokens * len(settings.criteria)})
            return sampled_criteria_rows([[blank(method, speaker, c, *slot) for c in settings.criteria]
                                          for slot in slots], ("score",), judgments)

        if settings.per_call == "all":  # one call per (speaker, memory, sample): they share the criteria prefix
            by_call = await asyncio.gather(*(rows_or_failed(
                [blank(m, sp, c, *slot) for slot in slots for c in settings.criteria], rated_all(m, sp),
                f"judge_memory on {m}'s memory of {sp}") for sp in speakers for m in views))
            order = {(m, sp): i for i, (m, sp) in enumerate((m, sp) for m in views for sp in speakers)}
            rows = sorted((r for part in by_call for r in part), key=lambda r: (
                order[r["method"], r["speaker"]], settings.criteria.index(r["criterion"]), r["run"], r["sample"]))
            return {"memory_judgments": rows}
        parts = await asyncio.gather(*(rows_or_failed(
            [blank(m, sp, c, *slot) for slot in slots], rated(m, sp, c),
            f"judge_memory {c} on {m}'s memory of {sp}") for m in views for sp in speakers for c in settings.criteria))
        return {"memory_judgments": [r for part in parts for r in part]}
