"""Memory banks as Lance tables (lancedb), so users can open and query them outside the pipeline.

One table per bank (e.g. `turn`, `session`, `segment`), one row per memory unit with its
embedding. Writes overwrite the table. Atomicity: lance has no rename of a table, so the banks
stage writes its database folder inside the stage's temporary work dir, which the stage runner
renames into place only when the whole stage succeeded; a crash never leaves a bank that looks
complete.

Searches are exact (no ANN index: banks here are per-run and small; users can add an index) and
deterministic: equal distances are ordered by unit_id.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa

BANK_COLUMNS = ("unit_id", "episode_id", "granularity", "session_idx", "turn_start", "turn_end",
                "text", "compressed_text", "vector")


def bank_schema(vector_dim: int) -> pa.Schema:
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


def _connect(db_dir: str | Path) -> Any:
    # lance logs a WARN line for every table it creates; keep stderr for real problems.
    os.environ.setdefault("LANCEDB_LOG", "error")
    import lancedb  # imported lazily: stages that never touch banks do not pay for it

    return lancedb.connect(str(db_dir))


def bank_table(rows: Iterable[dict[str, Any]], vector_dim: int) -> pa.Table:
    """Rows -> Arrow table with the bank schema; checks every vector's length."""
    rows = list(rows)
    schema = bank_schema(vector_dim)
    cols: dict[str, list[Any]] = {name: [] for name in BANK_COLUMNS}
    for n, row in enumerate(rows):
        missing = [c for c in ("unit_id", "episode_id", "granularity", "text", "vector") if c not in row]
        if missing:
            raise ValueError(f"bank row {n} ({row.get('unit_id')!r}): missing {', '.join(missing)}")
        vec = np.asarray(row["vector"], dtype=np.float32).reshape(-1)
        if vec.shape[0] != vector_dim:
            raise ValueError(f"bank row {n} ({row['unit_id']!r}): vector has {vec.shape[0]} values, "
                             f"expected {vector_dim}")
        for name in BANK_COLUMNS:
            cols[name].append(vec if name == "vector" else row.get(name))
    arrays = []
    for f in schema:
        if f.name == "vector":
            flat = np.concatenate(cols["vector"]) if rows else np.zeros(0, np.float32)
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), vector_dim))
        else:
            arrays.append(pa.array(cols[f.name], type=f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def write_bank(db_dir: str | Path, table_name: str, rows: list[dict[str, Any]], vector_dim: int) -> int:
    """(Over)write bank `table_name` in the lance database `db_dir`; returns the row count."""
    Path(db_dir).mkdir(parents=True, exist_ok=True)
    table = bank_table(rows, vector_dim)
    _connect(db_dir).create_table(table_name, data=table, schema=table.schema, mode="overwrite")
    return table.num_rows


def open_bank(db_dir: str | Path, table_name: str) -> Any:
    """The lancedb table (query it with lancedb's API, or `.to_arrow()`)."""
    db = _connect(db_dir)
    try:
        return db.open_table(table_name)
    except (FileNotFoundError, ValueError) as e:
        raise FileNotFoundError(f"no memory bank {table_name!r} in {db_dir}: {e}") from None


def search_bank(db_dir: str | Path, table_name: str, qvec: np.ndarray, k: int,
                where: str | None = None) -> list[dict[str, Any]]:
    """k nearest units by cosine similarity, best first, as dicts with `score` (cosine) added.

    where: a lance SQL filter applied before the search, e.g. "episode_id = 'e1' AND session_idx < 3".
    """
    if k <= 0:
        return []
    table = open_bank(db_dir, table_name)
    q = np.asarray(qvec, dtype=np.float32).reshape(-1)
    query = table.search(q, vector_column_name="vector").distance_type("cosine")
    if where:
        query = query.where(where, prefilter=True)
    # Fetch a little more than k so ties at the cut can be ordered by unit_id deterministically.
    result = query.limit(k + 8).to_arrow()
    rows = result.drop_columns([c for c in ("vector",) if c in result.column_names]).to_pylist()
    for r in rows:
        r["score"] = 1.0 - float(r.pop("_distance"))
    rows.sort(key=lambda r: (-round(r["score"], 6), r["unit_id"]))
    return rows[:k]
