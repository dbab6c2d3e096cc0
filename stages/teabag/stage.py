"""teabag: TeaFarm's counterfactual questions and the sessions that lead to them (Theanine Sec. 5,
App. B-C), per episode.

(1) each past session 1..N is summarised with TeaBag's own summary prompt under the stage's own
`teabag_summary` role (when the config sets no `roles.teabag_summary`, the `teabag` generator's
client), never the memory methods' `memory` role or prompt, so TeaFarm's truth is not the tested
methods' own output; (2) the summaries go to the `teabag` role in session order; (3) it writes
`questions_per_episode` counterfactual questions, the two speakers asking in turn and the other one
answering, each with its answer and evidence sessions; our check (on by default, off in the
paper-faithful config) regenerates rejected ones, keeping every reject with its reason; (4)-(5) a
new session N+1 per question, the speakers in strict turn, leads to it and ends with it; our leak
check (on by default) writes a session again when it gives the truth away, keeping every leaking
one in `session_rejects`. `probes` turns each question into a TeaFarm probe, every method answers it
from sessions 1..N plus that session, and `judge_answers` grades it (step 6). Every generated row
carries the model, prompt fingerprint and seed that made it; the settings and role models the run
used are written beside the tables (`SETTINGS_FILE`) for the dataset card.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pydantic import Field

from pipeline.artifacts import atomic_write_json
from pipeline.config import Section
from pipeline.failures import FAILURE_FIELDS, NO_FAILURE, attempt
from pipeline.hashing import prompt_fingerprint
from pipeline.engine.stage import EpisodeStage, Rows, StageContext
from stages.dialogue import sessions_of
from stages.methods.shared.session_memories import session_time
from stages.teabag import generate
from stages.teabag.generate import Summary

GENERATOR_ROLE = "teabag"
# TeaBag's own summariser: the ground truth must not be the tested methods' own session memories.
SUMMARY_ROLE = "teabag_summary"
SETTINGS_FILE = "teabag_settings.json"  # in the stage folder: what the run was made with

STAMP = [
    pa.field("model", pa.string()),
    pa.field("prompt_fingerprint", pa.string(), nullable=False),
    pa.field("seed", pa.int64()),
]

SUMMARIES = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("session_idx", pa.int32(), nullable=False),
        pa.field("session_time", pa.string()),
        pa.field("memories", pa.list_(pa.string())),
        *STAMP,
        *FAILURE_FIELDS,
    ]
)

QUESTIONS = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("question_id", pa.string(), nullable=False),  # "<episode>:tb<k>"
        pa.field("question_idx", pa.int32(), nullable=False),
        pa.field("asker", pa.string(), nullable=False),
        pa.field("answerer", pa.string(), nullable=False),  # the other speaker, who must answer
        pa.field("question", pa.string()),
        pa.field("false_premise", pa.string()),
        pa.field("answer", pa.string()),
        pa.field("evidence_sessions", pa.list_(pa.int32())),
        pa.field("memory_sessions", pa.int32(), nullable=False),  # sessions 1..N are the past
        pa.field("attempts", pa.int32()),
        pa.field("checked", pa.bool_()),  # passed the counterfactual check; null: check off
        pa.field("check_reason", pa.string()),
        pa.field("session_attempts", pa.int32()),  # sessions N+1 written for it (leaking ones included)
        pa.field("leak_checked", pa.bool_()),  # its session passed the leak check; null: check off
        pa.field("leak_reason", pa.string()),
        *STAMP,
        *FAILURE_FIELDS,  # error set: no usable question or session N+1 (the reason)
    ]
)

REJECTS = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("attempt", pa.int32(), nullable=False),
        pa.field("asker", pa.string(), nullable=False),
        pa.field("question", pa.string()),
        pa.field("false_premise", pa.string()),
        pa.field("answer", pa.string()),
        pa.field("evidence_sessions", pa.list_(pa.int32())),
        pa.field("reason", pa.string()),
        *STAMP,
    ]
)

TURN = pa.struct([pa.field("speaker", pa.string()), pa.field("text", pa.string())])

# Sessions N+1 the leak check rejected: kept, never used.
SESSION_REJECTS = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("attempt", pa.int32(), nullable=False),
        pa.field("asker", pa.string(), nullable=False),
        pa.field("turns", pa.list_(TURN)),  # ending with the question, as a used session does
        pa.field("reason", pa.string()),
        *STAMP,
    ]
)

# Session N+1 of each question: the new episode's last session, ending with the question.
SESSIONS = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("session_idx", pa.int32(), nullable=False),
        pa.field("turn_idx", pa.int32(), nullable=False),
        pa.field("speaker", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("is_question", pa.bool_(), nullable=False),
        *STAMP,
    ]
)


class TeabagConfig(Section):
    enabled: bool = False  # adds the stage and TeaFarm probes to the run
    sessions: int | None = Field(default=5, ge=1)  # past sessions 1..N (paper: 5); None = every session
    min_sessions: int = Field(default=2, ge=1)  # episodes with fewer past sessions get no questions
    questions_per_episode: int = Field(default=2, ge=1)  # the paper: 2 (one per speaker)
    max_memories: int = Field(default=10, ge=1)  # per session summary
    counterfactual_check: bool = True  # ours; the paper-faithful config turns it off
    max_attempts: int = Field(default=3, ge=1)  # tries per question when the check rejects
    session_turns: int = Field(default=8, ge=2)  # about this many turns before the question
    leak_check: bool = True  # ours: reject a session N+1 that gives the truth away
    session_attempts: int = Field(default=3, ge=1)  # sessions written per question when the leak check rejects
    style_turns: int = Field(default=6, ge=0)  # turns of the last session shown as the speakers' style
    max_tokens: int | None = Field(default=None, ge=16)  # None keeps the role's


PROMPTS = generate.PROMPTS


def fingerprint() -> str:
    """The prompts every TeaBag item was made with (the summary prompts included)."""
    return prompt_fingerprint(PROMPTS)


def summary_role(cfg: Any) -> str:
    """The role whose client summarises the past sessions: `teabag_summary` when the config sets it,
    else the `teabag` generator's (a role the config does not set would fall back to `llm`)."""
    return SUMMARY_ROLE if SUMMARY_ROLE in cfg.roles else GENERATOR_ROLE


