"""judge_answers: every method's answer to a probe, judged alone: SeCom's GPT4Score (against the
reference answer, or MemoChat's evidence-based judge), correct / incorrect in a strict and a lenient
wording, LongMemEval's yes/no judge with a prompt per question type (`correctness: [longmemeval]`,
stages/judging/longmemeval.py), the community LoCoMo judge (`correctness: [locomo_j]`: mem0's "J",
CORRECT or WRONG against the gold answer, stages/judging/answers.py), and TeaFarm correctness for
TeaFarm's counterfactual questions (Theanine Table 3).

Every (probe, method, judge) of the judged kinds gets a row. A question without a reference answer
(LoCoMo's adversarial category) is judged against "Not mentioned in the conversation" by the
reference-based judges (`unanswerable: not_mentioned`), or written as a row with `skipped` saying why
(`unanswerable: skip`); MemoChat's judge needs no reference and judges it like any other question
unless `unanswerable: skip`, so that GPT4Score can average the same questions as BLEU / ROUGE /
BERTScore, which cannot score an answer without a reference. MemoChat's judge sees one history per
probe, whichever method answered: the probe's evidence turns, else the whole past (`history_source`).
LongMemEval's judge asks whether such a question, and any question flagged `abstention`, was declined;
it is shown the bare question (not the request with its "[Current date: ...]" line), as
LongMemEval's evaluate_qa.py shows it. The LoCoMo judge is shown the bare question too, as mem0's
llm_judge.py is; with `unanswerable: skip` it skips LoCoMo's adversarial category as mem0's evals.py
does (every row of category 5 written with `skipped`), so its per-category and overall shares cover
categories 1-4.

MemoryAgentBench's judges (`correctness: [memoryagentbench]`, stages/judging/memoryagentbench.py) judge
its LongMemEval subset with LongMemEval's per-type yes/no judge (1 / 0) and its InfBench summaries with
HELMET's three calls (fluency, key-point recall, precision; their fluency-scaled F1 the score, the parts
and replies in `reason`); its other tasks, and every other dataset, get rows with `skipped` saying so.

BEAM's judge (`correctness: [beam]`, stages/judging/beam.py) scores a BEAM answer against its question's
rubric (the QA row's judge notes): one gpt-4.1-mini call per nugget (1 / 0.5 / 0, read as the official
reads it, int() on nine abilities), the question's score their mean; an event-ordering answer's score is
the normalised Kendall's tau-b of its lines, aligned to the rubric's items by an LLM equivalence check,
against the rubric's order, as BEAM reports it. The nugget readings, replies, F1 and alignment are kept
in `reason` as JSON; other datasets get rows with `skipped`.

HaluMem's QA judge (`correctness: [halumem]`, stages/judging/halumem.py) classifies an answer Correct /
Hallucination / Omission against the question, its reference and its evidence memory points (the QA row's
judge notes), as HaluMem's evaluation.py does: score 1 for Correct, else 0, the label and the reply in
`reason` as JSON (halumem.qa_ratios gives the release's three ratios from the rows); other datasets get
rows with `skipped`.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Literal

import pyarrow as pa
from pydantic import Field, field_validator

from pipeline.failures import FAILURE_FIELDS, NO_FAILURE
from pipeline.engine.stage import Rows, StageContext
from stages.judging import answers, beam, halumem, locomo_plus, longmemeval
from stages.judging import memoryagentbench as mab
from pipeline.corpus.memoryagentbench import JUDGE_NOTES
from pipeline.llm.usage import costed_to
from stages.judging.base import JudgeSettings, JudgeStage, rows_or_failed, sampled_rows
from stages.judging.panel import (F1, JUDGE_ROLE, PanelJudge, accepted, default_panel, f1_score, panel_roles,
                                  shown_category)
from stages.dialogue import format_unit, sessions_of
from stages.probes import PROBE_KEY_FIELDS, sample

ANSWER_JUDGMENTS = pa.schema(
    [
        *PROBE_KEY_FIELDS,
        # gpt4score | strict | lenient | longmemeval | locomo_j | locomo_plus | memoryagentbench | beam | halumem |
        # teafarm
        pa.field("judge", pa.string(), nullable=False),
        pa.field("run", pa.int32(), nullable=False),  # which of the judge's independent runs (judge_answers.runs), from 0
        # 0-100 (1-100 memochat) for gpt4score; memoryagentbench on a summary: HELMET's F1 (0-1); beam: the
        # rubric's nugget mean (0-1), on event ordering the normalised tau-b (0-1); 1 correct / 0 incorrect otherwise
        pa.field("score", pa.float64()),
        # the judge's reason (MemoChat: its explanation; longmemeval: its reply; memoryagentbench on a
        # summary: JSON of fluency, recall and precision found / totals, recall, precision, f1 and the replies;
        # beam: JSON of the nuggets (value, stated score, reply), their mean and, on event ordering, the order
        # scores (precision, recall, f1, tau_b, tau_norm, final_score) and the alignment of each answer line;
        # halumem: JSON of the label (Correct | Hallucination | Omission, null: unreadable) and the reply)
        pa.field("reason", pa.string()),
        # What the judge was shown as the expected answer: gold | not_mentioned | rubric (beam); null: none (memochat)
        pa.field("reference_source", pa.string()),
        # memochat: the history the judge saw, the same for every method: evidence (the probe's gold
        # evidence turns) | full_past (every turn before the probe: the probe has no evidence the corpus
        # holds, e.g. Long-MT-Bench+ as released); null otherwise
        pa.field("history_source", pa.string()),
        pa.field("skipped", pa.string()),  # why the item was not judged (by design, not a failure); null: judged
        # longmemeval (and memoryagentbench on its LongMemEval subset): the prompt the question type chose
        # (standard | temporal | knowledge_update | preference | abstention); memoryagentbench on a summary:
        # summary; beam: rubric | event_ordering; halumem: qa; null for the other judges
        pa.field("judge_prompt", pa.string()),
        # the judge's prompt (strict | lenient | longmemeval | locomo_j | locomo_plus | memoryagentbench | beam |
        # halumem | gpt4score | teafarm) or f1
        # (LoCoMo's F1, no model): a panel judge's `judge` is its own name (judge_answers.panel)
        pa.field("judge_kind", pa.string()),
        # the verdict as accept / reject for agreement and robust differences (stages/judging/panel.py
        # `accepted`): a correct verdict; F1 at or above the judge's accept_at; null for GPT4Score
        pa.field("accepted", pa.bool_()),
        # the answer key the reference came from (corpus.answer_key): an audited run also judges each
        # answer whose gold the audit changed against the dataset's own (rows with `original`)
        pa.field("answer_key", pa.string()),
        pa.field("abstention", pa.bool_()),  # the probe's flag (LongMemEval "_abs"), for the report's own row
        pa.field("judge_model", pa.string()),
        pa.field("prompt_fingerprint", pa.string(), nullable=False),
        *FAILURE_FIELDS,
    ]
)

SKIP_NO_REFERENCE = "no reference answer"
SKIP_UNANSWERABLE = "unanswerable question (judge_answers.unanswerable: skip)"
UNANSWERABLE_CATEGORIES = frozenset({"adversarial", "5"})  # LoCoMo category 5


class JudgeAnswersSettings(JudgeSettings):
    explain: bool = True  # ask for a short reason with each verdict, before it (kept in the table)
    kinds: list[str] = ["qa", "teafarm"]  # probe kinds that are judged
    score_0_100: bool = True  # SeCom's GPT4Score
    # reference: against the reference answer, 0-100 (ours); memochat: MemoChat's judge (SeCom App. A.4):
    # related history + question + response, faithfulness, explanation then [[1-100]]
    gpt4score_mode: Literal["reference", "memochat"] = "reference"
    memochat_max_tokens: int = Field(default=512, ge=16)  # room for the explanation before the [[rating]]
    # MemoChat's history with each session's date in its "[Session n, date]" header (true), or
    # "[Session n]" only (false: MemoChat's own layout has no dates, and an answer prompt without dates,
    # SeCom's chat frame, is then judged on what its generator could see)
    memochat_dates: bool = True
    # strict / lenient: ours; longmemeval: LongMemEval's yes/no judge, its prompt chosen by question type;
    # locomo_j: the community LoCoMo judge (mem0's J: CORRECT / WRONG against the gold answer)
    # locomo_plus: LoCoMo-Plus's correct / partial / wrong judge, its prompt chosen by category;
    # memoryagentbench: MemoryAgentBench's judges of its longmemeval and infbench_sum tasks;
    # beam: BEAM's rubric judge (nuggets 1 / 0.5 / 0) and its event-ordering tau-b;
    # halumem: HaluMem's Correct / Hallucination / Omission judge against the evidence memory points
    correctness: list[Literal["strict", "lenient", "longmemeval", "locomo_j", "locomo_plus", "memoryagentbench",
                              "beam", "halumem"]] = ["strict", "lenient"]
    # Questions without a reference answer that the conversation cannot answer (LoCoMo category 5):
    # judged (against "Not mentioned in the conversation" by the reference-based judges; MemoChat's
    # judge needs no reference), or skipped by every judge (rows with `skipped` set): `skip` leaves out
    # the whole category, its few items with a gold answer too.
    unanswerable: Literal["not_mentioned", "skip"] = "not_mentioned"
    # Independent runs of every judgment (the mem0 paper's J: 10 runs, mean and s.d. across them): one
    # row per run, sent as samples of one prompt (one request with `n` where the endpoint takes it; the
    # runs differ only as the judge's sampling lets them). The report averages each item over its
    # runs and gives the runs' spread (answer_summary `runs`, `run_sd`).
    runs: int = Field(default=1, ge=1)
    # Several judges of the same answers (stages/judging/panel.py): each {name, prompt, role[, accept_at]};
    # replaces `score_0_100` and `correctness` for questions (TeaFarm's questions keep TeaFarm's judge).
    panel: list[PanelJudge] | None = None

    @field_validator("panel")
    @classmethod
    def _distinct_names(cls, panel: list[PanelJudge] | None) -> list[PanelJudge] | None:
        names = [j.name for j in panel or []]
        if len(set(names)) != len(names) or "teafarm" in names:
            raise ValueError(f"panel judges need distinct names other than teafarm (got {names})")
        if panel is not None and not panel:
            raise ValueError("an empty panel judges nothing: leave `panel` out for the default judges")
        return panel

    def judges(self) -> list[PanelJudge]:
        """The judges of questions: the panel, else GPT4Score (`score_0_100`) and `correctness`."""
        return self.panel if self.panel is not None else default_panel(self.correctness, self.score_0_100)

    def declared_roles(self) -> set[str]:
        """The LLM roles the panel names, so that `roles.<role>` may configure them."""
        return set(panel_roles(self.panel or []))


def evidence_ids(evidence: list[str] | None) -> list[str]:
    """Source turn ids of a probe's evidence; LoCoMo sometimes packs several into one string ("D8:6; D9:17")."""
    return [part for item in evidence or [] for part in re.split(r"[;,\s]+", item) if part]


