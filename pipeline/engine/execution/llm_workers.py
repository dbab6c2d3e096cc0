"""The Ray executor's LLM workers: async actors that run LLM stages' shards, several at once each,
so that requests keep flowing across shard boundaries (pipeline.engine.execution.executors)."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, ClassVar, Iterator

from pipeline.config import RunConfig
from pipeline.engine.execution.cluster import live_nodes
from pipeline.engine.execution.embedding_service import node_embedder
from pipeline.engine.heap import release_when_grown
from pipeline.engine.shard import ShardTask, run_shard_async

if TYPE_CHECKING:
    from pipeline.engine.stage import Stage
    from pipeline.llm.ledger import Ledger
    from pipeline.llm.shared import RoleHandles


class LLMWorker:
    """A Ray actor (async) that runs several shards of LLM stages at once on one event loop. Their
    clients share the loop's HTTP pool and `llm.max_concurrency` slots per role, so while one
    shard waits on its last replies the next one's requests already fill the slots."""

    async def run(self, task: ShardTask, cfg: RunConfig, handles: RoleHandles,
                  ledger: Ledger | None = None) -> dict[str, Any]:
        import ray

        # A stage that embeds locally uses its node's embedding service (the executor started it).
        stats = await run_shard_async(task, cfg, handles, ledger, embedder_factory=node_embedder)
        stats["node"] = ray.get_runtime_context().get_node_id()
        # The shard's rows are garbage now: after a shard that grew the worker, their pages go back,
        # not kept for its next shards (at 10M tokens a worker that had answered from the bank stayed
        # at 2+ GB: bench/beam_scale.py).
        release_when_grown()
        return stats

    def warm(self, stages: list[Stage]) -> int:
        """Receiving `stages` imported their code (methods, libraries) here; build what every LLM
        shard's first request builds once per process (the HTTP client's TLS context, the cl100k
        encoding that token budgets count in: a second of CPU together), before a shard waits on it."""
        from pipeline.llm.transport import warm_process
        from pipeline.retrieval import count_tokens

        warm_process()
        count_tokens("")
        return len(stages)


class LLMWorkers:
    """A pool of `LLMWorker` actors: one per `ray.llm_task_cpus` of each node's CPUs when the first
    LLM stage starts, kept as long as Ray runs: to the end of a run, and across runs of one
    process on one Ray (a notebook, the tests), so imports and loaded models are paid once. They
    reserve no CPU: a reservation would starve the CPU stages' tasks that run beside the LLM
    stages. A worker that dies restarts and reruns its shards."""

    _pools: ClassVar[dict[tuple, "LLMWorkers"]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()  # stages starting at once (the runner's DAG) share one pool

    @classmethod
    def _key(cls, cfg: RunConfig) -> tuple:
        import ray

        ctx = ray.get_runtime_context()
        # The driver's node id tells one Ray instance from the next (job ids repeat across them).
        return ((ctx.get_job_id(), ctx.get_node_id()), cfg.ray.max_task_retries, cfg.ray.llm_task_cpus)

    @classmethod
    def of(cls, cfg: RunConfig) -> "LLMWorkers":
        """This Ray job's pool for these settings, started on first use (actors end with Ray)."""
        key = cls._key(cfg)
        with cls._lock:
            if key not in cls._pools:
                cls._pools = {k: v for k, v in cls._pools.items() if k[0] == key[0]}  # an earlier Ray's are gone
                cls._pools[key] = cls(cfg)
            return cls._pools[key]

    @classmethod
    def discard(cls, cfg: RunConfig) -> None:
        pool = cls._pools.pop(cls._key(cfg), None)
        if pool is not None:
            pool.stop()

    def __init__(self, cfg: RunConfig) -> None:
        self.retries = cfg.ray.max_task_retries
        self.per_cpu = cfg.ray.llm_task_cpus
        per_node = [[node] * max(1, int(cpus // self.per_cpu)) for node, cpus in live_nodes().items()]
        # Interleaved by node, so that even a few shards spread over the nodes.
        self.nodes = [n for group in itertools.zip_longest(*per_node) for n in group if n is not None]
        self.actors = [self._start(n) for n in self.nodes]

    def _start(self, node: str) -> Any:
        """A worker pinned to `node` (Ray places a CPU-less actor anywhere under a soft affinity);
        one whose process dies restarts there, one whose node is lost is replaced (`_replace`)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # Ray's default for an async actor: up to 1000 calls at once; run() decides how many.
        return ray.remote(LLMWorker).options(
            num_cpus=0, max_restarts=self.retries, max_task_retries=self.retries,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()

    def _replace(self, i: int) -> None:
        """Worker `i` is gone for good (its node, or its restarts): a new one on the live node with
        the fewest workers for its CPUs."""
        live = live_nodes()
        if not live:
            return
        node = min(live, key=lambda n: self.nodes.count(n) * self.per_cpu / live[n])
        self.nodes[i], self.actors[i] = node, self._start(node)

    @staticmethod
    def _worker_lost(ref: Any) -> bool:
        """Did the shard end because its worker is gone (not because the shard raised)?"""
        import ray

        try:
            ray.get(ref, timeout=0)
        # Unschedulable: its node is gone, so the restart its pinning asks for can never happen.
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnschedulableError):
            return True
        except Exception:  # noqa: BLE001 - the shard's own failure: the caller reports it
            return False
        return False

    def run(self, tasks: list[ShardTask], cfg: RunConfig, handles: RoleHandles, ledger: Ledger | None,
            per_worker: int) -> Iterator[tuple[ShardTask, Any]]:
        """Feed the workers, least loaded first, up to `per_worker` shards each, and yield (task,
        result ref) as shards finish; a worker gets its next shard before the driver looks at the
        last one's result. A shard whose worker was lost for good (its node died) goes to a new
        worker, up to `ray.max_task_retries` times; after that its error is yielded."""
        import ray

        queue = deque(tasks)
        load = [0] * len(self.actors)
        reruns: dict[int, int] = {}
        running: dict[Any, tuple[ShardTask, int, Any]] = {}

        def fill() -> None:
            while queue:
                i = min(range(len(load)), key=load.__getitem__)
                if load[i] >= per_worker:
                    return
                task = queue.popleft()
                load[i] += 1
                running[self.actors[i].run.remote(task, cfg, handles, ledger)] = (task, i, self.actors[i])

        fill()
        while running:
            ready, _ = ray.wait(list(running), num_returns=1)
            task, i, actor = running.pop(ready[0])
            load[i] -= 1
            if self._worker_lost(ready[0]) and reruns.get(task.shard_idx, 0) < self.retries:
                reruns[task.shard_idx] = reruns.get(task.shard_idx, 0) + 1
                if self.actors[i] is actor:  # its other shards come back lost too: replace it once
                    self._replace(i)
                queue.appendleft(task)
                fill()
                continue
            fill()
            yield task, ready[0]

    def warm(self, stages: list[Stage]) -> None:
        """Every worker imports `stages`' code now (not awaited: their first shards queue behind it)."""
        for actor in self.actors:
            actor.warm.remote(stages)

    def stop(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