def _role_record(role: str, llm: Any) -> dict[str, Any]:
    cfg = llm.cfg
    return {"role": role, **{k: getattr(cfg, k, None) for k in ("model", "temperature", "seed", "max_tokens")}}


def recorded_settings(section: TeabagConfig, gen: Any, summ: Any, summ_role: str) -> dict[str, Any]:
    """What the dataset card is rendered from: the section, and the model, temperature and seed of the
    clients that generated and summarised (the checks run on the generator at temperature 0)."""
    generator = _role_record(GENERATOR_ROLE, gen)
    if section.max_tokens:  # the section's limit overrides the role's on the generator's calls only
        generator["max_tokens"] = section.max_tokens
    return {"teabag": section.model_dump(mode="json"), "generator": generator,
            "summariser": _role_record(summ_role, summ), "prompt_fingerprint": fingerprint()}


def _stamp(llm: Any, fp: str, sample: int = 0) -> dict[str, Any]:
    """The STAMP columns of a row `llm` made (its `sample`-th try offsets the seed)."""
    seed = llm.cfg.seed
    return {"model": llm.cfg.model, "prompt_fingerprint": fp, "seed": None if seed is None else seed + sample}


def _record_settings(out_dir: Any, cfg: TeabagConfig, gen: Any, summ: Any, summ_role: str) -> None:
    """Write SETTINGS_FILE into the stage folder; every shard records the same settings, the first write stays."""
    if out_dir is not None:
        path = Path(out_dir) / SETTINGS_FILE
        if not path.exists():
            atomic_write_json(path, recorded_settings(cfg, gen, summ, summ_role))


