"""Small stages for runner tests: they log every episode they process, so tests can count work."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline.config import RunConfig, Section, compose_config
from pipeline.schemas import EPISODES, TURNS
from pipeline.engine.stage import EpisodeStage, GlobalStage, StageContext

COUNTS = pa.schema([("episode_id", pa.string()), ("n_turns", pa.int64()), ("error", pa.string())])
DOUBLED = pa.schema([("episode_id", pa.string()), ("value", pa.int64())])


def toy_dir() -> Path:
    return Path(os.environ["TOY_DIR"])


def control() -> dict[str, Any]:
    """Per-test behaviour switches; a file, because Ray workers outlive environment changes."""
    path = toy_dir() / "control.json"
    return json.loads(path.read_text()) if path.exists() else {}


def log_work(stage: str, episode: str) -> None:
    path = toy_dir() / "work.log"
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(f"{stage} {episode}\n")


def read_work_log() -> list[str]:
    path = toy_dir() / "work.log"
    return path.read_text().split("\n")[:-1] if path.exists() else []


def log_upstream(ctx: StageContext) -> None:
    """Record the upstream manifests the stage's context carried (one JSON line per episode)."""
    seen = {name: m.to_json() for name, m in ctx.upstream_manifests.items()}
    with (toy_dir() / "upstream.log").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps({"stage": ctx.stage.name, "upstream": seen}) + "\n")


def read_upstream_log() -> list[dict[str, Any]]:
    path = toy_dir() / "upstream.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class ToyIngest(GlobalStage):
    """corpus.path holds the number of episodes; each gets three turns."""

    name = "ingest"
    outputs = {"episodes": EPISODES, "turns": TURNS}
    section = "corpus"

    def extra_fingerprint(self, cfg: Any) -> dict[str, Any]:
        return {"content": Path(cfg.corpus.path).read_text()}

    async def run(self, ctx: StageContext, inputs: dict[str, pa.Table]) -> dict[str, pa.Table]:
        n = int(Path(ctx.cfg.corpus.path).read_text())
        log_work(self.name, "*")
        eps = [
            {"episode_id": f"ep{i:02d}", "dataset": "toy", "speakers": ["A", "B"], "n_sessions": 1, "source_file": "x"}
            for i in range(n)
        ]
        turns = [
            {"episode_id": e["episode_id"], "session_idx": 1, "turn_idx": t, "speaker": "AB"[t % 2], "text": f"t{t}"}
            for e in eps
            for t in range(3)
        ]
        return {"episodes": pa.Table.from_pylist(eps, EPISODES), "turns": pa.Table.from_pylist(turns, TURNS)}


class CountSettings(Section):
    seed: int = 0


class OtherSettings(Section):
    size: list[int] = [1]


class CountTurns(EpisodeStage[CountSettings]):
    name = "count"
    inputs = ("ingest",)
    outputs = {"counts": COUNTS}
    section = "count"

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict) -> dict:
        log_work(self.name, episode_id)
        ctl = control()
        if ctl.get("hang_on") == episode_id:
            time.sleep(600)  # the test kills the driver while this shard hangs
        if ctl.get("raise_on") == episode_id:
            raise RuntimeError(f"toy crash on {episode_id}")  # the shard fails: the attempt stops
        if ctl.get("fail_row") == episode_id:
            return {"counts": [{"episode_id": episode_id, "n_turns": None, "error": "toy failure"}]}
        return {"counts": [{"episode_id": episode_id, "n_turns": len(inputs["ingest.turns"]), "error": None}]}

    def shard_stats(self, produced: dict) -> dict[str, Any]:
        return {"counted": len(produced["counts"])}  # a stage's own count, summed into its manifest


class Double(EpisodeStage):
    name = "double"
    inputs = ("count",)
    outputs = {"doubled": DOUBLED}

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict) -> dict:
        log_work(self.name, episode_id)
        log_upstream(ctx)
        return {"doubled": [{"episode_id": episode_id, "value": 2 * (r["n_turns"] or 0)} for r in inputs["count.counts"]]}


class Unrelated(EpisodeStage[OtherSettings]):
    name = "other"
    inputs = ("ingest",)
    outputs = {"sizes": DOUBLED}
    section = "other"

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict) -> dict:
        log_work(self.name, episode_id)
        return {"sizes": [{"episode_id": episode_id, "value": len(inputs["ingest.turns"])}]}


class WholeUpstream(EpisodeStage):
    """Reads `double` and asks for the manifests of its whole upstream (not in `registry()`: a test adds it)."""

    name = "whole"
    inputs = ("double",)
    outputs = {"seen": DOUBLED}
    whole_upstream = True

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict) -> dict:
        log_upstream(ctx)
        return {"seen": [{"episode_id": episode_id, "value": len(ctx.upstream_manifests)}]}


def registry() -> dict:
    return {s.name: s for s in [ToyIngest(), CountTurns(), Double(), Unrelated()]}


def config_model() -> type[RunConfig]:
    return compose_config({"count": CountSettings, "other": OtherSettings}, {}, [])
