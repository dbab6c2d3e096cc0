"""The LLM call cache: keys, the diskcache store, and Parquet export / import.

A key is the sha256 of canonical JSON of everything that determines an answer (endpoint identity,
model, messages, sampling params, response schema, sample index) and nothing else: never the API
key. Values are JSON text, so the store holds nothing but what the model said and its token counts.

Only one process should open a cache directory on a multi-node cluster (see `shared.py`); on one
node diskcache is process-safe. Never put the directory on NFS (SQLite locking is unreliable there).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any, Protocol

import diskcache

from pipeline.hashing import canonical_json, sha256

# diskcache defaults to a 1 GB limit with eviction; a call cache must never silently drop answers.
_SIZE_LIMIT = 2**50


class CallCache(Protocol):
    async def get(self, key: str) -> dict[str, Any] | None: ...

    async def set(self, key: str, value: dict[str, Any]) -> None: ...


def make_key(payload: dict[str, Any]) -> str:
    return sha256(canonical_json(payload))


def chat_cache_key(endpoint: str, model: str, messages: list[dict[str, Any]], params: dict[str, Any],
                   response_format: dict[str, Any] | None, sample: int) -> str:
    return make_key({
        "kind": "chat", "endpoint": endpoint, "model": model, "messages": messages,
        "params": params, "response_format": response_format, "sample": sample,
    })


def embed_cache_key(endpoint: str, model: str, text: str) -> str:
    return make_key({"kind": "embed", "endpoint": endpoint, "model": model, "text": text})


def mode_cache_key(endpoint: str, model: str) -> str:
    """Where the structured mode an endpoint accepts is remembered (see LLMClient)."""
    return make_key({"kind": "structured_mode", "endpoint": endpoint, "model": model})


def _kind(value: dict[str, Any]) -> str:
    if "embedding" in value:
        return "embed"
    return "structured_mode" if "structured_mode" in value else "chat"


def _open(directory: str | Path) -> diskcache.Cache:
    return diskcache.Cache(str(directory), size_limit=_SIZE_LIMIT, eviction_policy="none")


class DiskCallCache:
    """diskcache-backed store. The sync methods are used by the cache actor; async ones by clients."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = str(directory)
        self._cache = _open(directory)

    def get_sync(self, key: str) -> dict[str, Any] | None:
        raw = self._cache.get(key)
        return None if raw is None else json.loads(raw)

    def set_sync(self, key: str, value: dict[str, Any]) -> None:
        self._cache.set(key, canonical_json(value))

    def get_many_raw(self, keys: list[str]) -> list[str | None]:
        """Stored JSON texts (None for a miss), in key order; the caller parses them."""
        return [self._cache.get(k) for k in keys]

    def set_many_raw(self, items: list[tuple[str, str]]) -> None:
        """Store (key, JSON text) pairs in one SQLite transaction: one commit for the lot."""
        with self._cache.transact():
            for key, raw in items:
                self._cache.set(key, raw)

    async def get(self, key: str) -> dict[str, Any] | None:
        # SQLite calls block; a thread keeps the event loop serving other in-flight requests.
        return await asyncio.to_thread(self.get_sync, key)

    async def set(self, key: str, value: dict[str, Any]) -> None:
        await asyncio.to_thread(self.set_sync, key, value)

    def close(self) -> None:
        self._cache.close()

    def __repr__(self) -> str:
        return f"DiskCallCache({self.directory!r})"


def cache_stats(directory: str | Path) -> dict[str, Any]:
    """Entries, bytes on disk, and entry counts per model and per kind (chat / embed)."""
    with _open(directory) as cache:
        per_model: Counter[str] = Counter()
        per_kind: Counter[str] = Counter()
        entries = 0
        for key in cache.iterkeys():
            raw = cache.get(key)
            if raw is None:
                continue
            entries += 1
            value = json.loads(raw)
            per_model[value.get("model") or "?"] += 1
            per_kind[_kind(value)] += 1
        return {"entries": entries, "size_bytes": int(cache.volume()), "per_model": dict(per_model),
                "per_kind": dict(per_kind)}


def export_cache(directory: str | Path, out_parquet: str | Path) -> int:
    """Write every entry to Parquet (columns key, value_json); returns the number of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    keys: list[str] = []
    values: list[str] = []
    with _open(directory) as cache:
        for key in cache.iterkeys():
            raw = cache.get(key)
            if raw is not None:
                keys.append(key)
                values.append(raw)
    table = pa.table({"key": pa.array(keys, pa.string()), "value_json": pa.array(values, pa.string())})
    out = Path(out_parquet)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(out)  # atomic: a crash never leaves a half-written export under the final name
    return len(keys)


def import_cache(in_parquet: str | Path, directory: str | Path) -> int:
    """Load an export into a cache directory (existing keys are overwritten); returns rows read."""
    import pyarrow.parquet as pq

    table = pq.read_table(in_parquet, columns=["key", "value_json"])
    n = 0
    with _open(directory) as cache:
        with cache.transact():
            for batch in table.to_batches():
                for key, raw in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
                    json.loads(raw)  # refuse to import something that is not a cache value
                    cache.set(key, raw)
                    n += 1
    return n
