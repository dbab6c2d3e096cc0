"""A reproduction sheet: the `paper:` block of a config that reproduces a paper's table.

It states the paper, the table and rows it reproduces, the protocol the paper ran (each setting as
a dotted config path with the paper's value and where the paper says it), and the paper's numbers
for the rows the run produces, each with where the run writes its own. The framework knows no
paper: it only compares a run's effective settings with the sheet and looks numbers up.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any, Iterable, Literal

import pyarrow as pa
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.errors import ConfigError
from pipeline.yamlio import read_yaml
from pipeline.settings_keys import unknown_key


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProtocolSetting(_Strict):
    """One setting the paper states: its value and where the paper says it ("Sec. 3.1", "Table 6",
    "App. B.1", "reference code: chat.py", or "inferred: <why>"), or "ours: <why>" for a choice of ours."""

    value: Any
    source: str

    @property
    def kind(self) -> SourceKind:
        return source_kind(self.source)


SourceKind = Literal["ours", "inferred", "reference code", "paper", "unsourced"]
_PAPER_PLACE = re.compile(r"\b(Sec\.|App\.|Table|Algorithm|Figure|Fig\.|footnote)")


def source_kind(source: str) -> SourceKind:
    """Whose a sheet's value is, by how its source starts (the sheets' convention): a choice of ours,
    inferred, read from the reference code, or the paper's (a place in it: a section, table, appendix,
    algorithm, figure or footnote); "unsourced" when it says none of these."""
    if source.startswith("ours"):
        return "ours"
    if source.startswith("inferred:"):
        return "inferred"
    if source.startswith("reference code"):
        return "reference code"
    return "paper" if _PAPER_PLACE.search(source) else "unsourced"


class PaperResult(_Strict):
    """One number of the paper's table and where the run writes its own: the row of the report's
    `table` whose columns equal `where` (null matches null), column `column`; the run's value is
    multiplied by `scale` (e.g. 100 when the paper prints a percentage of a 0-1 share)."""

    name: str  # e.g. "SeCom, GPT4Score"
    paper: float
    source: str  # e.g. "Table 6"
    table: str  # a report table, e.g. "answer_summary"
    where: dict[str, Any] = Field(default_factory=dict)
    column: str
    scale: float = 1.0


class PaperSheet(_Strict):
    title: str
    seed: str  # the seed file's number in shared/seeds, e.g. "001"
    reproduces: str  # e.g. "Table 6: LoCoMo official QA, GPT-3.5-Turbo generator"
    protocol: dict[str, ProtocolSetting] = Field(default_factory=dict)  # dotted path -> setting
    results: list[PaperResult] = Field(default_factory=list)
    # Which judge or scorer produced the published numbers, by the report column each is compared
    # with ("score": a judge's; "mem0_f1": a scorer's): disputes about a number are mostly about this.
    scored_by: dict[str, str] = Field(default_factory=dict)


class Deviation(_Strict):
    """A setting where the run differs from the paper's protocol."""

    path: str
    paper: Any
    run: Any
    source: str

    def __str__(self) -> str:
        return f"{self.path}: {self.run!r} (paper: {self.paper!r}, {self.source})"


_MISSING = object()


