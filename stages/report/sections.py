"""The report's sections, in the order it shows them: the leaderboard, the reproduction and the
head-to-head; cost beside quality; the answer judges and TeaFarm; the reference metrics and memory
quality. Each builder takes the summary tables and returns `render.Section`s; the figures are drawn
once (`draw_figures`) and a section names those that were."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from stages.judging.base import JUDGE_ROLE
from stages.report import diagnosis, plots, render, tables
from stages.report import pairwise as pairwise_report
from stages.report.reproduction import compared_sheets, reproduction_section

# How the report's intervals are made, said once in the leaderboard.
INTERVALS = ("Intervals resample whole episodes (an episode-level cluster bootstrap), because one conversation's "
             "questions are not independent, so they are wide when n comes from few episodes and absent with one. "
             "The intervals and tests that treat every item as independent stay in the tables as extra columns "
             "(`*iid*`, `mcnemar_p`, `sign_p`).")


def pairwise_intro(pairwise: pl.DataFrame) -> str:
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


def quality_column(methods: pl.DataFrame) -> str:
    """The quality measure the cost plot sets against context tokens: gpt4score where judged, else token F1."""
    return next((q for q in ("gpt4score", "token_f1") if q in methods.columns and methods[q].drop_nulls().len()),
                "token_f1")


def draw_figures(t: dict[str, pl.DataFrame], quality: str, out: Path) -> dict[str, bool]:
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


def headline_sections(t: dict[str, pl.DataFrame], cfg: Any, wins: pl.DataFrame | None,
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
                       "decided head-to-head pairs against the reference, pooled over criteria. `failed=k`: k items "
                       "whose answer (or its judgment) failed; a failed answer is inside n and scored 0 (wrong) in "
                       "strict correctness, TeaFarm and token F1, and left out of the gpt4score mean (a 0-100 score "
                       "has no wrong), so a blank gpt4score reads `failed=k`. " + INTERVALS
                       + calibrated + " Details in the sections below.", [("", board)],
                       table_class="leaderboard"),
        *[s for s in [reproduction_section(
            t["reproduction_summary"], [p for p, sheet in compared_sheets(cfg) if sheet is None])] if s],
        render.Section("Head-to-head (G-Eval)", pairwise_intro(pairwise) + (
            " The matrices: the reference's win share per method and criterion over each whole dataset, "
            "green where the reference wins, red where it loses; the full table (per session too) is folded "
            "below and kept in `pairwise_summary`." if not pairwise.is_empty() else ""),
                       [("Full head-to-head table", pairwise)], fig("win_rates.png", "win rates"),
                       matrices=render.win_matrices(pairwise)),
    ]


def cost_sections(t: dict[str, pl.DataFrame], quality: str, fig: Figure) -> list[render.Section]:
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
                          "paid. `truncated_calls`, shown when any: outputs the endpoint cut at max_tokens, "
                          "taken as they stand (a structured one the cut left invalid was re-asked). Every "
                          "(stage, role, method) row is in `cost_breakdown`.",
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


def calibration_tables(calibration: pl.DataFrame | None) -> list[tuple[str, pl.DataFrame]]:
    return [(CALIBRATION_CAPTION, render.calibration_view(calibration))] \
        if calibration is not None and not calibration.is_empty() else []


def answer_sections(t: dict[str, pl.DataFrame], teabag: pl.DataFrame, judges_differ: str,
                     fig: Figure, calibration: pl.DataFrame | None = None) -> list[render.Section]:
    """The answers judged against the reference, then TeaFarm (when the run asked its questions)."""
    answers = t["answer_summary"]
    calibrated = calibration_tables(calibration)
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


def score_sections(t: dict[str, pl.DataFrame], implementations: pl.DataFrame, fig: Figure) -> list[render.Section]:
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


def report_header(cfg: Any, methods: Sequence[str]) -> list[str]:
    """The report's opening lines: its methods and corpus, and the model of every role."""
    roles = {r: cfg.role(r).model for r in sorted(set(cfg.roles) | {JUDGE_ROLE, "generator"})}
    corpora = "; ".join(f"`{c.format}` ({c.path})" for c in cfg.corpus.sources())
    return [f"Methods: {', '.join(methods)}; corpus {corpora}.",
            "Models by role: " + ", ".join(f"{r} = {m}" for r, m in roles.items()) + "."]
