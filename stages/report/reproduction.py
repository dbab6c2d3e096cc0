"""The report's reproduction table: the run beside each paper sheet it reproduces, result by result,
then the run's deviations from the sheet's protocol."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl
import pyarrow as pa

from pipeline.reproduction import PaperSheet, run_value, sheet_deviations
from stages.report.method_costs import whole_run_scope
from stages.report.scorers import scorer

# The run beside each paper it reproduces or is compared with (`paper:` sheets): per sheet, one
# `result` row per number of the paper's table (the run's value x scale, its cluster interval, n and
# episodes, or produced = false), then one `deviation` row per protocol setting where the run differs.
REPRODUCTION_SUMMARY = pa.schema(
    [
        pa.field("sheet", pa.string()),  # the sheet's title
        pa.field("origin", pa.string()),  # the config file whose `paper:` block it is
        pa.field("kind", pa.string()),  # result | deviation
        pa.field("name", pa.string()),  # the result's name, or the setting's dotted config path
        pa.field("source", pa.string()),  # where the paper states it ("Table 6", "Sec. 3.1")
        pa.field("paper", pa.float64()),  # result: the paper's number
        pa.field("run", pa.float64()),  # result: the run's number, scaled as the paper prints it
        pa.field("run_low", pa.float64()),  # the table's episode-level cluster interval, scaled
        pa.field("run_high", pa.float64()),
        pa.field("n", pa.int64()),
        pa.field("episodes", pa.int64()),  # the episodes behind n (null: the table has no `episodes`)
        pa.field("produced", pa.bool_()),  # result: the run wrote the row the sheet names
        pa.field("difference", pa.float64()),  # run - paper
        pa.field("looked_up", pa.string()),  # result: table, column, where and scale
        pa.field("scorer", pa.string()),  # result: the scorer that computed the column (stages/report/scorers.py)
        pa.field("paper_scored_by", pa.string()),  # result: the judge or scorer behind the paper's number (its sheet)
        pa.field("paper_setting", pa.string()),  # deviation: the paper's value (JSON)
        pa.field("run_setting", pa.string()),  # deviation: the run's value (JSON)
    ]
)


def _looked_up(r: Any) -> str:
    where = ", ".join(f"{k}={'null' if v is None else v}" for k, v in r.where.items())
    return f"{r.table}.{r.column}" + (f" where {where}" if where else "") + (f" x {r.scale:g}" if r.scale != 1 else "")


def _whole_run_where(table: Any, result: Any) -> Any:
    """A `method_summary` result that names no `dataset` (or no `kind`) reads the whole-run row, as
    the table held a single pooled row per method before it was split by dataset and probe kind.
    Any other result: as is."""
    if result.table != "method_summary":
        return result
    frame = table if isinstance(table, pl.DataFrame) else pl.from_arrow(table)
    where = {**result.where, **{k: v for k, v in whole_run_scope(frame).items() if k not in result.where}}
    return result.model_copy(update={"where": where})


def reproduction_summary(cfg: Any, sheets: Sequence[tuple[str, PaperSheet]],
                         produced: Mapping[str, Any]) -> pl.DataFrame:
    """`REPRODUCTION_SUMMARY` rows for each (origin, sheet): its results looked up in the run's
    report tables `produced` (name -> pyarrow or polars table; a table the run did not write makes
    the result `produced = false`), then the run's deviations from the sheet's protocol."""
    rows: list[dict[str, Any]] = []
    for origin, sheet in sheets:
        base = {"sheet": sheet.title, "origin": origin}
        for r in sheet.results:
            r = _whole_run_where(produced[r.table], r) if r.table in produced else r
            got = run_value(produced[r.table], r) if r.table in produced else None
            value = got.value if got is not None else None
            rows.append({**base, "kind": "result", "name": r.name, "source": r.source, "paper": r.paper,
                         "run": value, "run_low": got.low if got else None, "run_high": got.high if got else None,
                         "n": got.n if got else None, "episodes": got.episodes if got else None,
                         "produced": bool(got and got.produced), "difference": None if value is None else value - r.paper,
                         "looked_up": _looked_up(r), "scorer": scorer(cfg, r),
                         "paper_scored_by": sheet.scored_by.get(r.column)})
        for d in sheet_deviations(cfg, sheet, origin):
            rows.append({**base, "kind": "deviation", "name": d.path, "source": d.source,
                         "paper_setting": json.dumps(d.paper, default=str),
                         "run_setting": json.dumps(d.run, default=str)})
    return pl.from_arrow(pa.Table.from_pylist(rows, REPRODUCTION_SUMMARY))  # type: ignore[return-value]
