"""One unit of stage work: a shard of episodes (or the whole input, for a global stage).

This is what a Ray task runs. It reads its slice of the upstream tables, calls the stage,
writes one Parquet part per output table and then a marker; the marker is the completion
record that makes the shard skippable after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import tempfile
import time
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipeline import storage
from pipeline.artifacts import StageDir, atomic_write_json, atomic_write_parquet, exists, part_name
from pipeline.config import RunConfig
from pipeline.errors import PipelineError
from pipeline.failures import fail_fast
from pipeline.manifest import Manifest, ShardMarker
from pipeline.engine.heap import release_free_memory
from pipeline.engine.rows import rows_by_episode, table_rows
from pipeline.engine.stage import PART_STATS, EmbedderFactory, EpisodeStage, GlobalStage, Rows, Stage, StageContext
from pipeline.llm.types import LLMError, ask_samples
from pipeline.llm.usage import costed_to

if TYPE_CHECKING:
    from pipeline.llm.ledger import Ledger
    from pipeline.llm.shared import RoleHandles


@dataclass
class ShardTask:
    stage: Stage  # pickled into the task, so workers need no registry lookup
    shard_idx: int
    episode_ids: list[str] | None  # None for a global stage
    run_dir: str
    upstream: dict[str, dict[str, pa.Schema]]  # finished upstream stage -> its tables
    retry_samples: int = 0  # --retry-failed: new samples for requests whose answers were all invalid
    # upstream stage -> the part files holding this shard's episodes (None: read every part), so a
    # shard opens a few files however many shards the upstream stage had
    upstream_parts: dict[str, list[str] | None] = field(default_factory=dict)
    episodes_per_part: int = 4  # how a global stage splits its per-episode tables into parts
    fail_fast: bool = False  # --fail-fast: a row's exception stops the shard instead of failing the row
    # Upstream stages still running (name -> the fingerprint they run under): this shard waits for
    # their shard of the same episodes (index `shard_idx`) and reads its parts from the stage in
    # progress (the runner's streaming).
    streamed: dict[str, str] = field(default_factory=dict)


def count_errors(table: pa.Table) -> int:
    if "error" not in table.column_names:
        return 0
    return table.num_rows - table.column("error").null_count


def _to_table(rows: Rows, schema: pa.Schema, stage: str, table: str) -> pa.Table:
    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
        raise RuntimeError(f"stage {stage}: rows of table {table!r} do not match its schema: {e}") from e


def _make_clients(cfg: RunConfig, task: ShardTask, handles: RoleHandles, ledger: Ledger | None) -> dict[str, Any]:
    """One client per LLM role of the stage, on the job's shared cache and limiter of that role,
    counting its calls into the run's ledger (progress, budget) when there is one."""
    roles = task.stage.llm_roles(cfg)
    if not roles:
        return {}
    from pipeline.llm.ledger import StageTally
    from pipeline.llm.shared import make_client

    return {role: make_client(cfg.role(role), handles.get(role), section=f"roles.{role}",
                              retry_samples=task.retry_samples,
                              tally=None if ledger is None else StageTally(ledger, task.stage.name, role))
            for role in roles}


# The tasks each running shard started (episodes, and whatever they spawn), so that a shard that
# fails waits for its own stragglers, not for other shards sharing the worker's event loop.
_SHARD_TASKS: contextvars.ContextVar["weakref.WeakSet[asyncio.Future] | None"] = \
    contextvars.ContextVar("mempipe_shard_tasks", default=None)


