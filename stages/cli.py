"""`mempipe`: the framework's command line (`pipeline/cli.py`) over this project's stages."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import stages
from pipeline import cli
from pipeline.artifacts import StageDir
from stages.judging.judge_calibration import JudgeCalibrationStage
from stages.report import compared_sheets
from stages.scaffold import add_new_method_command
from stages.report.scorers import scorer


def cmd_judges_calibrate(args: argparse.Namespace) -> int:
    """`mempipe judges calibrate`: ingest and judge_calibration, as `mempipe run --until
    judge_calibration` with the stage switched on; then where its tables are. Exits as `run` does."""
    args.set = [*args.set, "judges.calibration.enabled=true"]  # in the graph whatever the config says
    args.only, args.from_stage, args.force, args.retry_failed = [], None, [], None
    args.until, args.fail_fast = JudgeCalibrationStage.name, False
    code = cli.cmd_run(args)
    out = StageDir(cli._config(args).run_dir, JudgeCalibrationStage.name)
    for table in JudgeCalibrationStage.outputs:
        for path in out._part_files(out.table_dir(table), None):
            print(f"{table}: {path}")
    return code


def add_commands(sub: argparse._SubParsersAction) -> None:
    """The project's own subcommands: `new-method`, `judges calibrate`."""
    add_new_method_command(sub)
    judges = sub.add_parser("judges", help="the answer judges themselves: `judges calibrate`")
    which = judges.add_subparsers(dest="judges_command", required=True)
    calibrate = which.add_parser("calibrate", help="every answer judge of the run on answers whose verdict is known "
                                                   "by construction: false accepts and false rejects per kind")
    cli._common(calibrate)
    calibrate.set_defaults(func=cmd_judges_calibrate)


class _Project:
    """The App the framework's CLI runs: `stages`' entry points, plus the paper sheets the report
    compares a run with (`report.compare_with`), which `mempipe check` lists too, the scorer behind
    each sheet result, and the project's own subcommands."""

    compared_sheets = staticmethod(compared_sheets)
    scorer = staticmethod(scorer)
    add_commands = staticmethod(add_commands)

    def __getattr__(self, name: str) -> Any:
        return getattr(stages, name)


def main(argv: list[str] | None = None) -> int:
    return cli.main(_Project(), argv)


if __name__ == "__main__":
    sys.exit(main())
