"""The report's summary tables: per-item scores and judgments aggregated per method, dataset,
category, criterion and session. Pure functions over polars frames; one schema per table.

Intervals and tests are cluster-aware first: the items of one episode (a conversation's questions,
its probes, its two speakers' memory ratings) are not independent, so every interval the report
shows first (`ci_low/ci_high`, `score_low/high`, `<metric>_low/_high`, `win_share_low/high`) is an
episode-level cluster bootstrap and `p_value` a paired cluster test against the reference, with
`episodes` beside the item count. The intervals and tests that treat items as independent stay as
extra columns named `*iid*`, `mcnemar_p` and `sign_p`.

The tables live in modules by job (this module names them all, and lists every table the report
writes): answers.py (answers judged alone, TeaFarm), agreement.py (the answer judges compared), pairwise.py (head-to-head), scores.py
(segmentation, retrieval, memory ratings, response metrics), method_costs.py (cost beside quality,
where the money goes), question_costs.py (what one question costs), diagnosis.py (why answers fail:
write, retrieval, read), reproduction.py (the run beside the papers), frames.py (what they share)."""

from __future__ import annotations

from pipeline.llm.usage import SHARED
from stages.report.agreement import (JUDGE_AGREEMENT, PANEL_SCORES, ROBUST_PAIRS, judge_agreement, panel_scores,
                                     robust_pairs)
from stages.report.answers import (ANSWER_KEYS, ANSWER_SUMMARY, TASK_AVERAGE, TEAFARM_SUMMARY, answer_keys,
                                   answer_summary, judge_runs, run_key_rows, task_average, teafarm_summary)
from stages.report.diagnosis import DIAGNOSIS_SUMMARY, diagnosis_summary
from stages.report.memory_ops import MEMORY_OPS_SUMMARY
from stages.report.frames import ALL, empty, to_arrow
from stages.report.memory_accuracy import MEMORY_ACCURACY
from stages.report.method_costs import (COST_BREAKDOWN, METHOD_SUMMARY, STAGE_SPANS, USAGE_KEYS, cost_breakdown,
                                        cost_views, method_summary, stage_spans, whole_run_rows, whole_run_scope)
from stages.report.question_costs import QUESTION_COSTS, question_costs
from stages.report.pairwise import (PAIRWISE_SUMMARY, POOLED_WIN_SHARES, pair_outcomes, pairwise_summary,
                                    pooled_win_shares)
from stages.report.reproduction import REPRODUCTION_SUMMARY, reproduction_summary
from stages.report.scores import (MEMORY_SUMMARY, METRIC_SUMMARY, RETRIEVAL_SUMMARY, SEGMENTATION_SUMMARY,
                                  memory_summary, metric_summary, retrieval_summary, segmentation_summary)

__all__ = [
    "ALL", "DIAGNOSIS_SUMMARY", "diagnosis_summary", "QUESTION_COSTS", "question_costs", "ANSWER_KEYS", "ANSWER_SUMMARY", "answer_keys", "run_key_rows", "JUDGE_AGREEMENT", "PANEL_SCORES", "ROBUST_PAIRS", "judge_agreement", "panel_scores",
    "robust_pairs", "COST_BREAKDOWN", "MEMORY_SUMMARY", "METHOD_SUMMARY", "METRIC_SUMMARY",
    "PAIRWISE_SUMMARY", "POOLED_WIN_SHARES", "REPRODUCTION_SUMMARY", "RETRIEVAL_SUMMARY", "SEGMENTATION_SUMMARY",
    "SHARED", "STAGE_SPANS", "SUMMARY_TABLES", "TASK_AVERAGE", "TEAFARM_SUMMARY", "USAGE_KEYS", "answer_summary", "cost_breakdown",
    "cost_views", "empty", "judge_runs", "memory_summary", "method_summary", "metric_summary", "pair_outcomes",
    "pairwise_summary", "pooled_win_shares", "reproduction_summary", "retrieval_summary", "segmentation_summary",
    "stage_spans", "task_average", "teafarm_summary", "to_arrow", "whole_run_rows", "whole_run_scope",
]

# Every table the report writes, whatever the run's methods (methods' panels add their own).
SUMMARY_TABLES = {
    "segmentation_summary": SEGMENTATION_SUMMARY,
    "retrieval_summary": RETRIEVAL_SUMMARY,
    "method_summary": METHOD_SUMMARY,
    "cost_breakdown": COST_BREAKDOWN,
    "question_costs": QUESTION_COSTS,  # what one question costs each method, and its latency
    "stage_spans": STAGE_SPANS,
    "diagnosis": DIAGNOSIS_SUMMARY,  # why answers fail: the diagnose stage's buckets per method and category
    "memory_ops": MEMORY_OPS_SUMMARY,  # what memory operations do to the facts (stages/report/memory_ops.py)
    "pairwise_summary": PAIRWISE_SUMMARY,
    "answer_summary": ANSWER_SUMMARY,
    "answer_keys": ANSWER_KEYS,  # an audited LoCoMo run: both answer keys side by side
    "panel_scores": PANEL_SCORES,  # the answer judges side by side (stages/report/agreement.py)
    "judge_agreement": JUDGE_AGREEMENT,
    "robust_pairs": ROBUST_PAIRS,
    "memory_summary": MEMORY_SUMMARY,
    "metric_summary": METRIC_SUMMARY,
    "teafarm_summary": TEAFARM_SUMMARY,
    "memory_accuracy_summary": MEMORY_ACCURACY,  # RSum Table 2 (stages/report/memory_accuracy.py)
    "reproduction_summary": REPRODUCTION_SUMMARY,
}
