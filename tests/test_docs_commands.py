"""Every concrete `mempipe` command in the README's and the docs' code blocks and in the configs'
header comments is one the CLI accepts, and its config and `--set` keys load: a renamed
flag or key fails here, not in a reader's shell. bench/docs_commands.py runs each of them against
local stand-ins. The extraction is tests/docs_commands.py (synopsis lines with [optional] parts or |
choices and lines eliding arguments with "..." are not concrete and are skipped)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

import stages
from docs_commands import command_lines
from pipeline.cli import build_parser
from stages.cli import PROJECT

ROOT = Path(__file__).resolve().parent.parent

COMMANDS = command_lines()


def test_the_docs_hold_commands_to_check() -> None:
    assert len(COMMANDS) >= 20 and any(c.startswith("mempipe data fetch") for _, c in COMMANDS)
    assert any(doc.startswith("configs/") for doc, _ in COMMANDS)


@pytest.mark.parametrize("doc,command", COMMANDS, ids=[f"{d}:{c[:60]}" for d, c in COMMANDS])
def test_each_command_parses_and_its_config_loads(doc: str, command: str) -> None:
    args = build_parser(PROJECT).parse_args(shlex.split(command)[1:])
    config = getattr(args, "config", None)
    if config is not None or getattr(args, "set", None):
        stages.load_config(ROOT / config if config else None, args.set)
