"""judge_pairwise: head-to-head of a reference method against every other method on the same probes
(ours, after Theanine's G-Eval, App. D, Table 1; CREEM App. B.1).

Protocols:
- `both_orders` (SeCom App. A.4: "alternate the order of the responses and conduct a second
  comparison for each pair"), used here for Theanine's criteria: each pair judged with the
  reference shown first and shown second, to cancel position bias; ties allowed; the report gives
  win / tie / loss rates and wins / (wins + losses) with a two-sided sign test per criterion, per
  session, per dataset and pooled over datasets (Table 1 pools MSC and CC).
- `creem` (CREEM App. B.1): consistency and memorability in B.1's terms, the whole current session,
  no tie, N samples per item (paper: 19) with the reference's position drawn per sample (seeded,
  stored in `reference_first`), their majority vote; win rate over decided pairs.

`runs` repeats the whole judgment of every item (both orders and every sample; `run` in the table):
run r asks sample indexes r*N .. r*N+N-1 of each prompt (N: `samples`), so run 0 is exactly the single
run and no two runs share a cache key; under `creem` each run draws its own positions. The report
takes each run's outcome as one run alone would, then each item's majority over its runs.

Under every protocol the judge sees the earlier sessions by default (`show_past`): memorability and
consistency with the past cannot be judged without them. They are cut to `past_session_tokens`
(cl100k), dropping the oldest sessions first; a dropped session is shown as the corpus's own
session summary when the episode carries one (LoCoMo) and it fits. Each row records what was shown.
Under `both_orders` the judge is told that length alone is no merit unless `length_rule` is off (the
rule is ours; the Theanine configs turn it off and show the whole current session). With
`reason_first` (both_orders; on in the Theanine configs) the judge follows G-Eval's form as Theanine
App. D names it: per-criterion evaluation steps (ours) and its reasoning before the verdict.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import pyarrow as pa
from pydantic import Field, model_validator

from pipeline.errors import ConfigError
from pipeline.engine.stage import Rows, StageContext
from pipeline.failures import FAILURE_FIELDS, NO_FAILURE
from stages.dialogue import last_turns, sessions_of
from stages.judging import pairwise
from stages.judging.pairwise import (PairProtocol, PairShown, Past, past_within, reference_shown_first,
                                     session_summaries, transcript)
from pipeline.llm.usage import billed_to
from stages.judging.base import JudgeSettings, JudgeStage, rows_or_failed, sampled_criteria_rows, sampled_rows
from stages.judging.calls import RunSamples, run_samples
from stages.probes import probe_view, sample

Criterion = Literal["specificity", "memorability", "consistency"]
PROTOCOL_CRITERIA: dict[str, list[Criterion]] = {
    "both_orders": ["specificity", "memorability", "consistency"],
    "creem": ["consistency", "memorability"],
}
PROTOCOL_SAMPLES = {"both_orders": 1, "creem": 19}
PROTOCOL_CONTEXT_TURNS: dict[str, int | None] = {"both_orders": 10, "creem": None}  # None: the whole session

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
        pa.field("run", pa.int32(), nullable=False),  # which of the judge's independent runs (`runs`), from 0
        # the sample within its run (G-Eval's N per order; creem's N per item); the request's sample
        # index is run * N + sample
        pa.field("sample", pa.int32(), nullable=False),
        pa.field("preferred", pa.string()),  # reference | other | tie; null when the judgment failed
        pa.field("reason", pa.string()),
        # What the judge saw of the past (null when `show_past` is off): earlier sessions shown in
        # full, shown as the corpus's session summary, and whether any was not shown in full.
        pa.field("past_shown", pa.int32()),
        pa.field("past_summarised", pa.int32()),
        pa.field("past_truncated", pa.bool_()),
        pa.field("current_shown", pa.int32()),  # turns of the current session shown
        pa.field("judge_model", pa.string()),
        pa.field("prompt_fingerprint", pa.string(), nullable=False),
        *FAILURE_FIELDS,
    ]
)


class JudgePairwiseSettings(JudgeSettings):
    explain: bool = True  # ask for a one-sentence reason with each verdict (kept in the table; B.1 asks for one)
    reference: str | None = None  # the method every other is compared with; None = first of `methods`
    protocol: Literal["both_orders", "creem"] = "both_orders"
    criteria: list[Criterion] | None = None  # None = the protocol's
    samples: int | None = Field(default=None, ge=1)  # per order; None = the protocol's (creem: 19)
    kinds: list[str] = ["next_response"]  # probe kinds judged
    # Turns of the current session shown: a number, "all", or None = the protocol's (both_orders 10,
    # creem the whole session as B.1).
    context_turns: Annotated[int, Field(ge=0)] | Literal["all"] | None = None
    show_past: bool = True  # show the earlier sessions (every protocol)
    # both_orders: tell the judge "length alone is not a merit" (ours; Theanine's G-Eval states no such
    # rule and credits RSum-LLM's long answers for its wins, so the Theanine configs turn it off)
    length_rule: bool = True
    past_session_tokens: int | None = Field(default=6000, ge=1)  # cl100k budget of the past; null = all
    # criterion: one call per criterion (Theanine, CREEM B.1); all (ours, both_orders only): one call
    # gives a verdict on every criterion, a third of the calls; max_tokens then holds per criterion
    per_call: Literal["criterion", "all"] = "criterion"
    # both_orders: G-Eval's form (Theanine App. D: "chain-of-thoughts and a form-filling paradigm"):
    # per-criterion evaluation steps (ours) and the reasoning before the verdict (schema: reason, better).
    # Off: the verdict, then a one-sentence reason. The Theanine configs turn it on.
    reason_first: bool = False
    # Independent runs of every item's whole judgment (both orders, every sample): one row group per
    # run (`run`); the report takes each item's majority outcome over its runs (a tie where runs split
    # evenly) and gives the runs' spread (pairwise_summary `runs`, `run_sd`). Sent as `run_requests` says.
    runs: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _one_metric_per_call_under_creem(self) -> "JudgePairwiseSettings":
        if self.per_call == "all" and self.protocol == "creem":
            raise ValueError("per_call: all is for the both_orders protocol; CREEM B.1 judges one metric per prompt")
        if self.reason_first and self.protocol == "creem":
            raise ValueError("reason_first is for the both_orders protocol; CREEM B.1 asks for the choice, then a brief "
                             "explanation")
        return self


@dataclass
class _EpisodePairs:
    """One episode's head-to-head judgments being made: what its pairs share, and how each is judged."""
    ctx: StageContext
    settings: JudgePairwiseSettings
    episode_id: str
    reference: str
    criteria: list[Criterion]
    samples: int
    runs: int
    stamp: dict[str, Any]
    params: dict[str, Any]
    responses: dict[str, dict[str, dict[str, Any]]]  # method -> probe id -> its response row
    views: dict[str, tuple[list[dict], Past | None]]  # probe id -> (current turns shown, past)

    @property
    def protocol(self) -> str:
        return self.settings.protocol

    @property
    def how(self) -> PairProtocol:
        """How the judge is asked, from the stage's settings."""
        s = self.settings
        return PairProtocol(s.protocol, s.explain, s.length_rule, s.reason_first)

    def blank(self, probe: dict[str, Any], other: str, criterion: str, reference_first: bool, run: int,
              s: int) -> dict:
        current, past = self.views[probe["probe_id"]]
        return {**self.stamp, "probe_id": probe["probe_id"], "session_idx": probe["session_idx"],
                "criterion": criterion, "reference": self.reference, "other": other, "protocol": self.protocol,
                "reference_first": reference_first, "run": run, "sample": s, "preferred": None, "reason": None,
                "past_shown": past.shown if past else None, "past_summarised": past.summarised if past else None,
                "past_truncated": past.truncated if past else None, "current_shown": len(current), **NO_FAILURE}

    def judged(self, probe: dict[str, Any], other: str) -> tuple[str, str, str, str | None] | str:
        """(dialogue, the reference's response, the other's, the past shown) or why there is no pair."""
        reference = self.reference
        ref, oth = self.responses[reference].get(probe["probe_id"]), self.responses[other].get(probe["probe_id"])
        missing = [m for m, r in ((reference, ref), (other, oth)) if r is None or r["error"] is not None]
        if missing:
            return f"no response from {', '.join(missing)}"
        assert ref is not None and oth is not None  # neither is missing
        current, past = self.views[probe["probe_id"]]
        dialogue = transcript(current) if current else f"(question) {probe['request']}"
        return dialogue, ref["response"], oth["response"], past.text if past else None

    def shown(self, probe: dict[str, Any], other: str, criterion: str) -> list[tuple[bool, int, int]]:
        """(reference shown first, run, sample) of each judgment of one item, in the table's order."""
        if self.protocol == "both_orders":
            return [(first, run, s) for run in range(self.runs) for first in (True, False) for s in range(self.samples)]
        # CREEM: the position drawn per request sample index, so each run draws its own and run 0 the single run's
        return [(reference_shown_first(self.settings.seed, self.episode_id, probe["probe_id"], other, criterion,
                                       self.sample_index(run, s)), run, s)
                for run in range(self.runs) for s in range(self.samples)]

    def sample_index(self, run: int, s: int) -> int:
        """The request's sample index of sample `s` of run `run` (calls.run_samples)."""
        return run_samples(run, self.samples)[s]

    def requested(self, slots: list[tuple[int, int]]) -> RunSamples:
        """The request sample indexes of (run, sample) `slots` of one prompt, grouped by run."""
        runs = sorted({run for run, _ in slots})
        return RunSamples(tuple(tuple(self.sample_index(run, s) for r, s in slots if r == run) for run in runs),
                          self.settings.run_requests)

    # The samples of one item shown in one order share a prompt: one request with `n` for them
    # (pipeline.llm.client), every run's together unless `run_requests: requests`; CREEM's draw per
    # sample splits an item's samples into two such prompts.
    async def pair(self, probe: dict[str, Any], other: str, criterion: str) -> Rows:
        """The judgments of one item (probe, opponent, criterion), one call per order shown."""
        slots, judged_pair = self.shown(probe, other, criterion), self.judged(probe, other)
        rows = {slot: self.blank(probe, other, criterion, *slot) for slot in slots}
        if isinstance(judged_pair, str):
            return [{**rows[slot], "error": judged_pair} for slot in slots]
        dialogue, ref, oth, past = judged_pair

        async def in_order(first: bool, shown: list[tuple[int, int]]) -> Rows:
            with billed_to(other):
                judgments = await pairwise.judge_pair(
                    self.ctx.llm, criterion, PairShown(dialogue, probe["respondent"], ref, oth, first, past),
                    self.how, samples=self.requested(shown), **self.params)
            # `requested` keeps `shown` in order (runs ascending, as `shown` lists them)
            return sampled_rows([rows[first, run, s] for run, s in shown], ("preferred", "reason"), judgments)

        orders = {first: [(run, s) for f, run, s in slots if f == first] for first in (True, False)}
        for part in await asyncio.gather(*(in_order(f, shown) for f, shown in orders.items() if shown)):
            rows.update({(r["reference_first"], r["run"], r["sample"]): r for r in part})
        return [rows[slot] for slot in slots]

    async def every(self, probe: dict[str, Any], other: str, reference_first: bool) -> Rows:
        """The judgments of every criterion of one (probe, opponent) in one order, from one call
        (per run with `run_requests: requests`)."""
        settings, criteria = self.settings, self.criteria
        slots = [(run, s) for run in range(self.runs) for s in range(self.samples)]
        groups = [[self.blank(probe, other, c, reference_first, run, s) for c in criteria] for run, s in slots]
        judged_pair = self.judged(probe, other)
        if isinstance(judged_pair, str):
            return [{**r, "error": judged_pair} for rows in groups for r in rows]
        dialogue, ref, oth, past = judged_pair
        with billed_to(other):
            judgments = await pairwise.judge_pair_all(
                self.ctx.llm, list(criteria), PairShown(dialogue, probe["respondent"], ref, oth, reference_first, past),
                self.how, samples=self.requested(slots),
                **{**self.params, "max_tokens": settings.max_tokens * len(criteria)})
        return sampled_criteria_rows(groups, ("preferred", "reason"), judgments)

    async def all_at_once(self, probes: Rows, others: list[str]) -> Rows:
        """Every criterion in one call: rows in the same order as one call per criterion."""
        calls = [rows_or_failed([self.blank(p, o, c, first, run, s) for run in range(self.runs)
                                 for s in range(self.samples) for c in self.criteria],
                                self.every(p, o, first), f"judge_pairwise on {o} for {p['probe_id']}")
                 for p in probes for o in others for first in (True, False)]
        rows = [r for part in await asyncio.gather(*calls) for r in part]
        rank = {c: i for i, c in enumerate(self.criteria)}
        order = {(p["probe_id"], o): i for i, (p, o) in enumerate((p, o) for p in probes for o in others)}
        rows.sort(key=lambda r: (order[r["probe_id"], r["other"]], rank[r["criterion"]], r["run"],
                                 not r["reference_first"], r["sample"]))
        return rows

    async def one_by_one(self, probes: Rows, others: list[str]) -> Rows:
        """One call per criterion (and per order shown)."""
        parts = await asyncio.gather(*(
            rows_or_failed([self.blank(p, o, c, *slot) for slot in self.shown(p, o, c)], self.pair(p, o, c),
                           f"judge_pairwise {c} on {o} for {p['probe_id']}")
            for p in probes for o in others for c in self.criteria))
        return [r for part in parts for r in part]


