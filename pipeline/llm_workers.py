"""The Ray executor's LLM workers: async actors that run LLM stages' shards, several at once each,
so that requests keep flowing across shard boundaries (pipeline.executors)."""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any, Iterator

from pipeline.config import RunConfig
from pipeline.shard import ShardTask, run_shard_async


class LLMWorker:
    """A Ray actor (async) that runs several shards of LLM stages at once on one event loop. Their
    clients share the loop's HTTP pool and `llm.max_concurrency` slots per role, so while one
    shard waits on its last replies the next one's requests already fill the slots."""

    async def run(self, task: ShardTask, cfg: RunConfig, handles: dict[str, Any], ledger: Any | None = None) -> dict[str, Any]:
        import ray

        stats = await run_shard_async(task, cfg, handles, ledger)
        stats["node"] = ray.get_runtime_context().get_node_id()
        return stats


class LLMWorkers:
    """The run's pool of `LLMWorker` actors: one per `ray.llm_task_cpus` of each node's CPUs when
    the first LLM stage starts, kept until the run ends (imports and loaded
    models are paid once, not per stage). They reserve no CPU: stages run one at a time, and a
    reservation would starve the CPU stages' tasks between LLM stages. A worker that dies restarts
    and reruns its shards."""

    def __init__(self, cfg: RunConfig) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        retries = cfg.ray.max_task_retries
        actor = ray.remote(LLMWorker)
        # Ray's default for an async actor: up to 1000 calls at once; run() decides how many.
        options = {"num_cpus": 0, "max_restarts": retries, "max_task_retries": retries}
        per_node = []
        for node in ray.nodes():
            cpus = node["Resources"].get("CPU", 0.0) if node["Alive"] else 0.0
            if cpus > 0:
                # Soft: a worker whose node is lost restarts on another one.
                where = NodeAffinitySchedulingStrategy(node["NodeID"], soft=True)
                per_node.append([actor.options(**options, scheduling_strategy=where).remote()
                                 for _ in range(max(1, int(cpus // cfg.ray.llm_task_cpus)))])
        # Interleaved by node, so that even a few shards spread over the nodes.
        self.actors = [a for group in itertools.zip_longest(*per_node) for a in group if a is not None]
        self.cfg = cfg

    def run(self, tasks: list[ShardTask], handles: dict[str, Any], ledger: Any | None,
            per_worker: int) -> Iterator[tuple[ShardTask, Any]]:
        """Feed the workers, least loaded first, up to `per_worker` shards each, and yield (task,
        result ref) as shards finish; a worker gets its next shard before the driver looks at the
        last one's result."""
        import ray

        queue = deque(tasks)
        load = [0] * len(self.actors)
        running: dict[Any, tuple[ShardTask, int]] = {}

        def fill() -> None:
            while queue:
                i = min(range(len(load)), key=load.__getitem__)
                if load[i] >= per_worker:
                    return
                task = queue.popleft()
                load[i] += 1
                running[self.actors[i].run.remote(task, self.cfg, handles, ledger)] = (task, i)

        fill()
        while running:
            ready, _ = ray.wait(list(running), num_returns=1)
            task, i = running.pop(ready[0])
            load[i] -= 1
            fill()
            yield task, ready[0]

    def stop(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
