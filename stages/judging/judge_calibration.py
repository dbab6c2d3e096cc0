"""judge_calibration: every answer judge of the run judges answers whose verdict is known by
construction (stages/judging/calibration.py), so that a reader knows each judge's false-accept and
false-reject rates on the benchmark at hand before trusting its scores (issue 63).

The judges are the run's answer judges, named as the answer tables name them
(`judge_answers.judges()`: the panel, else GPT4Score and `correctness`), with their prompts, roles,
`runs` and `run_requests`: each constructed answer is judged `runs` times and its verdict is the
majority of its runs (the mean of its scores, as the report averages an item's runs); LoCoMo's F1
once, accepted at its `accept_at`; GPT4Score (0-100), which gives no verdict in the panel's
agreement, accepts here at `judges.calibration.gpt4score_accept_at` (50 unless set: ours). The
paraphrases come from the LLM role `judges.calibration.paraphraser`, which no panel judge may use
(a judge that wrote the paraphrase would grade its own words).

In the graph when `judges.calibration.enabled`, and always under `mempipe judges calibrate`, which
runs ingest and this stage only. Tables: `calibration` (one row per judge and kind) and
`calibration_items` (one row per question, kind and judge: the answer built, or why the kind was
skipped, and the judge's verdict). A judge's exception on one answer is that row's failure.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, field_validator

from pipeline.config import Section
from pipeline.errors import ConfigError
from pipeline.failures import FAILURE_FIELDS, NO_FAILURE, guarded, row_failure
from pipeline.hashing import prompt_fingerprint
from pipeline.engine.stage import GlobalStage, StageContext
from stages.judging import answers, calibration, longmemeval
from stages.judging.base import JUDGE_ROLE, judge_params
from stages.judging.calibration import KINDS, Kind
from stages.judging.judge_answers import JudgeAnswersSettings, JudgeAnswersStage, judge_call
from stages.judging.panel import F1, PanelJudge, accepted, f1_score, panel_roles, shown_category

PARAPHRASER_ROLE = "paraphraser"

CALIBRATION = pa.schema(
    [
        pa.field("judge", pa.string(), nullable=False),  # as the answer tables name it
        pa.field("judge_kind", pa.string()),  # its prompt, or f1
        pa.field("judge_model", pa.string()),
        pa.field("kind", pa.string(), nullable=False),  # the construction (stages/judging/calibration.py)
        pa.field("expected", pa.string(), nullable=False),  # accept | reject
        pa.field("n", pa.int64(), nullable=False),  # answers of this kind the judge gave a verdict on
        pa.field("skipped", pa.int64(), nullable=False),  # questions the kind did not apply to (or paraphrases not kept)
        pa.field("failed", pa.int64(), nullable=False),  # answers built but not judged (a failed call)
        # reject kinds: the share the judge accepted, with its 95% Wilson interval; null for accept kinds
        pa.field("false_accept_rate", pa.float64()),
        pa.field("false_accept_low", pa.float64()),
        pa.field("false_accept_high", pa.float64()),
        # accept kinds: the share the judge rejected, with its 95% Wilson interval; null for reject kinds
        pa.field("false_reject_rate", pa.float64()),
        pa.field("false_reject_low", pa.float64()),
        pa.field("false_reject_high", pa.float64()),
        pa.field("flagged", pa.bool_(), nullable=False),  # false accepts above judges.calibration.max_false_accept
    ]
)

CALIBRATION_ITEMS = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("dataset", pa.string()),
        pa.field("qa_id", pa.string(), nullable=False),
        pa.field("category", pa.string()),
        pa.field("question", pa.string()),
        pa.field("gold", pa.string()),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("expected", pa.string(), nullable=False),
        pa.field("answer", pa.string()),  # the constructed answer; null when skipped
        pa.field("change", pa.string()),  # what the construction changed ("8 May 2023 -> 9 May 2023")
        # paraphrase only: the rule it had to pass (keeps_content), whether it held, and the
        # paraphraser's own check that both mean the same; kept only when both say yes
        pa.field("rule", pa.string()),
        pa.field("rule_ok", pa.bool_()),
        pa.field("verified", pa.bool_()),
        pa.field("paraphraser_model", pa.string()),
        pa.field("skipped", pa.string()),  # why this kind was not built for the question; null: built
        pa.field("judge", pa.string(), nullable=False),
        pa.field("judge_kind", pa.string()),
        pa.field("runs", pa.int32()),  # judge runs behind the verdict (judge_answers.runs; F1: 1)
        pa.field("score", pa.float64()),  # mean over the runs that answered (GPT4Score 0-100, F1, else 0/1)
        pa.field("accepted", pa.bool_()),  # the verdict; null when skipped or failed
        pa.field("reason", pa.string()),  # the first run's reason
        pa.field("judge_prompt", pa.string()),  # longmemeval: the prompt its question type chose
        pa.field("judge_model", pa.string()),
        pa.field("prompt_fingerprint", pa.string(), nullable=False),
        *FAILURE_FIELDS,
    ]
)


class CalibrationSettings(Section):
    enabled: bool = False  # in the graph of `mempipe run` (always under `mempipe judges calibrate`)
    max_false_accept: float = Field(default=0.2, ge=0, le=1)  # a judge above this on a kind is flagged
    max_items: int | None = Field(default=200, ge=1)  # questions drawn (seeded) from the corpus; None: all
    seed: int = 0
    kinds: list[Kind] = Field(default_factory=lambda: list(KINDS))
    paraphraser: str = Field(default=PARAPHRASER_ROLE, pattern=r"^[A-Za-z0-9_.-]+$")  # the LLM role that paraphrases
    paraphrase_max_tokens: int = Field(default=200, ge=16)
    gpt4score_accept_at: float = Field(default=50, ge=0, le=100)  # GPT4Score accepts at or above (ours)

    @field_validator("kinds")
    @classmethod
    def _some_kinds(cls, kinds: list[str]) -> list[str]:
        if not kinds or len(set(kinds)) != len(kinds):
            raise ValueError(f"kinds must be distinct and not empty (got {kinds})")
        return kinds


class JudgesSettings(Section):
    """`judges:`: what concerns every judge of the run (today: their calibration)."""

    calibration: CalibrationSettings = Field(default_factory=CalibrationSettings)

    def declared_roles(self) -> set[str]:
        """The paraphraser's role, so that `roles.<role>` may configure it."""
        return {self.calibration.paraphraser}