def _track_shard_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Make the loop file every new task under the shard whose code created it (the creator's
    context is current when the factory runs)."""
    base = loop.get_task_factory()
    if getattr(base, "files_shard_tasks", False):
        return

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future:
        task = base(loop, coro, **kwargs) if base else asyncio.Task(coro, loop=loop, **kwargs)
        owned = _SHARD_TASKS.get()
        if owned is not None:
            owned.add(task)
        return task

    factory.files_shard_tasks = True  # type: ignore[attr-defined]
    loop.set_task_factory(factory)


async def _let_in_flight_calls_land(timeout_s: float = 600.0) -> None:
    """Wait for this shard's other tasks (rows whose siblings failed) before the shard stops: a
    request already sent then lands in the cache, so a rerun never pays for it twice. Each such
    task ends at its next call when the run is out of budget."""
    others = set(_SHARD_TASKS.get() or ()) - {asyncio.current_task()}
    pending = {t for t in others if not t.done()}
    if pending:
        await asyncio.wait(pending, timeout=timeout_s)


async def _close(clients: dict[str, Any]) -> None:
    for c in clients.values():
        await c.aclose()


def add_stats(total: dict[str, Any], more: dict[str, Any]) -> None:
    """Add counts into `total` in place; nested dicts (e.g. counts per episode) merge key by key."""
    for k, v in more.items():
        if isinstance(v, dict):
            add_stats(total.setdefault(k, {}), v)
        else:
            total[k] = total.get(k, 0) + v


class EpisodeUsage:
    """A client seen by one episode: passes every call through and counts that episode's calls and
    tokens, so manifests report LLM use per episode as well as per role."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.counts = {"calls": 0, "cached_calls": 0, "prompt_tokens": 0, "completion_tokens": 0}
        # Seconds its calls took when they were sent (a cached answer brings its first latency), summed
        self.latency_s = 0.0

    async def chat(self, messages: Any, **kwargs: Any) -> Any:
        result = await self.inner.chat(messages, **kwargs)
        self._count(result)
        return result

    async def chat_samples(self, messages: Any, samples: Any, **kwargs: Any) -> list[Any]:
        results = await ask_samples(self.inner, messages, samples, **kwargs)
        for result in results:
            if not isinstance(result, LLMError):
                self._count(result)
        return results

    def _count(self, result: Any) -> None:
        self.counts["calls"] += 1
        self.counts["cached_calls"] += int(result.cached)
        self.counts["prompt_tokens"] += result.prompt_tokens
        self.counts["completion_tokens"] += result.completion_tokens
        self.latency_s += getattr(result, "latency_s", None) or 0.0

    def __getattr__(self, name: str) -> Any:  # cfg, usage, embed, ... of the shared client
        return getattr(self.inner, name)

    @staticmethod
    def total(usages: Any) -> dict[str, int]:
        out: dict[str, int] = {}
        for u in usages:
            add_stats(out, u.counts)
        return out


_STREAM_POLL_S = 0.2


async def wait_for_streamed(run_dir: storage.Location, task: ShardTask) -> None:
    """Wait until every streamed input stage has written its shard of this shard's episodes (its
    marker), or published; a stage that stopped instead ends the wait with an error."""
    for name, fingerprint in task.streamed.items():
        sd = StageDir(run_dir, name)
        marker = sd.shard_marker(task.shard_idx)

        def published() -> bool:
            manifest = sd.manifest()
            return manifest is not None and manifest.fingerprint == fingerprint

        # The marker counts once the stage in progress is this run's (an older run's is cleared first).
        while not (published() or (sd.partial_fingerprint() == fingerprint and exists(marker))):
            if sd.failed_attempt() is not None:  # cleared when its attempt opened: this one stopped
                raise PipelineError(f"stage {task.stage.name}: its input stage {name!r} stopped before writing "
                                    f"shard {task.shard_idx}; rerun to continue")
            await asyncio.sleep(_STREAM_POLL_S)


def upstream_manifests(run_dir: storage.Location, task: ShardTask) -> dict[str, Manifest]:
    """The manifests of the shard's finished input stages (the runner checked they are done; a
    streamed one may still be running, and has none yet), and for a stage that asks
    (`whole_upstream`) those of every stage upstream of them. Read here, beside the upstream tables,
    rather than shipped in the task: a manifest grows with the episodes (parts, per-episode stats)
    and every task's arguments are pickled."""
    out: dict[str, Manifest] = {}
    for name in task.upstream:
        manifest = StageDir(run_dir, name).manifest()
        if manifest is None and name in task.streamed:
            continue
        if manifest is None:
            raise PipelineError(f"stage {task.stage.name}: input stage {name!r} has no manifest under {run_dir}")
        out[name] = manifest
    return in_pipeline_order(with_their_upstream(run_dir, out)) if task.stage.whole_upstream else out


