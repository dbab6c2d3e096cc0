"""report: summary tables (Parquet) and `report.md` + `report.html` with plots: every method's
cost beside its quality, judge win rates with p-values, answer judges, reference metrics per
dataset and category, memory quality, segmentation and retrieval, the run beside the papers it
reproduces or is compared with (`paper:` sheets), why wrong answers failed (write, retrieval or
read: the `diagnose` stage's buckets), and the per-probe rows.
Every judged number carries its judge model and prompt fingerprint; every interval it shows first
resamples whole episodes (stages/report/tables.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow as pa
from pydantic import Field

from pipeline.config import PathField, Section
from pipeline.manifest import Manifest
from pipeline.engine.stage import GlobalStage, StageContext
from stages.method_stages import memory_stage_name, respond_stage_name
from stages.method_stages.respond import RESPONSES
from stages.methods.base import Method, ReportPanel
from stages.report import diagnosis, memory_accuracy, memory_ops, render, tables
from stages.report.frames import from_table
from stages.report.per_probe import probe_browser_data, probe_rows, teabag_rows
from stages.report.reproduction import compared_sheets, run_sheets
from stages.report.sections import (answer_sections, cost_sections, draw_figures, headline_sections, quality_column,
                                    report_header, score_sections)

if TYPE_CHECKING:
    from stages.judging.judge_pairwise import JudgePairwiseSettings

REPORT_MD = "report.md"
REPORT_HTML = "report.html"


class ReportSettings(Section):
    max_probe_rows: int = Field(default=300, ge=0)  # per-probe rows shown (all are in the Parquet tables)
    text_chars: int = Field(default=240, ge=20)  # request / response text shown per cell
    # Other configs (relative paths: from the working directory, else beside the config or in its
    # project) whose `paper:` blocks the run is compared with: the report's Reproduction section lists
    # their numbers and the run's deviations.
    compare_with: list[str] = PathField(default_factory=list, lookup=True)


def _frame(inputs: dict[str, pa.Table], key: str) -> pl.DataFrame:
    return from_table(inputs[key]) if key in inputs else pl.DataFrame()


def memory_tables(method: Method, inputs: dict[str, pa.Table]) -> dict[str, list[dict]]:
    """A method's memory tables (`Method.memory`) as rows, those its memory stage wrote in this run."""
    stage = memory_stage_name(method.name)
    return {t: inputs[f"{stage}.{t}"].to_pylist() for t in method.memory if f"{stage}.{t}" in inputs}


def stage_usage(manifests: dict[str, Manifest], stages: list[str]) -> dict[str, float]:
    """LLM usage (tables.USAGE_KEYS) summed over the roles of the given stages' manifests."""
    out: dict[str, float] = {k: 0 for k in tables.USAGE_KEYS}  # counts stay integers
    for m in (manifests[s] for s in stages if s in manifests):
        for k, v in m.usage_total().items():
            out[k] += v or 0
        out["cached_prompt_tokens"] += sum(u.cached_prompt_tokens for u in (m.llm_usage or {}).values())
    return out


