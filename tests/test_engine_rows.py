"""A stage reads its upstream rows with embedding columns as numpy views into the Arrow buffer (a
10M-token conversation's bank as Python floats was ~0.5 GB in every worker that read it), and
everything else exactly as `to_pylist` gives it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.engine.rows import rows_by_episode, table_rows

SCHEMA = pa.schema([("episode_id", pa.string()), ("vector", pa.list_(pa.float32())),
                    ("fixed", pa.list_(pa.float32(), 2)), ("words", pa.list_(pa.string())), ("n", pa.int32())])
ROWS = [{"episode_id": "a", "vector": [1.0, 2.0, 3.0], "fixed": [1.0, 2.0], "words": ["x"], "n": 1},
        {"episode_id": "b", "vector": None, "fixed": None, "words": None, "n": None},
        {"episode_id": "a", "vector": [], "fixed": [5.0, 6.0], "words": [], "n": 3}]


def _plain(row: dict) -> dict:
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in row.items()}


def test_vectors_come_as_numpy_views_and_the_rest_as_to_pylist_gives_it():
    table = pa.concat_tables([pa.Table.from_pylist(ROWS, schema=SCHEMA)] * 2).slice(1)  # chunks, an offset
    rows = table_rows(table)
    assert [_plain(r) for r in rows] == table.to_pylist()
    assert [list(r) for r in rows] == [SCHEMA.names] * 5  # the columns in the table's order
    assert isinstance(rows[1]["vector"], np.ndarray) and rows[1]["vector"].dtype == np.float32
    assert isinstance(rows[1]["words"], list) and rows[0]["vector"] is None
    # one buffer under every row's vector of a chunk: no copy per row, and none can be written
    assert rows[2]["fixed"].base is not None and rows[2]["fixed"].base is rows[4]["fixed"].base
    assert not rows[1]["vector"].flags.writeable


def test_rows_are_grouped_by_episode_in_order():
    grouped = rows_by_episode(pa.Table.from_pylist(ROWS, schema=SCHEMA))
    assert [r["n"] for r in grouped["a"]] == [1, 3] and [r["n"] for r in grouped["b"]] == [None]
    assert rows_by_episode(pa.table({"x": [1]})) == {}
