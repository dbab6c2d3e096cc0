"""The stage runner: plans, fingerprints, skips, executes shards (pipeline.engine.execution), publishes manifests."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from pipeline import __version__
from pipeline.artifacts import StageDir, make_dirs, part_name
from pipeline.config import LLMConfig, RunConfig, local_server_key
from pipeline.errors import PipelineError, RunStopped
from pipeline.engine.execution.executors import make_executor
from pipeline.engine.fingerprint import stage_fingerprints
from pipeline.llm.ledger import Budget, LedgerBook
from pipeline.llm.local_server import LocalLLMServers
from pipeline.llm.usage import Usage
from pipeline.manifest import Manifest, ShardMarker, Timings
from pipeline.engine.progress import StageProgress, end_text, planned_calls
from pipeline.schemas import EPISODES
from pipeline.engine.selection import Selection
from pipeline.engine.shard import ShardTask, add_stats
from pipeline.engine.spend import load_spend, save_spend
from pipeline.storage import is_remote, local_scratch
from pipeline.engine.stage import EpisodeStage, GlobalStage, Stage

log = logging.getLogger("mempipe")
_STREAM_LOOK_S = 0.5  # how often the DAG looks for stages that may start streaming from a running one


@dataclass
class StageStatus:
    name: str
    state: str  # done | stale | partial | missing
    fingerprint: str
    manifest: Manifest | None  # the published stage's (counts only when `state` is done)
    shards_done: int = 0
    attempt_rows: int = 0  # partial: rows and failed rows of this attempt's finished shards
    attempt_errors: int = 0
    failed: dict[str, Any] | None = None  # partial: why the latest attempt stopped, if it did


def stage_state(sd: StageDir, fingerprint: str) -> tuple[str, Manifest | None]:
    """A stage's state for `fingerprint`, with its published manifest; `status` shows it and `select`
    runs what is not done, so the two never disagree: done (published with this fingerprint), partial
    (an attempt with it in progress or stopped, its finished shards kept; the older manifest's counts
    are not this attempt's), stale (published with another), missing (never published)."""
    manifest = sd.manifest()
    if manifest is not None and manifest.fingerprint == fingerprint:
        return "done", manifest
    if sd.partial_fingerprint() == fingerprint:
        return "partial", manifest
    return ("stale" if manifest is not None else "missing"), manifest


def _sum_usage(markers: list[ShardMarker]) -> dict[str, Usage] | None:
    """Per-role usage summed over shards: {role: usage}."""
    per_role: dict[str, Usage] = {}
    for m in markers:
        for role, u in (m.llm_usage or {}).items():
            per_role.setdefault(role, Usage()).merge(u)
    return dict(sorted(per_role.items())) or None


def _sum_stats(markers: list[ShardMarker]) -> dict[str, Any]:
    total: dict[str, Any] = {}
    for m in markers:
        add_stats(total, m.extra)
    return total


class Runner:
    """Plans and runs the stages of `registry` (the CLI builds it from the config with
    `stages.registry(cfg)`; the framework itself knows no stage)."""

    def __init__(self, cfg: RunConfig, registry: dict[str, Stage], fail_fast: bool = False) -> None:
        self.cfg = cfg
        self.registry = registry
        self.fail_fast = fail_fast  # --fail-fast: the first failed row stops the run
        self.stopped_stage: str | None = None  # the stage whose attempt stopped this run, if one did
        # Stages whose attempt has opened its stage in progress (an older attempt's stop record
        # cleared): a stage may stream from them (`_run_graph`).
        self._opened: set[str] = set()
        self.run_dir = cfg.run_dir
        self.executor = make_executor(cfg)  # chosen once: inline or Ray
        self.plan = self._plan()
        self._fingerprints: dict[str, str] | None = None
        self._retry_round: dict[str, int] = {}
        self.spend: dict[str, Any] | None = None  # the ledger's last snapshot, once a run used the LLM

    # --- planning ---------------------------------------------------------------------------
    def _plan(self) -> list[Stage]:
        names = self.cfg.stages or list(self.registry)
        unknown = [n for n in names if n not in self.registry]
        if unknown:
            raise PipelineError(f"stages: unknown stage(s) {unknown}; known: {list(self.registry)}")
        order = [n for n in self.registry if n in names]  # registry order is pipeline order
        for n in order:
            missing = [i for i in self.registry[n].inputs if i not in order]
            if missing:
                raise PipelineError(f"stages: {n!r} needs {missing}, which the run's stage list leaves out")
        return [self.registry[n] for n in order]

    def fingerprints(self) -> dict[str, str]:
        if self._fingerprints is None:
            self._fingerprints = stage_fingerprints(self.cfg, self.plan)
        return self._fingerprints

    def downstream(self, names: set[str]) -> set[str]:
        out = set(names)
        for stage in self.plan:  # plan is topologically ordered
            if any(i in out for i in stage.inputs):
                out.add(stage.name)
        return out

    def upstream(self, name: str) -> set[str]:
        """`name` and every stage it needs, directly or not."""
        out, todo = set(), [name]
        while todo:
            n = todo.pop()
            if n not in out:
                out.add(n)
                todo.extend(self.registry[n].inputs)
        return out

    def status(self) -> list[StageStatus]:
        fps = self.fingerprints()
        result = []
        for stage in self.plan:
            sd = StageDir(self.run_dir, stage.name)
            fp = fps[stage.name]
            state, manifest = stage_state(sd, fp)
            status = StageStatus(stage.name, state, fp, manifest)
            if state == "partial":  # this attempt's own counts, never the published stage's
                markers = [ShardMarker.from_json(d) for d in sd.finished_shards().values()]
                status.shards_done = len(markers)
                status.attempt_rows = sum(sum(m.rows.values()) for m in markers)
                status.attempt_errors = sum(m.errors for m in markers)
                status.failed = sd.failed_attempt()
            result.append(status)
        return result

    def failed_rows(self) -> dict[str, int]:
        """Stage -> its failed rows, over the run's finished stages of this config."""
        return {st.name: st.manifest.errors for st in self.status()
                if st.state == "done" and st.manifest is not None and st.manifest.errors}

    # --- selection --------------------------------------------------------------------------
    def select(self, selection: Selection | None = None, **selectors: Any) -> list[tuple[Stage, str]]:
        """The stages `selection` (or the selectors by keyword: only=, from_=, ...) picks, in pipeline
        order, each with why it would run: `new` (no output yet), `stale` (an output of another
        fingerprint), `partial` (an interrupted run of this fingerprint: its finished shards are
        kept), `forced` (--force, --from, --retry-failed), or `done` (up to date: skipped). `run`
        executes exactly the ones not `done`, and `mempipe plan` estimates them, so the two never
        disagree. Reads only: nothing is invalidated here.
        Raises PipelineError for an unknown stage, two exclusive selectors, or a stage to run whose
        input is neither done nor to run."""
        sel = Selection.of(selection, **selectors)
        names = {s.name for s in self.plan}
        for n in sel.named():
            if n not in names:
                raise PipelineError(f"unknown stage {n!r}; this run's stages: {[s.name for s in self.plan]}")
        forced = set(sel.force)
        if sel.only:
            selected = set(sel.only)
        elif sel.rebuilt is not None:
            selected = self.downstream({sel.rebuilt})
            forced |= selected
        elif sel.until:
            selected = self.upstream(sel.until)
        else:
            selected = names
        fps = self.fingerprints()
        out: list[tuple[Stage, str]] = []
        for stage in self.plan:
            if stage.name not in selected:
                continue
            state = stage_state(StageDir(self.run_dir, stage.name), fps[stage.name])[0]
            reason = "forced" if stage.name in forced else "new" if state == "missing" else state
            out.append((stage, reason))
        todo_names = {s.name for s, reason in out if reason != "done"}
        for stage, reason in out:
            if reason == "done":
                continue
            for up in stage.inputs:
                if up not in todo_names and stage_state(StageDir(self.run_dir, up), fps[up])[0] != "done":
                    raise PipelineError(
                        f"stage {stage.name!r} needs {up!r}, which is not done for this config; "
                        f"run it first (--until {stage.name} runs both)"
                    )
        return out

    # --- execution --------------------------------------------------------------------------
    def run(self, selection: Selection | None = None, **selectors: Any) -> dict[str, str]:
        """Run what is not done: what `selection` (or the selectors by keyword: `run(force=[...])`)
        picks, `select`'s answer. Selection says what each selector does; --retry-failed re-asks
        with new sample indexes."""
        sel = Selection.of(selection, **selectors)
        picked = self.select(sel)
        fps = self.fingerprints()
        outcome: dict[str, str] = {}
        todo: list[Stage] = []
        self._retry_round = {}
        for stage, reason in picked:
            sd = StageDir(self.run_dir, stage.name)
            manifest = sd.manifest()
            # A forced rerun of the same config keeps the retry rounds it had (so it replays the
            # same answers from the cache); --retry-failed adds one.
            same = manifest is not None and manifest.fingerprint == fps[stage.name]
            rounds = manifest.retry_round if manifest is not None and same else 0
            self._retry_round[stage.name] = rounds + (stage.name == sel.retry_failed)
            if reason == "done":
                outcome[stage.name] = "skipped"
                continue
            if reason == "forced":
                sd.invalidate()
            todo.append(stage)
        if not todo:
            return outcome
        for stage in todo:
            stage.check_inputs(self.cfg)
        with self._services(todo) as (handles, ledger):
            for name in self._run_graph(todo, fps, handles, ledger):
                outcome[name] = "ran"
        return outcome

    def _run_graph(self, todo: list[Stage], fps: dict[str, str], handles: dict[str, Any],
                   ledger: Any | None) -> Iterator[str]:
        """Run `todo` as the DAG its inputs make, yielding each stage's name as it finishes: every
        stage whose inputs among `todo` have finished starts at once, in a thread of this driver,
        all sharing the run's services (endpoint slots, cache, budget, ledger, progress). When one
        stops, no stage starts after it; the running ones finish (their shards kept, so a rerun
        resumes), then the stop is raised (a `RunStopped` before any other error). The inline
        executor, or `ray.parallel_stages: false`, runs one stage at a time, in pipeline order."""
        if not (self.executor.parallel_stages and self.cfg.ray.parallel_stages) or len(todo) == 1:
            for stage in todo:
                self._attempt(stage, fps[stage.name], handles, ledger)
                yield stage.name
            return
        names = {s.name for s in todo}
        waiting, finished = list(todo), set()
        stops: list[BaseException] = []
        running: dict[Future, Stage] = {}
        pool = ThreadPoolExecutor(max_workers=len(todo), thread_name_prefix="mempipe-stage")
        try:
            while waiting or running:
                while not stops:  # start what can start, then what streams from those
                    now = {s.name: s for s in running.values()}
                    ready = [s for s in waiting if all(i not in names or i in finished or self._streams(now.get(i), s)
                                                       for i in s.inputs)]
                    if not ready:
                        break
                    for stage in ready:
                        waiting.remove(stage)
                        streamed = {i: fps[i] for i in stage.inputs if i in now}
                        running[pool.submit(self._attempt, stage, fps[stage.name], handles, ledger, streamed)] = stage
                if not running:
                    break
                # A stage that streams from a running one may start once that one has opened.
                done, _ = wait(running, timeout=_STREAM_LOOK_S, return_when=FIRST_COMPLETED)
                for future in done:
                    stage = running.pop(future)
                    error = future.exception()
                    if error is None:
                        finished.add(stage.name)
                        yield stage.name
                    else:
                        stops.append(error)
        finally:
            # Ctrl-C or a stop: start nothing more; the backend's shutdown ends what still runs.
            pool.shutdown(wait=not running, cancel_futures=True)
        if stops:
            raise next((e for e in stops if isinstance(e, RunStopped)), stops[0])

    def _streams(self, upstream: Stage | None, stage: Stage) -> bool:
        """Whether `stage` may start while `upstream` (running) is unfinished, each of its shards
        reading the upstream shard of the same episodes as soon as that one is written: both work per
        episode in the same shards, every table upstream writes is per episode, and `stage` runs in
        the LLM workers (a shard that waits there holds no CPU a Ray task of `upstream` needs)."""
        return (upstream is not None and upstream.name in self._opened
                and isinstance(upstream, EpisodeStage) and isinstance(stage, EpisodeStage)
                and upstream.episodes_from == stage.episodes_from and bool(stage.llm_roles(self.cfg))
                and all("episode_id" in schema.names for schema in upstream.outputs.values()))

    def _attempt(self, stage: Stage, fingerprint: str, handles: dict[str, Any], ledger: Any | None,
                 streamed: dict[str, str] | None = None) -> None:
        """Execute one stage (reading `streamed` inputs shard by shard as they finish); when it stops
        before publishing, record why in its stage in progress (what `status` shows), then let the
        stop go on."""
        sd = StageDir(self.run_dir, stage.name)
        try:
            self._execute(stage, fingerprint, handles, ledger, streamed or {})
        except BaseException as e:
            self.stopped_stage = stage.name
            with contextlib.suppress(Exception):
                sd.record_failed_attempt(f"{type(e).__name__}: {e}"[:2000])
            raise

    @contextlib.contextmanager
    def _services(self, todo: list[Stage]) -> Iterator[tuple[dict[str, Any], Any | None]]:
        """The executor's backend (Ray), the embedded model servers of each distinct local model, per
        LLM role what the shards' clients share, and the run's spend ledger (progress, budget);
        yields (role handles, ledger). The ledger's spend is saved to the run directory at the end,
        also when the run stops on the budget or an error."""
        roles = sorted({r for s in todo for r in s.llm_roles(self.cfg)})
        with contextlib.ExitStack() as stack:
            servers = self._local_servers(roles)
            for _, local in servers:
                stack.callback(local.stop)  # also when the backend fails to start
            # The embedded servers load their models while the backend starts (seconds each).
            with ThreadPoolExecutor(max(1, len(servers)), thread_name_prefix="llm-servers") as pool:
                starting = [(role_cfg, pool.submit(local.start)) for role_cfg, local in servers]
                stack.enter_context(self.executor.session())
                for role_cfg, started in starting:
                    # Runtime-only addresses; fingerprints and cache keys use the model file instead.
                    self.cfg.set_local_url(role_cfg, started.result())
                    stack.callback(self.cfg.set_local_url, role_cfg, None)
            # After the servers: a role's shared handles are made from its config with the URL set.
            handles = stack.enter_context(self.executor.llm_handles(roles))
            ledger = None
            if roles:
                ledger = stack.enter_context(self.executor.ledger(LedgerBook(Budget.of(self.cfg),
                                                                             load_spend(self.run_dir))))
                stack.callback(self._keep_spend, ledger)
            self.executor.prepare(todo)
            yield handles, ledger

    def _local_servers(self, roles: list[str]) -> list[tuple[LLMConfig, LocalLLMServers]]:
        """(role config, its `LocalLLMServers`, not started) per distinct embedded set-up of `roles`."""
        # The servers write their logs as local files (for an object-store run, a folder on this machine).
        logs = local_scratch(self.run_dir, "logs") if is_remote(self.run_dir) else Path(self.run_dir) / "_logs"
        found: dict[str, tuple[LLMConfig, LocalLLMServers]] = {}
        for role in roles:
            role_cfg = self.cfg.role(role)
            key = local_server_key(role_cfg)
            if role_cfg.provider == "local" and not role_cfg.base_url and key not in found:
                log_name = "llm-server.log" if not found else f"llm-server-{len(found) + 1}.log"
                found[key] = (role_cfg, LocalLLMServers(role_cfg, log_path=logs / log_name))
        return list(found.values())

    def _keep_spend(self, ledger: Any) -> None:
        """Save the run directory's spend (before the ledger's actor stops) and keep it for the CLI."""
        try:
            self.spend = ledger.snapshot()
        except Exception as e:  # noqa: BLE001 - Ray already gone (interrupted): nothing to read
            log.warning("could not read this run's spend from the ledger: %s", e)
            return
        make_dirs(self.run_dir)
        save_spend(self.run_dir, self.spend)

    def _shards(self, stage: Stage, streamed: dict[str, str] | None = None) -> list[ShardTask]:
        streamed = streamed or {}
        upstream = {name: dict(self.registry[name].outputs) for name in stage.inputs}
        retry = self._retry_round.get(stage.name, 0)
        size = self.cfg.ray.episodes_per_shard
        if isinstance(stage, GlobalStage):
            return [ShardTask(stage, 0, None, str(self.run_dir), upstream, retry, episodes_per_part=size,
                              fail_fast=self.fail_fast)]
        source = StageDir(self.run_dir, stage.episodes_from)
        episodes = source.read_table("episodes", schema=EPISODES).column("episode_id").to_pylist()
        layouts = {name: StageDir(self.run_dir, name).episode_parts() for name in stage.inputs if name not in streamed}
        tasks = []
        for i in range(0, len(episodes), size):
            ids = episodes[i : i + size]
            parts = {name: None if layout is None else sorted({layout[e] for e in ids if e in layout})
                     for name, layout in layouts.items()}
            # A streamed input's shard of the same episodes wrote one part, of the same index.
            parts.update({name: [part_name(i // size)] for name in streamed})
            tasks.append(ShardTask(stage, i // size, ids, str(self.run_dir), upstream, retry, parts, size,
                                   fail_fast=self.fail_fast, streamed=streamed))
        return tasks

    def _execute(self, stage: Stage, fingerprint: str, handles: dict[str, Any], ledger: Any | None = None,
                 streamed: dict[str, str] | None = None) -> None:
        sd = StageDir(self.run_dir, stage.name)
        sd.open_partial(fingerprint)
        sd.clear_failed_attempt()
        self._opened.add(stage.name)
        done = {i: ShardMarker.from_json(data) for i, data in sd.finished_shards().items()}
        shards = self._shards(stage, streamed)
        pending = [t for t in shards if t.shard_idx not in done]
        started = time.time()
        progress = StageProgress(stage.name, len(shards), len(shards) - len(pending),
                                 ledger if stage.llm_roles(self.cfg) else None, planned_calls(self.run_dir, stage.name, fingerprint))
        with progress:
            for idx, marker in self.executor.run_shards(stage, pending, handles, ledger):
                done[idx] = marker
                progress.shard_done()
        markers = [done[i] for i in sorted(done)]
        rows: dict[str, int] = {}
        layout: dict[str, list[str]] = {}
        for m in markers:
            for t, n in m.rows.items():
                rows[t] = rows.get(t, 0) + n
            layout.update(m.parts or {})
        # Shards resumed from an older run did not say where their rows are: readers take every part.
        parts = None if any(m.parts is None for m in markers) else layout
        fps = self.fingerprints()
        manifest = Manifest(
            stage=stage.name,
            fingerprint=fingerprint,
            upstream={i: fps[i] for i in stage.inputs},
            code_version=__version__,
            config_section=stage.section,
            tables=rows,
            rows=sum(rows.values()),
            errors=sum(m.errors for m in markers),
            shards=len(markers),
            parts=parts,
            llm_usage=_sum_usage(markers),
            roles={r: self.cfg.role(r).model for r in stage.llm_roles(self.cfg)},
            retry_round=self._retry_round.get(stage.name, 0),
            timings=Timings(
                finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                started_at=datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="milliseconds"),
                wall_s=round(time.time() - started, 3),
                shard_s=round(sum(m.wall_s for m in markers), 3),
                resumed_shards=len(shards) - len(pending),
                # where the work went on a cluster: counts this invocation's shards only
                shards_per_node=dict(Counter(m.node for m in done.values() if m.node)),
            ),
            stats=_sum_stats(markers),
        )
        sd.publish(manifest)
        progress.finish(end_text(stage.name, manifest.timings.wall_s, manifest.llm_usage, manifest.errors, manifest.rows),
                        notable=any(u.structured_fallbacks or u.structured_invalid
                                    for u in (manifest.llm_usage or {}).values()))