def history_text(turns: Rows, dates: bool = True) -> str:
    """Turns grouped under "[Session n, time]" headers ("[Session n]" without `dates`) in time order;
    "..." marks skipped turns."""
    blocks = []
    for s, part in sessions_of(turns).items():
        when = part[0].get("session_time") if dates else None
        header = f"[Session {s}" + (f", {when}" if when not in (None, "") else "") + "]"
        lines: list[str] = []
        for prev, t in zip([None, *part[:-1]], part):
            if prev is not None and t["turn_idx"] != prev["turn_idx"] + 1:
                lines.append("...")
            lines.append(format_unit([t]))
        blocks.append(header + "\n" + "\n".join(lines))
    return "\n\n".join(blocks)


def related_history(probe: dict[str, Any], turns: Rows, dates: bool = True) -> tuple[str, str]:
    """(history text, source) for MemoChat's judge, the same whichever method answered: the probe's
    gold evidence turns (source `evidence`); when the corpus holds none of them, every turn before the
    probe (`full_past`). Never what a method put in its own context: a judge shown the method's
    retrieval would rate faithfulness to that retrieval, however wrong it was."""
    ids = set(evidence_ids(probe.get("evidence")))
    chosen = [t for t in turns if t.get("source_turn_id") in ids] if ids else []
    if chosen:
        return history_text(chosen, dates), "evidence"
    s, turn = probe["session_idx"], probe.get("turn_idx")
    before = [t for t in turns if t["session_idx"] < s or (t["session_idx"] == s and turn is not None
                                                            and t["turn_idx"] < turn)]
    return history_text(before, dates) or "(no earlier conversation)", "full_past"


