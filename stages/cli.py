"""`mempipe`: the framework's command line (`pipeline/cli.py`) over this project's stages."""

from __future__ import annotations

import sys
from typing import Any

import stages
from pipeline import cli
from stages.report import compared_sheets
from stages.scaffold import add_new_method_command
from stages.scorers import scorer


class _Project:
    """The App the framework's CLI runs: `stages`' entry points, plus the paper sheets the report
    compares a run with (`report.compare_with`), which `mempipe check` lists too, and the scorer behind
    each sheet result."""

    compared_sheets = staticmethod(compared_sheets)
    scorer = staticmethod(scorer)
    add_commands = staticmethod(add_new_method_command)

    def __getattr__(self, name: str) -> Any:
        return getattr(stages, name)


def main(argv: list[str] | None = None) -> int:
    return cli.main(_Project(), argv)


if __name__ == "__main__":
    sys.exit(main())
