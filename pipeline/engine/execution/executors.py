"""Where a stage's shards run: in this process, or as Ray tasks on a local Ray or a cluster.

The runner picks one executor from `ray.executor` when it starts (`make_executor`) and never tests
the string again, as datatrove splits LocalPipelineExecutor from RayPipelineExecutor. Both have one
shape: `session()` holds the backend for the run, `llm_handles(roles)` what the shards' LLM
clients share per role, and `run_shards(...)` runs a stage's pending shards and yields each one's
index and marker (`ShardMarker`) as it finishes; shards that fail do so after the others finished.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import threading
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from pipeline.artifacts import StageDir
from pipeline.config import RunConfig
from pipeline.errors import InputError, PipelineError, RunStopped
from pipeline.engine.execution.cluster import check_cluster_paths, require_visible
from pipeline.engine.execution.embedding_service import EmbeddingServices, node_embedder
from pipeline.engine.execution.llm_workers import LLMWorkers
from pipeline.llm.ledger import Ledger, LedgerBook, RunLedger
from pipeline.manifest import ShardMarker
from pipeline.engine.shard import ShardTask, run_shard
from pipeline.engine.stage import Stage

if TYPE_CHECKING:
    from pipeline.llm.shared import RoleHandles


class Executor(ABC):
    # Whether stages whose inputs are done may run at the same time (the runner's DAG): their shards
    # must share one set of services (endpoint slots, cache, limiter) for the run's caps to hold.
    parallel_stages = False

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg

    @abstractmethod
    def session(self) -> AbstractContextManager[None]:
        """The backend, started for one run and stopped after it."""

    @abstractmethod
    def llm_handles(self, roles: list[str]) -> AbstractContextManager[RoleHandles]:
        """Per LLM role, the cache and rate limiter every shard's client shares ({}: each client
        keeps its own); released when the run ends."""

    @abstractmethod
    def ledger(self, book: LedgerBook) -> AbstractContextManager[RunLedger]:
        """The run's spend ledger (pipeline.llm.ledger) as the shards' clients reach it."""

    @abstractmethod
    def run_shards(self, stage: Stage, tasks: list[ShardTask], handles: RoleHandles,
                   ledger: Ledger | None = None) -> Iterator[tuple[int, ShardMarker]]:
        """Run `tasks` and yield each one's (shard_idx, marker), in the order they finish."""

    def prepare(self, stages: list[Stage]) -> None:
        """Start what `stages` will need (workers, services) while the first stages run; nothing by default."""


