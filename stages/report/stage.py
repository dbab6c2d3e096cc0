"""report: summary tables (Parquet) and `report.md` + `report.html` with plots: every method's
cost beside its quality, judge win rates with p-values, answer judges, reference metrics per
dataset and category, memory quality, segmentation and retrieval, the run beside the papers it
reproduces or is compared with (`paper:` sheets), why wrong answers failed (write, retrieval or
read: the `diagnose` stage's buckets), and the per-probe rows.
Every judged number carries its judge model and prompt fingerprint; every interval it shows first
resamples whole episodes (stages/report/tables.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow as pa
from pydantic import Field

from pipeline.artifacts import StageDir
from pipeline.config import PathField, Section, under_cwd
from pipeline.errors import ConfigError
from pipeline.manifest import Manifest
from pipeline.reproduction import PaperSheet, load_sheet
from pipeline.stage import GlobalStage, StageContext
from stages.report import diagnosis, memory_accuracy, plots, render, tables
from stages.report import pairwise as pairwise_report
from stages.judging.base import JUDGE_ROLE
from stages.method_stages import memory_stage_name, respond_stage_name
from stages.method_stages.respond import RESPONSES
from stages.methods.base import Method, ReportPanel

if TYPE_CHECKING:
    from pipeline.storage import Location

REPORT_MD = "report.md"
REPORT_HTML = "report.html"
# How the report's intervals are made, said once in the leaderboard.
INTERVALS = ("Intervals resample whole episodes (an episode-level cluster bootstrap), because one conversation's "
             "questions are not independent, so they are wide when n comes from few episodes and absent with one. "
             "The intervals and tests that treat every item as independent stay in the tables as extra columns "
             "(`*iid*`, `mcnemar_p`, `sign_p`).")


class ReportSettings(Section):
    max_probe_rows: int = Field(default=300, ge=0)  # per-probe rows shown (all are in the Parquet tables)
    text_chars: int = Field(default=240, ge=20)  # request / response text shown per cell
    # Other configs (relative paths: from the working directory, else beside the config or in its
    # project) whose `paper:` blocks the run is compared with: the report's Reproduction section lists
    # their numbers and the run's deviations.
    compare_with: list[str] = PathField(default_factory=list, lookup=True)


def compared_sheets(cfg: Any) -> list[tuple[str, PaperSheet | None]]:
    """(file, its `paper:` sheet or None when it has none) for each of `report.compare_with`; the file
    named as given when it is under the working directory (configs/x.yaml), else in full."""
    out = []
    for path in cfg.report.compare_with:
        if not Path(path).exists():
            raise ConfigError(f"report.compare_with: no such file {path}{cfg.report.looked_in(path)}")
        out.append((under_cwd(path), load_sheet(path)))
    return out



def run_sheets(cfg: Any) -> list[tuple[str, PaperSheet]]:
    """The sheets the run's report compares it with: its own `paper:` block, then the compared
    files' (those without a block left out)."""
    own = [("this run's config", cfg.paper)] if cfg.paper is not None else []
    return own + [(path, sheet) for path, sheet in compared_sheets(cfg) if sheet is not None]


