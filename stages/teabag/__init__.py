"""teabag: TeaFarm's counterfactual questions and the sessions that lead to them (Theanine Sec. 5,
App. B-C), per episode.

(1) each past session 1..N is summarised by the shared session-memory prompt under the `memory`
role (the calls the memory methods make, so a run pays for them once); (2) the summaries go to the
`teabag` role in session order; (3) it writes `questions_per_episode` counterfactual questions, the
two speakers asking in turn and the other one answering, each with its answer and evidence
sessions; our check (on by default, off in the paper-faithful config) regenerates rejected ones,
keeping every reject with its reason; (4)-(5) a new session N+1 per question leads to it and ends
with it. `probes` turns each question into a TeaFarm probe, every method answers it from sessions
1..N plus that session, and `judge_answers` grades it (step 6). Every generated row carries the
model, prompt fingerprint and seed that made it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pyarrow as pa
from pydantic import Field

from pipeline.config import Section
from pipeline.hashing import prompt_fingerprint
from pipeline.stage import EpisodeStage, Rows, StageContext
from pipeline.failures import FAILURE_FIELDS, NO_FAILURE, attempt
from stages.methods.dialogue import sessions_of
from stages.methods.session_memories import SUMMARY_SYSTEM, session_time, summarize_session
from stages.teabag import generate
from stages.teabag.generate import Summary

GENERATOR_ROLE = "teabag"
SUMMARY_ROLE = "memory"  # the session-memory role of the memory methods: same calls, one payment

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
    max_memories: int = Field(default=10, ge=1)  # per session summary; match the memory methods to share calls
    counterfactual_check: bool = True  # ours; the paper-faithful config turns it off
    max_attempts: int = Field(default=3, ge=1)  # tries per question when the check rejects
    session_turns: int = Field(default=8, ge=2)  # about this many turns before the question
    style_turns: int = Field(default=6, ge=0)  # turns of the last session shown as the speakers' style
    max_tokens: int | None = Field(default=None, ge=16)  # None keeps the role's


def fingerprint() -> str:
    """The prompts every TeaBag item was made with (summary prompt included)."""
    return prompt_fingerprint({**generate.PROMPTS, "summary.system": SUMMARY_SYSTEM})


class TeabagStage(EpisodeStage):
    name = section = "teabag"
    settings = TeabagConfig
    inputs = ("ingest",)
    outputs = {"summaries": SUMMARIES, "questions": QUESTIONS, "rejects": REJECTS, "sessions": SESSIONS}
    roles = (GENERATOR_ROLE, SUMMARY_ROLE)
    prompts = dict(generate.PROMPTS)

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict[str, Rows]) -> dict[str, Rows]:
        cfg: TeabagConfig = ctx.section
        episode = inputs["ingest.episodes"][0]
        sessions = sessions_of(inputs["ingest.turns"])
        n = cfg.sessions or max(sessions, default=0)
        past = {s: t for s, t in sessions.items() if s <= n and t}
        speakers = list(dict.fromkeys(episode["speakers"]))[:2]
        empty: dict[str, Rows] = {k: [] for k in self.outputs}
        if len(past) < cfg.min_sessions or len(speakers) < 2:
            return empty
        n = max(past)
        gen, summ = ctx.role(GENERATOR_ROLE), ctx.role(SUMMARY_ROLE)
        fp = fingerprint()

        def stamp(llm: Any, sample: int = 0) -> dict[str, Any]:
            seed = llm.cfg.seed
            return {"model": llm.cfg.model, "prompt_fingerprint": fp, "seed": None if seed is None else seed + sample}

        async def summarize(s: int, turns: Rows) -> dict[str, Any]:
            row = {"episode_id": episode_id, "session_idx": s, "session_time": session_time(turns), **stamp(summ),
                   "memories": None}
            memories, failed = await attempt(summarize_session(summ, turns, s, cfg.max_memories))
            return {**row, "memories": memories, **failed}

        summary_rows = list(await asyncio.gather(*(summarize(s, t) for s, t in past.items())))
        failed = [r for r in summary_rows if r["error"]]
        summaries = [Summary(r["session_idx"], r["session_time"], r["memories"] or []) for r in summary_rows]
        params = {"max_tokens": cfg.max_tokens} if cfg.max_tokens else {}
        slots = [(k, speakers[k % 2], speakers[(k + 1) % 2]) for k in range(cfg.questions_per_episode)]
        out = {**empty, "summaries": summary_rows}

        async def slot(k: int, asker: str, answerer: str, avoid: list[str]) -> None:
            qid = f"{episode_id}:tb{k}"
            row: dict[str, Any] = {"episode_id": episode_id, "dataset": episode["dataset"], "question_id": qid,
                                   "question_idx": k, "asker": asker, "answerer": answerer, "memory_sessions": n,
                                   **stamp(gen), **NO_FAILURE}
            if failed:
                out["questions"].append({**row, "error": f"session {failed[0]['session_idx']} summary: {failed[0]['error']}"})
                return
            made, failed_call = await attempt(generate.generate_question(
                gen, summaries, speakers, asker, answerer, avoid=avoid, check=cfg.counterfactual_check,
                max_attempts=cfg.max_attempts, params=params))
            if made is None:
                out["questions"].append({**row, **failed_call})
                return
            out["rejects"] += [{"episode_id": episode_id, "question_id": qid, "attempt": r.attempt, "asker": asker,
                                "question": r.question, "false_premise": r.false_premise, "answer": r.answer,
                                "evidence_sessions": r.evidence_sessions, "reason": r.reason, **stamp(gen, r.attempt)}
                               for r in made.rejects]
            a = made.accepted
            if a is None:
                out["questions"].append({**row, "attempts": len(made.rejects), "checked": False,
                                         "error": f"no counterfactual question after {len(made.rejects)} attempts"})
                return
            avoid.append(a.question)
            row.update(question=a.question, false_premise=a.false_premise, answer=a.answer,
                       evidence_sessions=a.evidence_sessions, attempts=a.attempt + 1, checked=a.accepted,
                       check_reason=a.reason, **stamp(gen, a.attempt))
            turns, failed_call = await attempt(generate.synthesize_session(
                gen, summaries, speakers, asker, a.question, past[n], turns=cfg.session_turns,
                style_turns=cfg.style_turns, params=params))
            if turns is None:
                out["questions"].append({**row, **failed_call, "error": f"session {n + 1}: {failed_call['error']}"})
                return
            out["questions"].append(row)
            out["sessions"] += [{"episode_id": episode_id, "question_id": qid, "session_idx": n + 1, "turn_idx": i,
                                 "speaker": t["speaker"], "text": t["text"], "is_question": i == len(turns) - 1,
                                 **stamp(gen)} for i, t in enumerate(turns)]

        async def asks(speaker: str) -> None:  # one speaker's questions in turn, so they differ
            avoid: list[str] = []
            for k, asker, answerer in slots:
                if asker == speaker:
                    await slot(k, asker, answerer, avoid)

        await asyncio.gather(*(asks(s) for s in speakers))
        for table, key in (("questions", "question_idx"), ("rejects", "attempt"), ("sessions", "turn_idx")):
            out[table].sort(key=lambda r: (r["question_id"], r[key]))
        return out

    def shard_stats(self, produced: dict[str, Rows]) -> dict[str, Any]:
        qs = produced["questions"]
        return {"questions": sum(q["error"] is None for q in qs), "failed_questions": sum(q["error"] is not None for q in qs),
                "rejected_attempts": len(produced["rejects"])}
