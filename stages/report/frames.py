"""What every report table shares: the label of a pooled row, and frames to and from a schema."""

from __future__ import annotations

from typing import cast

import polars as pl
import pyarrow as pa

ALL = "all"  # the label of a row that pools every dataset, or every probe kind, of the run


def from_table(table: pa.Table) -> pl.DataFrame:
    """`pl.from_arrow` of a table, which is a DataFrame (polars types the call `DataFrame | Series`,
    the latter for an array)."""
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def as_float(value: object) -> float:
    """`float()` of an aggregate of a numeric column (`Series.mean()`, `.std()`, `.quantile()`), which
    polars types as any Python value or None; a null raises TypeError, as `float(None)` does."""
    return float(cast(float, value))


def empty(schema: pa.Schema) -> pl.DataFrame:
    return from_table(schema.empty_table())


def to_arrow(df: pl.DataFrame, schema: pa.Schema) -> pa.Table:
    if df.is_empty():
        return schema.empty_table()
    return df.select(schema.names).to_arrow().cast(schema)