def reproduction_section(summary: pl.DataFrame, unsheeted: list[str]) -> render.Section | None:
    """The report's Reproduction section from `reproduction_summary`: per sheet, its results beside
    the run's, then the run's deviations from its protocol. None when there is no sheet."""
    if summary.is_empty() and not unsheeted:
        return None

    def num(v: float | None) -> str:
        return "" if v is None else f"{v:.4g}"

    shown: list[tuple[str, pl.DataFrame]] = []
    for (sheet, origin), rows in summary.group_by(["sheet", "origin"], maintain_order=True):
        results = rows.filter(pl.col("kind") == "result")
        shown.append((f"{sheet} ({origin})", pl.DataFrame({
            "result": results["name"], "paper": results["paper"], "source": results["source"],
            "run": [num(r["run"]) + (f" [{num(r['run_low'])}, {num(r['run_high'])}]" if r["run_low"] is not None
                                     else "") if r["produced"] else "not produced"
                    for r in results.iter_rows(named=True)],
            "n": results["n"], "episodes": results["episodes"], "difference": results["difference"],
            "looked_up": results["looked_up"], "scorer": results["scorer"]},
            schema_overrides={"n": pl.Int64, "episodes": pl.Int64, "paper": pl.Float64, "difference": pl.Float64})))
        off = rows.filter(pl.col("kind") == "deviation")
        shown.append((f"Where this run differs from {sheet}'s protocol ({off.height})", pl.DataFrame({
            "setting": off["name"], "run": off["run_setting"], "paper": off["paper_setting"],
            "source": off["source"]})))
    intro = ("The paper's numbers beside this run's, each looked up in the report table, row and column the "
             "sheet (`paper:` block) names, scaled as the paper prints it (interval, n and episodes as that table "
             "gives them: the interval is the episode-level cluster bootstrap, so it is wide when n comes from few "
             "episodes, and missing with one), with the scorer that computed it (library, convention and whose: "
             "the paper's own scorer for every score); `not produced`: the run wrote no such row. Below each, every "
             "protocol setting where this run differs from the paper's (`mempipe check` lists them before a run).")
    if unsheeted:
        intro += " Compared configs with no `paper:` block yet: " + ", ".join(unsheeted) + "."
    return render.Section("Reproduction", intro, shown)


def _frame(inputs: dict[str, pa.Table], key: str) -> pl.DataFrame:
    return pl.from_arrow(inputs[key]) if key in inputs else pl.DataFrame()  # type: ignore[return-value]


def stage_usage(manifests: dict[str, Manifest], stages: list[str]) -> dict[str, float]:
    """LLM usage (tables.USAGE_KEYS) summed over the roles of the given stages' manifests."""
    out: dict[str, float] = {k: 0 for k in tables.USAGE_KEYS}  # counts stay integers
    for m in (manifests[s] for s in stages if s in manifests):
        for k, v in m.usage_total().items():
            out[k] += v or 0
        out["cached_prompt_tokens"] += sum(u.cached_prompt_tokens for u in (m.llm_usage or {}).values())
    return out


def run_manifests(run_dir: Location, given: dict[str, Manifest]) -> dict[str, Manifest]:
    """`given` (the report's inputs') and those of every stage upstream of them, transitively, read
    from the run directory where the manifest is the one that fed them (its fingerprint as recorded
    downstream): the segmenter, TeaBag or the embedder cost money though the report reads none of
    their rows. In pipeline order: each stage after those it read."""
    found = dict(given)
    todo = [kv for m in given.values() for kv in m.upstream.items()]
    while todo:
        name, fingerprint = todo.pop()
        if name in found:
            continue
        m = StageDir(run_dir, name).manifest()
        if m is not None and m.fingerprint == fingerprint:
            found[name] = m
            todo += m.upstream.items()
    out: dict[str, Manifest] = {}

    def place(name: str) -> None:
        if name in found and name not in out:
            for up in found[name].upstream:
                place(up)
            out[name] = found[name]

    for name in sorted(found, key=lambda n: found[n].timings.finished_at):
        place(name)
    return out