def effective(cfg: Any, path: str) -> Any:
    """The value a run uses for a dotted config path, after defaults: `roles.<role>.<field>` goes
    through the role's fallback to `llm` (`cfg.role`), anything else walks the validated config
    (attributes, dict keys, list indexes; an index past the list's end reads as None). A path that
    names nothing raises KeyError naming it."""
    parts = path.split(".")
    if parts[0] == "roles" and len(parts) >= 3:
        value: Any = cfg.role(parts[1])
        parts = parts[2:]
    else:
        value = cfg
    walked = []
    for part in parts:
        walked.append(part)
        if isinstance(value, list) and part.isdigit():  # `corpus.extra.0.limit`: a list's item by its index
            if int(part) >= len(value):
                return None  # the run has no such item (e.g. no second corpus)
            nxt = value[int(part)]
        else:
            nxt = value.get(part, _MISSING) if isinstance(value, dict) else getattr(value, part, _MISSING)
        if nxt is _MISSING:
            raise KeyError(f"paper.protocol: {path!r} names no setting (no {'.'.join(walked)!r})")
        value = nxt
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def same(paper: Any, run: Any) -> bool:
    """Equal as the paper states it: numbers compare as numbers, lists element by element."""
    if isinstance(paper, bool) or isinstance(run, bool):
        return paper is run or paper == run
    if isinstance(paper, (int, float)) and isinstance(run, (int, float)):
        return abs(float(paper) - float(run)) <= 1e-9 * max(1.0, abs(float(paper)))
    if isinstance(paper, (list, tuple)) and isinstance(run, (list, tuple)):
        return len(paper) == len(run) and all(same(p, r) for p, r in zip(paper, run))
    return paper == run


def deviations(cfg: Any, sheet: PaperSheet | None = None) -> list[Deviation]:
    """Every protocol setting of the sheet (the config's own `paper:` block by default) where the
    run's effective value differs from the paper's, in the sheet's order."""
    sheet = sheet if sheet is not None else cfg.paper
    if sheet is None:
        return []
    out = []
    for path, setting in sheet.protocol.items():
        run = effective(cfg, path)
        if not same(setting.value, run):
            out.append(Deviation(path=path, paper=setting.value, run=run, source=setting.source))
    return out


def setting_method(path: str) -> str | None:
    """The method a protocol path configures (`method.<name>.<key>`), else None."""
    parts = path.split(".")
    return parts[1] if len(parts) >= 3 and parts[0] == "method" else None


def sheet_methods(sheet: PaperSheet) -> set[str]:
    """The methods a sheet is about: those its results' rows name and those whose settings its
    protocol states."""
    named = {str(r.where["method"]) for r in sheet.results if r.where.get("method") is not None}
    return named | {m for m in map(setting_method, sheet.protocol) if m is not None}


def for_run(sheet: PaperSheet, methods: Iterable[str], absent: Iterable[str] = ()) -> PaperSheet:
    """The sheet narrowed to what a run holds: the protocol settings and results of methods other
    than `methods` left out (those of no method kept), and the settings of the `absent` sections
    (stages the run does not hold, e.g. SeCom's `segment` when no selected method reads it) and
    roles (`roles.segmenter`, when no stage of the run calls it)."""
    keep, gone = set(methods), set(absent)

    def kept(path: str) -> bool:
        method, parts = setting_method(path), path.split(".")
        return (method is None or method in keep) and parts[0] not in gone and ".".join(parts[:2]) not in gone

    results = [r for r in sheet.results if r.where.get("method") is None or r.where["method"] in keep]
    return sheet.model_copy(update={"protocol": {p: s for p, s in sheet.protocol.items() if kept(p)},
                                    "results": results})


def sheet_deviations(cfg: Any, sheet: PaperSheet, origin: str) -> list[Deviation]:
    """`deviations` of the run from one sheet, a protocol path that names no setting raised as a
    one-line ConfigError naming where the sheet comes from (`origin`: a config file)."""
    try:
        return deviations(cfg, sheet)
    except KeyError as e:
        raise ConfigError(f"{origin}: {e.args[0]}") from None


