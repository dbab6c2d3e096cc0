"""diagnose: where each question was lost, per (probe, method): at write (the memory never stated
the evidence), at retrieval (it did, but the answer's context did not hold it), or at read (the
context held it and the answer is still wrong). Ours; docs/judges-and-metrics.md defines each bucket.

For each question (`qa` probe) with evidence turns, and each method:
- *written*: every evidence turn is stated in the method's memory at question time. By provenance
  where the memory is the conversation's own turns (`Method.memory_evidence`: `every_turn`, SeCom's
  units, every earlier turn kept; `turns_in_context`, histories, what the context held); by a judge
  (stages/judging/written.py) where the method writes its own memory: one call per (probe, method)
  names the memory entries (`Method.memory_items`) that state each evidence turn.
- *retrieved*: each evidence turn's stating entries (or the turn itself) are among what entered the
  answer's context (`memory_ids`, or the recorded turn spans); all of them where the whole memory
  enters every answer (`whole_memory_in_context`).
- *answered*: the verdict of `diagnose.verdict_judge` (a `judge_answers` judge with a correct / wrong
  verdict, majority over its runs, a tie correct as the panel counts it; by default the first such
  judge), or, in a run without one, LoCoMo's F1 at 0.5 (no model).

Buckets: `failed` (no response, no verdict, or the written check failed), `no_evidence` (LoCoMo's
adversarial category, LongMemEval's abstention, or evidence that names no turn of the corpus),
`correct` (written, retrieved, right), `correct_without_evidence` (right without the evidence
written and retrieved), `missed_write`, `missed_retrieval`, `misread`. Under the audited LoCoMo key a
probe's evidence is the audit's (ingest puts it there)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from pydantic import Field

from pipeline.config import RunConfig
from pipeline.errors import ConfigError
from pipeline.llm.types import ChatLLM
from pipeline.failures import FAILURE_FIELDS, NO_FAILURE, failure
from pipeline.hashing import prompt_fingerprint
from pipeline.llm.usage import billed_to
from pipeline.retrieval import within_tokens
from pipeline.engine.stage import Rows, StageContext
from stages.judging import written
from stages.judging.base import JudgeSettings, JudgeStage, run_probe_kinds
from stages.judging.judge_answers import UNANSWERABLE_CATEGORIES, evidence_ids
from stages.judging.panel import F1, accepted, f1_score
from stages.method_stages import memory_stage_name, respond_stage_name
from stages.methods.base import Method, MemoryItem, visible_memory
from stages.dialogue import format_unit
from stages.probes import PROBE_KEY_FIELDS, sample

BUCKETS = ("correct", "correct_without_evidence", "missed_write", "missed_retrieval", "misread", "no_evidence",
           "failed")
F1_VERDICT = "f1 (no correct / wrong judge in the run)"

DIAGNOSIS = pa.schema([
    *PROBE_KEY_FIELDS,
    pa.field("bucket", pa.string(), nullable=False),  # one of BUCKETS
    # how *written* was checked: provenance (the memory is the turns themselves) | judge; null where no
    # check was made (no_evidence, or failed before it)
    pa.field("written_by", pa.string()),
    pa.field("evidence_items", pa.int32()),  # evidence turns of the probe found in the corpus
    pa.field("evidence_written", pa.float64()),  # share of them stated in the memory at question time
    pa.field("evidence_retrieved", pa.float64()),  # share of them that entered the answer's context
    # per evidence turn (the probe's order), the memory ids that state it (judge) or its own turn id
    # where the memory holds that turn (provenance); empty: not written
    pa.field("stated_by", pa.list_(pa.list_(pa.string()))),
    pa.field("memory_entries", pa.int32()),  # entries the judge was shown (judge only)
    pa.field("memory_truncated", pa.bool_()),  # some older entries not shown (diagnose.max_memory_tokens)
    pa.field("verdict", pa.bool_()),  # the answer judged correct (null: no verdict)
    pa.field("verdict_judge", pa.string()),
    pa.field("judge_model", pa.string()),  # of the written check (judge only)
    pa.field("prompt_fingerprint", pa.string(), nullable=False),
    *FAILURE_FIELDS,  # `error`: why the bucket is `failed`
])


class DiagnoseSettings(JudgeSettings):
    # The judge_answers judge whose verdict decides right / wrong (its `name`: strict, locomo_j, a panel
    # judge); None: the first with a correct / wrong verdict, else LoCoMo's F1 at 0.5 (no model).
    verdict_judge: str | None = None
    # The memory shown to the written check's judge, oldest entries dropped first (cl100k tokens).
    max_memory_tokens: int | None = Field(default=4000, ge=1)
    max_tokens: int = Field(default=96, ge=16)  # the judge's reply: lists of entry numbers


def verdict_judge(cfg: Any) -> tuple[str, str]:
    """(judge name, its prompt kind) whose verdict `diagnose` uses; (F1_VERDICT, f1) without one."""
    judges = cfg.judge_answers.judges() if cfg.judge_answers.enabled else []
    with_verdict = [j for j in judges if j.prompt != "gpt4score"]
    wanted = cfg.diagnose.verdict_judge
    if wanted is not None:
        found = [j for j in with_verdict if j.name == wanted]
        if not found:
            raise ConfigError(f"diagnose.verdict_judge: {wanted!r} is not a judge_answers judge with a correct / "
                              f"wrong verdict in this run (it has: {[j.name for j in with_verdict] or 'none'})")
        return found[0].name, found[0].prompt
    return (with_verdict[0].name, with_verdict[0].prompt) if with_verdict else (F1_VERDICT, F1)


def uses_judge_verdicts(cfg: Any) -> bool:
    """Whether `diagnose` reads judge_answers' verdicts (else it scores F1 itself and needs no judge)."""
    return verdict_judge(cfg)[1] != F1