def probe_rows(probes: pl.DataFrame, responses: pl.DataFrame, answers: pl.DataFrame, metrics: pl.DataFrame,
               limit: int, chars: int, buckets: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per (probe, method): what was asked, the gold, the response, its scores and (`buckets`:
    the diagnose stage's rows, when the run has them) its bucket."""
    if responses.is_empty():
        return pl.DataFrame()
    keys = ["episode_id", "probe_id", "method"]
    out = responses.select([*keys, "response", "context_tokens", "error"]).join(
        probes.select(["episode_id", "probe_id", "kind", "request", "gold"]), on=["episode_id", "probe_id"], how="left")
    if not answers.is_empty():
        wide = answers.pivot(on="judge", index=keys, values="score", aggregate_function="first")
        out = out.join(wide, on=keys, how="left")
    if not metrics.is_empty():
        out = out.join(metrics.select([*keys, "token_f1", "rougeL"]), on=keys, how="left")
    if buckets is not None and not buckets.is_empty():
        out = out.join(buckets.select([*keys, "bucket"]), on=keys, how="left")
    cut = [pl.col(c).str.slice(0, chars) for c in ("request", "gold", "response") if c in out.columns]
    ordered = ["episode_id", "probe_id", "kind", "request", "gold", "method", "response"]
    out = out.with_columns(cut).sort(["episode_id", "probe_id", "method"])
    return out.select(ordered + [c for c in out.columns if c not in ordered]).head(limit)


def _cut(v: Any, chars: int) -> Any:
    return v[:chars] + "…" if isinstance(v, str) and len(v) > chars else v


def _answer_verdict(r: dict[str, Any]) -> str:
    """An answer judgment as the browser shows and filters it: "secom strict correct", "secom gpt4score 70"."""
    if r.get("error") or (r["score"] is None and not r.get("skipped")):
        return f"{r['method']} {r['judge']} failed"
    if r.get("skipped"):
        return f"{r['method']} {r['judge']} skipped"
    if r["judge"] == "gpt4score":
        return f"{r['method']} gpt4score {r['score']:.0f}"
    return f"{r['method']} {r['judge']} {'correct' if r['score'] >= 1 else 'incorrect'}"


def _pair_verdict(r: dict[str, Any]) -> str:
    if r.get("error") or r["preferred"] is None:
        return f"{r['reference']} vs {r['other']} failed"
    return {"reference": f"{r['reference']} beats {r['other']}", "other": f"{r['other']} beats {r['reference']}"}.get(
        r["preferred"], f"{r['reference']} ties {r['other']}")


def probe_browser_data(probes: pl.DataFrame, responses: pl.DataFrame, answers: pl.DataFrame,
                       pairwise: pl.DataFrame, limit: int, chars: int, context_turns: int = 6,
                       buckets: pl.DataFrame | None = None) -> list[dict[str, Any]]:
    """The probe browser's records, one per probe that has a response (the first `limit` by episode and
    probe): its context (last `context_turns` turns the probe carries), request, gold, each method's
    response with its memory ids, `details_json` excerpt and (`buckets`: the diagnose stage's rows) its
    bucket with the shares of evidence written and retrieved, and every answer and head-to-head judgment
    with its reason. `verdicts` lists the outcomes the browser filters on ("secom bucket misread" among
    them). Text is cut to `chars`."""
    if responses.is_empty() or probes.is_empty():
        return []
    keys = ["episode_id", "probe_id"]

    def by_probe(df: pl.DataFrame) -> dict[tuple[str, str], list[dict[str, Any]]]:
        out: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in df.iter_rows(named=True) if not df.is_empty() else ():
            out.setdefault((r["episode_id"], r["probe_id"]), []).append(r)
        return out

    answered, judged, paired = by_probe(responses), by_probe(answers), by_probe(pairwise)
    diagnosed = diagnosis.by_response(buckets if buckets is not None else pl.DataFrame())
    no_bucket = {"bucket": None, "evidence_written": None, "evidence_retrieved": None}
    datasets = {r["episode_id"]: r["dataset"] for rows in (*judged.values(), *paired.values()) for r in rows}
    records = []
    for p in probes.sort(keys).iter_rows(named=True):
        key = (p["episode_id"], p["probe_id"])
        if key not in answered:
            continue
        if len(records) >= limit:
            break
        ans = [{"method": r["method"], "judge": r["judge"], "score": r["score"], "verdict": _answer_verdict(r),
                "reason": _cut(r.get("reason") or r.get("error") or r.get("skipped"), chars)}
               for r in sorted(judged.get(key, []), key=lambda r: (r["method"], r["judge"]))]
        pw = [{"reference": r["reference"], "other": r["other"], "criterion": r["criterion"],
               "first": r["reference"] if r["reference_first"] else r["other"], "sample": r["sample"],
               "preferred": r["preferred"] or "failed", "verdict": _pair_verdict(r),
               "reason": _cut(r.get("reason") or r.get("error"), chars)}
              for r in sorted(paired.get(key, []), key=lambda r: (r["other"], r["criterion"], not r["reference_first"]))]
        resp = [{"method": r["method"], "response": _cut(r["response"], chars), "error": _cut(r.get("error"), chars),
                 "memory_ids": (r.get("memory_ids") or [])[:20], "context_tokens": r.get("context_tokens"),
                 "details": _cut(r.get("details_json"), chars),
                 **diagnosed.get((*key, r["method"]), no_bucket)}
                for r in sorted(answered[key], key=lambda r: r["method"])]
        records.append({
            "episode_id": p["episode_id"], "probe_id": p["probe_id"], "dataset": datasets.get(p["episode_id"], ""),
            "session": p["session_idx"], "kind": p["kind"], "category": p.get("category"),
            "request": _cut(p["request"], chars), "gold": _cut(p.get("gold"), chars),
            "context": [[t["speaker"], _cut(t["text"], chars)] for t in (p.get("context") or [])[-context_turns:]],
            "responses": resp, "answers": ans, "pairwise": pw,
            "verdicts": sorted({a["verdict"] for a in ans if "gpt4score" not in a["verdict"]}
                               | {x["verdict"] for x in pw} | {f"{r['method']} failed" for r in resp if r["error"]}
                               | {f"{r['method']} bucket {r['bucket']}" for r in resp if r["bucket"]})})
    return records


def teabag_rows(questions: pl.DataFrame, limit: int, chars: int) -> pl.DataFrame:
    """The TeaBag questions of the run, one row each (failed ones with their reason)."""
    if questions.is_empty():
        return questions
    cols = ["question_id", "asker", "answerer", "question", "false_premise", "answer", "evidence_sessions",
            "checked", "attempts", "error"]
    cut = [pl.col(c).str.slice(0, chars) for c in ("question", "false_premise", "answer", "error")]
    return questions.select(cols).with_columns(cut).sort("question_id").head(limit)


def _pairwise_intro(pairwise: pl.DataFrame) -> str:
    if pairwise.is_empty():
        return "No head-to-head judgments in this run."
    protocol = pairwise["protocol"][0]
    how = ("SeCom App. A.4's protocol: each pair judged in both orders (reference shown first, then second); a "
           "preference that flips with the order counts as a tie" if protocol == "both_orders"
           else "CREEM's protocol: the reference's position drawn per sample (seeded), N samples per item, "
                "majority vote, no tie")
    return (f"Win / tie / loss of the reference method against each other method ({how}); `win_share` = wins / "
            "(wins + losses), the figure Theanine's Table 1 and CREEM's Tables 3-4 report, with a 95% interval that "
            "resamples whole episodes (`episodes` beside `pairs`); p (`p_value`) is a paired cluster permutation test "
            "of wins against losses that flips each episode's wins and losses together. `win_share_iid_*` (Wilson) "
            "and `sign_p` (the sign test) treat every pair as independent. Rows with an empty session are the whole "
            "dataset; `all` pools the datasets. `past_shown`: the judge saw the earlier sessions. "
            + pairwise_report.MULTIPLICITY_NOTE)


# A figure of the report as a section's figures: [(file, alt text)] when it was drawn, else [].
Figure = Callable[[str, str], list[tuple[str, str]]]


def _quality_column(methods: pl.DataFrame) -> str:
    """The quality measure the cost plot sets against context tokens: gpt4score where judged, else token F1."""
    return next((q for q in ("gpt4score", "token_f1") if q in methods.columns and methods[q].drop_nulls().len()),
                "token_f1")


def _draw_figures(t: dict[str, pl.DataFrame], quality: str, out: Path) -> dict[str, bool]:
    """Draw the report's figures into `out` from the summary tables `t`: file name -> whether drawn."""
    teafarm = t["teafarm_summary"].filter(pl.col("dataset") == "all")
    return {
        "win_rates.png": plots.win_rates(t["pairwise_summary"], out / "win_rates.png"),
        "accuracy_per_cost.png": plots.accuracy_per_cost(t.get("question_costs", pl.DataFrame()),
                                                         out / "accuracy_per_cost.png"),
        "cost_quality.png": plots.cost_quality(tables.whole_run_rows(t["method_summary"]), quality,
                                               out / "cost_quality.png"),
        "teafarm.png": plots.bars_by_method({r["method"]: r["correctness"] for r in teafarm.iter_rows(named=True)},
                                            out / "teafarm.png", "TeaFarm correct / total", 1.0),
        "memory_quality.png": plots.memory_quality(t["memory_summary"], out / "memory_quality.png"),
        "segmentation.png": plots.segmentation(t["segmentation_summary"], out / "segmentation.png"),
        "retrieval_recall.png": plots.retrieval_recall(t["retrieval_summary"], out / "retrieval_recall.png"),
        "diagnosis.png": plots.diagnosis(diagnosis.whole_run(t.get("diagnosis", pl.DataFrame())),
                                         out / "diagnosis.png"),
    }


def _headline_sections(t: dict[str, pl.DataFrame], cfg: Any, wins: pl.DataFrame | None,
                       fig: Figure, calibration: pl.DataFrame | None = None) -> list[render.Section]:
    """The leaderboard, the reproduction of the compared papers (when any) and the head-to-head."""
    pairwise = t["pairwise_summary"]
    panel = t["robust_pairs"] if t["panel_scores"]["judge"].n_unique() > 1 else None
    board = render.leaderboard(t["method_summary"], t["answer_summary"], t["teafarm_summary"], t["metric_summary"],
                               pairwise, wins, panel, calibration)
    calibrated = (" `judge false accepts`: how often each answer judge accepted a wrong answer built on purpose "
                  "(judge_calibration; the section on the answer judges gives every kind)."
                  if calibration is not None and not calibration.is_empty() else "")
    return [
        render.Section("Leaderboard",
                       "Each method's headline numbers over the whole run (`all` when datasets are pooled): "
                       "value [95% interval] n=items ep=episodes. gpt4score 0-100 and strict correctness from the "
                       "answer judges, TeaFarm correctness, token F1 against the gold, and the method's share of "
                       "decided head-to-head pairs against the reference, pooled over criteria. " + INTERVALS
                       + calibrated + " Details in the sections below.", [("", board)],
                       table_class="leaderboard"),
        *[s for s in [reproduction_section(
            t["reproduction_summary"], [p for p, sheet in compared_sheets(cfg) if sheet is None])] if s],
        render.Section("Head-to-head (G-Eval)", _pairwise_intro(pairwise) + (
            " The matrices: the reference's win share per method and criterion over each whole dataset, "
            "green where the reference wins, red where it loses; the full table (per session too) is folded "
            "below and kept in `pairwise_summary`." if not pairwise.is_empty() else ""),
                       [("Full head-to-head table", pairwise)], fig("win_rates.png", "win rates"),
                       matrices=render.win_matrices(pairwise)),
    ]


def _cost_sections(t: dict[str, pl.DataFrame], quality: str, fig: Figure) -> list[render.Section]:
    """Cost beside quality per method, then where the money goes (when the run spent any)."""
    methods = t["method_summary"]
    return [
        render.Section("Methods: cost beside quality",
                      "LLM calls and tokens of each method's memory and respond stages (cached calls "
                      "included), memory tokens in the context, response length, and its scores.",
                      [("", methods)], fig("cost_quality.png", f"context tokens vs {quality}")),
        *([render.Section("Where the money goes",
                          "LLM cost (USD) per method: its memory and respond stages, its share of the judges "
                          "(each judged row billed to its method; head-to-head, to the non-reference one) and of "
                          f"other stages; `{tables.SHARED}`: calls made for no one method (segmentation, TeaBag, "
                          "or a stage whose manifest predates the split). Then per stage and per LLM role. "
                          "`cost_usd` counts every call, cache replays included; `spent_usd` is what this run "
                          "paid. Every (stage, role, method) row is in `cost_breakdown`.",
                          tables.cost_views(t["cost_breakdown"]))]
          if "cost_breakdown" in t and not t["cost_breakdown"].is_empty() else []),
        *([render.Section("Cost and latency per question",
                          "Per method: the tokens and dollars of building its memory spread over the probes it "
                          "answers (`build_spread` episode: each probe carries its own episode's build split over "
                          "that episode's probes, the mean over the probes shown; run: the run's build over all "
                          "its probes, where the memory stage recorded no per-episode usage), those of answering "
                          "(each answer's own calls), the seconds an answer's calls "
                          "took when they were sent (median and 95th percentile; a cached rerun reports the "
                          "first run's), and dollars per correct answer under the named correct / wrong judge "
                          "(each item's judge runs averaged). In `question_costs`.",
                          [("", t["question_costs"])], fig("accuracy_per_cost.png",
                                                           "accuracy vs USD per correct answer"))]
          if not t.get("question_costs", pl.DataFrame()).is_empty() else []),
        *([render.Section("When each stage ran",
                          "Each stage that fed this report, in the order it started, with its wall time: stages "
                          "whose inputs were done ran at the same time (the run's stage graph). In `stage_spans`.",
                          [("", t["stage_spans"])])]
          if "stage_spans" in t and not t["stage_spans"].is_empty() else []),
    ]


# What the calibration table says, beside every table of answer judges.
CALIBRATION_CAPTION = "Calibration: each judge on answers whose verdict is known (judge_calibration)"
CALIBRATION_NOTE = (" Calibration (`judge_calibration`, when the run has it): every answer judge judged answers "
                    "built from the gold whose verdict is known: accept kinds (the gold, the gold in a longer "
                    "answer, a checked paraphrase) give its false rejects, reject kinds (a shifted date, a swapped "
                    "name, a changed number, a vague answer, \"not mentioned\", the gold negated) its false accepts, "
                    "each with a 95% Wilson interval; `flagged`: false accepts above judges.calibration."
                    "max_false_accept. A judge that accepts wrong answers of a kind inflates every score it gives "
                    "on questions where methods answer that way.")


def _calibration_tables(calibration: pl.DataFrame | None) -> list[tuple[str, pl.DataFrame]]:
    return [(CALIBRATION_CAPTION, render.calibration_view(calibration))] \
        if calibration is not None and not calibration.is_empty() else []


def _answer_sections(t: dict[str, pl.DataFrame], teabag: pl.DataFrame, judges_differ: str,
                     fig: Figure, calibration: pl.DataFrame | None = None) -> list[render.Section]:
    """The answers judged against the reference, then TeaFarm (when the run asked its questions)."""
    answers = t["answer_summary"]
    calibrated = _calibration_tables(calibration)
    note = CALIBRATION_NOTE if calibrated else ""
    return [
        render.Section("Answers judged against the reference",
                      "gpt4score: 0-100 (mean); strict / lenient: share judged correct; teafarm: TeaFarm "
                      "correctness. `ci_low` / `ci_high`: 95% interval resampling whole episodes (`episodes` "
                      "beside `judged`); `iid_low` / `iid_high`: the same treating questions as independent "
                      "(Wilson for a share, bootstrap for a mean). `p_value`: paired cluster permutation test "
                      "against the reference method over episodes, on the questions both answered; `mcnemar_p`: "
                      "exact McNemar test over those questions taken as independent (`only_reference` / "
                      "`only_other`: questions only one got right). LongMemEval's `task_average` row is the mean "
                      "of its per-type scores (its official task-averaged accuracy), `abstention` its abstention "
                      "questions. Failed responses are counted in `failed`, skipped items in `skipped`; `all` "
                      "pools the datasets. " + pairwise_report.MULTIPLICITY_NOTE + " " + judges_differ + note,
                      [("", answers), *calibrated]),
        *([render.Section("Both answer keys",
                          "The run scored LoCoMo's audited answer key (corpus.answer_key: audited, "
                          "dial481/locomo-audit's corrections of its score-corrupting errors); `original` is the "
                          "same answers against the dataset's own gold, which every published LoCoMo number used. "
                          "`changed`: items whose gold the audit changed, judged against both.",
                          [("", t["answer_keys"])])]
          if not t["answer_keys"].is_empty() else []),
        *([render.Section("The judges side by side",
                          "Each method's score and rank under each answer judge (`panel_scores`: the share "
                          "judged correct, GPT4Score 0-100, LoCoMo's F1 as its mean), each judge's runs averaged "
                          "per item first. `judge_agreement`: Cohen's kappa between two judges' verdicts on the "
                          "items both judged (F1 accepts at its `accept_at`, 0.5 unless set; GPT4Score gives "
                          "no verdict), Kendall's tau between their rankings of the methods, and a `panel` row "
                          "with Krippendorff's alpha and the share of items the judges split on. `robust_pairs`: "
                          "A beats B only where every judge's paired 95% interval of A - B (whole episodes "
                          "resampled, on the questions both answered) excludes 0 on the same side; `comparisons` "
                          "counts the pairs compared, which no correction accounts for." + note,
                          [("", t["panel_scores"]), ("Agreement", t["judge_agreement"]),
                           ("Robust differences", t["robust_pairs"]), *calibrated])]
          if t["panel_scores"]["judge"].n_unique() > 1 else []),
        *([render.Section("TeaFarm (counterfactual questions)",
                         "Each question treats an outdated or false thing as true; a method is correct when its "
                         "answer does not go along with it (Theanine Table 3: correct / total; `ci_*`: 95% interval "
                         "resampling whole episodes, `iid_*`: Wilson; `p_value`: paired cluster permutation test "
                         "against the reference method over episodes, `mcnemar_p`: exact McNemar over questions "
                         "taken as independent). `all` pools every dataset. " + pairwise_report.MULTIPLICITY_NOTE,
                         [("", t["teafarm_summary"]), ("TeaBag questions", teabag)],
                         fig("teafarm.png", "TeaFarm correct / total"))]
          if not (t["teafarm_summary"].is_empty() and teabag.is_empty()) else []),
    ]


def _score_sections(t: dict[str, pl.DataFrame], implementations: pl.DataFrame, fig: Figure) -> list[render.Section]:
    """The reference metrics, CREEM's memory quality and the memory accuracy against gold (when any)."""
    return [
        render.Section("Reference metrics", "Means per dataset, probe kind, category and session (empty = all); a failed response "
                       "scores 0 (`failed` counts them); `_low` / `_high`: 95% interval resampling whole episodes "
                       "(`episodes` beside `responses`), `_iid_low` / `_iid_high`: bootstrap over responses taken "
                       "as independent. Each paper's numbers are its own scorer's: `evaluate_bleu*` (SeCom: HF "
                       "evaluate's corpus BLEU by sacrebleu), `evaluate_precision*`, `rsum_*` (RSum), `ldagent_*` "
                       "(LD-Agent: nlg-eval per reply, averaged per episode and session); the Implementations "
                       "table names the scorer of every column.",
                      [("", t["metric_summary"]), ("Implementations", implementations)]),
        render.Section("Memory quality (CREEM G-Eval, 1-5)",
                       "One rating per (episode, speaker), the mean of its samples; `score_low` / `score_high`: "
                       "95% interval resampling whole episodes (both speakers together), `score_iid_*`: bootstrap "
                       "over ratings taken as independent.", [("", t["memory_summary"])],
                      fig("memory_quality.png", "memory quality")),
        *([render.Section("Memory accuracy against gold persona summaries (RSum Table 2)",
                          "Each method's memory after session k-1 (what session k reads) against the corpus's "
                          "persona summaries of sessions 1..k-1 with RSum's scorer: precision, recall and F1 as its "
                          "`compute_f1` (`rsum_mem_f1` with a 95% bootstrap interval over episodes), BLEU-1/2 as "
                          "evaluate's precisions (`evaluate_precision1/2`); our sentence BLEU-1/2 (means); "
                          "`memory_tokens` / `gold_tokens`: mean lengths.",
                          [("", t["memory_accuracy_summary"])])]
          if not t["memory_accuracy_summary"].is_empty() else []),
    ]


def _report_header(cfg: Any, methods: Sequence[str]) -> list[str]:
    """The report's opening lines: its methods and corpus, and the model of every role."""
    roles = {r: cfg.role(r).model for r in sorted(set(cfg.roles) | {JUDGE_ROLE, "generator"})}
    corpora = "; ".join(f"`{c.format}` ({c.path})" for c in cfg.corpus.sources())
    return [f"Methods: {', '.join(methods)}; corpus {corpora}.",
            "Models by role: " + ", ".join(f"{r} = {m}" for r, m in roles.items()) + "."]


class ReportStage(GlobalStage):
    """Reads the scores, the judges, and every per-method stage of the run."""

    name = section = "report"
    settings = ReportSettings
    roles = ()
    config_keys = ("paper",)  # the run's own reproduction sheet

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
        return ctx.cfg.judge_pairwise.reference or (self.methods[0] if self.methods else None)

    def usage(self, ctx: StageContext) -> dict[str, dict[str, float]]:
        return {m: stage_usage(ctx.upstream_manifests, [respond_stage_name(m), memory_stage_name(m)])
                for m in self.methods}

    def cost_breakdown(self, ctx: StageContext) -> pl.DataFrame:
        """tables.COST_BREAKDOWN over every finished stage that fed the report."""
        owners = {stage(m): m for m in self.methods for stage in (memory_stage_name, respond_stage_name)}
        return tables.cost_breakdown(run_manifests(ctx.cfg.run_dir, ctx.upstream_manifests), owners)

    async def run(self, ctx: StageContext, inputs: dict[str, pa.Table]) -> dict[str, pa.Table]:
        settings: ReportSettings = ctx.section
        responses = pl.from_arrow(pa.concat_tables(
            [inputs[f"{respond_stage_name(m)}.responses"] for m in self.methods] or [RESPONSES.empty_table()]))
        both_keys = _frame(inputs, "judge_answers.answer_judgments")
        answers_raw = tables.run_key_rows(both_keys)  # each item once, under the run's answer key
        answers = tables.judge_runs(answers_raw)  # one row per item, its judge runs averaged
        metrics_raw = _frame(inputs, "response_metrics.response_metrics")
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
            "stage_spans": tables.stage_spans(run_manifests(ctx.cfg.run_dir, ctx.upstream_manifests)),
            "memory_accuracy_summary": self.memory_accuracy(ctx, inputs),
        }
        summaries["question_costs"] = tables.question_costs(responses, summaries["cost_breakdown"], answers_raw,
                                                            self.build_per_episode(ctx))
        buckets = _frame(inputs, "diagnose.buckets")
        summaries["diagnosis"] = tables.diagnosis_summary(buckets)
        panels = self.method_panels(inputs, responses)
        for name, schema in self.outputs.items():
            if name not in summaries and name != "reproduction_summary":  # a panel's table: the rows of every method that shows one
                summaries[name] = pl.from_arrow(pa.Table.from_pylist(
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

    def memory_accuracy(self, ctx: StageContext, inputs: dict[str, pa.Table]) -> pl.DataFrame:
        """RSum Table 2: every memory method's memory after each session against the corpus's gold
        persona summaries (the report reads `ingest` only in runs whose corpus has them: MSC)."""
        if "ingest.episodes" not in inputs:
            return memory_accuracy.memory_accuracy_summary([])
        chosen = [(m, getattr(ctx.cfg.method, m.name)) for m in self.method_objects if m.memory]
        memory = {m.name: {t: inputs[f"{memory_stage_name(m.name)}.{t}"].to_pylist() for t in m.memory
                           if f"{memory_stage_name(m.name)}.{t}" in inputs} for m, _ in chosen}
        return memory_accuracy.memory_accuracy_summary(memory_accuracy.memory_accuracy_rows(
            chosen, inputs["ingest.episodes"].to_pylist(), memory))

    def method_panels(self, inputs: dict[str, pa.Table], responses: pl.DataFrame
                      ) -> list[tuple[Method, ReportPanel]]:
        """Each method's own report section, from its memory tables and responses (`Method.report_panel`)."""
        panels = []
        for m in self.method_objects:
            memory = {t: inputs[f"{memory_stage_name(m.name)}.{t}"].to_pylist() for t in m.memory
                      if f"{memory_stage_name(m.name)}.{t}" in inputs}
            panel = m.report_panel(memory, responses.filter(pl.col("method") == m.name).to_dicts())
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
        quality = _quality_column(t["method_summary"])
        judges_differ = self.strict_vs_lenient(t["answer_summary"])
        figures = _draw_figures(t, quality, out)

        def fig(name: str, alt: str) -> list[tuple[str, str]]:
            return [(name, alt)] if figures[name] else []

        sections = [
            *_headline_sections(t, cfg, wins, fig, calibration),
            *_cost_sections(t, quality, fig),
            *_answer_sections(t, teabag, judges_differ, fig, calibration),
            *([diagnosis.section(t["diagnosis"], fig("diagnosis.png", "each method's questions by bucket"))]
              if diagnosis.STAGE in self.inputs else []),
            *_score_sections(t, implementations, fig),
            *(self.panel_section(m, p, out) for m, p in panels),
            render.Section("Segmentation", "", [("", t["segmentation_summary"])], fig("segmentation.png", "segmentation")),
            render.Section("Retrieval against gold evidence", "", [("", t["retrieval_summary"])],
                          fig("retrieval_recall.png", "evidence recall by k")),
        ]
        header = _report_header(cfg, self.methods)
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
