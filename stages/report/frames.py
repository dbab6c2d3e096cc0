"""What every report table shares: the label of a pooled row, and frames to and from a schema."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

ALL = "all"  # the label of a row that pools every dataset, or every probe kind, of the run


def empty(schema: pa.Schema) -> pl.DataFrame:
    return pl.from_arrow(schema.empty_table())  # type: ignore[return-value]


def to_arrow(df: pl.DataFrame, schema: pa.Schema) -> pa.Table:
    if df.is_empty():
        return schema.empty_table()
    return df.select(schema.names).to_arrow().cast(schema)