def majority(rows: Rows, prompt: str) -> bool | None:
    """The verdict over a judge's runs on one answer: correct when at least half of the judged runs
    accept it (the panel's rule); None when no run gave a verdict."""
    given = [accepted(r["score"], prompt) for r in rows if r.get("error") is None and r.get("skipped") is None]
    votes = [v for v in given if v is not None]
    return None if not votes else sum(votes) * 2 >= len(votes)


def bucket_of(verdict: bool, written_all: bool, retrieved_all: bool) -> str:
    """Where a judged answer with evidence stands."""
    if verdict:
        return "correct" if written_all and retrieved_all else "correct_without_evidence"
    if not written_all:
        return "missed_write"
    return "misread" if retrieved_all else "missed_retrieval"


def context_turns(response: dict[str, Any]) -> set[tuple[int, int]]:
    """(session, turn) of every corpus turn the answer's context held, from its recorded turn spans."""
    details = json.loads(response["details_json"]) if response.get("details_json") else {}
    return {(int(s), t) for s, first, last in details.get("context_spans") or [] for t in range(int(first), int(last) + 1)}


def evidence_line(turn: dict[str, Any]) -> str:
    """An evidence turn on one line, with its session (and date) for questions about when."""
    when = turn.get("session_time")
    return f"[Session {turn['session_idx']}{f', {when}' if when else ''}] {format_unit([turn])}"


def is_unanswerable(probe: dict[str, Any]) -> bool:
    return str(probe.get("category")) in UNANSWERABLE_CATEGORIES or bool(probe.get("abstention"))


