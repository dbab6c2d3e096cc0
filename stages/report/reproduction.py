"""The report's reproduction table: the run beside each paper sheet it reproduces, result by result,
then the run's deviations from the sheet's protocol; the sheets a run is compared with, and the
report section that shows the table."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pathlib import Path

import polars as pl
import pyarrow as pa

from pipeline.config import under_cwd
from pipeline.errors import ConfigError
from pipeline.reproduction import PaperSheet, load_sheet, run_value, sheet_deviations
from stages.report import render
from stages.report.frames import from_table
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
    frame = table if isinstance(table, pl.DataFrame) else from_table(table)
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
    return from_table(pa.Table.from_pylist(rows, REPRODUCTION_SUMMARY))


def compared_sheets(cfg: Any) -> list[tuple[str, PaperSheet | None]]:
    """(file, its `paper:` sheet or None when it has none) for each of `report.compare_with`; the file
    named as given when it is under the working directory (configs/x.yaml), else in full."""
    out = []
    for path in cfg.report.compare_with:
        if not Path(path).exists():
            raise ConfigError(f"report.compare_with: no such file {path}{cfg.report.looked_in(path)}")
        out.append((under_cwd(path), load_sheet(path)))
    return out


def run_sheets(cfg: Any) -> list[tuple[str, PaperSheet]]:
    """The sheets the run's report compares it with: its own `paper:` block, then the compared
    files' (those without a block left out)."""
    own = [("this run's config", cfg.paper)] if cfg.paper is not None else []
    return own + [(path, sheet) for path, sheet in compared_sheets(cfg) if sheet is not None]


def reproduction_section(summary: pl.DataFrame, unsheeted: list[str]) -> render.Section | None:
    """The report's Reproduction section from `reproduction_summary`: per sheet, its results beside
    the run's, then the run's deviations from its protocol. None when there is no sheet."""
    if summary.is_empty() and not unsheeted:
        return None

    def num(v: float | None) -> str:
        return "" if v is None else f"{v:.4g}"

    shown: list[tuple[str, pl.DataFrame]] = []
    for (sheet, origin), rows in summary.group_by(["sheet", "origin"], maintain_order=True):
        results = rows.filter(pl.col("kind") == "result")
        shown.append((f"{sheet} ({origin})", pl.DataFrame({
            "result": results["name"], "paper": results["paper"], "source": results["source"],
            "run": [num(r["run"]) + (f" [{num(r['run_low'])}, {num(r['run_high'])}]" if r["run_low"] is not None
                                     else "") if r["produced"] else "not produced"
                    for r in results.iter_rows(named=True)],
            "n": results["n"], "episodes": results["episodes"], "difference": results["difference"],
            "looked_up": results["looked_up"], "scorer": results["scorer"]},
            schema_overrides={"n": pl.Int64, "episodes": pl.Int64, "paper": pl.Float64, "difference": pl.Float64})))
        off = rows.filter(pl.col("kind") == "deviation")
        shown.append((f"Where this run differs from {sheet}'s protocol ({off.height})", pl.DataFrame({
            "setting": off["name"], "run": off["run_setting"], "paper": off["paper_setting"],
            "source": off["source"]})))
    intro = ("The paper's numbers beside this run's, each looked up in the report table, row and column the "
             "sheet (`paper:` block) names, scaled as the paper prints it (interval, n and episodes as that table "
             "gives them: the interval is the episode-level cluster bootstrap, so it is wide when n comes from few "
             "episodes, and missing with one), with the scorer that computed it (library, convention and whose: "
             "the paper's own scorer for every score); `not produced`: the run wrote no such row. Below each, every "
             "protocol setting where this run differs from the paper's (`mempipe check` lists them before a run).")
    if unsheeted:
        intro += " Compared configs with no `paper:` block yet: " + ", ".join(unsheeted) + "."
    return render.Section("Reproduction", intro, shown)