def with_their_upstream(run_dir: storage.Location, given: dict[str, Manifest]) -> dict[str, Manifest]:
    """`given` and the manifests of every stage upstream of them, transitively, each the one that fed
    its reader (the fingerprint the reader recorded; a stage rebuilt since is left out)."""
    found = dict(given)
    todo = [kv for m in given.values() for kv in m.upstream.items()]
    while todo:
        name, fingerprint = todo.pop()
        if name in found:
            continue
        m = StageDir(run_dir, name).manifest()
        if m is not None and m.fingerprint == fingerprint:
            found[name] = m
            todo += m.upstream.items()
    return found


def in_pipeline_order(manifests: dict[str, Manifest]) -> dict[str, Manifest]:
    """The same manifests, each after the stages it read (ties by when they finished)."""
    out: dict[str, Manifest] = {}

    def place(name: str) -> None:
        if name in manifests and name not in out:
            for up in manifests[name].upstream:
                place(up)
            out[name] = manifests[name]

    for name in sorted(manifests, key=lambda n: manifests[n].timings.finished_at):
        place(name)
    return out


def run_shard(task: ShardTask, cfg: RunConfig, handles: RoleHandles, ledger: Ledger | None = None,
              embedder_factory: EmbedderFactory | None = None) -> dict[str, Any]:
    """One shard on an event loop of its own (a Ray task, or the inline executor); its marker's JSON."""
    return asyncio.run(run_shard_async(task, cfg, handles, ledger, embedder_factory))


async def run_shard_async(task: ShardTask, cfg: RunConfig, handles: RoleHandles, ledger: Ledger | None = None,
                          embedder_factory: EmbedderFactory | None = None) -> dict[str, Any]:
    """One shard on the running loop, which may run other shards meanwhile (an LLM worker of the
    Ray executor): reads and writes go to a thread so that their requests keep flowing. Returns the
    marker it wrote, as JSON: a plain dict crosses Ray, and workers add the node they ran on.
    `embedder_factory` is the executor's shared local embedder (`StageContext.embedder_factory`)."""
    started = time.time()
    stage = task.stage
    run_dir = storage.location(task.run_dir)
    sd = StageDir(run_dir, stage.name)
    await wait_for_streamed(run_dir, task)
    manifests = upstream_manifests(run_dir, task)  # before the clients, which `work` closes
    clients = _make_clients(cfg, task, handles, ledger)
    with contextlib.ExitStack() as stack:
        # Side files (Lance banks, JSON, the report's pages) are written by libraries that want a
        # local folder: on an object store, a scratch folder uploaded before the shard's marker.
        out_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mempipe-shard-"))) if sd.remote \
            else Path(sd.partial)
        ctx = StageContext(cfg=cfg, stage=stage, out_dir=out_dir,
                           upstream_dirs={n: storage.join(run_dir, n) for n in task.upstream},
                           upstream_manifests=manifests, clients=clients, embedder_factory=embedder_factory)
        with fail_fast(task.fail_fast):
            marker = await _run_shard_in(ctx, task, sd, inputs_from=run_dir, clients=clients)
        if sd.remote:
            await asyncio.to_thread(storage.upload_dir, out_dir, str(sd.partial))
    marker.wall_s = round(time.time() - started, 3)
    data = marker.to_json()
    await asyncio.to_thread(atomic_write_json, sd.shard_marker(task.shard_idx), data)
    return data


async def _run_shard_in(ctx: StageContext, task: ShardTask, sd: StageDir, inputs_from: storage.Location,
                        clients: dict[str, Any]) -> ShardMarker:
    stage = task.stage
    inputs = await asyncio.to_thread(_read_inputs, inputs_from, task)
    extra_stats: dict[str, Any] = {}
    _track_shard_tasks(asyncio.get_running_loop())
    _SHARD_TASKS.set(weakref.WeakSet())  # this coroutine's context: the tasks it creates are the shard's
    streamed: ShardMarker | None = None
    try:
        if isinstance(stage, GlobalStage) and stage.streams:
            # Made and written part by part in a thread: the stage never holds its whole output.
            streamed = await asyncio.to_thread(_stream_outputs, stage, ctx, sd, task, inputs)
        else:
            produced = await _produce(stage, ctx, task, inputs, clients, extra_stats)
    except Exception:
        await _let_in_flight_calls_land()
        raise
    finally:
        await _close(clients)
    marker = streamed if streamed is not None else await asyncio.to_thread(_write_outputs, stage, sd, task, produced)
    marker.llm_usage = {role: c.usage for role, c in clients.items()} or None
    if streamed is None:  # a streamed stage's counts came with its parts
        marker.extra = extra_stats
    return marker


