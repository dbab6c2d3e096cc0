"""A synthetic corpus in the project's sample format, for the throughput, fault, crash and scale
benchmarks (generated on demand, never committed).

    python bench/make_corpus.py OUT.jsonl --episodes 1000 --sessions 5 --turns 10 --questions 4

Deterministic for a given seed; turns draw from a small vocabulary so BM25 and embeddings have
something to rank, and every question's evidence names real turns.
"""

from __future__ import annotations

import argparse
import json
import random
from datetime import datetime, timedelta
from pathlib import Path

WORDS = ("marathon trip job garden sister cello house bike paper recipe concert kitchen visa dog exam "
         "move wedding loan novel piano rain office coffee train boat camera beach studio hospital").split()
ASKS = ("In session {session}, what did {speaker} say about the {topic} (turn {turn})?",
        "What was {speaker}'s remark on the {topic} in turn {turn} of session {session}?",
        "Which words did {speaker} use for the {topic} in session {session}, turn {turn}?",
        "Recall session {session}, turn {turn}: what did {speaker} tell about the {topic}?")
NAMES = ("Ann Bob Cara Dev Eli Fay Gus Hana Ivo Jun Kai Lea Mo Nia Oto Pia Raj Sol Tao Uma Vic Wen").split()


def episode(i: int, sessions: int, turns: int, questions: int, rng: random.Random) -> dict:
    a, b = rng.sample(NAMES, 2)
    start = datetime(2024, 1, 1) + timedelta(days=rng.randrange(300))
    out_sessions = []
    for s in range(sessions):
        lines = [{"speaker": (a, b)[t % 2],
                  "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 16))) + "."} for t in range(turns)]
        out_sessions.append({"time": (start + timedelta(days=14 * s)).isoformat(), "gap": None, "turns": lines})
    # Every question of an episode is worded differently, so none sends the same request as
    # another (identical requests are shared, and a benchmark would count fewer calls than rows).
    turn_ids = [(s, t) for s in range(sessions) for t in range(turns)]
    if questions > len(turn_ids) * len(ASKS):
        raise ValueError(f"at most {len(turn_ids) * len(ASKS)} distinct questions for {sessions} sessions "
                         f"x {turns} turns; asked for {questions}")
    rng.shuffle(turn_ids)
    qa = []
    for q in range(questions):
        s, t = turn_ids[q % len(turn_ids)]
        turn = out_sessions[s]["turns"][t]
        ask = ASKS[q // len(turn_ids)].format(speaker=turn["speaker"], topic=turn["text"].split()[0],
                                              session=s + 1, turn=t + 1)
        qa.append({"qa_id": f"syn-{i:06d}-q{q}", "question": ask, "answer": turn["text"],
                   "evidence": [f"D{s + 1}:{t + 1}"], "category": "single-hop"})
    return {"episode_id": f"syn-{i:06d}", "speakers": [a, b], "personas": {a: [], b: []},
            "relationship": "friends", "sessions": out_sessions, "qa": qa}


def write_corpus(path: Path, episodes: int, sessions: int = 5, turns: int = 10, questions: int = 4,
                 seed: int = 0) -> Path:
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i in range(episodes):
            f.write(json.dumps(episode(i, sessions, turns, questions, rng)) + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--episodes", type=int, default=1000)
    ap.add_argument("--sessions", type=int, default=5)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    write_corpus(a.out, a.episodes, a.sessions, a.turns, a.questions, a.seed)
    print(f"wrote {a.episodes} episodes to {a.out}")


if __name__ == "__main__":
    main()
