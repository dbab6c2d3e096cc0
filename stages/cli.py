"""`mempipe`: the framework's command line (`pipeline/cli.py`) over this project's stages."""

from __future__ import annotations

import sys

import stages
from pipeline import cli


def main(argv: list[str] | None = None) -> int:
    return cli.main(stages, argv)


if __name__ == "__main__":
    sys.exit(main())