def _read_inputs(run_dir: storage.Location, task: ShardTask) -> dict[str, pa.Table]:
    """"<stage>.<table>" -> this shard's rows of each upstream table."""
    inputs: dict[str, pa.Table] = {}
    for name, tables in task.upstream.items():
        for table, schema in tables.items():
            parts = task.upstream_parts.get(name) if "episode_id" in schema.names else None
            read = _read_streamed if name in task.streamed else StageDir.read_table
            inputs[f"{name}.{table}"] = read(StageDir(run_dir, name), table, task.episode_ids, schema, parts)
            pa.default_memory_pool().release_unused()  # the scan's read-ahead buffers, freed, back to the system
    return inputs


def _read_streamed(sd: StageDir, table: str, episode_ids: list[str] | None, schema: pa.Schema,
                   parts: list[str] | None) -> pa.Table:
    """A streamed input's rows: from its stage in progress, or once it published (it may, between
    two looks), from the published stage; the part files are the same."""
    for _ in range(5):
        try:
            if sd.manifest() is not None:
                return sd.read_table(table, episode_ids, schema, parts)
            return sd.read_partial_table(table, episode_ids, schema, parts)
        except (OSError, pa.ArrowInvalid):  # published while it was read: look again
            time.sleep(_STREAM_POLL_S)
    raise PipelineError(f"stage {sd.stage}: table {table!r} of parts {parts} could not be read, in progress or published")


async def _produce(stage: Stage, ctx: StageContext, task: ShardTask, inputs: dict[str, pa.Table],
                   clients: dict[str, Any], extra_stats: dict[str, Any]) -> dict[str, Rows] | dict[str, pa.Table]:
    if isinstance(stage, GlobalStage):
        return await stage.run(ctx, inputs)
    assert isinstance(stage, EpisodeStage)
    grouped = {t: rows_by_episode(tbl) for t, tbl in inputs.items()}
    # Tables without an episode_id column (stage-level artifacts) go to every episode whole.
    whole = {t: table_rows(tbl) for t, tbl in inputs.items() if "episode_id" not in tbl.column_names}
    # The rows are what the stage reads from here on: the tables' buffers go back (the vectors' stay,
    # under their numpy views), and Arrow's allocator hands its freed pages to the system. A 10M-token
    # episode's bank held twice, as table and as rows, was ~0.5 GB of a 2 GB worker (bench/beam_scale.py).
    inputs.clear()
    pa.default_memory_pool().release_unused()
    release_free_memory()
    jobs, counters = [], []
    for ep in task.episode_ids or []:
        ep_inputs = {t: whole[t] if t in whole else grouped[t].get(ep, []) for t in grouped}
        counting = {role: EpisodeUsage(c) for role, c in clients.items()}
        counters.append(counting)
        jobs.append(costed_to(stage.billed_method, stage.process_episode(replace(ctx, clients=counting), ep, ep_inputs)))
    results = await asyncio.gather(*jobs)
    merged: dict[str, Rows] = {t: [] for t in stage.outputs}
    for ep, res, counting in zip(task.episode_ids or [], results, counters):
        add_stats(extra_stats, stage.shard_stats(res))
        if counting:
            add_stats(extra_stats, {"llm_per_episode": {ep: EpisodeUsage.total(counting.values())}})
        for t, rows in res.items():
            merged[t].extend(rows)
    return merged


def _write_outputs(stage: Stage, sd: StageDir, task: ShardTask, produced: dict[str, Any]) -> ShardMarker:
    """Each output table as the shard's Parquet part(s); the marker of what was written."""
    marker = ShardMarker(episodes=len(task.episode_ids or []))
    tables: dict[str, pa.Table] = {}
    for table, schema in stage.outputs.items():
        tbl = _conform(stage, table, produced.get(table, []), schema)
        tables[table] = tbl
        marker.rows[table] = tbl.num_rows
        marker.errors += count_errors(tbl)
    if isinstance(stage, GlobalStage):
        marker.parts = _write_global_parts(sd.partial, tables, task.episodes_per_part)
    else:
        for table, tbl in tables.items():
            atomic_write_parquet(storage.join(sd.partial, table, part_name(task.shard_idx)), tbl)
        marker.parts = {part_name(task.shard_idx): list(task.episode_ids or [])}
    return marker