def reference_or_skip(probe: dict[str, Any], memochat: bool,
                      unanswerable: str) -> tuple[str | None, str | None]:
    """(reference_source, skipped) of one probe's judgment: what the judge compares the response with
    (`gold`, `not_mentioned`; None for MemoChat's judge, which reads the history instead), or why it is
    skipped (`unanswerable`: the `judge_answers.unanswerable` setting)."""
    gold = probe["gold"]
    adversarial = str(probe["category"]) in UNANSWERABLE_CATEGORIES
    is_unanswerable = gold is None and adversarial
    if adversarial and unanswerable == "skip":
        # by category, gold or not (two of locomo10's carry answer "No"), as mem0's evals.py skips category 5
        return None, SKIP_UNANSWERABLE
    if memochat:
        return None, None
    if gold is not None:
        return "gold", None
    if not is_unanswerable:
        return None, SKIP_NO_REFERENCE
    if unanswerable == "skip":
        return None, SKIP_UNANSWERABLE
    return "not_mentioned", None


def _asked(probe: dict[str, Any], questions: dict[str, str]) -> str:
    """The probe's question as its qa item words it (`questions`: qa id -> question), else its request."""
    qa_id = probe.get("qa_id")
    return probe["request"] if qa_id is None else questions.get(qa_id, probe["request"])


