"""`mempipe` command line: run, plan, status, check, report, export, cache.

The framework's half: it knows no stage. The project's stages arrive as an `App` (what `stages/`
exports), handed in by the entry point `stages/cli.py`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import traceback
from datetime import datetime, timezone
from html import escape as html_escape
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from pipeline import storage
from pipeline.artifacts import atomic_write_bytes, exists, run_lock
from pipeline.config import RunConfig, project_dirs, resolve_paths
from pipeline.corpus.fetch import add_data_command
from pipeline.model_fetch import add_models_command
from pipeline.models_needed import ModelsMissing, preflight
from pipeline.errors import PipelineError, RunStopped
from pipeline.engine.selection import Selection
from pipeline.storage import Location, is_remote
from pipeline.llm.ledger import BudgetExceeded

if TYPE_CHECKING:
    from pipeline.llm.usage import Usage
    from pipeline.reproduction import PaperSheet
    from pipeline.engine.stage import Stage


class App(Protocol):
    """What the command line needs from the project's stages."""

    def load_config(self, path: str | Path | None, overrides: list[str] | None) -> RunConfig: ...

    def registry(self, cfg: RunConfig) -> dict[str, Stage]: ...

    def report_files(self, cfg: RunConfig) -> tuple[Location, Location]: ...

    def exporter(self, name: str) -> Callable[[RunConfig, Path], Path] | None: ...

    # The reproduction sheets the run's report compares it with besides its own `paper:` block:
    # (config file, its sheet or None when it has no `paper:` block). Optional: none when absent.
    def compared_sheets(self, cfg: RunConfig) -> list[tuple[str, PaperSheet | None]]: ...

    # Which scorer computes the number a sheet's result row looks up (library, convention, whose);
    # optional: `check` lists the scorers only where the project says.
    def scorer(self, cfg: RunConfig, result: Any) -> str | None: ...

    # `mempipe export predictions`: the run's answers in the files a benchmark's official scorer reads.
    def export_predictions(self, cfg: RunConfig, fmt: str, methods: list[str] | None, out: Path) -> Path: ...

    # Optional: the project's own subcommands, added to the parser (`mempipe new-method`).
    def add_commands(self, sub: argparse._SubParsersAction) -> None: ...


def _config(args: argparse.Namespace) -> RunConfig:
    return resolve_paths(args.app.load_config(args.config, args.set), search=project_dirs(args.config))


def _selection(args: argparse.Namespace) -> Selection:
    """The selectors of `run` and `plan` (plan has no --retry-failed)."""
    return Selection(only=args.only, from_=args.from_stage, force=args.force, until=args.until,
                     retry_failed=getattr(args, "retry_failed", None))


def _runner(args: argparse.Namespace, cfg: RunConfig) -> Any:
    from pipeline.engine.runner import Runner

    return Runner(cfg, args.app.registry(cfg), fail_fast=getattr(args, "fail_fast", False))


# `mempipe run` finished, but some rows failed (an LLM error, or an exception in a method, judge or
# metric on that row): each is a row with `error` set; `status` counts them per stage.
EXIT_ROWS_FAILED = 6


def cmd_run(args: argparse.Namespace) -> int:
    cfg = _config(args)
    preflight(cfg, args.app.registry(cfg), args.config, args.set)  # a missing model offline: one line, exit 5
    runner = _runner(args, cfg)
    try:
        with run_lock(cfg.run_dir):
            outcome = runner.run(_selection(args))
    except BudgetExceeded as e:
        _mark_report_outdated(args, cfg, runner, e)
        if runner.spend is None:
            raise
        raise e.with_spend(runner.spend["total_usd"], sum(runner.spend["spent"].values())) from None
    except BaseException as e:
        _mark_report_outdated(args, cfg, runner, e)
        raise
    spent = _spend_line(runner.spend)
    width = max([12, *(len(n) for n in outcome)])
    for name, what in outcome.items():
        print(f"{name:{width}s} {what}")
    print(f"artifacts: {cfg.run_dir}")
    html, _ = args.app.report_files(cfg)
    if exists(html):
        print(f"report: {html}")
    if spent:
        print(spent)
    failed = runner.failed_rows()
    if failed:
        listed = ", ".join(f"{name} {n}" for name, n in failed.items())
        print(f"mempipe: {sum(failed.values())} row(s) failed ({listed}); each row says why in its `error` column "
              f"(`mempipe status`); exit {EXIT_ROWS_FAILED}", file=sys.stderr)
        return EXIT_ROWS_FAILED
    return 0


