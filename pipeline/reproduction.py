"""A reproduction sheet: the `paper:` block of a config that reproduces a paper's table.

It states the paper, the table and rows it reproduces, the protocol the paper ran (each setting as
a dotted config path with the paper's value and where the paper says it), and the paper's numbers
for the rows the run produces, each with where the run writes its own. The framework knows no
paper: it only compares a run's effective settings with the sheet and looks numbers up.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProtocolSetting(_Strict):
    """One setting the paper states: its value and where the paper says it ("Sec. 3.1", "Table 6",
    "App. B.1", "reference code: chat.py", or "inferred: <why>")."""

    value: Any
    source: str


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
    (attributes, then dict keys). A path that names nothing raises KeyError naming it."""
    parts = path.split(".")
    if parts[0] == "roles" and len(parts) >= 3:
        value: Any = cfg.role(parts[1])
        parts = parts[2:]
    else:
        value = cfg
    walked = []
    for part in parts:
        walked.append(part)
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
