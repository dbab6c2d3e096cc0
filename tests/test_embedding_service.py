"""The node's embedding service embeds a huge request slice by slice, its heap trimmed between slices
(a 10M-token conversation's bank is one request: bench/beam_scale.py), and gives back the same vectors
in the same order as one call would."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from pipeline.config import EmbeddingConfig
from pipeline.engine.execution import embedding_service as service


class CountingEmbedder:
    """An embedder whose vector of a text is its number; records each call's size."""

    name = "counting"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def encode(self, texts: list[str]) -> np.ndarray:
        self.calls.append(len(texts))
        return np.asarray([[float(t), 1.0] for t in texts], dtype=np.float32)


def test_a_request_longer_than_a_slice_is_embedded_slice_by_slice_with_a_trim_between(monkeypatch):
    trims: list[int] = []
    monkeypatch.setattr(service, "ENCODE_SLICE", 4)
    monkeypatch.setattr(service, "TRIM_EVERY_S", -1.0)  # due after every slice
    monkeypatch.setattr(service, "release_free_memory", lambda: trims.append(1) or True)
    svc = service.EmbeddingService(EmbeddingConfig(), cpus=1)
    svc._embedder = embedder = CountingEmbedder()
    out = asyncio.run(svc.encode([str(i) for i in range(10)]))
    assert sorted(embedder.calls) == [2, 4, 4] and len(trims) == 3
    assert out[:, 0].tolist() == [float(i) for i in range(10)]  # in order, as one call would give them
    assert asyncio.run(svc.encode(["7"])).tolist() == [[7.0, 1.0]] and embedder.calls[-1] == 1


def test_as_many_slices_are_in_flight_as_the_model_has_copies(monkeypatch):
    monkeypatch.setattr(service, "ENCODE_SLICE", 2)
    svc = service.EmbeddingService(EmbeddingConfig(), cpus=2)
    assert svc.copies == 2
    live = peak = 0

    lock = threading.Lock()

    class SlowEmbedder(CountingEmbedder):
        """A local model: `encode` in a thread, slow enough that slices overlap when they can."""

        def encode(self, texts: list[str]) -> np.ndarray:
            nonlocal live, peak
            with lock:
                live += 1
                peak = max(peak, live)
            time.sleep(0.05)
            with lock:
                live -= 1
            return super().encode(texts)

    svc._embedder = SlowEmbedder()
    out = asyncio.run(svc.encode([str(i) for i in range(9)]))
    assert peak == 2 and out[:, 0].tolist() == [float(i) for i in range(9)]  # two copies busy, order kept


class FakeService:
    """A service handle as a worker sees it: `encode.remote(texts)` is awaitable; records each part."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.parts: list[list[str]] = []
        self.encode = self  # `handle.encode.remote(...)`

    def remote(self, texts: list[str]) -> asyncio.Future:
        self.parts.append(texts)
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        done.set_result(np.asarray([[float(t), 0.0] for t in texts], dtype=np.float32))
        return done


def test_a_huge_request_is_scattered_over_every_nodes_service_in_order(monkeypatch):
    monkeypatch.setattr(service, "SCATTER_AT", 6)
    here, other, third = FakeService("here"), FakeService("other"), FakeService("third")
    embedder = service.ServiceEmbedder(here, "m", [other, third])
    out = asyncio.run(embedder.aencode([str(i) for i in range(10)]))
    assert out[:, 0].tolist() == [float(i) for i in range(10)]  # as one call would give them
    assert [len(s.parts[0]) for s in (here, other, third)] == [4, 4, 2]  # contiguous parts, one per node
    small = asyncio.run(embedder.aencode(["1", "2"]))  # under SCATTER_AT: this node's service alone
    assert small[:, 0].tolist() == [1.0, 2.0] and len(here.parts) == 2 and len(other.parts) == 1


def test_scatter_keeps_a_request_whole_on_one_node_or_when_small():
    texts = [str(i) for i in range(service.SCATTER_AT)]
    assert service.scatter(texts, 1) == [texts]
    assert service.scatter(texts[:-1], 3) == [texts[:-1]]
    parts = service.scatter(texts, 3)
    assert len(parts) == 3 and sum(parts, []) == texts