def _mark_report_outdated(args: argparse.Namespace, cfg: RunConfig, runner: Any, stop: BaseException) -> None:
    """A run whose stage stopped leaves the previous report in place: say so at its top, so a reader
    of the report never takes it for this attempt's. The next finished report replaces the note."""
    if runner.stopped_stage is None:  # stopped before any stage started: nothing newer than the report
        return
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    note = (f"This report predates a failed attempt ({when}): stage {runner.stopped_stage} stopped with "
            f"{type(stop).__name__}: {stop}. `mempipe status` shows it; a rerun continues from there.")
    for path in args.app.report_files(cfg):
        target = Path(str(path))
        if is_remote(path) or not target.exists():
            continue
        text = target.read_text(encoding="utf-8")
        if target.suffix == ".md":
            text = f"> **Outdated.** {note}\n\n{text}"
        else:
            banner = f'<p class="outdated" style="background:#fde8e8;padding:.6em"><b>Outdated.</b> {html_escape(note)}</p>'
            text = text.replace("<body>", f"<body>{banner}", 1) if "<body>" in text else banner + text
        with contextlib.suppress(OSError):
            atomic_write_bytes(target, text.encode("utf-8"))


def cmd_plan(args: argparse.Namespace) -> int:
    """Before any LLM call: the stages `mempipe run` would run with these selectors and why, and per
    stage and role the expected calls, tokens and cost (pipeline/plan/); also `<run_dir>/_plan.json`."""
    from pipeline.plan import PlanOptions, make_plan, render

    cfg = _config(args)
    _warn_missing_models(args, cfg)  # plan runs no model: it answers, and says what `run` will miss
    options = PlanOptions(sample=args.sample, calibrate_k=args.calibrate, like=args.like,
                          completion_fraction=args.assume_completion,
                          **{k: v for k, v in (("max_turns", args.max_turns), ("probe_cap", args.probe_cap))
                             if v is not None})
    plan = make_plan(cfg, args.app.registry, _selection(args), options,
                     say=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(plan.to_json(), indent=2) if args.json else render(plan))
    return 0


def _warn_missing_models(args: argparse.Namespace, cfg: RunConfig) -> None:
    """The preflight of `run`, as a warning: plan and check load no model themselves."""
    try:
        preflight(cfg, args.app.registry(cfg), args.config, args.set)
    except ModelsMissing as e:
        for line in str(e).splitlines():
            print(f"mempipe: warning: {line} (before `mempipe run`)", file=sys.stderr)


def _spend_line(snapshot: dict[str, Any] | None) -> str | None:
    """What this command spent on fresh LLM calls, and the run directory's total."""
    if not snapshot:
        return None
    now = sum(snapshot.get("spent", {}).values())
    return f"spent: ${now:.4f} by this command, ${snapshot.get('total_usd', now):.4f} on this run directory"


def _usage_cell(u: Usage) -> str:
    cut = f" ({u.truncated_calls} cut at max_tokens)" if u.truncated_calls else ""
    return f"{u.calls - u.cached_calls}/{u.cached_calls}/{u.failed_calls}{cut}"


def _roles_cell(per_role: dict[str, Usage] | None) -> str:
    if not per_role:
        return "-"
    return ", ".join(f"{role} {_usage_cell(u)}" for role, u in per_role.items())


