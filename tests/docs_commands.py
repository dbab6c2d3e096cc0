"""The concrete `mempipe` commands in the README's and the docs' code blocks and in the configs' header
comments: what tests/test_docs_commands.py parses and bench/docs_commands.py runs. Synopsis lines with
[optional] parts, | choices or <placeholders>, and lines eliding arguments with "...", are not
concrete and are left out (`skipped_lines` lists them); brackets inside a single-quoted argument (a
YAML value such as --set 'corpus.extra=[{format: cc, ...}]') do not count."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.DOTALL)
NOT_CONCRETE = ("...", "[", "|", "<", "CONFIG")


def _mempipe_line(line: str) -> str | None:
    line = line.strip().removeprefix("$ ").removeprefix("#").strip()
    return line.split(" #", 1)[0].strip() if line.startswith("mempipe ") else None


def _concrete(line: str) -> str | None:
    command = _mempipe_line(line)
    unquoted = re.sub(r"'[^']*'", "''", line)  # a quoted YAML value ('corpus.extra=[{...}]') is concrete
    if command is None or any(mark in unquoted for mark in NOT_CONCRETE):
        return None
    return command


def _doc_lines(root: Path = ROOT) -> list[tuple[str, str]]:
    """(file, line) for each line of a fenced block (continuation lines joined) or of the configs'
    header comments, and the fetch command each config header names."""
    found = []
    docs = [root / "README.md", *sorted((root / "docs").rglob("*.md")), *sorted((root / "configs").glob("*.yaml"))]
    for doc in docs:
        text = doc.read_text()
        blocks = FENCE.findall(text)
        if doc.suffix == ".yaml":  # commands in the header's comments: `#   mempipe run -c ...`
            blocks = ["\n".join(line.lstrip()[1:] for line in text.splitlines() if line.lstrip().startswith("#"))]
        lines = [line for block in blocks for line in re.sub(r"\\\n\s*#?", " ", block).splitlines()]
        if doc.suffix == ".yaml":  # and the fetch command each header names: "# Data: `mempipe data fetch msc`"
            lines += re.findall(r"`(mempipe data fetch [^`]+)`", blocks[0])
        found += [(str(doc.relative_to(root)), line) for line in lines]
    return found


def command_lines(root: Path = ROOT) -> list[tuple[str, str]]:
    """(file, command) for each concrete `mempipe ...` line, in file order, each pair once."""
    out: dict[tuple[str, str], None] = {}
    for doc, line in _doc_lines(root):
        command = _concrete(line)
        if command:
            out[doc, command] = None
    return list(out)


def skipped_lines(root: Path = ROOT) -> list[tuple[str, str]]:
    """(file, line) for each `mempipe ...` line left out as not concrete."""
    out: dict[tuple[str, str], None] = {}
    for doc, line in _doc_lines(root):
        command = _mempipe_line(line)
        if command and _concrete(line) is None:
            out[doc, command] = None
    return list(out)