def judge_call(judge: str, probe: dict[str, Any], response: str, questions: dict[str, str], turns: Rows,
               memochat: bool, explain: bool, memochat_dates: bool = True) -> tuple[Any, tuple[str, ...], str | None]:
    """(the judge's call, the fields it fills, the history source) for one probe's response."""
    gold = probe["gold"]
    if judge == longmemeval.JUDGE:
        # An unanswerable question without a reference is an abstention question explained by
        # "not mentioned"; an `_abs` question's reference is its explanation.
        kind = longmemeval.prompt_kind(probe["category"], bool(probe.get("abstention")) or gold is None)
        reference = gold if gold is not None else answers.NOT_MENTIONED
        question = _asked(probe, questions)
        return longmemeval.judge_call(kind, question, reference, response), ("score", "judge_prompt", "reason"), None
    if judge == locomo_plus.JUDGE:
        # No question shown: the release's prompts have none; cognitive items are judged on their cue.
        evidence = locomo_plus.evidence_text(evidence_ids(probe.get("evidence")), turns)
        return (locomo_plus.judge_call(locomo_plus.prompt_kind(probe["category"]), response, gold or "", evidence),
                ("score", "judge_prompt", "reason"), None)
    if judge == answers.LOCOMO_J:
        question = _asked(probe, questions)
        expected = gold if gold is not None else f"{answers.NOT_MENTIONED} {answers.UNANSWERABLE_NOTE}"
        return answers.locomo_j_call(question, expected, response), ("score", "reason"), None
    if memochat:
        history, source = related_history(probe, turns, memochat_dates)
        return answers.memochat_call(history, probe["request"], response), ("score", "reason"), source
    return (answers.answer_call(judge, probe["request"], gold, response, explain=explain,
                                false_premise=probe.get("false_premise")), ("score", "reason"), None)