def cmd_status(args: argparse.Namespace) -> int:
    """Per stage of the run's graph: its state, with the counts of the state shown (a stage in
    progress shows its own attempt's, and why it stopped; never an older published stage's)."""
    cfg = _config(args)
    runner = _runner(args, cfg)
    why = {s.name: getattr(s, "why", "") for s in runner.plan}
    rows = []
    for st in runner.status():
        m = st.manifest
        if st.state == "partial":
            state = f"partial ({st.shards_done} shards)"
            if st.failed:
                state = f"failed at {st.failed.get('failed_at', '?')} ({st.shards_done} shards done): {st.failed.get('reason', '')}"
            rows.append([st.name, state, str(st.attempt_rows), str(st.attempt_errors), "-", "-", why[st.name]])
            continue
        if m is None or st.state != "done":
            rows.append([st.name, st.state, "-", "-", "-", "-", why[st.name]])
            continue
        usage = m.usage_total()
        rows.append([st.name, st.state, str(m.rows), str(m.errors), _roles_cell(m.llm_usage),
                     str(int(usage["prompt_tokens"] + usage["completion_tokens"])), why[st.name]])
    header = ["stage", "state", "rows", "errors", "llm per role: fresh/cached/failed", "tokens", "in the run because"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print(f"run {cfg.run_name} at {cfg.run_dir}")
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


def _print_graph(plan: list[Any]) -> None:
    """The run's stages, each with why it is in the graph."""
    width = max([5, *(len(s.name) for s in plan)])
    print(f"stages of this run ({len(plan)}), each with why it is in the graph:")
    for s in plan:
        print(f"  {s.name:{width}s}  {getattr(s, 'why', '') or '-'}")


def cmd_check(args: argparse.Namespace) -> int:
    """Before anything runs: every setting where the run differs from each paper's protocol (its own
    `paper:` block, then each sheet the report compares it with), one line each, for the methods the
    run selects and the stages it holds: a sheet about none of its methods is one line, and so is a
    selected method no sheet names."""
    from pipeline.reproduction import for_run, sheet_deviations, sheet_methods

    cfg = _config(args)
    _warn_missing_models(args, cfg)
    own = args.config or "the built-in defaults"
    sheets = [("paper: block of", own, cfg.paper)] if cfg.paper is not None else []
    compared = getattr(args.app, "compared_sheets", None)
    sheets += [("compared with", path, sheet) for path, sheet in (compared(cfg) if compared else [])]
    if not sheets:
        print(f"{own} has no paper: block and compares with no paper config: nothing to check")
    selected = list(cfg.methods)
    plan = _runner(args, cfg).plan
    # Stage sections (the config's keys beyond the run-level ones and `method`) of stages this run does
    # not hold, and the roles none of its stages calls: their settings are not this run's to check.
    sections = set(type(cfg).model_fields) - set(RunConfig.model_fields) - {"method"}
    absent = sections - {getattr(s, "section", None) for s in plan}
    absent |= {f"roles.{r}" for r in {*type(cfg).known_roles, *cfg.roles}} - {f"roles.{r}" for s in plan for r in s.llm_roles(cfg)}
    covered: set[str] = set()
    for how, path, whole in sheets:
        if whole is None:
            print(f"{path}: no paper: block")
            continue
        about = sheet_methods(whole)
        covered |= about
        if about and not about & set(selected):
            print(f"{whole.title} ({how} {path}): about {', '.join(sorted(about))}, none of which this run selects")
            continue
        stages_about = {p for p in map(_section_or_role, whole.protocol) if p in sections or p.startswith("roles.")}
        if not about and stages_about and stages_about <= absent:  # e.g. SeCom's segmentation, run without it
            print(f"{whole.title} ({how} {path}): about {', '.join(sorted(stages_about))}, which this run does not hold")
            continue
        sheet = for_run(whole, selected, absent)
        found = sheet_deviations(cfg, sheet, path)
        if not found:
            print(f"{sheet.title} ({how} {path}): matches the paper's protocol ({len(sheet.protocol)} settings)")
        else:
            print(f"{sheet.title} ({how} {path}): {len(found)} of {len(sheet.protocol)} settings differ")
            for d in found:
                print(f"  {d}")
        _print_scorers(args.app, cfg, sheet)
    if any(sheet is not None for _, _, sheet in sheets):
        for method in selected:
            if method not in covered:
                print(f"{method}: no paper sheet names it (a paper: block or a report.compare_with config); "
                      "nothing to compare")
    print()
    _print_graph(plan)
    return 0


def _section_or_role(path: str) -> str:
    """`segment` for `segment.k`; `roles.segmenter` for `roles.segmenter.model`."""
    parts = path.split(".")
    return ".".join(parts[:2]) if parts[0] == "roles" else parts[0]


def _print_scorers(app: Any, cfg: RunConfig, sheet: PaperSheet) -> None:
    """One line per scorer the sheet's results are computed by: the column(s), how many rows, and the scorer."""
    scorer = getattr(app, "scorer", None)
    if scorer is None or not sheet.results:
        return
    by_scorer: dict[str, list[str]] = {}
    for r in sheet.results:
        by_scorer.setdefault(scorer(cfg, r) or "unknown", []).append(f"{r.table}.{r.column}")
    print(f"  scored by ({len(sheet.results)} results):")
    for what, columns in by_scorer.items():
        named = sorted(set(columns))
        print(f"    {', '.join(named)} ({len(columns)}): {what}")


def cmd_report(args: argparse.Namespace) -> int:
    cfg = _config(args)
    html, md = args.app.report_files(cfg)
    if not exists(html):
        raise PipelineError(f"no report at {html} yet: run `mempipe run{' -c ' + args.config if args.config else ''}` first")
    if storage.is_remote(html):  # a browser opens local files: the report's folder, copied down
        local = Path(args.out or Path("reports") / cfg.run_name).resolve()
        storage.download_dir(str(html).rsplit("/", 1)[0], local)
        print(f"copied from {str(html).rsplit('/', 1)[0]}")
        html, md = local / storage.name_of(html), local / storage.name_of(md)
    print(f"report: {html}\nmarkdown: {md}")
    if args.open:
        import webbrowser

        if not webbrowser.open(html.as_uri()):
            print("mempipe: no browser to open it with here; open the file above", file=sys.stderr)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from pipeline.artifacts import StageDir
    from pipeline.export import export_stage

    cfg = _config(args)
    if args.name == "predictions":  # the answers in the official scorers' files, not a stage's tables
        if args.format is None:
            raise PipelineError("export predictions needs --format locomo|longmemeval")
        out = args.app.export_predictions(cfg, args.format, args.methods, Path(args.out))
        print(f"exported {args.format} predictions to {out}")
        return 0
    if args.format or args.methods:
        raise PipelineError("--format and --method belong to `mempipe export predictions`")
    dataset = args.app.exporter(args.name)  # a stage that ships a dataset (tables + card) exports it so
    out = dataset(cfg, Path(args.out)) if dataset else export_stage(StageDir(cfg.run_dir, args.name), Path(args.out))
    print(f"exported {args.name} to {out}")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    from pipeline.llm.cache import cache_stats, export_cache, import_cache

    cfg = _config(args)
    directory = cfg.role(args.role).cache_dir if args.role else cfg.llm.cache_dir
    if args.action == "stats":
        print(json.dumps(cache_stats(directory), indent=2))
    elif args.action == "export":
        n = export_cache(directory, args.path)
        print(f"exported {n} cached calls to {args.path}")
    else:
        n = import_cache(args.path, directory)
        print(f"imported {n} cached calls into {directory}")
    return 0


def _common(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("-c", "--config", default=None, help="YAML config (default: built-in defaults)")
    sp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    sp.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")


def _selectors(sp: argparse.ArgumentParser) -> None:  # which stages: `run` and `plan` take the same
    sp.add_argument("--only", action="append", default=[], metavar="STAGE", help="run only this stage")
    sp.add_argument("--from", dest="from_stage", default=None, metavar="STAGE",
                    help="rebuild this stage and all after it")
    sp.add_argument("--force", action="append", default=[], metavar="STAGE",
                    help="rebuild this stage even if up to date")
    sp.add_argument("--until", default=None, metavar="STAGE",
                    help="run this stage and whatever it needs that is not done")


def _add_run_and_plan(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run the pipeline (skips stages whose fingerprint matches)")
    _common(run)
    _selectors(run)
    run.add_argument("--retry-failed", default=None, metavar="STAGE",
                     help="rebuild this stage, re-asking rows whose answers were all invalid with a new sample")
    run.add_argument("--fail-fast", action="store_true",
                     help="stop at the first row that fails (an exception in a method, judge or metric, or an "
                          "LLM error), with its traceback, instead of recording it as a failed row (debugging)")
    run.set_defaults(func=cmd_run)

    plan = sub.add_parser("plan", help="before a run: the stages it would run and why, expected LLM calls, tokens, cost")
    _common(plan)
    _selectors(plan)
    plan.add_argument("--sample", type=int, default=20, metavar="K",
                      help="episodes the dry run reads at most (all when fewer), fewer while their turns exceed "
                           "--max-turns; per-episode stages are scaled by episodes, turns, sessions or questions "
                           "(default 20)")
    # Defaults: pipeline.plan's DRY_RUN_TURNS / DRY_RUN_PROBES (imported only when plan runs).
    plan.add_argument("--max-turns", type=int, default=None, metavar="N",
                      help="turns the dry run's episodes hold at most, never fewer than 2 episodes (default 1000)")
    plan.add_argument("--probe-cap", type=int, default=None, metavar="N",
                      help="probes per episode and kind the dry run answers; the run's full count scales them "
                           "(default 50)")
    plan.add_argument("--calibrate", type=int, default=None, metavar="K",
                      help="calibrate on a real run of the first K episodes (<run>-calibrate-K; its calls are cached)")
    plan.add_argument("--like", default=None, metavar="RUN_DIR", help="calibrate on the manifests of another run directory")
    plan.add_argument("--assume-completion", type=float, default=0.5, metavar="F",
                      help="without calibration, completions are F x max_tokens (default 0.5)")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON (stages, total, method)")
    plan.set_defaults(func=cmd_plan)


def _add_inspection(sub: argparse._SubParsersAction) -> None:
    """status, check, report: what a run is, would differ in, and wrote."""
    status = sub.add_parser("status", help="per stage: done / stale / partial / missing, rows, errors, LLM usage")
    _common(status)
    status.set_defaults(func=cmd_status)

    check = sub.add_parser("check", help="before a run: where it differs from each paper's protocol (paper: sheets)")
    _common(check)
    check.set_defaults(func=cmd_check)

    report = sub.add_parser("report", help="where the run's HTML and Markdown report are; --open opens it")
    _common(report)
    report.add_argument("--open", action="store_true", help="open the HTML report in a browser")
    report.add_argument("--out", help="for a run on an object store: the local folder to copy the report into "
                                      "(default reports/<run_name>)")
    report.set_defaults(func=cmd_report)


def _add_export_and_cache(sub: argparse._SubParsersAction) -> None:
    export = sub.add_parser("export", help="copy a stage's Parquet tables with a README (teabag: the TeaBag dataset with its card)")
    _common(export)
    export.add_argument("name", help="stage name, or `predictions`: the answers in LoCoMo's / LongMemEval's scorer files")
    export.add_argument("--out", required=True, help="output folder")
    export.add_argument("--format", choices=["locomo", "longmemeval", "locomo_plus", "memoryagentbench"], default=None,
                        help="predictions: whose official scorer's layout")
    export.add_argument("--method", dest="methods", action="append", default=None, metavar="M",
                        help="predictions: this method's answers (repeatable; default: every method of the run)")
    export.set_defaults(func=cmd_export)

    cache = sub.add_parser("cache", help="inspect, export or import the LLM call cache")
    cache.add_argument("action", choices=["stats", "export", "import"])
    cache.add_argument("path", nargs="?", help="Parquet file for export/import")
    cache.add_argument("--role", default=None, help="the cache of this LLM role (default: llm.cache_dir)")
    _common(cache)
    cache.set_defaults(func=cmd_cache)


def build_parser(app: "App | None" = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mempipe", description="Long-term conversational memory pipeline")
    sub = p.add_subparsers(dest="command", required=True)
    _add_run_and_plan(sub)
    _add_inspection(sub)
    _add_export_and_cache(sub)
    add_data_command(sub)
    add_models_command(sub, _common, _config)
    if app is not None and hasattr(app, "add_commands"):
        app.add_commands(sub)  # the project's own commands
    return p


def main(app: App, argv: list[str] | None = None) -> int:
    args = build_parser(app).parse_args(argv)
    args.app = app
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.command == "cache" and args.action in ("export", "import") and not args.path:
        print("mempipe: error: cache export/import needs a PATH", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except RunStopped as e:  # budget reached, endpoint down: one line, finished work kept
        print(f"mempipe: {e}", file=sys.stderr)
        return e.EXIT_CODE
    except PipelineError as e:
        if args.debug:
            traceback.print_exc()
        print(f"mempipe: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("mempipe: interrupted; finished shards are kept and a rerun resumes", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `mempipe status | head`: the reader left; nothing to say to it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's exit flush must not fail again
        return 141


if __name__ == "__main__":
    # The framework's CLI needs a project's stages (an App): `mempipe` / `python -m stages.cli` give them.
    print("mempipe: error: pipeline.cli is the framework's command line without a project; run `mempipe ...` "
          "or `python -m stages.cli ...`", file=sys.stderr)
    sys.exit(2)
