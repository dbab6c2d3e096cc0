"""Freed heap pages go back to the system after a shard that grew the process, and only then: the
hundreds of small shards of a run skip a full garbage collection each."""

from __future__ import annotations

import gc

import pytest

from pipeline.engine import heap

MB = 1 << 20


def test_release_happens_once_the_process_grew_and_not_again_until_it_grows_more(monkeypatch: pytest.MonkeyPatch) -> None:
    collections: list[int] = []

    def collect(*generation: int) -> int:
        collections.append(1)
        return 0

    monkeypatch.setattr(gc, "collect", collect)
    monkeypatch.setattr(heap, "_baseline", [0])
    assert heap.resident_bytes() > 0
    assert heap.release_when_grown(growth=64 * MB)  # nothing released yet: the first one does
    assert collections == [1]
    assert not heap.release_when_grown(growth=64 * MB)  # a small shard: nothing to do
    assert collections == [1]

    held = bytearray(128 * MB)  # what a big shard left resident: 128 MB of touched pages
    assert heap.resident_bytes() >= heap._baseline[0] + 64 * MB
    released = heap.release_when_grown(growth=64 * MB)
    assert collections == [1, 1] and released == heap.release_free_memory()  # False only without malloc_trim
    assert not heap.release_when_grown(growth=64 * MB)  # measured from the grown size now
    del held
