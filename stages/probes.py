"""probes: the test points every method answers.

- next_response: in sessions from_session..to_session, each turn i >= 1 of the agent speaker (or,
  with `agent_speaker: all`, of whichever speaker says it, who then responds), given the history
  and the current session up to the turn before it (MSC / CC style evaluation);
- qa: each dataset question, asked after the full history (LoCoMo, Long-MT-Bench+), or right after the
  session its `asked_after_session` names (HaluMem);
- teafarm: each TeaBag question (with `teabag.enabled`), asked at the end of its generated session
  N+1, which the probe carries as `context` since the corpus does not hold it; the speaker who did
  not ask answers, from the memory of sessions 1..N. Its `false_premise` (what the question wrongly
  takes for granted) goes to the judge, so "does not go along with it" can be decided.
Sampling is seeded per episode, so the same config always yields the same probes.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, Literal

import pyarrow as pa
from pydantic import Field, NonNegativeInt

from pipeline.config import Section
from pipeline.engine.stage import EpisodeStage, Rows, StageContext
from stages.dialogue import sessions_of

def probe_view(probe: dict[str, Any], sessions: dict[int, Rows]) -> Rows:
    """The turns of its own session a probe sees, the same for the method that answers it and the
    judge that rates the answer: the turns before its turn; with a null turn (a probe after its
    session's last turn) the whole session, as the memory it may see (`visible_memory`); for a session
    the corpus does not hold (TeaFarm's session N+1) the `context` the probe carries."""
    s, t = probe["session_idx"], probe["turn_idx"]
    if probe.get("context") is not None:
        return [{"episode_id": probe["episode_id"], "session_idx": s, "turn_idx": i, "speaker": c["speaker"],
                 "text": c["text"], "session_time": None, "session_gap_label": None, "source_turn_id": None}
                for i, c in enumerate(probe["context"])]
    turns = sessions.get(s, [])
    return list(turns) if t is None else [turn for turn in turns if turn["turn_idx"] < t]


# The keys every per-(probe, method) score row opens with (judged answers, reference metrics).
PROBE_KEY_FIELDS = [
    pa.field("episode_id", pa.string(), nullable=False),
    pa.field("dataset", pa.string(), nullable=False),
    pa.field("probe_id", pa.string(), nullable=False),
    pa.field("kind", pa.string(), nullable=False),
    pa.field("category", pa.string()),
    pa.field("method", pa.string(), nullable=False),
]

PROBES = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("probe_id", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),  # next_response | qa | teafarm
        pa.field("session_idx", pa.int32(), nullable=False),  # session the probe sits in
        pa.field("turn_idx", pa.int32()),  # the turn to produce (next_response); null for qa
        pa.field("respondent", pa.string(), nullable=False),
        pa.field("request", pa.string(), nullable=False),  # last partner utterance, or the question
        pa.field("gold", pa.string()),  # the real next turn, or the reference answer
        pa.field("qa_id", pa.string()),
        pa.field("evidence", pa.list_(pa.string())),
        pa.field("category", pa.string()),
        # the probe's session up to the turn to produce, when the corpus does not hold it (TeaFarm)
        pa.field("context", pa.list_(pa.struct([pa.field("speaker", pa.string()), pa.field("text", pa.string())]))),
        pa.field("false_premise", pa.string()),  # TeaFarm: what the question wrongly assumes; null otherwise
        pa.field("adversarial_answer", pa.string()),  # LoCoMo category 5: the tempting wrong option
        pa.field("abstention", pa.bool_()),  # the history cannot answer it (LongMemEval "_abs"); null: not said
        # the dataset's own reference where the run's answer key changed it (corpus.answer_key: audited,
        # LoCoMo); null where the gold is the dataset's
        pa.field("gold_original", pa.string()),
    ]
)


class ProbesConfig(Section):
    next_response: bool = True
    from_session: int = Field(default=3, ge=2)  # next-response probes in sessions >= this
    to_session: int | None = Field(default=None, ge=2)  # ... and <= this (Theanine: 3-5); None = the last
    max_per_episode: int | None = Field(default=2, ge=1)  # sampled; None = every agent turn
    # Whose turns are predicted: an index into the episode's speakers, or "all" (every turn i >= 1,
    # answered by the speaker who said it: both sides of the conversation are probed).
    agent_speaker: NonNegativeInt | Literal["all"] = 1
    qa: bool = True
    max_qa_per_episode: int | None = Field(default=2, ge=1)
    seed: int = 0


