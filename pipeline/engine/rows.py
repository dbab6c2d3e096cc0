"""Arrow tables as the plain rows a stage reads, with embedding columns as numpy views.

A float list column (an embedding) read with `to_pylist` becomes one Python float object per
value: a 10M-token conversation's bank (20,819 units, two 384-float vectors each) took ~0.5 GB that
way in every worker that read it (bench/beam_scale.py). Here each row's vector is a read-only
numpy view into the column's one Arrow buffer; readers already take vectors with `np.asarray`.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pyarrow as pa

Row = dict[str, object]


def _is_vector(kind: pa.DataType) -> bool:
    return ((pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind))
            and pa.types.is_floating(kind.value_type))


def vector_views(column: pa.ChunkedArray) -> list[np.ndarray | None]:
    """One numpy view per row of a float list column (None for a null row), sharing its buffers."""
    views: list[np.ndarray | None] = []
    for chunk in column.chunks:
        if isinstance(chunk, pa.FixedSizeListArray):
            width = chunk.type.list_size
            values = chunk.values.to_numpy(zero_copy_only=False)  # every slot, null rows' too
            offsets = np.arange(chunk.offset, chunk.offset + len(chunk) + 1) * width
        else:
            values = chunk.values.to_numpy(zero_copy_only=False)  # every slot, offsets index into it
            offsets = chunk.offsets.to_numpy()
        values.flags.writeable = False
        valid = chunk.is_valid().to_numpy(zero_copy_only=False)
        views.extend(values[offsets[i]:offsets[i + 1]] if valid[i] else None for i in range(len(chunk)))
    return views


def table_rows(table: pa.Table) -> list[Row]:
    """`table.to_pylist()`, but float list columns as numpy views (same keys, same column order)."""
    vectors = [name for name, f in zip(table.column_names, table.schema) if _is_vector(f.type)]
    if not vectors or table.num_rows == 0:
        return table.to_pylist()
    plain = table.drop_columns(vectors).to_pylist()
    views = {name: vector_views(table.column(name)) for name in vectors}
    return [{name: views[name][i] if name in views else row[name] for name in table.column_names}
            for i, row in enumerate(plain)]


def rows_by_episode(table: pa.Table) -> dict[str, list[Row]]:
    """A table's rows grouped by `episode_id` (none when it has no such column)."""
    groups: dict[str, list[Row]] = defaultdict(list)
    if "episode_id" not in table.column_names:
        return groups
    for row in table_rows(table):
        groups[str(row["episode_id"])].append(row)
    return groups
