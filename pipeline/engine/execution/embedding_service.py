"""One local embedding model per node, shared by every worker on it (Ray executor).

Without it each Ray worker that embeds (the banks tasks, every LLM worker of a method that
retrieves) imports torch and sentence-transformers and loads its own copy of the model: about
600 MB a process before any data, and model calls of a few texts each. The service is an async
actor per node that holds the model (a few copies, one per share of the cores) and the vector
cache, and runs what the node's workers send at once in rounds, one per free copy
(`pipeline.embeddings.aencode`). The
driver starts the services before a stage that embeds; a worker finds its node's by name and
falls back to a model of its own where there is none (a node that joined since).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time
from typing import Any, ClassVar, Sequence

import numpy as np

from pipeline.config import EmbeddingConfig, RunConfig
from pipeline.engine.execution.cluster import live_nodes
from pipeline.engine.heap import release_free_memory

MAX_COPIES = 4  # model copies per node's service
TRIM_EVERY_S = 2.0  # how often the service hands freed heap memory back to the system, at most
# Texts per model call within one request: a huge episode's bank (a 10M-token conversation's ~42,000
# units in one request) is embedded slice by slice, a slice per model copy at once, the heap trimmed
# between slices; whole, it ran on one copy (one core) and the service grew to 3.3 GB over the
# request's 24 minutes (bench/beam_scale.py).
ENCODE_SLICE = 512


class EmbeddingService:
    """A Ray actor (async): `encode` from any worker of the node; the model loads at the first call."""

    def __init__(self, cfg: EmbeddingConfig, cpus: int) -> None:
        self.cfg = cfg
        # A few copies of the model, each on its share of the node's cores: one thread per copy
        # embeds more texts per second than one copy on all of them (MiniLM on 2 cores: 138 vs 108
        # short texts/s), and a copy costs ~100 MB beside the ~500 MB that torch's import takes once.
        self.copies = min(cpus, MAX_COPIES)
        # Read when torch loads (not yet: Ray gives a CPU-less actor one OpenMP thread).
        threads = str(max(1, cpus // self.copies))
        os.environ.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        self._embedder: Any = None
        self._trimmed = time.monotonic()

    @property
    def embedder(self) -> Any:
        if self._embedder is None:
            from pipeline.embeddings import make_embedder

            self._embedder = make_embedder(self.cfg, copies=self.copies)
        return self._embedder

    async def encode(self, texts: list[str]) -> np.ndarray:
        from pipeline.embeddings import aencode

        if len(texts) <= ENCODE_SLICE:
            out = await aencode(self.embedder, texts)
            self._trim_when_due()
            return out
        # As many slices in flight as the model has copies, each in a thread of its own: every copy
        # (core) works on one huge request, and no more than that many slices' activations are alive
        # at once. Not through `aencode`'s rounds, which would merge the waiting slices into one
        # round, run one after another on one copy.
        in_flight = asyncio.Semaphore(self.copies)
        native = getattr(self.embedder, "aencode", None)  # an endpoint's embedder: its own requests

        async def one_slice(start: int) -> np.ndarray:
            part = texts[start:start + ENCODE_SLICE]
            async with in_flight:
                out = await (native(part) if native else asyncio.to_thread(self.embedder.encode, part))
                self._trim_when_due()
                return np.asarray(out, dtype=np.float32)

        return np.concatenate(await asyncio.gather(*(one_slice(s) for s in range(0, len(texts), ENCODE_SLICE))))

    def _trim_when_due(self) -> None:
        if time.monotonic() - self._trimmed > TRIM_EVERY_S:
            # The model's activations come and go in every shape; freed, they stay in the heap
            # (one malloc arena) and the process grew past 1 GB over a long run without this.
            self._trimmed = time.monotonic()
            release_free_memory()

    async def dim(self) -> int:
        import asyncio

        return await asyncio.to_thread(lambda: self.embedder.dim)


class ServiceEmbedder:
    """A worker's side of its node's `EmbeddingService`: the `Embedder` interface, no model here.

    A request of more than `SCATTER_AT` texts (one huge episode's bank) is cut into contiguous parts,
    one per node's service of the job (`peers`, this node's first), and the parts embedded at once:
    one episode's embedding uses every node of a cluster, not only the node its task landed on."""

    def __init__(self, handle: Any, name: str, peers: Sequence[Any] = ()) -> None:
        self.handle = handle
        self.name = name
        self.peers = [handle, *peers]
        self._dim: int | None = None

    @property
    def dim(self) -> int:
        import ray

        if self._dim is None:
            self._dim = int(ray.get(self.handle.dim.remote()))
        return self._dim

    async def aencode(self, texts: Sequence[str]) -> np.ndarray:
        parts = scatter(list(texts), len(self.peers))
        if len(parts) == 1:
            return await self.handle.encode.remote(parts[0])
        done = await asyncio.gather(*(peer.encode.remote(part) for peer, part in zip(self.peers, parts)))
        return np.concatenate([np.asarray(d, dtype=np.float32) for d in done])

    def encode(self, texts: list[str]) -> np.ndarray:
        import ray

        return ray.get(self.handle.encode.remote(list(texts)))