class JudgeAnswersStage(JudgeStage[JudgeAnswersSettings]):
    name = section = "judge_answers"
    outputs = {"answer_judgments": ANSWER_JUDGMENTS}
    module_prompts = {**answers.PROMPTS, **longmemeval.PROMPTS, **locomo_plus.PROMPTS, **mab.PROMPTS, **beam.PROMPTS,
                      **halumem.PROMPTS}

    async def process_episode(self, ctx: StageContext[JudgeAnswersSettings], episode_id: str,
                              inputs: dict[str, Rows]) -> dict[str, Rows]:
        settings = ctx.settings
        if not settings.enabled:
            return {"answer_judgments": []}
        episode = inputs["ingest.episodes"][0]
        turns = inputs["ingest.turns"]
        questions = {q["qa_id"]: q["question"] for q in inputs.get("ingest.qa", [])}  # bare, without a date line
        # MemoryAgentBench: a LongMemEval question's type or a summary's key points (its loader's JUDGE_NOTES);
        # BEAM: a question's rubric, one nugget each
        notes = {q["qa_id"]: list(q.get(JUDGE_NOTES) or []) for q in inputs.get("ingest.qa", [])}
        responses = self.responses(inputs)
        probes = sample([p for p in inputs["probes.probes"] if p["kind"] in settings.kinds],
                        settings.max_probes_per_episode, settings.seed, episode_id)
        stamp = self.stamp(ctx, episode)
        params = self.params(settings)

        async def one(probe: dict[str, Any], method: str, judge: PanelJudge, key: str) -> Rows:
            """The rows of one (probe, method, judge) under answer key `key`: one per judge run (F1: one)."""
            row = {**stamp, "probe_id": probe["probe_id"], "kind": probe["kind"], "category": probe["category"],
                   "answer_key": key,
                   "method": method, "judge": judge.name, "judge_kind": judge.prompt, "run": 0, "score": None,
                   "reason": None, "reference_source": None, "history_source": None, "skipped": None,
                   "judge_prompt": None, "abstention": probe.get("abstention"), "accepted": None, **NO_FAILURE,
                   "judge_model": None if judge.prompt == F1 else ctx.role(judge.role).cfg.model}
            runs = [{**row, "run": r} for r in range(1 if judge.prompt == F1 else settings.runs)]
            rows = await rows_or_failed(runs, judged(probe, method, judge, row, runs),
                                        f"{self.name} {judge.name} on {method}'s answer to {probe['probe_id']}")
            return [{**r, "accepted": accepted(r["score"], judge.prompt, judge.accept_at)} for r in rows]

        async def judged(probe: dict[str, Any], method: str, judge: PanelJudge, row: dict[str, Any],
                         runs: Rows) -> Rows:
            memochat = judge.prompt == "gpt4score" and settings.gpt4score_mode == "memochat"
            task = mab.judged_task(episode["dataset"], probe["category"]) if judge.prompt == mab.JUDGE else None
            if judge.prompt == mab.JUDGE and task is None:
                not_ours = mab.SKIP_OTHER_TASK if episode["dataset"] == mab.DATASET else mab.SKIP_OTHER_DATASET
                return [{**r, "skipped": not_ours} for r in runs]
            if judge.prompt == halumem.JUDGE and (not_halumem := halumem.skip_reason(episode["dataset"])):
                return [{**r, "skipped": not_halumem} for r in runs]
            if judge.prompt == beam.JUDGE:  # against the question's rubric; no reference answer is shown
                rubric = notes.get(probe.get("qa_id") or "", [])
                not_judged = beam.skip_reason(episode["dataset"], probe["category"], rubric)
                if not_judged is not None:
                    return [{**r, "skipped": not_judged} for r in runs]
                resp = responses[method].get(probe["probe_id"])
                if resp is None or resp["error"] is not None:
                    return [{**r, "error": f"no response from {method}"} for r in runs]
                outcomes = await beam.judge_runs(ctx.role(judge.role), probe["category"], rubric, resp["response"],
                                                 settings.runs, settings.run_requests, **params)
                return sampled_rows([{**r, "reference_source": beam.RUBRIC} for r in runs],
                                    ("score", "judge_prompt", "reason", "skipped"), outcomes)
            # LoCoMo-Plus's cognitive items have no reference: its judge reads their cue instead
            cue = judge.prompt == locomo_plus.JUDGE and str(probe["category"]) == locomo_plus.COGNITIVE
            reference_source, skipped = reference_or_skip(probe, memochat or cue, settings.unanswerable)
            if skipped is not None:
                return [{**r, "skipped": skipped} for r in runs]
            row["reference_source"] = reference_source
            resp = responses[method].get(probe["probe_id"])
            if resp is None or resp["error"] is not None:
                return [{**r, "error": f"no response from {method}"} for r in runs]
            if judge.prompt == F1:
                score = f1_score(episode["dataset"], probe["category"], resp["response"], probe["gold"])
                return [{**r, "score": score, "skipped": SKIP_NO_REFERENCE if score is None else None} for r in runs]
            noted = notes.get(probe.get("qa_id") or "", [])
            if task == mab.SUMMARY_TASK:
                summaries = await mab.judge_summary_runs(ctx.role(judge.role), resp["response"], noted,
                                                         probe["gold"], settings.runs, settings.run_requests, **params)
                return sampled_rows([{**row, "run": r} for r in range(settings.runs)],
                                    ("score", "judge_prompt", "reason", "skipped"), summaries)
            if judge.prompt == halumem.JUDGE:  # the evidence memory points are the QA row's judge notes
                reference = probe["gold"] if probe["gold"] is not None else answers.NOT_MENTIONED
                call = halumem.judge_call(_asked(probe, questions), reference, noted, resp["response"])
                judgments = await call.runs(ctx.role(judge.role), settings.runs, settings.run_requests,
                                            **{**params, **halumem.HALUMEM_SAMPLING})
                return sampled_rows([{**row, "run": r} for r in range(settings.runs)],
                                    ("score", "judge_prompt", "reason"), judgments)
            if task == mab.LONGMEMEVAL_TASK:  # LongMemEval's judge, its prompt by the question's type
                kind = longmemeval.prompt_kind(mab.question_type(noted), bool(probe.get("abstention")))
                call = longmemeval.judge_call(kind, _asked(probe, questions), probe["gold"] or "", resp["response"])
                judgments = await call.runs(ctx.role(judge.role), settings.runs, settings.run_requests, **params)
                return sampled_rows([{**row, "run": r} for r in range(settings.runs)],
                                    ("score", "judge_prompt", "reason"), judgments)
            shown = {**probe, "category": shown_category(episode["dataset"], probe["category"], judge.prompt)}
            call, fields, row["history_source"] = judge_call(judge.prompt, shown, resp["response"], questions,
                                                             turns, memochat, settings.explain,
                                                             settings.memochat_dates)
            run_params = {**params, "max_tokens": settings.memochat_max_tokens} if memochat else params
            judgments = await call.runs(ctx.role(judge.role), settings.runs, settings.run_requests, **run_params)
            return sampled_rows([{**row, "run": r} for r in range(settings.runs)], fields, judgments)

        # TeaFarm's questions get TeaFarm's own judge (not a panel prompt: built, not validated).
        teafarm = [PanelJudge.model_construct(name="teafarm", prompt="teafarm",  # type: ignore[arg-type]
                                              role=JUDGE_ROLE, accept_at=0.5)]
        key = ctx.cfg.corpus.answer_key
        keyed = [(p, key) for p in probes] + [({**p, "gold": p["gold_original"]}, "original") for p in probes
                                               if key != "original" and p.get("gold_original") is not None]
        jobs = [costed_to(m, one(p, m, j, k)) for p, k in keyed for m in self.methods
                for j in (teafarm if p["kind"] == "teafarm" else settings.judges())]
        return {"answer_judgments": [r for rows in await asyncio.gather(*jobs) for r in rows]}

    def llm_roles(self, cfg: Any) -> tuple[str, ...]:
        """The judge role, and every role the panel calls."""
        own = super().llm_roles(cfg)
        return (*own, *(r for r in panel_roles(self.settings_of(cfg).panel or []) if r not in own))

    def shard_stats(self, produced: dict[str, Rows]) -> dict[str, Any]:
        rows = produced["answer_judgments"]
        return {"judgments": len(rows), "failed_judgments": sum(r["error"] is not None for r in rows),
                "skipped_judgments": sum(r["skipped"] is not None for r in rows)}
