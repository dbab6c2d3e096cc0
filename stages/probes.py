"""probes: the test points every method answers.

- next_response: in sessions >= from_session, each turn of the agent speaker, given the history
  and the current session up to the turn before it (MSC / CC style evaluation);
- qa: each dataset question, asked after the full history (LoCoMo, Long-MT-Bench+).
Sampling is seeded per episode, so the same config always yields the same probes.
"""

from __future__ import annotations

import random
from typing import Any

from pipeline.schemas import PROBES
from pipeline.stage import EpisodeStage, Rows, StageContext
from stages.common import sessions_of


def next_response_probes(episode: dict[str, Any], sessions: dict[int, Rows], cfg: Any) -> Rows:
    speakers = episode["speakers"]
    agent = speakers[min(cfg.agent_speaker, len(speakers) - 1)]
    probes: Rows = []
    for s, turns in sessions.items():
        if s < cfg.from_session:
            continue
        for i in range(1, len(turns)):
            if turns[i]["speaker"] != agent:
                continue
            probes.append({
                "episode_id": episode["episode_id"], "probe_id": f"nr:{s}:{turns[i]['turn_idx']}",
                "kind": "next_response", "session_idx": s, "turn_idx": turns[i]["turn_idx"],
                "respondent": agent, "request": turns[i - 1]["text"], "gold": turns[i]["text"],
            })
    return probes


def qa_probes(episode: dict[str, Any], qa: Rows) -> Rows:
    return [
        {
            "episode_id": episode["episode_id"], "probe_id": f"qa:{q['qa_id']}", "kind": "qa",
            "session_idx": episode["n_sessions"] + 1, "turn_idx": None,
            "respondent": episode["speakers"][-1], "request": q["question"], "gold": q["answer"],
            "qa_id": q["qa_id"], "evidence": q["evidence"], "category": q["category"],
        }
        for q in qa
    ]


def sample(rows: Rows, n: int | None, seed: int, episode_id: str) -> Rows:
    if n is None or len(rows) <= n:
        return rows
    picked = sorted(random.Random(f"{seed}:{episode_id}").sample(range(len(rows)), n))
    return [rows[i] for i in picked]


class ProbesStage(EpisodeStage):
    name = "probes"
    inputs = ("ingest",)
    outputs = {"probes": PROBES}
    section = "probes"

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict[str, Rows]) -> dict[str, Rows]:
        cfg = ctx.section
        episode = inputs["episodes"][0]
        rows: Rows = []
        if cfg.next_response:
            rows += sample(next_response_probes(episode, sessions_of(inputs["turns"]), cfg), cfg.max_per_episode, cfg.seed, episode_id)
        if cfg.qa:
            rows += sample(qa_probes(episode, inputs["qa"]), cfg.max_qa_per_episode, cfg.seed, episode_id)
        return {"probes": rows}
