"""The type checker's reach does not shrink: `Any` and `type: ignore` in pipeline/ and stages/ stay at
or under the counts they had when mypy joined CI (issue 67), and every ignore names its error code
(mypy's `ignore-without-code` says so too; this test says it without running mypy)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Before mypy ran in .ci/run (commit a0cf78d): 918 and 67; with it passing: 900 and 25. Lower them when
# code drops an `Any` or an ignore, never raise them.
MAX_ANY = 900
MAX_IGNORES = 25

ANY = re.compile(r"\bAny\b")
IGNORE = re.compile(r"#\s*type:\s*ignore(\[[^\]]+\])?")


def _sources() -> list[Path]:
    return sorted(p for folder in ("pipeline", "stages") for p in (ROOT / folder).rglob("*.py"))


def count(sources: list[Path]) -> tuple[int, list[str]]:
    """How many lines name `Any`, and where each `type: ignore` stands (`path:line`, `!` when it has no code)."""
    anys, ignores = 0, []
    for path in sources:
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for n, line in enumerate(path.read_text().splitlines(), 1):
            anys += bool(ANY.search(line))
            for m in IGNORE.finditer(line):
                ignores.append(f"{where}:{n}{'' if m.group(1) else ' !'}")
    return anys, ignores


def test_any_and_ignores_do_not_grow() -> None:
    anys, ignores = count(_sources())
    assert anys <= MAX_ANY, f"{anys} lines name Any in pipeline/ and stages/ (at most {MAX_ANY}): type the new ones"
    assert len(ignores) <= MAX_IGNORES, f"{len(ignores)} type: ignore (at most {MAX_IGNORES}): {ignores}"


def test_every_ignore_names_its_code() -> None:
    _, ignores = count(_sources())
    assert not [i for i in ignores if i.endswith(" !")]


def test_the_counter_sees_both(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("from typing import Any\nx: Any = 1  # type: ignore\ny = 2  # type: ignore[misc]\n")
    anys, ignores = count([src])
    assert anys == 2
    assert [i.endswith(" !") for i in ignores] == [True, False]