async def _summaries(summ: Any, fp: str, episode_id: str, past: dict[int, Rows], max_memories: int) -> Rows:
    """One SUMMARIES row per past session (its memories; None and the error when the call failed)."""
    async def summarize(s: int, turns: Rows) -> dict[str, Any]:
        row = {"episode_id": episode_id, "session_idx": s, "session_time": session_time(turns), **_stamp(summ, fp),
               "memories": None}
        memories, failed = await attempt(generate.summarize_session(summ, turns, s, row["session_time"], max_memories))
        return {**row, "memories": memories, **failed}

    return list(await asyncio.gather(*(summarize(s, t) for s, t in past.items())))


@dataclass
class _Questions:
    """One episode's TeaBag questions being made: what its question slots share, and the rows they add
    to `out` (the stage's tables)."""
    cfg: TeabagConfig
    gen: Any
    fp: str
    episode: dict[str, Any]
    speakers: list[str]
    summaries: list[Summary]
    failed: Rows  # the summary rows whose call failed: no question can be made
    last: Rows  # session N's turns (the speakers' style)
    n: int  # sessions 1..N are the past
    out: dict[str, Rows]

    def stamp(self, sample: int = 0) -> dict[str, Any]:
        return _stamp(self.gen, self.fp, sample)

    @property
    def params(self) -> dict[str, Any]:
        return {"max_tokens": self.cfg.max_tokens} if self.cfg.max_tokens else {}

    async def asks(self, speaker: str, slots: list[tuple[int, str, str]]) -> None:
        """One speaker's questions in turn, so they differ."""
        avoid: list[str] = []
        for k, asker, answerer in slots:
            if asker == speaker:
                await self.slot(k, asker, answerer, avoid)

    async def slot(self, k: int, asker: str, answerer: str, avoid: list[str]) -> None:
        """Question k: a counterfactual question `asker` puts to `answerer`, then its session N+1."""
        episode_id = self.episode["episode_id"]
        qid = f"{episode_id}:tb{k}"
        row: dict[str, Any] = {"episode_id": episode_id, "dataset": self.episode["dataset"], "question_id": qid,
                               "question_idx": k, "asker": asker, "answerer": answerer, "memory_sessions": self.n,
                               **self.stamp(), **NO_FAILURE}
        if self.failed:
            failed = self.failed[0]
            self.out["questions"].append({**row, "error": f"session {failed['session_idx']} summary: {failed['error']}"})
            return
        made, failed_call = await attempt(generate.generate_question(
            self.gen, self.summaries, self.speakers, asker, answerer, avoid=avoid,
            review=generate.Review(self.cfg.counterfactual_check, self.cfg.max_attempts), params=self.params))
        if made is None:
            self.out["questions"].append({**row, **failed_call})
            return
        self.out["rejects"] += [{"episode_id": episode_id, "question_id": qid, "attempt": r.attempt, "asker": asker,
                                 "question": r.question, "false_premise": r.false_premise, "answer": r.answer,
                                 "evidence_sessions": r.evidence_sessions, "reason": r.reason,
                                 **self.stamp(r.attempt)} for r in made.rejects]
        a = made.accepted
        if a is None:
            self.out["questions"].append({**row, "attempts": len(made.rejects), "checked": False,
                                          "error": f"no counterfactual question after {len(made.rejects)} attempts"})
            return
        avoid.append(a.question)
        row.update(question=a.question, false_premise=a.false_premise, answer=a.answer,
                   evidence_sessions=a.evidence_sessions, attempts=a.attempt + 1, checked=a.accepted,
                   check_reason=a.reason, **self.stamp(a.attempt))
        await self.session(row, asker, answerer, a)

    async def session(self, row: dict[str, Any], asker: str, answerer: str, a: Any) -> None:
        """Session N+1 of the accepted question `a` (`row`: its QUESTIONS row so far), ending with it."""
        n, qid = self.n, row["question_id"]
        written, failed_call = await attempt(generate.write_session(
            self.gen, generate.SessionBrief(self.summaries, asker, answerer, a, self.last),
            generate.SessionShape(self.cfg.session_turns, self.cfg.style_turns),
            review=generate.Review(self.cfg.leak_check, self.cfg.session_attempts), params=self.params))
        if written is None:
            self.out["questions"].append({**row, **failed_call, "error": f"session {n + 1}: {failed_call['error']}"})
            return
        self.out["session_rejects"] += [{"episode_id": row["episode_id"], "question_id": qid, "attempt": r.attempt,
                                         "asker": asker, "turns": r.turns, "reason": r.reason,
                                         **self.stamp(r.attempt)} for r in written.rejects]
        used = written.accepted
        if used is None:
            last = written.rejects[-1]
            self.out["questions"].append({**row, "session_attempts": len(written.rejects), "leak_checked": False,
                                          "leak_reason": last.reason,
                                          "error": f"session {n + 1} gave the truth away in all "
                                                   f"{len(written.rejects)} attempts"})
            return
        row.update(session_attempts=used.attempt + 1, leak_checked=used.hidden, leak_reason=used.reason)
        self.out["questions"].append(row)
        self.out["sessions"] += [{"episode_id": row["episode_id"], "question_id": qid, "session_idx": n + 1,
                                  "turn_idx": i, "speaker": t["speaker"], "text": t["text"],
                                  "is_question": i == len(used.turns) - 1, **self.stamp(used.attempt)}
                                 for i, t in enumerate(used.turns)]