SCATTER_AT = 4 * ENCODE_SLICE  # below this a request stays on its node: shipping it costs more than it saves


def scatter(texts: list[str], services: int) -> list[list[str]]:
    """`texts` in contiguous parts, one per service (as even as can be), or whole when it is small."""
    if services <= 1 or len(texts) < SCATTER_AT:
        return [texts]
    size = -(-len(texts) // services)
    return [texts[i:i + size] for i in range(0, len(texts), size)]


def service_name(job: str, node: str, cfg: EmbeddingConfig) -> str:
    """Per job, node and embedding settings: two runs of one job with other settings get their own."""
    settings = hashlib.sha256(cfg.model_dump_json().encode()).hexdigest()[:12]
    return f"mempipe-embedder-{job}-{node[:16]}-{settings}"


class EmbeddingServices:
    """The driver's services for one job and embedding config, one per live node with CPUs, kept as
    long as the job runs (like the LLM workers: a notebook's second run reuses the loaded models)."""

    _started: ClassVar[dict[str, Any]] = {}  # service name -> actor handle
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def ensure(cls, cfg: RunConfig) -> None:
        """Start the missing services (on the driver, after ray.init), each ready (its name known to
        the cluster) before a shard can look it up."""
        import ray

        job = ray.get_runtime_context().get_job_id()
        retries = cfg.ray.max_task_retries
        with cls._lock:  # stages that embed may start at once (the runner's DAG)
            cls._ensure(cfg, job, retries)

    @classmethod
    def _ensure(cls, cfg: RunConfig, job: str, retries: int) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        for node, node_cpus in live_nodes().items():
            cpus = max(1, int(node_cpus))
            name = service_name(job, node, cfg.embedding)
            if name in cls._started:
                continue
            # Owned by the driver: it ends with the job. Restarts on its node if its process dies;
            # an `encode` is safe to repeat.
            service = ray.remote(EmbeddingService).options(
                name=name, get_if_exists=True, num_cpus=0, max_restarts=retries, max_task_retries=retries,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(cfg.embedding, cpus)
            ray.get(getattr(service, "__ray_ready__").remote())  # Ray's readiness call, not in its type hints
            cls._started[name] = service


def node_embedder(cfg: EmbeddingConfig) -> ServiceEmbedder | None:
    """This node's service as an embedder (the other nodes' services its peers), in a Ray worker
    whose driver started them; else None."""
    try:
        import ray
    except ImportError:  # pragma: no cover - Ray is a dependency; kept for inline runs without it
        return None
    if not ray.is_initialized():
        return None
    ctx = ray.get_runtime_context()
    job, here = ctx.get_job_id(), ctx.get_node_id()
    try:
        handle = ray.get_actor(service_name(job, here, cfg))
    except ValueError:  # none on this node
        return None
    peers = []
    for node in live_nodes():
        if node == here:
            continue
        try:
            peers.append(ray.get_actor(service_name(job, node, cfg)))
        except ValueError:  # a node that joined after the services started
            continue
    return ServiceEmbedder(handle, cfg.model, peers)