class InlineExecutor(Executor):
    """`ray.executor: inline`: shards one after another in this process, without Ray (debugging,
    profiling, a single sequential worker). A stage that embeds loads its own model (no factory)."""

    def session(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def llm_handles(self, roles: list[str]) -> AbstractContextManager[RoleHandles]:
        return contextlib.nullcontext({})  # one process: the clients' own cache and limiter

    def ledger(self, book: LedgerBook) -> AbstractContextManager[RunLedger]:
        return contextlib.nullcontext(RunLedger.local(book))

    def run_shards(self, stage: Stage, tasks: list[ShardTask], handles: RoleHandles,
                   ledger: Ledger | None = None) -> Iterator[tuple[int, ShardMarker]]:
        for t in tasks:
            yield t.shard_idx, ShardMarker.from_json(run_shard(t, self.cfg, handles, ledger))


class RayExecutor(Executor):
    """`ray.executor: ray`: a stage without LLM roles runs one Ray task per shard; an LLM stage's
    shards go to a pool of LLM workers (`LLMWorkers`) that keep requests flowing across shard
    boundaries. A shard whose worker or node is lost runs again. A stage that embeds with a local
    model sends its texts to its node's embedding service (`EmbeddingServices`), which the shards'
    contexts reach through their embedder factory (`node_embedder`)."""

    parallel_stages = True  # every shard's clients share the role's cache, limiter and slots (Ray actors)

    def session(self) -> AbstractContextManager[None]:
        return ray_session(self.cfg)

    def _shards_per_worker(self, stage: Stage) -> int:
        """`ray.llm_shards_per_worker`, or enough shards that their episodes alone could fill the
        stage's `llm.max_concurrency` slots, plus one: a stage whose calls within an episode wait on
        each other (a session-by-session memory) has one request in flight per episode."""
        if self.cfg.ray.llm_shards_per_worker:
            return self.cfg.ray.llm_shards_per_worker
        slots = max(self.cfg.role(r).max_concurrency for r in stage.llm_roles(self.cfg))
        return math.ceil(slots / self.cfg.ray.episodes_per_shard) + 1


    @contextlib.contextmanager
    def llm_handles(self, roles: list[str]) -> Iterator[RoleHandles]:
        if not roles:
            yield {}
            return
        import ray

        from pipeline.llm.shared import SharedLLMHandles

        job = ray.get_runtime_context().get_job_id()
        with contextlib.ExitStack() as stack:
            handles: RoleHandles = {}
            for role in roles:
                handles[role] = SharedLLMHandles.get_or_create(self.cfg.role(role), job)
                # The actors hold the cache file open; two roles may share them (close is idempotent).
                stack.callback(handles[role].close)
            yield handles

    @contextlib.contextmanager
    def ledger(self, book: LedgerBook) -> Iterator[RunLedger]:
        import ray

        ledger = RunLedger.start(book, ray.get_runtime_context().get_job_id())
        try:
            yield ledger
        finally:
            ledger.close()

    def prepare(self, stages: list[Stage]) -> None:
        """The LLM workers start and import the LLM stages' code, and the node's embedding service
        loads its model, while ingest runs: seconds of both cores that the run's first LLM call
        would otherwise wait for (bench/default_job.py)."""
        llm = [s for s in stages if s.llm_roles(self.cfg)]
        if llm:
            LLMWorkers.of(self.cfg).warm(llm)
        if self.cfg.embedding.provider == "local" and any(s.uses_embedder for s in stages):
            # In the background: a stage that embeds waits for it in its own `ensure` (one lock).
            threading.Thread(target=_quietly, args=(EmbeddingServices.ensure, self.cfg), daemon=True).start()

    def run_shards(self, stage: Stage, tasks: list[ShardTask], handles: RoleHandles,
                   ledger: Ledger | None = None) -> Iterator[tuple[int, ShardMarker]]:
        if not tasks:
            return
        import ray

        retries = self.cfg.ray.max_task_retries
        if stage.uses_embedder and self.cfg.embedding.provider == "local":
            EmbeddingServices.ensure(self.cfg)
        llm = bool(stage.llm_roles(self.cfg))
        if llm:
            finished = LLMWorkers.of(self.cfg).run(tasks, self.cfg, handles, ledger, self._shards_per_worker(stage))
        else:
            # A shard whose worker or node dies is run again elsewhere: parts and markers are
            # written atomically. Exceptions are never retried.
            remote = ray.remote(_run_or_explain).options(num_cpus=self.cfg.ray.task_cpus, max_retries=retries,
                                                         retry_exceptions=False)
            finished = _as_finished({remote.remote(t, self.cfg, handles, ledger): t for t in tasks})
        here = ray.get_runtime_context().get_node_id()
        sd = StageDir(self.cfg.run_dir, stage.name)
        failures: list[BaseException] = []
        for task, ref in finished:
            try:
                data = ray.get(ref)
            except Exception as e:  # finish the other shards so a rerun resumes from them
                failures.append(task_error(e, retries))
                continue
            marker = ShardMarker.from_json(data)
            if marker.node and marker.node != here:  # written on another node's view of artifacts_dir
                require_visible(sd.shard_marker(task.shard_idx), marker.node, self.cfg.artifacts_dir)
            yield task.shard_idx, marker
        if failures:
            if llm and any(isinstance(f, WorkerLost) for f in failures):
                LLMWorkers.discard(self.cfg)  # a worker out of restarts: the next LLM stage starts a new pool
            stops = [f for f in failures if isinstance(f, RunStopped)]
            first = stops[0] if stops else failures[0]
            if isinstance(first, (InputError, RunStopped)):
                raise first  # names the file and field, or the budget and spend: the whole story
            raise PipelineError(f"stage {stage.name}: {len(failures)} shard(s) failed: {_explain(first)}")


def _as_finished(refs: dict[Any, ShardTask]) -> Iterator[tuple[ShardTask, Any]]:
    """(task, its result's ref) in the order they finish."""
    import ray

    while refs:
        ready, _ = ray.wait(list(refs), num_returns=1)
        yield refs.pop(ready[0]), ready[0]


def _quietly(start: Callable[[RunConfig], None], cfg: RunConfig) -> None:
    """A head start that failed says nothing: the stage that needs it starts it again and reports."""
    with contextlib.suppress(Exception):
        start(cfg)


def make_executor(cfg: RunConfig) -> Executor:
    """The executor `ray.executor` names."""
    return {"inline": InlineExecutor, "ray": RayExecutor}[cfg.ray.executor](cfg)


def _run_or_explain(task: ShardTask, cfg: RunConfig, handles: RoleHandles,
                    ledger: Ledger | None = None) -> dict[str, Any]:
    """One shard in a Ray task; its marker's JSON also names the node it ran on. (Ray lists the task
    under this function's name; bench/cluster.py looks for it.)"""
    import ray

    stats = run_shard(task, cfg, handles, ledger, embedder_factory=node_embedder)
    stats["node"] = ray.get_runtime_context().get_node_id()
    return stats


class WorkerLost(PipelineError):
    """A shard's worker process or node died more often than `ray.max_task_retries` allows."""


def task_error(e: BaseException, retries: int = 0) -> BaseException:
    """The exception the task raised, unwrapped from Ray's RayTaskError; a lost worker or node (after
    `retries` reruns) becomes a PipelineError saying so."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        return cause
    ray = sys.modules.get("ray")
    if ray is not None and isinstance(e, ray.exceptions.RayError) and not isinstance(e, ray.exceptions.RayTaskError):
        first_line = (str(e).strip().splitlines() or [""])[0]
        return WorkerLost(f"a shard's worker process or node was lost {retries + 1} time(s) "
                             f"(ray.max_task_retries={retries}): {type(e).__name__}: {first_line}; finished "
                             "shards are kept and a rerun resumes")
    return e


def _explain(e: BaseException) -> str:
    return str(e) if isinstance(e, PipelineError) else f"{type(e).__name__}: {e}"


# Model-loading progress bars from every worker drown the stage progress bars.
QUIET_WORKERS = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TQDM_DISABLE": "1",  # e.g. transformers' GGUF conversion bar; workers draw none of their own
    "PYTHONWARNINGS": "ignore::FutureWarning",  # libraries' deprecation notes, printed per worker
}
# glibc gives threads that allocate their own malloc arenas (up to 8 per core) and keeps freed memory
# in each: an LLM worker's threads (event loop, file I/O, HTTP) left it at 1.2 GB. One arena:
# 959 MB (bench/scale_e2e.py at 100 episodes; 2 arenas: 1,032 MB). Arrow and torch allocate their
# large buffers with their own allocators, and the GIL serialises the Python side anyway.
LEAN_WORKERS = {"MALLOC_ARENA_MAX": "1"}


@contextlib.contextmanager
def ray_session(cfg: RunConfig) -> Iterator[None]:
    """Ray for one run: the cluster at ray.address / $RAY_ADDRESS (what `ray job submit` sets for
    its driver), else a new local instance; then the cluster path checks (pipeline.engine.execution.cluster)."""
    import ray

    if ray.is_initialized():
        check_cluster_paths(cfg)
        yield
        return
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": True}
    if address:
        kwargs["address"] = address
    else:
        # "local" always starts a new instance: without it ray.init() would attach to whatever
        # cluster `ray start` last left running on this machine.
        kwargs["address"] = "local"
        kwargs["num_cpus"] = cfg.ray.num_cpus
        # Ray warns, for every new local instance, that it turned on its default (token
        # authentication); that line would sit over the progress lines and say nothing to act on.
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        # Ray keeps idle workers only up to one per CPU and stops the rest after a second; an LLM
        # stage with fractional-CPU tasks would start them again (imports: seconds each) every time.
        cpus = cfg.ray.num_cpus or os.cpu_count() or 1
        kwargs["_system_config"] = {
            "num_workers_soft_limit": math.ceil(cpus / min(cfg.ray.task_cpus, cfg.ray.llm_task_cpus))}
        # Workers must import this checkout (also when not pip-installed).
        paths = [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
        env = {"PYTHONPATH": os.pathsep.join(p for p in paths if p), **QUIET_WORKERS, **LEAN_WORKERS}
        kwargs["runtime_env"] = {"env_vars": env}
    ray.init(**kwargs)
    try:
        check_cluster_paths(cfg)
        yield
    finally:
        ray.shutdown()
