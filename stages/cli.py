"""`mempipe`: the framework's command line (`pipeline/cli.py`) over this project's stages."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import stages
from pipeline import cli
from pipeline.artifacts import StageDir
from pipeline.config import RunConfig
from pipeline.reproduction import PaperSheet
from pipeline.engine.stage import Stage
from pipeline.storage import Location
from stages.judging.judge_calibration import JudgeCalibrationStage
from stages.predictions import export_predictions
from stages.report import compared_sheets
from stages.report.scorers import scorer
from stages.scaffold import add_new_method_command


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


@dataclass(frozen=True)
class Project:
    """The App the framework's CLI runs (`pipeline.cli.App`), each hook named: the config, the stage
    graph, the report's files, the dataset and prediction exports, the paper sheets the report
    compares a run with (`report.compare_with`, which `mempipe check` lists too), the scorer behind
    each sheet result, and the project's own subcommands."""

    load_config: Callable[[str | Path | None, list[str] | None], RunConfig]
    registry: Callable[[RunConfig], dict[str, Stage]]
    report_files: Callable[[RunConfig], tuple[Location, Location]]
    exporter: Callable[[str], Callable[[RunConfig, Path], Path] | None]
    export_predictions: Callable[..., Path]  # (cfg, format, methods, out): the format a literal of its own
    compared_sheets: Callable[[RunConfig], list[tuple[str, PaperSheet | None]]]
    scorer: Callable[..., str | None]  # (cfg, a sheet's result)
    add_commands: Callable[[argparse._SubParsersAction], None]


PROJECT = Project(load_config=stages.load_config, registry=stages.registry, report_files=stages.report_files,
                  exporter=stages.exporter, export_predictions=export_predictions, compared_sheets=compared_sheets,
                  scorer=scorer, add_commands=add_commands)


def main(argv: list[str] | None = None) -> int:
    return cli.main(PROJECT, argv)


if __name__ == "__main__":
    sys.exit(main())
