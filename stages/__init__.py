"""The pipeline's stages, in pipeline order, and the config model they make up.

`registry(cfg)` is what the CLI hands the runner: the run's stage graph, derived from what the
config selects (each method's `memory_<method>` and `respond_<method>`, the stages a method brings,
the judges and metrics its settings enable, the report) and what these read, in pipeline order,
each stage with `why` it is in the graph. `load_config` validates a YAML file against every stage's
and method's settings model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

from pipeline.config import RunConfig, Section, compose_config
from pipeline.errors import ConfigError
from pipeline.config import load_config as _load_config
from pipeline.engine.fingerprint import stage_fingerprints
from pipeline.engine.stage import EMBEDDER_ROLE, Stage
from pipeline.storage import Location, join
from stages.ingest import IngestStage
from stages.judging.diagnose import DiagnoseStage, uses_judge_verdicts
from stages.judging.judge_answers import JudgeAnswersStage
from stages.judging.judge_calibration import JudgeCalibrationStage
from stages.judging.judge_memory import JudgeMemoryStage
from stages.judging.judge_pairwise import JudgePairwiseStage
from stages.judging.memory_ops import MemoryOpsStage
from stages.method_stages import MethodStage
from stages.method_stages.memory import MemoryStage
from stages.methods import BROKEN_PLUGINS, METHODS
from stages.methods.base import Method
from stages.probes import ProbesStage
from stages.predictions import export_predictions  # noqa: F401 - the App's `export predictions`
from stages.report import REPORT_HTML, REPORT_MD, ReportStage
from stages.method_stages.respond import RespondStage
from stages.scoring.response_metrics import ResponseMetricsStage
from stages.scoring.score import ScoreStage
from stages.teabag import TeabagStage
from stages.teabag.export import export_teabag

# Stage classes in pipeline order around the per-method stages (a method's own stages, such as
# SeCom's segmentation and banks, come from the method: `Method.stages`).
BEFORE_METHODS: tuple[type[Stage], ...] = (IngestStage, TeabagStage, ProbesStage)
AFTER_METHODS: tuple[type[Stage], ...] = (ScoreStage, ResponseMetricsStage, JudgePairwiseStage, JudgeAnswersStage,
                                          DiagnoseStage, MemoryOpsStage, JudgeCalibrationStage, JudgeMemoryStage,
                                          ReportStage)


def method_stages(methods: Mapping[str, Method]) -> dict[str, Stage]:
    """Every stage the known methods bring, by name, in the order they bring them (a stage two
    methods bring is one stage: SeCom's three methods share its banks)."""
    out: dict[str, Stage] = {}
    for m in methods.values():
        for stage in m.stages():
            out.setdefault(stage.name, stage)
    return out


def registry(cfg: RunConfig, methods: Mapping[str, Method] = METHODS) -> dict[str, Stage]:
    """The run's stage graph, derived from what it selects: each selected method's memory and
    respond stages, the judges and metrics its settings enable, the report, and every stage these
    read, transitively (a method's own stages included); nothing nobody reads. Each stage carries
    `why` it is in the graph. `stages:` in the config then restricts this graph (the runner)."""
    chosen = [methods[name] for name in cfg.methods]
    teafarm = TeabagStage().settings_of(cfg).enabled
    readable: dict[str, Stage] = {IngestStage.name: IngestStage(), **method_stages(methods)}
    if teafarm:
        readable[TeabagStage.name] = TeabagStage()
    readable[ProbesStage.name] = ProbesStage(teafarm)
    wanted: dict[str, str] = {IngestStage.name: "the run's corpus (`mempipe export ingest` reads it)"}
    own: list[MethodStage] = [*(MemoryStage(m) for m in chosen if m.has_memory_stage), *(RespondStage(m) for m in chosen)]
    wanted.update((s.name, f"method {s.method.name}") for s in own)
    per_method: list[Stage] = list(own)
    names = tuple(cfg.methods)
    scored_answers = names if ScoreStage().settings_of(cfg).answer_retrieval else ()
    scoring: list[Stage] = [ScoreStage(scored_answers), ResponseMetricsStage(names), JudgePairwiseStage(names),
                            JudgeAnswersStage(names), JudgeCalibrationStage(),
                            JudgeMemoryStage(tuple(m.name for m in chosen if m.has_memory_stage))]
    brought = _reads(per_method, {**readable, **{s.name: s for s in per_method}})
    for stage in scoring:
        why = stage.selected_by(cfg, set(brought) | set(wanted))
        if why:
            wanted[stage.name] = why
    # After the answer judges: it reads their verdicts when one of them gives correct / wrong; with F1's
    # verdicts (no model) it needs none of them, and runs beside them.
    diagnose = DiagnoseStage(tuple(chosen), verdicts=JudgeAnswersStage.name in wanted and uses_judge_verdicts(cfg))
    if why := diagnose.selected_by(cfg, set(brought) | set(wanted)):
        wanted[diagnose.name] = why
    # What each memory operation did to the facts: diagnose's written check, at two points of the conversation.
    memory_ops = MemoryOpsStage(tuple(chosen))
    if why := memory_ops.selected_by(cfg, set(brought) | set(wanted)):
        wanted[memory_ops.name] = why
    at = next(i for i, s in enumerate(scoring) if s.name == JudgeAnswersStage.name) + 1
    scoring = [s for s in [*scoring[:at], diagnose, memory_ops, *scoring[at:]] if s.name in wanted]
    # The report reads the scoring stages of the graph (a Theanine run has no SeCom scores) and, for
    # MSC, the gold persona summaries in `ingest` that score the memories (RSum Table 2).
    gold = ["ingest"] if any(c.format == "msc" for c in cfg.corpus.sources()) and any(
        m.has_memory_stage for m in chosen) else []
    read = (*(["probes"] if chosen else []), *(["teabag"] if teafarm else []), *(s.name for s in scoring), *gold)
    in_run = tuple(n for n in read if not cfg.stages or n in cfg.stages)
    report = ReportStage(chosen, in_run)
    wanted[report.name] = "the run's report"
    roots = [*per_method, *scoring, report]
    reasons = _reads(roots, {**readable, **{s.name: s for s in roots}})
    graph = {**readable, **{s.name: s for s in roots}}
    order = [*readable, *(s.name for s in roots)]
    bringers: dict[str, list[str]] = {}
    for m in chosen:
        for stage in m.stages():
            bringers.setdefault(stage.name, []).append(m.name)
    out: dict[str, Stage] = {}
    for name in order:
        if name in wanted or name in reasons:
            stage = graph[name]
            stage.why = wanted.get(name) or reasons[name]
            if name in bringers:
                stage.why = f"method {', '.join(bringers[name])} brings it; {stage.why}"
            out[name] = stage
    return out


def _reads(roots: list[Stage], graph: Mapping[str, Stage]) -> dict[str, str]:
    """Every stage the `roots` read, directly or not, with the first reader that brought it in."""
    reasons: dict[str, str] = {}
    todo = [(root.name, i) for root in roots for i in root.inputs]
    while todo:
        reader, name = todo.pop(0)
        if name in reasons:
            continue
        if name not in graph:
            raise ConfigError(f"stage {reader} reads {name!r}, which no stage of this run or of a known "
                              f"method provides")
        reasons[name] = f"read by {reader}"
        todo += [(name, i) for i in graph[name].inputs]
    return reasons


def exporter(name: str) -> Callable[[RunConfig, Path], Path] | None:
    """The dataset export of a stage that has one (`mempipe export teabag`), else None."""
    if name == TeabagStage.name:  # checked against the run's fingerprint
        return lambda cfg, out: export_teabag(cfg.run_dir, out, cfg, fingerprint=teabag_fingerprint(cfg))
    return None


def teabag_fingerprint(cfg: RunConfig) -> str:
    """The teabag stage's fingerprint under `cfg` and the current code, as the runner computes it
    (also for a config that does not enable teabag, as an export's may not)."""
    plan = registry(cfg)
    plan.setdefault(TeabagStage.name, TeabagStage())
    return stage_fingerprints(cfg, plan.values())[TeabagStage.name]


def report_files(cfg: RunConfig) -> tuple[Location, Location]:
    """The run's HTML and Markdown report (URIs when the run is on an object store)."""
    out = join(cfg.run_dir, ReportStage.name)
    return join(out, REPORT_HTML), join(out, REPORT_MD)


def config_model(methods: Mapping[str, Method] = METHODS) -> type[RunConfig]:
    """Run-level sections + each stage's settings section + `method.<name>` per method."""
    sections: dict[str, type[Section]] = {}
    roles: set[str] = set()
    every: tuple[Stage | type[Stage], ...] = (*BEFORE_METHODS, *AFTER_METHODS, *method_stages(methods).values())
    for stage in every:
        roles.update(stage.roles)
        settings, section = stage.Settings, stage.section
        if settings is None or section is None:
            continue
        # A run-level section (ingest's `corpus`) is RunConfig's own: the stage only reads it.
        own = RunConfig.model_fields.get(section)
        if (own.annotation if own is not None else sections.get(section, settings)) is not settings:
            raise TypeError(f"stages disagree on the settings model of section {section!r}")
        if own is None:
            sections[section] = settings
    for m in methods.values():
        roles.update((m.build_role, m.answer_role) if m.memory else (m.answer_role,))
    roles.add(EMBEDDER_ROLE)  # stages that embed, when embedding.provider is openai
    return compose_config(sections, {name: m.Settings for name, m in methods.items()}, roles,
                          {n: why for n, why in BROKEN_PLUGINS.items() if n not in methods})


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                methods: Mapping[str, Method] = METHODS) -> RunConfig:
    """A YAML config with `--set` overrides, validated against every stage and method."""
    return _load_config(path, overrides, config_model(methods))