class ReportStage(GlobalStage[ReportSettings]):
    """Reads the scores, the judges, and every per-method stage of the run."""

    name = section = "report"
    roles = ()
    config_keys = ("paper",)  # the run's own reproduction sheet
    # The cost and span tables count every stage that fed the report, also those whose rows it never
    # reads (the segmenter, TeaBag, the embedder): their manifests, not their tables.
    whole_upstream = True

    def __init__(self, methods: Sequence[Method] = (),
                 scoring: tuple[str, ...] = ("probes", "score", "response_metrics", "judge_pairwise",
                                             "judge_answers", "judge_memory")) -> None:
        self.method_objects = tuple(methods)
        self.methods = tuple(m.name for m in methods)
        self.memory_methods = tuple(m.name for m in methods if m.has_memory_stage)
        self.inputs = (*scoring, *(respond_stage_name(m) for m in self.methods),
                       *(memory_stage_name(m) for m in self.memory_methods))
        # The report's own tables, then the tables of the methods' panels (CREEM's label shares).
        self.outputs = {**tables.SUMMARY_TABLES, **dict(m.report_table for m in methods if m.report_table)}

    def extra_fingerprint(self, cfg: Any) -> dict[str, Any]:
        """The `paper:` blocks of the compared configs: editing one re-renders the report."""
        return {"compare_with": {path: sheet.model_dump(mode="json") if sheet else None
                                 for path, sheet in compared_sheets(cfg)}}

    def code_roots(self) -> tuple[str, ...]:
        """The report's modules and the methods' (whose `report_panel` draws part of it)."""
        return (type(self).__module__, *sorted({type(m).__module__ for m in self.method_objects}))

    def reference(self, ctx: StageContext) -> str | None:
        """The method the paired tests compare every other with: the head-to-head reference."""
        pairwise: JudgePairwiseSettings = getattr(ctx.cfg, "judge_pairwise")  # the section compose_config adds
        return pairwise.reference or (self.methods[0] if self.methods else None)

    def usage(self, ctx: StageContext) -> dict[str, dict[str, float]]:
        return {m: stage_usage(ctx.upstream_manifests, [respond_stage_name(m), memory_stage_name(m)])
                for m in self.methods}

    def cost_breakdown(self, ctx: StageContext) -> pl.DataFrame:
        """tables.COST_BREAKDOWN over every finished stage that fed the report."""
        owners = {stage(m): m for m in self.methods for stage in (memory_stage_name, respond_stage_name)}
        return tables.cost_breakdown(ctx.upstream_manifests, owners)

    async def run(self, ctx: StageContext[ReportSettings], inputs: dict[str, pa.Table]) -> dict[str, pa.Table]:
        settings = ctx.settings
        responses = from_table(pa.concat_tables(
            [inputs[f"{respond_stage_name(m)}.responses"] for m in self.methods] or [RESPONSES.empty_table()]))
        both_keys = _frame(inputs, "judge_answers.answer_judgments")
        answers_raw = tables.run_key_rows(both_keys)  # each item once, under the run's answer key
        answers = tables.judge_runs(answers_raw)  # one row per item, its judge runs averaged
        metrics_raw = _frame(inputs, "response_metrics.response_metrics")
        memory = {m.name: memory_tables(m, inputs) for m in self.method_objects}
        memory_raw = _frame(inputs, "judge_memory.memory_judgments")
        summaries = {
            "segmentation_summary": tables.segmentation_summary(_frame(inputs, "score.segmentation_scores")),
            "retrieval_summary": tables.retrieval_summary(_frame(inputs, "score.retrieval_scores")),
            "pairwise_summary": tables.pairwise_summary(_frame(inputs, "judge_pairwise.pairwise_judgments")),
            "answer_summary": tables.answer_summary(answers_raw, reference=self.reference(ctx)),
            "teafarm_summary": tables.teafarm_summary(answers_raw, reference=self.reference(ctx)),
            "answer_keys": tables.answer_keys(both_keys),
            "panel_scores": tables.panel_scores(answers_raw),
            "judge_agreement": tables.judge_agreement(answers_raw),
            "robust_pairs": tables.robust_pairs(answers_raw),
            "memory_summary": tables.memory_summary(memory_raw),
            "metric_summary": tables.metric_summary(metrics_raw, _frame(inputs, "response_metrics.corpus_metrics")),
            "method_summary": tables.method_summary(responses, self.usage(ctx), answers, metrics_raw,
                                                       memory_raw),
            "cost_breakdown": self.cost_breakdown(ctx),
            "stage_spans": tables.stage_spans(ctx.upstream_manifests),
            "memory_accuracy_summary": self.memory_accuracy(ctx, inputs, memory),
        }
        summaries["question_costs"] = tables.question_costs(responses, summaries["cost_breakdown"], answers_raw,
                                                            self.build_per_episode(ctx))
        buckets = _frame(inputs, "diagnose.buckets")
        summaries["diagnosis"] = tables.diagnosis_summary(buckets)
        summaries["memory_ops"] = memory_ops.memory_ops_summary(_frame(inputs, "memory_ops.operations"))
        panels = self.method_panels(memory, responses)
        for name, schema in self.outputs.items():
            if name not in summaries and name != "reproduction_summary":  # a panel's table: the rows of every method that shows one
                summaries[name] = from_table(pa.Table.from_pylist(
                    [r for m, p in panels if m.report_table and m.report_table[0] == name for r in p.rows], schema))
        written = {name: tables.to_arrow(df, self.outputs[name]) for name, df in summaries.items()}
        summaries["reproduction_summary"] = tables.reproduction_summary(ctx.cfg, run_sheets(ctx.cfg), written)
        pairs_raw = _frame(inputs, "judge_pairwise.pairwise_judgments")
        self.write_report(ctx, settings, summaries, panels, probe_rows(
            _frame(inputs, "probes.probes"), responses, answers, metrics_raw, settings.max_probe_rows,
            settings.text_chars, buckets), _frame(inputs, "response_metrics.metric_implementations"),
            teabag_rows(_frame(inputs, "teabag.questions"), settings.max_probe_rows, settings.text_chars),
            probe_browser_data(_frame(inputs, "probes.probes"), responses, answers, pairs_raw,
                               settings.max_probe_rows, settings.text_chars, buckets=buckets),
            wins=tables.pooled_win_shares(pairs_raw), calibration=_frame(inputs, "judge_calibration.calibration"))
        written["reproduction_summary"] = tables.to_arrow(summaries["reproduction_summary"],
                                                          tables.REPRODUCTION_SUMMARY)
        return written

    def build_per_episode(self, ctx: StageContext) -> dict[str, dict[str, dict[str, float]]]:
        """method -> episode -> its memory stage's LLM calls and tokens on that episode (the manifest's
        `llm_per_episode`), for the methods whose manifest records them: question_costs spreads each
        episode's build over that episode's probes."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for m in self.memory_methods:
            manifest = ctx.upstream_manifests.get(memory_stage_name(m))
            per_episode = manifest.stats.get("llm_per_episode") if manifest is not None else None
            if isinstance(per_episode, dict) and per_episode:
                out[m] = per_episode
        return out

    def memory_accuracy(self, ctx: StageContext, inputs: dict[str, pa.Table],
                        memory: dict[str, dict[str, list[dict]]]) -> pl.DataFrame:
        """RSum Table 2: every memory method's memory after each session against the corpus's gold
        persona summaries (the report reads `ingest` only in runs whose corpus has them: MSC)."""
        if "ingest.episodes" not in inputs:
            return memory_accuracy.memory_accuracy_summary([])
        methods = getattr(ctx.cfg, "method")  # the `method` section compose_config adds: method.<name>
        chosen = [(m, getattr(methods, m.name)) for m in self.method_objects if m.memory]
        return memory_accuracy.memory_accuracy_summary(memory_accuracy.memory_accuracy_rows(
            chosen, inputs["ingest.episodes"].to_pylist(), {m.name: memory[m.name] for m, _ in chosen}))

    def method_panels(self, memory: dict[str, dict[str, list[dict]]], responses: pl.DataFrame
                      ) -> list[tuple[Method, ReportPanel]]:
        """Each method's own report section, from its memory tables and responses (`Method.report_panel`)."""
        panels = []
        for m in self.method_objects:
            panel = m.report_panel(memory[m.name], responses.filter(pl.col("method") == m.name).to_dicts())
            if panel is not None:
                panels.append((m, panel))
        return panels

    def write_report(self, ctx: StageContext, settings: ReportSettings, t: dict[str, pl.DataFrame],
                     panels: list[tuple[Method, ReportPanel]], probes: pl.DataFrame, implementations: pl.DataFrame,
                     teabag: pl.DataFrame, browser: list[dict[str, Any]] | None = None,
                     wins: pl.DataFrame | None = None, calibration: pl.DataFrame | None = None) -> None:
        """report.md and report.html from the summary tables `t` (and `wins`: tables.pooled_win_shares,
        the leaderboard's head-to-head column; `calibration`: judge_calibration's table, when the run has it)."""
        out = ctx.out_dir
        out.mkdir(parents=True, exist_ok=True)
        cfg = ctx.cfg
        quality = quality_column(t["method_summary"])
        judges_differ = self.strict_vs_lenient(t["answer_summary"])
        figures = draw_figures(t, quality, out)

        def fig(name: str, alt: str) -> list[tuple[str, str]]:
            return [(name, alt)] if figures[name] else []

        sections = [
            *headline_sections(t, cfg, wins, fig, calibration),
            *cost_sections(t, quality, fig),
            *answer_sections(t, teabag, judges_differ, fig, calibration),
            *([diagnosis.section(t["diagnosis"], fig("diagnosis.png", "each method's questions by bucket"))]
              if diagnosis.STAGE in self.inputs else []),
            *([memory_ops.section(t["memory_ops"])] if memory_ops.STAGE in self.inputs else []),
            *score_sections(t, implementations, fig),
            *(self.panel_section(m, p, out) for m, p in panels),
            render.Section("Segmentation", "", [("", t["segmentation_summary"])], fig("segmentation.png", "segmentation")),
            render.Section("Retrieval against gold evidence", "", [("", t["retrieval_summary"])],
                          fig("retrieval_recall.png", "evidence recall by k")),
        ]
        header = report_header(cfg, self.methods)
        title = f"Run {cfg.run_name}"
        (out / REPORT_MD).write_text(render.render_markdown(title, header, sections, probes))
        (out / REPORT_HTML).write_text(render.render_html(
            title, header, sections, probes,
            render.probe_browser(browser, settings.max_probe_rows) if browser else ""))

    @staticmethod
    def panel_section(method: Method, panel: ReportPanel, out: Path) -> render.Section:
        """A method's panel as a report section: its rows as a table, its figure drawn beside."""
        figure = f"panel_{method.name}.png"
        drawn = panel.figure is not None and panel.figure(out / figure)
        rows = [("", pl.DataFrame(panel.rows))] if panel.rows else []
        return render.Section(f"{panel.title} ({method.name})", panel.text, rows,
                              [(figure, panel.caption or panel.title)] if drawn else [])

    @staticmethod
    def strict_vs_lenient(answers: pl.DataFrame) -> str:
        """A line naming where the strict and lenient correctness judges disagree."""
        if answers.is_empty():
            return ""
        overall = answers.filter(pl.col("category").is_null() & pl.col("judge").is_in(["strict", "lenient"]))
        wide = overall.pivot(on="judge", index=["dataset", "method"], values="score", aggregate_function="first")
        if not {"strict", "lenient"} <= set(wide.columns):
            return ""
        differ = wide.filter((pl.col("strict") - pl.col("lenient")).abs() > 1e-9)
        if differ.is_empty():
            return "Strict and lenient correctness agree everywhere."
        cells = [f"{r['method']} on {r['dataset']}: strict {r['strict']:.2f} vs lenient {r['lenient']:.2f}"
                 for r in differ.iter_rows(named=True)]
        return "Strict and lenient correctness differ: " + "; ".join(cells) + "."