class TeabagStage(EpisodeStage[TeabagConfig]):
    name = section = "teabag"
    inputs = ("ingest",)
    outputs = {"summaries": SUMMARIES, "questions": QUESTIONS, "rejects": REJECTS, "sessions": SESSIONS,
               "session_rejects": SESSION_REJECTS}
    roles = (GENERATOR_ROLE, SUMMARY_ROLE)
    prompts = PROMPTS

    async def process_episode(self, ctx: StageContext[TeabagConfig], episode_id: str,
                              inputs: dict[str, Rows]) -> dict[str, Rows]:
        cfg = ctx.settings
        summ_role = summary_role(ctx.cfg)
        gen, summ = ctx.role(GENERATOR_ROLE), ctx.role(summ_role)
        _record_settings(ctx.out_dir, cfg, gen, summ, summ_role)
        episode = inputs["ingest.episodes"][0]
        sessions = sessions_of(inputs["ingest.turns"])
        n = cfg.sessions or max(sessions, default=0)
        past = {s: t for s, t in sessions.items() if s <= n and t}
        speakers = list(dict.fromkeys(episode["speakers"]))[:2]
        empty: dict[str, Rows] = {k: [] for k in self.outputs}
        if len(past) < cfg.min_sessions or len(speakers) < 2:
            return empty
        n = max(past)
        fp = fingerprint()
        summary_rows = await _summaries(summ, fp, episode_id, past, cfg.max_memories)
        out = {**empty, "summaries": summary_rows}
        questions = _Questions(cfg, gen, fp, {"episode_id": episode_id, "dataset": episode["dataset"]}, speakers,
                               [Summary(r["session_idx"], r["session_time"], r["memories"] or []) for r in summary_rows],
                               [r for r in summary_rows if r["error"]], past[n], n, out)
        slots = [(k, speakers[k % 2], speakers[(k + 1) % 2]) for k in range(cfg.questions_per_episode)]
        await asyncio.gather(*(questions.asks(s, slots) for s in speakers))
        for table, key in (("questions", "question_idx"), ("rejects", "attempt"), ("sessions", "turn_idx"),
                           ("session_rejects", "attempt")):
            out[table].sort(key=lambda r: (r["question_id"], r[key]))
        return out

    def shard_stats(self, produced: dict[str, Rows]) -> dict[str, Any]:
        qs = produced["questions"]
        return {"questions": sum(q["error"] is None for q in qs), "failed_questions": sum(q["error"] is not None for q in qs),
                "rejected_attempts": len(produced["rejects"]), "leaking_sessions": len(produced["session_rejects"])}