class JudgePairwiseStage(JudgeStage[JudgePairwiseSettings]):
    name = section = "judge_pairwise"
    outputs = {"pairwise_judgments": PAIRWISE_JUDGMENTS}
    module_prompts = pairwise.PROMPTS

    def pairing(self, settings: JudgePairwiseSettings) -> tuple[str, list[str]]:
        reference = settings.reference or (self.methods[0] if self.methods else "")
        if self.methods and reference not in self.methods:
            raise ConfigError(f"judge_pairwise.reference: {reference!r} is not one of methods {list(self.methods)}")
        return reference, [m for m in self.methods if m != reference]

    async def process_episode(self, ctx: StageContext[JudgePairwiseSettings], episode_id: str,
                              inputs: dict[str, Rows]) -> dict[str, Rows]:
        settings = ctx.settings
        reference, others = self.pairing(settings)
        if not settings.enabled or not others:
            return {"pairwise_judgments": []}
        episode = inputs["ingest.episodes"][0]
        sessions = sessions_of(inputs["ingest.turns"])
        summaries = session_summaries(episode)
        responses = self.responses(inputs)
        probes = sample([p for p in inputs["probes.probes"] if p["kind"] in settings.kinds],
                        settings.max_probes_per_episode, settings.seed, episode_id)
        protocol = settings.protocol
        turns_shown = PROTOCOL_CONTEXT_TURNS[protocol] if settings.context_turns is None else (
            None if settings.context_turns == "all" else settings.context_turns)
        stamp = self.stamp(ctx, episode)
        params = self.params(settings)

        def seen(probe: dict[str, Any]) -> tuple[list[dict], Past | None]:
            """The current session's turns shown and the past, for one probe."""
            current = probe_view(probe, sessions)
            past = (past_within(sessions, probe["session_idx"], settings.past_session_tokens, summaries)
                    if settings.show_past else None)
            return last_turns(current, turns_shown), past

        views = {p["probe_id"]: seen(p) for p in probes}
        pairs = _EpisodePairs(ctx, settings, episode_id, reference, settings.criteria or PROTOCOL_CRITERIA[protocol],
                              settings.samples or PROTOCOL_SAMPLES[protocol], settings.runs, stamp, params,
                              responses, views)
        if settings.per_call == "all":
            return {"pairwise_judgments": await pairs.all_at_once(probes, others)}
        return {"pairwise_judgments": await pairs.one_by_one(probes, others)}

    def shard_stats(self, produced: dict[str, Rows]) -> dict[str, Any]:
        rows = produced["pairwise_judgments"]
        return {"judgments": len(rows), "failed_judgments": sum(r["error"] is not None for r in rows),
                "past_truncated": sum(bool(r["past_truncated"]) for r in rows)}