def next_response_probes(episode: dict[str, Any], sessions: dict[int, Rows], cfg: Any) -> Rows:
    """One probe per predicted turn (turn 0 has no message to answer, so it is never one): the
    respondent is the agent speaker, or with `agent_speaker: all` the speaker of that turn."""
    speakers = episode["speakers"]
    agent = None if cfg.agent_speaker == "all" else speakers[min(cfg.agent_speaker, len(speakers) - 1)]
    probes: Rows = []
    for s, turns in sessions.items():
        if s < cfg.from_session or (cfg.to_session is not None and s > cfg.to_session):
            continue
        for i in range(1, len(turns)):
            respondent = turns[i]["speaker"]
            if agent is not None and respondent != agent:
                continue
            probes.append({
                "episode_id": episode["episode_id"], "probe_id": f"nr:{s}:{turns[i]['turn_idx']}",
                "kind": "next_response", "session_idx": s, "turn_idx": turns[i]["turn_idx"],
                "respondent": respondent, "request": turns[i - 1]["text"], "gold": turns[i]["text"],
            })
    return probes


def qa_probes(episode: dict[str, Any], qa: Rows) -> Rows:
    """One probe per question. A question asked at a known time (LongMemEval's question_date) carries
    that date in its request, so relative questions ("how many days ago") can be answered. It is asked
    after the whole history, or, with `asked_after_session` s (HaluMem), right after session s and before
    session s + 1: at turn 0 of session s + 1, so the method sees sessions 1..s and their memory only."""
    return [
        {
            "episode_id": episode["episode_id"], "probe_id": f"qa:{q['qa_id']}", "kind": "qa",
            **_qa_point(q, episode["n_sessions"]),
            "respondent": episode["speakers"][-1], "request": dated_question(q), "gold": q["answer"],
            "qa_id": q["qa_id"], "evidence": q["evidence"], "category": q["category"],
            "adversarial_answer": q.get("adversarial_answer"), "abstention": q.get("abstention"),
            "gold_original": q.get("gold_original") if q.get("gold_original") != q["answer"] else None,
        }
        for q in qa
    ]


def _qa_point(q: Mapping[str, object], n_sessions: int) -> dict[str, int | None]:
    """Where a question's probe sits: after its `asked_after_session`, else after the last session."""
    after = q.get("asked_after_session")
    if not isinstance(after, int) or after >= n_sessions:
        return {"session_idx": n_sessions + 1, "turn_idx": None}
    return {"session_idx": after + 1, "turn_idx": 0}


def dated_question(q: dict[str, Any]) -> str:
    """The question, after "[Current date: 2023/05/30 (Tue) 23:40]" when it has an `asked_at`."""
    when = q.get("asked_at")
    return q["question"] if when is None else f"[Current date: {when:%Y/%m/%d (%a) %H:%M}] {q['question']}"


def teafarm_probes(questions: Rows, sessions: Rows) -> Rows:
    """One probe per usable TeaBag question: its session N+1 (ending with the question) as context and
    the question's false premise for the judge."""
    probes = []
    for q in questions:
        if q["error"] is not None:
            continue
        turns = sorted((t for t in sessions if t["question_id"] == q["question_id"]), key=lambda t: t["turn_idx"])
        probes.append({
            "episode_id": q["episode_id"], "probe_id": f"tf:{q['question_id']}", "kind": "teafarm",
            "session_idx": q["memory_sessions"] + 1, "turn_idx": len(turns), "respondent": q["answerer"],
            "request": q["question"], "gold": q["answer"], "qa_id": q["question_id"],
            "evidence": [f"session {s}" for s in q["evidence_sessions"] or []],
            "context": [{"speaker": t["speaker"], "text": t["text"]} for t in turns],
            "false_premise": q["false_premise"],
        })
    return probes


def sample(rows: Rows, n: int | None, seed: int, episode_id: str) -> Rows:
    if n is None or len(rows) <= n:
        return rows
    picked = sorted(random.Random(f"{seed}:{episode_id}").sample(range(len(rows)), n))
    return [rows[i] for i in picked]


class ProbesStage(EpisodeStage[ProbesConfig]):
    name = "probes"
    outputs = {"probes": PROBES}
    section = "probes"

    def __init__(self, teafarm: bool = False) -> None:
        self.inputs = ("ingest", "teabag") if teafarm else ("ingest",)

    async def process_episode(self, ctx: StageContext[ProbesConfig], episode_id: str,
                              inputs: dict[str, Rows]) -> dict[str, Rows]:
        cfg = ctx.settings
        episode = inputs["ingest.episodes"][0]
        rows: Rows = []
        if cfg.next_response:
            rows += sample(next_response_probes(episode, sessions_of(inputs["ingest.turns"]), cfg), cfg.max_per_episode, cfg.seed, episode_id)
        if cfg.qa:
            rows += sample(qa_probes(episode, inputs["ingest.qa"]), cfg.max_qa_per_episode, cfg.seed, episode_id)
        if "teabag.questions" in inputs:
            rows += teafarm_probes(inputs["teabag.questions"], inputs["teabag.sessions"])
        return {"probes": rows}