class DiagnoseStage(JudgeStage[DiagnoseSettings]):
    name = section = "diagnose"
    outputs = {"buckets": DIAGNOSIS}
    module_prompts = written.PROMPTS
    judged_kinds = ("qa",)

    def __init__(self, methods: tuple[Method, ...] = (), verdicts: bool = False) -> None:
        """`verdicts`: the run judges answers (judge_answers), so its verdicts are read."""
        self.method_objects = methods
        super().__init__(tuple(m.name for m in methods), extra_inputs=("probes",), reads=respond_stage_name)
        self.inputs = (*self.inputs, *(["judge_answers"] if verdicts else []),
                       *(memory_stage_name(m.name) for m in methods if m.memory and m.evidence_check == "judge"))

    def selected_by(self, cfg: Any, present: set[str]) -> str | None:
        if not self.settings_of(cfg).enabled or not self.methods or "qa" not in run_probe_kinds(cfg):
            return None
        return "traces each question to write, retrieval or read (diagnose.enabled)"

    def check_inputs(self, cfg: Any) -> None:
        verdict_judge(cfg)  # a verdict_judge the run does not hold fails before the run starts

    def code_roots(self) -> tuple[str, ...]:
        # the methods' memory_items / memory_evidence decide the buckets
        return (type(self).__module__, *dict.fromkeys(type(m).__module__ for m in self.method_objects))

    async def process_episode(self, ctx: StageContext[DiagnoseSettings], episode_id: str,
                              inputs: dict[str, Rows]) -> dict[str, Rows]:
        settings = ctx.settings
        if not settings.enabled:
            return {"buckets": []}
        episode = inputs["ingest.episodes"][0]
        turns = inputs["ingest.turns"]
        by_source = {t["source_turn_id"]: t for t in turns if t.get("source_turn_id")}
        probes = sample([p for p in inputs["probes.probes"] if p["kind"] == "qa"],
                        settings.max_probes_per_episode, settings.seed, episode_id)
        responses = self.responses(inputs)
        judge_name, judge_prompt = verdict_judge(ctx.cfg)
        key = ctx.cfg.corpus.answer_key
        judged: dict[tuple[str, str], Rows] = {}
        for r in inputs.get("judge_answers.answer_judgments", []):
            if r["judge"] == judge_name and r.get("answer_key") in (None, key):
                judged.setdefault((r["probe_id"], r["method"]), []).append(r)
        stamp = {"episode_id": episode_id, "dataset": episode["dataset"],
                 "prompt_fingerprint": prompt_fingerprint(self.prompts)}
        judge_model = ctx.llm.cfg.model

        async def one(probe: dict[str, Any], method: Method) -> dict[str, Any]:
            row = {**stamp, "probe_id": probe["probe_id"], "kind": probe["kind"], "category": probe["category"],
                   "method": method.name, "bucket": "failed", "written_by": None, "evidence_items": None,
                   "evidence_written": None, "evidence_retrieved": None, "stated_by": None, "memory_entries": None,
                   "memory_truncated": None, "verdict": None, "verdict_judge": judge_name, "judge_model": None,
                   **NO_FAILURE}
            resp = responses[method.name].get(probe["probe_id"])
            if resp is None or resp.get("error") is not None or resp.get("response") is None:
                return {**row, "error": f"no response from {method.name}"}
            evidence = [by_source[i] for i in dict.fromkeys(evidence_ids(probe.get("evidence"))) if i in by_source]
            if is_unanswerable(probe) or not evidence:
                return {**row, "bucket": "no_evidence", "evidence_items": len(evidence)}
            if judge_prompt == F1:
                score = f1_score(episode["dataset"], probe["category"], resp["response"], probe["gold"])
                verdict = None if score is None else bool(accepted(score, F1))
            else:
                verdict = majority(judged.get((probe["probe_id"], method.name), []), judge_prompt)
            row.update(verdict=verdict, evidence_items=len(evidence))
            if verdict is None:
                return {**row, "error": f"no verdict from judge {judge_name} on this answer"}
            try:
                with billed_to(method.name):
                    stated, retrieved, extra = await self.checked(ctx, probe, method, resp, evidence, inputs)
            except Exception as e:  # one check's failure is this row's, never the stage's
                return {**row, **failure(e), "written_by": "judge" if method.evidence_check == "judge" else "provenance"}
            written_share = sum(bool(s) for s in stated) / len(stated)
            retrieved_share = sum(retrieved) / len(retrieved)
            return {**row, **extra, "stated_by": stated, "evidence_written": written_share,
                    "evidence_retrieved": retrieved_share,
                    "bucket": bucket_of(verdict, written_share == 1.0, retrieved_share == 1.0)}

        rows = await asyncio.gather(*(one(p, self._method(m)) for p in probes for m in self.methods))
        return {"buckets": list(rows)}

    def _method(self, name: str) -> Method:
        return next(m for m in self.method_objects if m.name == name)

    async def checked(self, ctx: StageContext[DiagnoseSettings], probe: dict[str, Any], method: Method,
                      resp: dict[str, Any], evidence: Rows, inputs: dict[str, Rows]) -> tuple[list[list[str]], list[bool], dict[str, Any]]:
        """(per evidence turn: what states it; per evidence turn: whether it entered the answer's
        context; the row's other columns) for one answer."""
        shown = context_turns(resp)
        keys = [(t["session_idx"], t["turn_idx"]) for t in evidence]
        if method.evidence_check != "judge":
            at = (probe["session_idx"], 10 ** 9 if probe.get("turn_idx") is None else probe["turn_idx"])
            before = {(t["session_idx"], t["turn_idx"]) for t in inputs["ingest.turns"]
                      if (t["session_idx"], t["turn_idx"]) < at}
            held = before if method.evidence_check == "every_turn" else shown
            stated: list[list[str]] = [[t["source_turn_id"]] if k in held else [] for t, k in zip(evidence, keys)]
            return stated, [k in shown for k in keys], {"written_by": "provenance"}
        settings = ctx.settings
        items = memory_at(ctx.cfg, method, inputs, probe["session_idx"], probe.get("turn_idx"))
        shown_items = newest_within(items, settings.max_memory_tokens)
        extra = {"written_by": "judge", "memory_entries": len(shown_items),
                 "memory_truncated": len(shown_items) < len(items)}
        stated, model = await stated_in(ctx.llm, probe["request"], probe["gold"], evidence, shown_items,
                                        self.params(settings))
        if model is not None:
            extra["judge_model"] = model
        used = set(resp.get("memory_ids") or []) | {i.id for i in items if i.always_shown}
        retrieved = [bool(s) if method.whole_memory_in_context else any(i in used for i in s) for s in stated]
        return stated, retrieved, extra


