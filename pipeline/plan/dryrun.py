"""The dry run: the stages to run, and those they need, on the simulated endpoint in a scratch
directory, no model loaded; it counts their calls and prompt tokens."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from pipeline import storage
from pipeline.artifacts import MANIFEST, StageDir, atomic_write_json, read_text
from pipeline.config import RunConfig
from pipeline.errors import PipelineError
from pipeline.manifest import Manifest
from pipeline.plan.configs import SIM_KEY_ENV, _probe_caps, dry_run_config
from pipeline.plan.estimates import DRY_RUN_PROBES, Registry
from pipeline.storage import Location, is_remote, join


@contextlib.contextmanager
def _quiet() -> Iterator[io.StringIO]:
    """The dry run's progress lines stay out of the user's terminal (kept for an error message)."""
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        yield buf


def _link_stage(real_dir: Location, scratch_dir: Path, name: str, fingerprint: str, upstream: dict[str, str]) -> None:
    """A finished stage of the real run, seen in the scratch run as done for its fingerprint there:
    its files linked (copied down from an object store), its manifest re-stamped."""
    src, dst = join(real_dir, name), scratch_dir / name
    dst.mkdir(parents=True)
    if is_remote(src):
        storage.download_dir(src, dst)
    else:
        for entry in Path(src).iterdir():
            if entry.name != MANIFEST:
                (dst / entry.name).symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
    data = json.loads(read_text(join(src, MANIFEST)))
    data.update(fingerprint=fingerprint, upstream=upstream)
    atomic_write_json(dst / MANIFEST, data)


@contextlib.contextmanager
def _no_models() -> Iterator[None]:
    """No model in a dry run: local embeddings and compression are simulated (pipeline.embeddings,
    pipeline.compression), in this process, where the inline executor runs every stage."""
    from pipeline.simulation import models_simulated

    with models_simulated():
        yield


@dataclass
class DryRun:
    manifests: dict[str, Manifest]  # simulated stage -> its dry-run manifest
    embeddings: dict[str, dict[str, float]]  # stage -> {"model", "calls" (texts), "requests", "prompt_tokens"}
    max_tokens: dict[str, float]  # stage -> mean max_tokens of its chat requests
    episodes: int  # episodes the dry run covered
    linked: list[str]  # stages linked from the real run
    seconds: dict[str, float] = field(default_factory=dict)  # stage -> wall seconds of its dry run
    # Per episode: the run's probes / the dry run's, where the dry run sampled probes (else empty)
    probe_factor: dict[str, float] = field(default_factory=dict)
    # stage -> {"texts": embedded, "units": compressed} by the simulated models (stages that used them)
    simulated: dict[str, dict[str, int]] = field(default_factory=dict)


def _probes_per_episode(run_dir: Location) -> dict[str, int]:
    table = StageDir(run_dir, "probes").read_table("probes")
    out: dict[str, int] = {}
    for eid in table.column("episode_id").to_pylist():
        out[eid] = out.get(eid, 0) + 1
    return out


def dry_run(cfg: RunConfig, registry_of: Registry, needed: list[str], reuse: set[str], limits: list[int] | None,
            episodes: int, completion_fraction: float, scratch: Path,
            probe_cap: int | None = DRY_RUN_PROBES) -> DryRun:
    """The stages `needed` on the simulated endpoint in `scratch`, but those in `reuse`: linked from
    the real run. `limits`: episodes per corpus source (None: all); `probe_cap`: see `_probe_caps`."""
    from pipeline.compression import simulated_units
    from pipeline.embeddings import simulated_texts
    from pipeline.plan.simulated import SimulatedEndpoint
    from pipeline.engine.runner import Runner

    os.environ.setdefault(SIM_KEY_ENV, "simulated-no-key")
    with _no_models(), SimulatedEndpoint(completion_fraction=completion_fraction) as sim:
        dcfg = dry_run_config(cfg, sim.base_url, scratch, needed, limits, probe_cap)
        runner = Runner(dcfg, dict(registry_of(dcfg)))
        fps = runner.fingerprints()
        for name in reuse:
            stage = runner.registry[name]
            _link_stage(cfg.run_dir, Path(dcfg.run_dir), name, fps[name], {i: fps[i] for i in stage.inputs})
        # Probes sampled: the run's own probes are made first (cheap, no LLM) and counted, then the
        # capped ones the stages after read; those stages are scaled back by their ratio per episode.
        sample_probes = "probes" in needed and "probes" not in reuse and bool(_probe_caps(cfg, probe_cap))
        full_probes: dict[str, int] = {}
        dry = DryRun({}, {}, {}, episodes, sorted(reuse))
        for stage in runner.plan:
            if stage.name in reuse:
                continue
            sim.stage = stage.name
            started = time.perf_counter()
            before = (simulated_texts(), simulated_units())
            with _quiet() as out:
                try:
                    if stage.name == "probes" and sample_probes:
                        full = dry_run_config(cfg, sim.base_url, scratch, needed, limits, None)
                        Runner(full, dict(registry_of(full))).run(only=["probes"])
                        full_probes = _probes_per_episode(dcfg.run_dir)
                    runner.run(only=[stage.name])
                except Exception as e:
                    raise PipelineError(f"plan: the dry run of stage {stage.name!r} failed: {e}\n{out.getvalue()[-2000:]}") from e
            dry.seconds[stage.name] = round(time.perf_counter() - started, 2)
            used = {"texts": simulated_texts() - before[0], "units": simulated_units() - before[1]}
            if any(used.values()):
                dry.simulated[stage.name] = used
            _record(dry, sim, stage.name, dcfg.run_dir)
        if full_probes:
            sampled = _probes_per_episode(dcfg.run_dir)
            dry.probe_factor = {e: n / sampled[e] for e, n in full_probes.items() if sampled.get(e)}
        covered = StageDir(dcfg.run_dir, "ingest").manifest()
        dry.episodes = int(covered.tables.get("episodes", episodes)) if covered is not None else episodes
        return dry


def _record(dry: DryRun, sim: Any, name: str, run_dir: Location) -> None:
    """What the simulated endpoint saw of stage `name`: its manifest, embedding texts and requests,
    and the mean max_tokens of its chat requests."""
    m = StageDir(run_dir, name).manifest()
    if m is not None:
        dry.manifests[name] = m
    for (kind, model), c in sim.stage_counts(name).items():
        if kind == "embeddings":
            e = dry.embeddings.setdefault(name, {"model": model, "calls": 0.0, "requests": 0.0, "prompt_tokens": 0.0})
            e["calls"] += c["texts"]
            e["requests"] += c["requests"]
            e["prompt_tokens"] += c["prompt_tokens"]
    chat = [c for (kind, _), c in sim.stage_counts(name).items() if kind == "chat"]
    if chat:
        dry.max_tokens[name] = sum(c["max_tokens"] for c in chat) / max(sum(c["requests"] for c in chat), 1)
