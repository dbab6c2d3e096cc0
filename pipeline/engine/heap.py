"""Handing freed heap memory back to the system (glibc's malloc_trim): a long-lived worker's heap
otherwise keeps the pages of every large thing it ever held (a huge episode's rows, a model's
activations), and its resident size only grows."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    libc = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None
    return None if trim is None else lambda pad: int(trim(pad))


def release_free_memory() -> bool:
    """Give the free pages inside the heap back to the system; False where the C library has no such call."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


TRIM_GROWTH_BYTES = 256 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_baseline = [0]  # this process's resident bytes after its last `release_when_grown` (0: none yet)


def resident_bytes() -> int:
    """This process's resident memory (Linux: /proc/self/statm, microseconds); 0 where unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def release_when_grown(growth: int = TRIM_GROWTH_BYTES) -> bool:
    """A full garbage collection, then `release_free_memory`, once the process has grown by `growth`
    bytes since the last time (a worker after a shard): a huge episode's pages go back after its
    shard, while the hundreds of small shards of a run skip a full collection each, which blocked
    the LLM workers' event loops for a third of their time (py-spy, bench/dag_throughput.py). True
    when it released."""
    now = resident_bytes()
    if now and now < _baseline[0] + growth:
        return False
    gc.collect()
    released = release_free_memory()
    _baseline[0] = resident_bytes()
    return released