def memory_at(cfg: RunConfig, method: Method, inputs: dict[str, Rows], session: int,
              turn: int | None) -> list[MemoryItem]:
    """A method's memory as its entries, as a probe at (`session`, `turn`) sees it (turn None: the whole
    session before it is over, i.e. the memory right after `session`'s end for a point in `session`)."""
    stage = memory_stage_name(method.name)
    tables = {t: visible_memory(inputs.get(f"{stage}.{t}", []), session, turn, method.memory_kind)
              for t in method.memory}
    return method.memory_items(tables, getattr(getattr(cfg, "method"), method.name))  # its `method.<name>` section


def newest_within(items: list[MemoryItem], max_tokens: int | None) -> list[MemoryItem]:
    """The newest entries that fit `max_tokens` (cl100k) together, in memory order."""
    kept = within_tokens([i.text for i in items], max_tokens)
    return items[len(items) - len(kept):]


async def stated_in(llm: ChatLLM, question: str, reference: str | None, evidence: Rows, shown: list[MemoryItem],
                    params: Mapping[str, object]) -> tuple[list[list[str]], str | None]:
    """The written check: per evidence turn, the ids of the `shown` entries that state it (one judge
    call; none for an empty memory, which states nothing), and the judge model (None: no call)."""
    if not shown:
        return [[] for _ in evidence], None
    call = written.written_call(question, reference, [evidence_line(t) for t in evidence], shown)
    stated, model = await call.once(llm, **params)
    return stated, model
