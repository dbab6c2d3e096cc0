"""The pipeline's stages, in pipeline order, and the config model they make up.

`registry(cfg)` is what the CLI hands the runner: the fixed stages (`teabag` only with
`teabag.enabled`), then for each method in
`cfg.methods` its `memory_<method>` (when it has memory) and `respond_<method>` stages, then
scoring, the reference metrics, the judges and the report. `load_config` validates a YAML file against every stage's and method's
settings model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

from pipeline.config import RunConfig, Section, compose_config
from pipeline.config import load_config as _load_config
from pipeline.fingerprint import stage_fingerprints
from pipeline.stage import EMBEDDER_ROLE, Stage
from pipeline.storage import Location, join
from stages.memory_units.banks import BanksStage
from stages.memory_units.compress import CompressStage
from stages.memory_units.guidance import GuidanceStage
from stages.ingest import IngestStage
from stages.judging.judge_answers import JudgeAnswersStage
from stages.judging.judge_memory import JudgeMemoryStage
from stages.judging.judge_pairwise import JudgePairwiseStage
from stages.method_stages.memory import MemoryStage
from stages.methods import BROKEN_PLUGINS, METHODS
from stages.methods.base import Method
from stages.probes import ProbesStage
from stages.predictions import export_predictions  # noqa: F401 - the App's `export predictions`
from stages.report import REPORT_HTML, REPORT_MD, ReportStage
from stages.method_stages.respond import RespondStage
from stages.scoring.response_metrics import ResponseMetricsStage
from stages.scoring.score import ScoreStage
from stages.memory_units.segment import SegmentStage
from stages.teabag import TeabagStage
from stages.teabag.export import export_teabag

# Stage classes in pipeline order around the per-method stages.
BEFORE_METHODS: tuple[type[Stage], ...] = (IngestStage, GuidanceStage, SegmentStage, CompressStage, BanksStage,
                                           TeabagStage, ProbesStage)
AFTER_METHODS: tuple[type[Stage], ...] = (ScoreStage, ResponseMetricsStage, JudgePairwiseStage, JudgeAnswersStage,
                                          JudgeMemoryStage, ReportStage)


def registry(cfg: RunConfig, methods: Mapping[str, Method] = METHODS) -> dict[str, Stage]:
    chosen = [methods[name] for name in cfg.methods]
    memory = [MemoryStage(m) for m in chosen if m.has_memory_stage]
    respond = [RespondStage(m) for m in chosen]
    teafarm = cfg.teabag.enabled
    fixed = [ProbesStage(teafarm) if cls is ProbesStage else cls() for cls in BEFORE_METHODS
             if cls is not TeabagStage or teafarm]
    stages: list[Stage] = fixed + memory + respond
    names = tuple(cfg.methods)
    scoring: list[Stage] = [ScoreStage(), ResponseMetricsStage(names), JudgePairwiseStage(names),
                            JudgeAnswersStage(names),
                            JudgeMemoryStage(tuple(m.name for m in chosen if m.has_memory_stage))]
    # The report reads the scoring stages the run includes (a Theanine run needs no SeCom scores).
    # MSC's gold persona summaries (in `ingest`) score the memories (RSum Table 2).
    gold = ["ingest"] if any(c.format == "msc" for c in cfg.corpus.sources()) and memory else []
    read = ("probes", *(["teabag"] if teafarm else []), *(s.name for s in scoring), *gold)
    in_run = tuple(n for n in read if not cfg.stages or n in cfg.stages)
    stages += [*scoring, ReportStage(chosen, in_run)]
    return {s.name: s for s in stages}


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
    for cls in (*BEFORE_METHODS, *AFTER_METHODS):
        roles.update(cls.roles)
        if cls.settings is not None and cls.section is not None:
            if sections.get(cls.section, cls.settings) is not cls.settings:
                raise TypeError(f"stages disagree on the settings model of section {cls.section!r}")
            sections[cls.section] = cls.settings
    for m in methods.values():
        roles.update((m.build_role, m.answer_role) if m.memory else (m.answer_role,))
    roles.add(EMBEDDER_ROLE)  # stages that embed, when embedding.provider is openai
    return compose_config(sections, {name: m.Settings for name, m in methods.items()}, roles,
                          {n: why for n, why in BROKEN_PLUGINS.items() if n not in methods})


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                methods: Mapping[str, Method] = METHODS) -> RunConfig:
    """A YAML config with `--set` overrides, validated against every stage and method."""
    return _load_config(path, overrides, config_model(methods))
