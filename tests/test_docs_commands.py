"""Every concrete `mempipe` command in the README's and the docs' code blocks and in the configs'
header comments is one the CLI accepts, and its config and `--set` keys load: a renamed
flag or key fails here, not in a reader's shell. (Running them is left to the tests and benches
that exercise each command; synopsis lines with [optional] parts or | choices and lines eliding
arguments with "..." are not concrete and are skipped.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

import stages
from pipeline.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.DOTALL)


def _concrete(line: str) -> str | None:
    line = line.strip().removeprefix("$ ").removeprefix("#").strip()
    if not line.startswith("mempipe ") or any(mark in line for mark in ("...", "[", "|", "<", "CONFIG")):
        return None
    return line.split(" #", 1)[0].strip()


def command_lines() -> list[tuple[str, str]]:
    """(file, command) for each `mempipe ...` line in a fenced block (continuation lines joined) or
    in the configs' header comments."""
    out: dict[tuple[str, str], None] = {}
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "configs").glob("*.yaml"))]
    for doc in docs:
        text = doc.read_text()
        blocks = FENCE.findall(text)
        if doc.suffix == ".yaml":  # commands in the header's comments: `#   mempipe run -c ...`
            blocks = ["\n".join(line.lstrip()[1:] for line in text.splitlines() if line.lstrip().startswith("#"))]
        lines = [line for block in blocks for line in re.sub(r"\\\n\s*#?", " ", block).splitlines()]
        if doc.suffix == ".yaml":  # and the fetch command each header names: "# Data: `mempipe data fetch msc`"
            lines += re.findall(r"`(mempipe data fetch [^`]+)`", blocks[0])
        for line in lines:
            command = _concrete(line)
            if command:
                out[str(doc.relative_to(ROOT)), command] = None
    return list(out)


COMMANDS = command_lines()


def test_the_docs_hold_commands_to_check() -> None:
    assert len(COMMANDS) >= 20 and any(c.startswith("mempipe data fetch") for _, c in COMMANDS)
    assert any(doc.startswith("configs/") for doc, _ in COMMANDS)


@pytest.mark.parametrize("doc,command", COMMANDS, ids=[f"{d}:{c[:60]}" for d, c in COMMANDS])
def test_each_command_parses_and_its_config_loads(doc: str, command: str) -> None:
    args = build_parser().parse_args(shlex.split(command)[1:])
    config = getattr(args, "config", None)
    if config is not None or getattr(args, "set", None):
        stages.load_config(ROOT / config if config else None, args.set)
