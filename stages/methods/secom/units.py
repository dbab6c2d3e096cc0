"""Memory units (SeCom Sec. 2.1): a conversation cut into turn, session or segment units.

A turn-level unit is one exchange (a turn of the session's first speaker and the replies to it,
`build_exchanges`), SeCom's "user-agent interaction"; a session-level unit is a whole session; a
segment-level unit is a topical segment from the `segment` stage. Every utterance lands in exactly one unit of each
granularity. Units are built here, compressed by the `compress` stage, embedded by `banks` and
searched with `unit_retriever`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from pipeline.retrieval import Retriever, count_tokens
from pipeline.engine.stage import Rows
from stages.dialogue import Span, build_exchanges, format_unit, unit_id

UNIT_FIELDS = [
    pa.field("episode_id", pa.string(), nullable=False),
    pa.field("unit_id", pa.string(), nullable=False),  # "<granularity>:<session>:<turn_start>"
    pa.field("granularity", pa.string(), nullable=False),  # turn | session | segment
    pa.field("session_idx", pa.int32(), nullable=False),
    pa.field("turn_start", pa.int32(), nullable=False),
    pa.field("turn_end", pa.int32(), nullable=False),
    pa.field("session_time", pa.timestamp("s")),
    pa.field("source_turn_ids", pa.list_(pa.string())),
    pa.field("text", pa.string(), nullable=False),  # what retrieval returns
    pa.field("compressed_text", pa.string()),  # the retrieval key after denoising
    pa.field("compression", pa.string()),  # method@rate, or "none"
]


def bank_schema(vector_dim: int) -> pa.Schema:
    """A memory bank's row (the Lance tables the `banks` stage writes through pipeline/lance_store.py):
    a unit with the embedding of its retrieval key, `vector_dim` values."""
    return pa.schema([
        pa.field("unit_id", pa.string(), nullable=False),
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("granularity", pa.string(), nullable=False),  # turn | session | segment | ...
        pa.field("session_idx", pa.int32()),
        pa.field("turn_start", pa.int32()),  # first turn_idx covered by the unit
        pa.field("turn_end", pa.int32()),  # last turn_idx covered (inclusive)
        pa.field("text", pa.string(), nullable=False),
        pa.field("compressed_text", pa.string()),  # denoised retrieval key; null = not compressed
        pa.field("vector", pa.list_(pa.float32(), vector_dim)),
    ])


BANK_COLUMNS = tuple(bank_schema(1).names)


def unit_exchanges(turns: Sequence[dict]) -> list[str]:
    """The text of a unit's turns cut into its exchanges (`build_exchanges`), each as "Speaker:
    text" lines: what LLMLingua-2 compresses one by one. Joined by newlines, they are the unit's text."""
    return [format_unit(turns[s : e + 1]) for s, e in build_exchanges(turns)]


def make_units(turns: Sequence[dict], spans: Sequence[Span], granularity: str) -> Rows:
    """Memory units of one session from inclusive spans of positions in `turns`.

    Each unit: episode_id, unit_id, granularity, session_idx, session_time, turn_start / turn_end
    (turn_idx of its first / last turn), text (`format_unit`) and source_turn_ids (for retrieval
    metrics; null ids are skipped).
    """
    units = []
    for start, end in spans:
        part = turns[start : end + 1]
        first = part[0]
        turn_start = first.get("turn_idx", start)
        units.append({
            "episode_id": first.get("episode_id"),
            "unit_id": unit_id(granularity, first["session_idx"], turn_start),
            "granularity": granularity,
            "session_idx": first.get("session_idx"),
            "session_time": first.get("session_time"),
            "turn_start": turn_start,
            "turn_end": part[-1].get("turn_idx", end),
            "text": format_unit(part),
            "source_turn_ids": [t["source_turn_id"] for t in part if t.get("source_turn_id") is not None],
        })
    return units


def spans_for(granularity: str, turns: Rows, segments: Rows) -> list[Span]:
    """Spans of positions in `turns` (one session) for one granularity."""
    n = len(turns)
    if granularity == "session":
        return [(0, n - 1)]
    if granularity == "turn":
        return build_exchanges(turns)
    if granularity == "segment":
        position = {t["turn_idx"]: i for i, t in enumerate(turns)}
        ordered = sorted(segments, key=lambda s: s["segment_idx"])
        return [(position[s["turn_start"]], position[s["turn_end"]]) for s in ordered]
    raise ValueError(f"unknown granularity {granularity!r}")


def build_units(sessions: dict[int, Rows], segments: Rows, granularity: str) -> Rows:
    """Every unit of one episode at one granularity, sessions in order."""
    units: Rows = []
    for session_idx, turns in sessions.items():
        if turns:
            own = [s for s in segments if s["session_idx"] == session_idx]
            units += make_units(turns, spans_for(granularity, turns, own), granularity)
    return units


def unit_retriever(pool: Rows, *, use_compression: bool, similarity: str = "cosine", bm25_tokens: str = "words",
                   bm25_idf: str = "lucene") -> Retriever:
    """A retriever over memory units. The key is the compressed text (SeCom's denoising) or the
    original, dense search uses the matching stored vector scored by `similarity` (cosine, dot or
    l2), BM25 cuts terms by `bm25_tokens` and weighs them by `bm25_idf` (pipeline.retrieval), and
    budgets count the original text, which is what enters the context."""
    vec_col = "vector" if use_compression else "text_vector"
    has_vectors = bool(pool) and all(u.get(vec_col) is not None for u in pool)
    return Retriever(
        ids=[u["unit_id"] for u in pool],
        texts=[(u.get("compressed_text") if use_compression else None) or u["text"] for u in pool],
        vectors=np.asarray([u[vec_col] for u in pool], dtype=np.float32) if has_vectors else None,
        token_counts=[u["text_tokens"] if u.get("text_tokens") is not None else count_tokens(u["text"]) for u in pool],
        similarity=similarity,
        bm25_tokens=bm25_tokens,
        bm25_idf=bm25_idf,
    )