def paraphraser_role(cfg: Any) -> str:
    """The paraphraser's role, after checking that no answer judge uses it (ConfigError)."""
    role = cfg.judges.calibration.paraphraser
    used = {j.role for j in cfg.judge_answers.judges() if j.prompt != F1}
    if role in used:
        raise ConfigError(f"judges.calibration.paraphraser: role {role!r} is an answer judge's role; the "
                          f"paraphraser must be a role of its own (judges use: {', '.join(sorted(used))})")
    return role


def probe_of(qa: dict[str, Any], dataset: str, judge: PanelJudge) -> dict[str, Any]:
    """A question as judge_answers' `judge_call` reads a probe: after the whole conversation (MemoChat's
    judge then reads the evidence turns, else every turn); LongMemEval's judge on LoCoMo picks its
    per-type prompt through the panel's stated map."""
    return {"gold": qa["answer"], "category": shown_category(dataset, qa.get("category"), judge.prompt), "abstention": False, "request": qa["question"],
            "qa_id": qa["qa_id"], "evidence": qa.get("evidence"), "session_idx": 10 ** 9, "turn_idx": None,
            "false_premise": None}


class JudgeCalibrationStage(GlobalStage[JudgesSettings]):
    name = "judge_calibration"
    section = "judges"
    inputs = ("ingest",)
    outputs = {"calibration": CALIBRATION, "calibration_items": CALIBRATION_ITEMS}
    roles = (JUDGE_ROLE, PARAPHRASER_ROLE)
    prompts = {**calibration.PROMPTS, **answers.PROMPTS, **longmemeval.PROMPTS}

    def selected_by(self, cfg: Any, present: set[str]) -> str | None:
        if cfg.judges.calibration.enabled:
            return "calibrates the answer judges on answers whose verdict is known (judges.calibration.enabled)"
        return None

    def llm_roles(self, cfg: Any) -> tuple[str, ...]:
        """Every role the answer judges call, and the paraphraser's when paraphrases are built."""
        own = panel_roles(cfg.judge_answers.judges())
        writer = paraphraser_role(cfg)
        return (*own, writer) if "paraphrase" in cfg.judges.calibration.kinds else tuple(own)

    def check_inputs(self, cfg: Any) -> None:
        paraphraser_role(cfg)

    def extra_fingerprint(self, cfg: Any) -> dict[str, Any]:
        """What the verdicts depend on in `judge_answers`: its judges and how they are asked."""
        ja: JudgeAnswersSettings = cfg.judge_answers
        return {"judges": [j.model_dump() for j in ja.judges()],
                **ja.model_dump(include={"runs", "run_requests", "explain", "temperature", "max_tokens",
                                         "gpt4score_mode", "memochat_max_tokens", "memochat_dates"})}

    async def run(self, ctx: StageContext[JudgesSettings], inputs: dict[str, pa.Table]) -> dict[str, pa.Table]:
        settings = ctx.settings.calibration
        questions = calibration.draw(inputs["ingest.qa"].to_pylist(), settings.max_items, settings.seed)
        wanted = pa.array(sorted({q["episode_id"] for q in questions}), pa.string())
        episodes = {e["episode_id"]: e for e in inputs["ingest.episodes"].filter(
            pc.is_in(inputs["ingest.episodes"]["episode_id"], wanted)).to_pylist()}
        turns: dict[str, list[dict[str, Any]]] = {}
        for t in inputs["ingest.turns"].filter(pc.is_in(inputs["ingest.turns"]["episode_id"], wanted)).to_pylist():
            turns.setdefault(t["episode_id"], []).append(t)
        pools = {e: calibration.conversation_names(turns.get(e, []), episodes[e].get("speakers") or [])
                 for e in episodes}
        stamp = prompt_fingerprint(self.prompts)
        items = await asyncio.gather(*(self.question(ctx, q, episodes[q["episode_id"]], turns.get(q["episode_id"], []),
                                                     pools[q["episode_id"]], stamp) for q in questions))
        rows = [r for rs in items for r in rs]
        summary = calibration.summarize(rows, settings.max_false_accept)
        return {"calibration": pa.Table.from_pylist(summary, CALIBRATION),
                "calibration_items": pa.Table.from_pylist(rows, CALIBRATION_ITEMS)}

    async def question(self, ctx: StageContext[JudgesSettings], qa: dict[str, Any], episode: dict[str, Any],
                       turns: list[dict[str, Any]], pool: list[str], stamp: str) -> list[dict[str, Any]]:
        """The rows of one question: each kind built (the paraphrase by the LLM), then judged by every judge."""
        settings = ctx.settings.calibration
        judges = JudgeAnswersStage().settings_of(ctx.cfg).judges()
        base = {"episode_id": qa["episode_id"], "dataset": episode.get("dataset"), "qa_id": qa["qa_id"],
                "category": qa.get("category"), "question": qa["question"], "gold": qa.get("answer"),
                "rule": None, "rule_ok": None, "verified": None, "paraphraser_model": None,
                "prompt_fingerprint": stamp}

        async def kind_rows(kind: str) -> list[dict[str, Any]]:
            try:
                built = calibration.construct(qa, kind, settings.seed, pool)
            except Exception as e:  # noqa: BLE001 - a construction that raises fails its rows, not the stage
                failed = row_failure(e, f"{self.name} building {kind} of {qa['qa_id']}")
                row = {**base, "kind": kind, "expected": calibration.expected_of(kind), "answer": None,
                       "change": None, "skipped": None}
                return [self.blank(row, j, failed) for j in judges]
            row = {**base, "kind": kind, "expected": built.expected, "answer": built.answer, "change": built.change,
                   "skipped": built.skipped}
            if kind == "paraphrase" and built.skipped is None:
                extra, failed = await guarded(self.paraphrase(ctx, qa), f"{self.name} paraphrase of {qa['qa_id']}")
                row.update(extra or {})
                if extra is None:
                    return [self.blank(row, j, failed) for j in judges]
            if row["skipped"] is not None:
                return [self.blank(row, j, NO_FAILURE) for j in judges]
            return list(await asyncio.gather(*(self.judged(ctx, row, qa, j, turns) for j in judges)))

        parts = await asyncio.gather(*(kind_rows(k) for k in settings.kinds))
        return [r for rows in parts for r in rows]

    @staticmethod
    def blank(row: dict[str, Any], judge: PanelJudge, failed: dict[str, Any]) -> dict[str, Any]:
        return {**row, "judge": judge.name, "judge_kind": judge.prompt, "runs": None, "score": None, "accepted": None,
                "reason": None, "judge_prompt": None, "judge_model": None, **failed}

    async def paraphrase(self, ctx: StageContext[JudgesSettings], qa: dict[str, Any]) -> dict[str, Any]:
        """The paraphrase and its two checks: the paraphraser asked again whether both mean the same,
        and the rule; `skipped` says why one not kept was not."""
        settings = ctx.settings.calibration
        llm = ctx.role(settings.paraphraser)
        gold = str(qa["answer"]).strip()
        written = await llm.chat(calibration.paraphrase_messages(qa["question"], gold), schema=calibration.Paraphrase,
                                 max_tokens=settings.paraphrase_max_tokens)
        text = written.parsed.paraphrase.strip()
        checked = await llm.chat(calibration.same_meaning_messages(qa["question"], gold, text),
                                 schema=calibration.SameMeaning, max_tokens=32)
        rule_ok, kept, why = calibration.paraphrase_verdict(gold, text, checked.parsed.same)
        return {"answer": text, "rule": calibration.RULE, "rule_ok": rule_ok, "verified": checked.parsed.same,
                "paraphraser_model": written.model or llm.cfg.model, "skipped": None if kept else why}

    async def judged(self, ctx: StageContext[JudgesSettings], row: dict[str, Any], qa: dict[str, Any],
                     judge: PanelJudge, turns: list[dict[str, Any]]) -> dict[str, Any]:
        out = self.blank(row, judge, NO_FAILURE)
        fields, failed = await guarded(self.verdict(ctx, row, qa, judge, turns),
                                       f"{self.name} {judge.name} on {row['kind']} of {qa['qa_id']}")
        return {**out, **failed, **(fields or {})}

    async def verdict(self, ctx: StageContext[JudgesSettings], row: dict[str, Any], qa: dict[str, Any],
                      judge: PanelJudge, turns: list[dict[str, Any]]) -> dict[str, Any]:
        """One judge's verdict on one constructed answer: its runs' mean score and the verdict it gives."""
        settings = ctx.settings.calibration
        ja = JudgeAnswersStage().settings_of(ctx.cfg)
        dataset = row["dataset"] or ""
        if judge.prompt == F1:
            score = f1_score(dataset, qa.get("category"), row["answer"], qa["answer"])
            return {"runs": 1, "score": score, "accepted": accepted(score, F1, judge.accept_at)}
        memochat = judge.prompt == "gpt4score" and ja.gpt4score_mode == "memochat"
        probe = probe_of(qa, dataset, judge)
        call, fields, _ = judge_call(judge.prompt, probe, row["answer"], {qa["qa_id"]: qa["question"]},
                                     turns if memochat else [],
                                     memochat, ja.explain, ja.memochat_dates)
        params = {**judge_params(ja), **({"max_tokens": ja.memochat_max_tokens} if memochat else {})}
        results = await call.runs(ctx.role(judge.role), ja.runs, ja.run_requests, **params)
        answered = [dict(zip((*fields, "model"), r)) for r in results if not isinstance(r, Exception)]
        if not answered:
            raise next(r for r in results if isinstance(r, Exception))
        score = sum(a["score"] for a in answered) / len(answered)
        verdict = score >= settings.gpt4score_accept_at if judge.prompt == "gpt4score" else accepted(score, judge.prompt)
        return {"runs": len(results), "score": score, "accepted": verdict, "reason": answered[0].get("reason"),
                "judge_prompt": answered[0].get("judge_prompt"), "judge_model": answered[0]["model"]}
