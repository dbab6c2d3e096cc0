"""A model's outputs by content, on disk: what a local model (an embedder, a prompt compressor)
returned for an input, reused by every later run and worker on this machine.

diskcache (SQLite, safe across processes) keyed by sha256 of the model's identity and the input. A
cache that cannot be opened, read or written is set aside with a warning and the caller computes
without it; it never stops a run.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
from pathlib import Path
from typing import Any, Iterable

log = logging.getLogger(__name__)


class ContentCache:
    """`get_many(inputs)` / `set_many(pairs)` of one model's outputs (`identity` names the model and
    every setting its output depends on). Values are whatever diskcache stores (bytes, str, lists)."""

    def __init__(self, directory: str | Path, identity: str, what: str = "cache") -> None:
        self.directory = str(directory)
        self.identity = identity
        self.what = what  # named in the warning when the cache is set aside
        self._cache: Any = None
        self._broken = False

    def key(self, text: str) -> str:
        return hashlib.sha256(f"{self.identity}\x00{text}".encode("utf-8", "surrogatepass")).hexdigest()

    def _open(self) -> Any:
        if self._cache is None and not self._broken:
            import diskcache

            try:
                self._cache = diskcache.Cache(self.directory, size_limit=2**34, eviction_policy="least-recently-stored")
            except (OSError, sqlite3.Error) as e:
                self._give_up(e)
        return self._cache

    def _give_up(self, e: BaseException) -> None:
        log.warning("%s %s set aside (%s: %s); going on without it", self.what, self.directory, type(e).__name__, e)
        self._broken, self._cache = True, None

    def get_many(self, texts: list[str]) -> list[Any]:
        """The stored value of each input, None where there is none (or the cache is unusable)."""
        cache = self._open()
        if cache is None:
            return [None] * len(texts)
        try:
            return [cache.get(self.key(t)) for t in texts]
        except (OSError, sqlite3.Error) as e:
            self._give_up(e)
            return [None] * len(texts)

    def set_many(self, pairs: Iterable[tuple[str, Any]]) -> None:
        cache = self._open()
        if cache is None:
            return
        try:
            with cache.transact():
                for text, value in pairs:
                    cache.set(self.key(text), value)
        except (OSError, sqlite3.Error) as e:
            self._give_up(e)

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory, "identity": self.identity, "what": self.what}  # workers open their own

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["directory"], state["identity"], state.get("what", "cache"))  # type: ignore[misc]