def load_sheet(path: str | Path) -> PaperSheet | None:
    """The `paper:` block of a config file (only that key is read), validated; None when the file
    has none. A missing or unreadable file, or a block that fails validation, raises a one-line
    ConfigError naming the file. Parsed once per text: a run asks for the compared sheets at every
    fingerprint and again for its report (a sheet is ~50 KB: ~25 ms to parse and validate, under
    1 ms to read), so one parsed sheet (frozen) serves every read of the same text."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"report.compare_with: cannot read {path}: {e.strerror}") from None
    return _parsed_sheet(str(path), text)


@functools.lru_cache(maxsize=32)
def _parsed_sheet(path: str, text: str) -> PaperSheet | None:
    try:
        data = read_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"report.compare_with: invalid YAML in {path}: {' '.join(str(e).split())}") from None
    block = data.get("paper") if isinstance(data, dict) else None
    if block is None:
        return None
    try:
        return PaperSheet.model_validate(block)
    except ValidationError as e:
        problems = "; ".join(f"paper.{'.'.join(map(str, err['loc']))}: "
                             f"{unknown_key(PaperSheet, err['loc']) if err['type'] == 'extra_forbidden' else err['msg']}"
                             for err in e.errors())
        raise ConfigError(f"report.compare_with: {path}: invalid paper: block: {problems}") from None


# Where a report table keeps a value's interval (first present pair) and its count (first present).
# The report's tables give these names to their episode-level cluster intervals; the intervals that
# assume independent items are named `*iid*` and are never picked.
INTERVAL_COLUMNS = ("{column}_low/{column}_high", "ci_low/ci_high", "win_share_low/win_share_high")
COUNT_COLUMNS = ("judged", "items", "pairs", "total", "responses", "ratings", "questions", "probes", "sessions", "episodes")
EPISODES_COLUMN = "episodes"  # how many episodes (clusters) the count comes from


class RunValue(_Strict):
    """The run's number for a `PaperResult`: `produced` is False (and the rest None) when the run
    wrote no row the result names. Value and interval are scaled by the result's `scale`; `n` counts
    the items, `episodes` the episodes they come from (None when the table does not say)."""

    produced: bool
    value: float | None = None
    low: float | None = None
    high: float | None = None
    n: int | None = None
    episodes: int | None = None


def _scaled(v: Any, scale: float) -> float | None:
    return None if v is None else float(v) * scale


def run_value(table: Any, result: PaperResult) -> RunValue:
    """Look the run's number for `result` up in a report table (pyarrow, or anything with
    `to_arrow()`, e.g. polars): the one row whose columns equal `result.where` (None matches null),
    `row[column] * scale`, the interval from the first pair of `INTERVAL_COLUMNS` the table has (the
    report's cluster interval), n from the first of `COUNT_COLUMNS` it has, episodes from its
    `episodes` column. No such row: `RunValue(produced=False)`. A column
    the table lacks, or several matching rows, raise ConfigError naming the result."""
    arrow: pa.Table = table if isinstance(table, pa.Table) else table.to_arrow()
    names = set(arrow.column_names)
    for col in (*result.where, result.column):
        if col not in names:
            raise ConfigError(f"paper result {result.name!r}: table {result.table} has no column {col!r}")
    # Only the `where` columns as Python values (a report reads hundreds of results per table).
    keys = arrow.select(list(result.where)).to_pydict()
    matches = [i for i in range(arrow.num_rows) if all(keys[k][i] == v if v is not None else keys[k][i] is None
                                                       for k, v in result.where.items())]
    if not matches:
        return RunValue(produced=False)
    if len(matches) > 1:
        raise ConfigError(f"paper result {result.name!r}: {len(matches)} rows of {result.table} match "
                          f"{json.dumps(result.where)}; add the columns that tell them apart to `where`")
    row = arrow.slice(matches[0], 1).to_pylist()[0]
    low = high = None
    for pair in INTERVAL_COLUMNS:
        lo, hi = pair.format(column=result.column).split("/")
        if lo in names and hi in names:
            low, high = _scaled(row[lo], result.scale), _scaled(row[hi], result.scale)
            break
    n = next((row[c] for c in COUNT_COLUMNS if c in names), None)
    episodes = row.get(EPISODES_COLUMN)
    return RunValue(produced=True, value=_scaled(row[result.column], result.scale), low=low, high=high,
                    n=None if n is None else int(n), episodes=None if episodes is None else int(episodes))