def _conform(stage: Stage, table: str, data: Any, schema: pa.Schema) -> pa.Table:
    tbl = data if isinstance(data, pa.Table) else _to_table(data, schema, stage.name, table)
    return tbl if tbl.schema.equals(schema) else tbl.select(schema.names).cast(schema)


def _stream_outputs(stage: GlobalStage, ctx: StageContext, sd: StageDir, task: ShardTask,
                    inputs: dict[str, pa.Table]) -> ShardMarker:
    """A streaming global stage's parts, each written as `run_parts` yields it: the same files and
    layout `_write_global_parts` makes of the whole output (tables without an `episode_id` column
    are not supported: they would need the whole output in one part)."""
    marker = ShardMarker(rows={t: 0 for t in stage.outputs})
    parts: dict[str, list[str]] = {}
    for table in stage.outputs:
        # A retried attempt (a lost worker, another part size) starts clean: no part of an earlier one is kept.
        sd.drop_partial_table(table)
    size = task.episodes_per_part
    i = -1
    for i, part in enumerate(stage.run_parts(ctx, inputs, size)):
        ids: dict[str, None] = {}  # the part's episodes in order of first appearance, as whole outputs keep
        for table, schema in stage.outputs.items():
            tbl = _conform(stage, table, part.get(table, []), schema)
            if "episode_id" not in tbl.column_names:
                raise RuntimeError(f"stage {stage.name}: streamed table {table!r} has no episode_id column")
            ids.update(dict.fromkeys(tbl.column("episode_id").to_pylist()))
            atomic_write_parquet(storage.join(sd.partial, table, part_name(i)), tbl)
            marker.rows[table] += tbl.num_rows
            marker.errors += count_errors(tbl)
        if len(ids) > size:
            raise RuntimeError(f"stage {stage.name}: part {i} holds {len(ids)} episodes, more than {size}")
        parts[part_name(i)] = list(ids)
        add_stats(marker.extra, part.get(PART_STATS) or {})
    if i < 0:  # no episodes: one empty part, as a whole empty output
        for table, schema in stage.outputs.items():
            atomic_write_parquet(storage.join(sd.partial, table, part_name(0)), schema.empty_table())
        parts[part_name(0)] = []
    marker.parts = parts
    return marker


def _write_global_parts(out_dir: storage.Location, tables: dict[str, pa.Table], episodes_per_part: int) -> dict[str, list[str]]:
    """Write a global stage's tables, those with an `episode_id` split into parts of
    `episodes_per_part` episodes (in order of first appearance), so that the episode shards of a
    later stage each read one small part instead of filtering the whole table. Returns the layout,
    {part name: episode ids}."""
    import numpy as np
    import pyarrow.compute as pc

    order: list[str] = []
    seen: set[str] = set()
    for tbl in tables.values():
        if "episode_id" in tbl.column_names:
            for eid in pc.unique(tbl.column("episode_id").drop_null()).to_pylist():
                if eid not in seen:
                    seen.add(eid)
                    order.append(eid)
    n_parts = max(1, -(-len(order) // episodes_per_part))
    layout = {part_name(i): order[i * episodes_per_part:(i + 1) * episodes_per_part] for i in range(n_parts)}
    for table, tbl in tables.items():
        if "episode_id" not in tbl.column_names or n_parts == 1:
            atomic_write_parquet(storage.join(out_dir, table, part_name(0)), tbl)
            continue
        position = pc.index_in(tbl.column("episode_id"), value_set=pa.array(order, pa.string()))
        part_of = np.asarray(pc.fill_null(position, 0), dtype=np.int64) // episodes_per_part
        rows = np.argsort(part_of, kind="stable")  # rows keep their order within a part
        bounds = np.searchsorted(part_of[rows], np.arange(n_parts + 1))
        for i in range(n_parts):
            atomic_write_parquet(storage.join(out_dir, table, part_name(i)), tbl.take(rows[bounds[i]:bounds[i + 1]]))
    return layout
