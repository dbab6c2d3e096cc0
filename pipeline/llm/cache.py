"""The LLM call cache: keys, chat values (`Reply`), the diskcache store, and Parquet export / import.

A key is the sha256 of canonical JSON of everything that determines an answer (endpoint identity,
model, messages, sampling params, response schema, sample index) and nothing else: never the API
key. Values are JSON text, so the store holds nothing but what the model said and its token counts.

Only one process should open a cache directory on a multi-node cluster (see `shared.py`); on one
node diskcache is process-safe. Never put the directory on NFS (SQLite locking is unreliable there).

A cache is never trusted blindly: a directory whose database SQLite cannot read (truncated,
garbage) or whose marker names another cache format is set aside (renamed `<dir>.unusable-<time>`,
with one warning naming both paths) and a new one is started; an entry that is not one of our
values is a miss, never an answer; a read that fails mid-run turns the cache off for that process
with one warning, and the run goes on without it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Iterable, Protocol, TypeVar

import diskcache

from pipeline.errors import PipelineError
from pipeline.hashing import canonical_json, sha256

T = TypeVar("T")

log = logging.getLogger(__name__)

# diskcache defaults to a 1 GB limit with eviction; a call cache must never silently drop answers.
_SIZE_LIMIT = 2**50
# The layout of keys and values; a cache written with another is set aside, not read.
CACHE_FORMAT = 1
MARKER = "mempipe-cache.json"
DB_FILE = diskcache.core.DBNAME  # the SQLite file in a cache directory


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
    """Where the structured mode an endpoint accepts is remembered (see pipeline.llm.structured)."""
    return make_key({"kind": "structured_mode", "endpoint": endpoint, "model": model})


def params_cache_key(endpoint: str, model: str) -> str:
    """Where the request parameters an endpoint refused (seed) are remembered (see pipeline.llm.params)."""
    return make_key({"kind": "rejected_params", "endpoint": endpoint, "model": model})


@dataclass
class Reply:
    """One chat request's answer as a client keeps it, and as the cache holds it (`value`)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    model: str
    cached: bool
    cached_prompt_tokens: int = 0  # of prompt_tokens, served from the endpoint's prompt cache
    finish_reason: str | None = None  # the endpoint's ("length": cut at max_tokens); None if not recorded
    # Seconds the request took when it was sent (a cached reply keeps its first latency); None: unknown
    latency_s: float | None = None

    @classmethod
    def from_cache(cls, hit: dict[str, Any], model: str) -> Reply:
        """A cached chat value as a reply (marked cached)."""
        return cls(hit["text"], int(hit.get("prompt_tokens", 0)), int(hit.get("completion_tokens", 0)),
                   hit.get("model") or model, cached=True, cached_prompt_tokens=int(hit.get("cached_prompt_tokens", 0)),
                   finish_reason=hit.get("finish_reason"), latency_s=hit.get("latency_s"))

    def value(self) -> dict[str, Any]:
        value = {"text": self.text, "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                 "model": self.model}
        if self.cached_prompt_tokens:
            value["cached_prompt_tokens"] = self.cached_prompt_tokens
        if self.finish_reason is not None:
            value["finish_reason"] = self.finish_reason
        if self.latency_s is not None:
            value["latency_s"] = round(self.latency_s, 4)
        return value


async def lookup_many(cache: CallCache, keys: list[str]) -> list[dict[str, Any] | None]:
    """Many lookups at once: the cache's own `get_many` where it has one (one thread hop), else
    concurrent `get`s (which a Ray cache proxy coalesces into one actor call)."""
    many = getattr(cache, "get_many", None)
    if many is not None:
        return await many(keys)
    return list(await asyncio.gather(*(cache.get(k) for k in keys)))


async def store_many(cache: CallCache, items: list[tuple[str, dict[str, Any]]]) -> None:
    many = getattr(cache, "set_many", None)
    if many is not None:
        await many(items)
    else:
        await asyncio.gather(*(cache.set(k, v) for k, v in items))


class StaleMisses:
    """Which misses of a client's lookups may be stale. A store answers what it held when it read,
    and that can be before another call of the same client stored the key and stopped being in
    flight (a thread hop, a Ray service's round trip): a caller that took the miss as final would
    send the request again. Keys stored while a lookup was in flight are kept (`in`) until every
    lookup that started before them has answered."""

    def __init__(self) -> None:
        self._stored_at: dict[str, int] = {}  # key -> the clock when stored; in the clock's order
        self._clock = 0
        self._lookups_since: list[int] = []  # the clock when each lookup in flight started

    async def lookup(self, read: Awaitable[T]) -> T:
        started = self._clock
        self._lookups_since.append(started)
        try:
            return await read
        finally:
            # Stored at or before the oldest lookup in flight (this one included) started: no
            # lookup that could have missed them is left.
            oldest = min(self._lookups_since)
            while self._stored_at and next(iter(self._stored_at.values())) <= oldest:
                self._stored_at.pop(next(iter(self._stored_at)))
            self._lookups_since.remove(started)

    def stored(self, keys: Iterable[str]) -> None:
        if not self._lookups_since:
            return  # no lookup in flight read before these
        self._clock += 1
        for key in keys:
            self._stored_at.pop(key, None)  # to the end: the dict stays in the clock's order
            self._stored_at[key] = self._clock

    def __contains__(self, key: str) -> bool:
        return key in self._stored_at


def _kind(value: dict[str, Any]) -> str:
    if "embedding" in value:
        return "embed"
    if "rejected_params" in value:
        return "rejected_params"
    return "structured_mode" if "structured_mode" in value else "chat"


def _open(directory: str | Path) -> diskcache.Cache:
    return diskcache.Cache(str(directory), size_limit=_SIZE_LIMIT, eviction_policy="none")


def _set_aside(directory: Path, why: str) -> Path:
    aside = directory.with_name(f"{directory.name}.unusable-{time.strftime('%Y%m%d-%H%M%S')}")
    directory.rename(aside)
    log.warning("LLM cache %s: %s; moved to %s and starting an empty cache (answers in it are not used)",
                directory, why, aside)
    return aside


class CacheWriteError(PipelineError):
    """The cache cannot store an answer (disk full, read-only): the run stops rather than pay for
    answers it cannot keep."""

    def __init__(self, directory: str, reason: str) -> None:
        self.directory, self.reason = directory, reason
        super().__init__(f"LLM cache {directory}: cannot store answers ({reason}); every answer stored so far "
                         "is kept: free space (or make the folder writable) and run the same command again")

    def __reduce__(self) -> tuple:
        return (type(self), (self.directory, self.reason))


def open_checked(directory: str | Path) -> diskcache.Cache:
    """Open a cache directory for our entries: one of another format or that SQLite cannot read is
    set aside and replaced by an empty one (PipelineError only when even that fails)."""
    path = Path(directory)
    marker = path / MARKER
    if marker.exists():
        try:
            found = json.loads(marker.read_text()).get("format")
        except (OSError, ValueError, AttributeError):
            found = "unreadable"
        if found != CACHE_FORMAT:
            _set_aside(path, f"written in cache format {found!r}, this version reads {CACHE_FORMAT}")
    try:
        cache = _open(path)
        cache.get("\0probe")  # reads a page: a database that is not one fails here, not mid-run
    except (sqlite3.OperationalError, OSError) as e:  # read-only, full, no permission: not damage
        raise CacheWriteError(str(path), str(e)) from None
    except sqlite3.DatabaseError as e:
        _set_aside(path, f"its database cannot be read ({e})")
        try:
            cache = _open(path)
        except (sqlite3.Error, OSError) as e2:
            raise PipelineError(f"LLM cache {path}: cannot start a new cache there: {e2}") from e2
    if not marker.exists():
        try:
            marker.write_text(json.dumps({"format": CACHE_FORMAT}))
        except OSError:
            pass  # a read-only cache still answers
    return cache


def _our_value(raw: Any) -> str | None:
    """The stored text when it is one of our values (a JSON object), else None: a miss."""
    if not isinstance(raw, str):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return raw if isinstance(value, dict) else None


class DiskCallCache:
    """diskcache-backed store. Clients in this process use the async methods; hosted as the job's
    cache (pipeline.llm.shared), it answers the workers' batches (`ops`) on the host's threads."""

    THREADED = True  # on the host's threads: reads overlap SQLite writes (diskcache: a connection per thread)

    def __init__(self, directory: str | Path) -> None:
        self.directory = str(directory)
        self._cache: diskcache.Cache | None = open_checked(directory)
        self.unreadable = 0  # entries that were not our values (served as misses)

    def _fail(self, e: Exception) -> None:
        """A read or write that fails mid-run: no answer from this cache again in this process, and
        a damaged database is set aside so that no later process reads it either."""
        if self._cache is None:
            return
        self._cache.close()
        self._cache = None
        damaged = not isinstance(e, sqlite3.OperationalError)  # malformed, not busy / full / read-only
        log.warning("LLM cache %s failed (%s: %s); this worker goes on without it", self.directory,
                    type(e).__name__, e)
        if damaged:
            try:
                _set_aside(Path(self.directory), f"its database is damaged ({e})")
            except OSError:
                pass  # another worker set it aside first

    def get_sync(self, key: str) -> dict[str, Any] | None:
        raw = self.get_many_raw([key])[0]
        return None if raw is None else json.loads(raw)

    def set_sync(self, key: str, value: dict[str, Any]) -> None:
        self.set_many_raw([(key, canonical_json(value))])

    def get_many_raw(self, keys: list[str]) -> list[str | None]:
        """Stored JSON texts (None for a miss), in key order; the caller parses them."""
        if self._cache is None:
            return [None] * len(keys)
        try:
            found = [self._cache.get(k) for k in keys]
        except sqlite3.DatabaseError as e:
            self._fail(e)
            return [None] * len(keys)
        out = [None if raw is None else _our_value(raw) for raw in found]
        self.unreadable += sum(1 for raw, ok in zip(found, out) if raw is not None and ok is None)
        return out

    def set_many_raw(self, items: list[tuple[str, str]]) -> None:
        """Store (key, JSON text) pairs in one SQLite transaction: one commit for the lot."""
        if self._cache is None:
            return
        try:
            with self._cache.transact():
                for key, raw in items:
                    self._cache.set(key, raw)
        except sqlite3.OperationalError as e:  # full, read-only, locked past its timeout
            raise CacheWriteError(self.directory, str(e)) from None
        except sqlite3.DatabaseError as e:
            self._fail(e)

    def ops(self, sets: list[tuple[str, str]], gets: list[str]) -> tuple[list[str | None], Exception | None]:
        """A worker's writes and lookups of the same few milliseconds as one call: the writes first
        (one transaction), then the lookups. A write that fails fails the writes only: returned, so
        the lookups still answer."""
        failed: Exception | None = None
        if sets:
            try:
                self.set_many_raw(sets)
            except Exception as e:  # CacheWriteError: for the writers, not the readers
                failed = e
        return (self.get_many_raw(gets) if gets else []), failed

    async def get(self, key: str) -> dict[str, Any] | None:
        # SQLite calls block; a thread keeps the event loop serving other in-flight requests.
        return await asyncio.to_thread(self.get_sync, key)

    async def set(self, key: str, value: dict[str, Any]) -> None:
        await asyncio.to_thread(self.set_sync, key, value)

    async def get_many(self, keys: list[str]) -> list[dict[str, Any] | None]:
        """`get` of many keys in one thread hop (an embedding batch's texts)."""
        raws = await asyncio.to_thread(self.get_many_raw, keys)
        return [None if raw is None else json.loads(raw) for raw in raws]

    async def set_many(self, items: list[tuple[str, dict[str, Any]]]) -> None:
        """`set` of many (key, value) pairs in one thread hop and one SQLite transaction."""
        # Serialised in the thread too: a batch of vectors is enough JSON to hold up the event loop.
        await asyncio.to_thread(lambda: self.set_many_raw([(k, canonical_json(v)) for k, v in items]))

    def close(self) -> None:
        if self._cache is not None:
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
