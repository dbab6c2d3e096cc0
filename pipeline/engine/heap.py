"""Handing freed heap memory back to the system (glibc's malloc_trim): a long-lived worker's heap
otherwise keeps the pages of every large thing it ever held (a huge episode's rows, a model's
activations), and its resident size only grows."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
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
