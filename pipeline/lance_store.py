"""Memory banks as Lance tables (lancedb), so users can open and query them outside the pipeline.

One table per bank (e.g. `turn`, `session`, `segment`), one row per memory unit with its
embedding, in the schema the caller passes (the memory units' own: SeCom's `bank_schema` in
stages/methods/secom/units.py; this module knows no method): a fixed-size float32 list column
`vector`, and a `unit_id` that orders ties in searches. Writes overwrite the table. Atomicity: lance has no rename of a table, so the banks
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

VECTOR = "vector"  # the embedding column every bank schema has: pa.list_(pa.float32(), dim)


def vector_dim(schema: pa.Schema) -> int:
    """The length of the schema's `vector` column (a fixed-size list)."""
    kind = schema.field(VECTOR).type
    if not pa.types.is_fixed_size_list(kind):
        raise ValueError(f"a bank schema's {VECTOR!r} column is a fixed-size list of float32, not {kind}")
    return kind.list_size


def _connect(db_dir: str | Path) -> Any:
    # lance logs a WARN line for every table it creates; keep stderr for real problems.
    os.environ.setdefault("LANCEDB_LOG", "error")
    import lancedb  # imported lazily: stages that never touch banks do not pay for it

    return lancedb.connect(str(db_dir))


def bank_table(rows: Iterable[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows -> Arrow table with the caller's bank `schema`; every row needs the schema's non-null
    columns and a vector, and every vector the schema's length."""
    rows = list(rows)
    dim = vector_dim(schema)
    required = [f.name for f in schema if not f.nullable or f.name == VECTOR]
    cols: dict[str, list[Any]] = {name: [] for name in schema.names}
    for n, row in enumerate(rows):
        missing = [c for c in required if c not in row]
        if missing:
            raise ValueError(f"bank row {n} ({row.get('unit_id')!r}): missing {', '.join(missing)}")
        vec = np.asarray(row[VECTOR], dtype=np.float32).reshape(-1)
        if vec.shape[0] != dim:
            raise ValueError(f"bank row {n} ({row.get('unit_id')!r}): vector has {vec.shape[0]} values, "
                             f"expected {dim}")
        for name in schema.names:
            cols[name].append(vec if name == VECTOR else row.get(name))
    arrays = []
    for f in schema:
        if f.name == VECTOR:
            flat = np.concatenate(cols[VECTOR]) if rows else np.zeros(0, np.float32)
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), dim))
        else:
            arrays.append(pa.array(cols[f.name], type=f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def write_bank(db_dir: str | Path, table_name: str, rows: list[dict[str, Any]], schema: pa.Schema) -> int:
    """(Over)write bank `table_name` in the lance database `db_dir` with the caller's `schema`;
    returns the row count."""
    Path(db_dir).mkdir(parents=True, exist_ok=True)
    table = bank_table(rows, schema)
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
    query = table.search(q, vector_column_name=VECTOR).distance_type("cosine")
    if where:
        query = query.where(where, prefilter=True)
    # Fetch a little more than k so ties at the cut can be ordered by unit_id deterministically.
    result = query.limit(k + 8).to_arrow()
    rows = result.drop_columns([c for c in (VECTOR,) if c in result.column_names]).to_pylist()
    for r in rows:
        r["score"] = 1.0 - float(r.pop("_distance"))
    rows.sort(key=lambda r: (-round(r["score"], 6), r["unit_id"]))
    return rows[:k]
