"""Which scorer computed each number a paper sheet can look up: the library and convention behind a
report table's column, and whose scorer it is ("SeCom's scorer: ...", "ours: ..."). `mempipe check` lists
them per sheet and the report's reproduction table carries them beside each paper number.

Reference metrics come from the registries beside the tables that compute them (response_metrics'
`COLUMN_SCORERS`, memory_accuracy's `MEMORY_SCORERS`); judged numbers are named by the judge and its
protocol as the run's settings choose them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stages.report.memory_accuracy import MEMORY_SCORERS
from stages.scoring.response_metrics import COLUMN_SCORERS

_ANSWER_JUDGES = {
    "locomo_j": "Mem0's scorer: evaluation/metrics/llm_judge.py's J, a gpt-4o-mini judge labelling each answer CORRECT "
                "or WRONG against the gold answer (1 for CORRECT, else 0), share judged CORRECT",
    "strict": "ours: strict correctness judge against the reference answer (share judged correct)",
    "lenient": "ours: lenient correctness judge against the reference answer (share judged correct)",
    "longmemeval": "LongMemEval's scorer: evaluate_qa.py's yes/no judge, one prompt per question type (share judged yes)",
    "locomo_plus": "LoCoMo-Plus's scorer: llm_as_judge.py's judge, one prompt per category (the cognitive one reads the "
                   "cue, not a reference), correct 1 / partial 0.5 / wrong 0, mean score",
    "memoryagentbench": "MemoryAgentBench's scorer: llm_based_eval/'s GPT-4o judges (longmemeval: LongMemEval's "
                        "yes/no judge; infbench_sum: HELMET's summary F1), each task's own mean",
    "teafarm": "Theanine's scorer: TeaFarm correctness judge (Sec. 5.1), correct / total",
    "beam": "BEAM's scorer: compute_metrics.py's gpt-4.1-mini rubric judge (nuggets), event ordering by normalised "
            "Kendall's tau-b; each ability's mean",
    "halumem": "HaluMem's scorer: evaluation.py's gpt-4o QA judge, Correct / Hallucination / Omission against the "
               "reference and the evidence memory points, share judged Correct (correct_qa_ratio(all))",
}
# BEAM's scorer per ability (a category names the ability)
_BEAM_ABILITIES = {
    "event_ordering": "BEAM's scorer: compute_metrics.py's event_ordering_score, the answer's lines aligned to the "
                      "rubric's items by a gpt-4.1-mini YES/NO equivalence check, Kendall's tau-b (scipy, variant b) "
                      "of the two orders normalised to (tau_b + 1) / 2 (report_results.py's tau_norm), mean",
    "rubric": "BEAM's scorer: compute_metrics.py's gpt-4.1-mini judge, one call per rubric nugget (1 / 0.5 / 0, read "
              "by int(), so a 0.5 counts 0), the question's score the nuggets' mean; mean per ability",
}
# MemoryAgentBench's judge per task (a category "<competency>/<source>" names the task)
_MAB_TASKS = {
    "longmemeval": "MemoryAgentBench's scorer: longmem_qa_evaluate.py's GPT-4o judge, LongMemEval's yes/no prompt per "
                   "question type (\"yes\" anywhere in the reply), share judged yes",
    "infbench_sum": "MemoryAgentBench's scorer: summarization_evaluate.py's GPT-4o judge after HELMET, fluency (0/1) x "
                    "F1 of key-point recall and sentence precision, mean over the summaries whose three replies read",
}
_PAIRWISE = {
    "both_orders": "ours, after Theanine's G-Eval (App. D): a head-to-head GPT-4 judge on Theanine's three criteria "
                   "(definitions ours; Figs. 20-22 are images), judged in both orders as SeCom App. A.4, a flipped "
                   "preference a tie; win share over decided pairs",
    "creem": "CREEM's scorer: App. B.1 head-to-head, reference position randomised, majority of the samples, no tie",
}
_COUNTS = {
    "mean_context_turns": "count: exchanges (user-agent interactions) in the response's context, mean per probe",
    "mean_context_turn_pairs": "count: SeCom Table 6's turns, per session the utterances in the response's context "
                               "halved and rounded down, summed, mean per probe",
    "mean_context_tokens": "count: cl100k tokens of the response's context, mean per probe",
    "mean_response_words": "count: whitespace words of the response, mean per probe",
}


def _gpt4score(cfg: Any) -> str:
    if cfg.judge_answers.gpt4score_mode == "memochat":
        return ("SeCom's scorer: GPT4Score with MemoChat's judge (App. A.4): related history, question and response, "
                "explanation then an integer rating, mean")
    return "ours: 0-100 rating against the reference answer, mean"


def _mab_task(where: Mapping[str, object]) -> str | None:
    """MemoryAgentBench's judge of the task a sheet result's category names, else the judge as a whole."""
    task = str(where.get("category") or "").partition("/")[2]
    return next((line for prefix, line in _MAB_TASKS.items() if task.startswith(prefix)),
                _ANSWER_JUDGES["memoryagentbench"])


def _beam_ability(where: Mapping[str, object]) -> str:
    """BEAM's scorer of the ability a sheet result's category names, else the judge as a whole."""
    category = where.get("category")
    if category is None:
        return _ANSWER_JUDGES["beam"]
    return _BEAM_ABILITIES["event_ordering" if category == "event_ordering" else "rubric"]


def _runs(cfg: Any, named: str | None) -> str | None:
    runs = cfg.judge_answers.runs
    return f"{named}; each item averaged over {runs} judge runs (s.d. across runs: run_sd)" if named and runs > 1 \
        else named


def scorer(cfg: Any, result: Any) -> str | None:
    """The scorer of one sheet result (`PaperResult`: table, column, where) under the run's settings
    `cfg`; None for a column no registry names."""
    table, column, where = result.table, result.column, result.where
    if table == "metric_summary":
        return COLUMN_SCORERS.get(column)
    if table == "memory_accuracy_summary":
        return MEMORY_SCORERS.get(column)
    if table == "answer_summary":
        judge = where.get("judge")
        named = _gpt4score(cfg) if judge == "gpt4score" else _mab_task(where) if judge == "memoryagentbench" \
            else _beam_ability(where) if judge == "beam" else _ANSWER_JUDGES.get(judge)
        return _runs(cfg, named)
    if table == "teafarm_summary":
        return _runs(cfg, _ANSWER_JUDGES["teafarm"])
    if table == "pairwise_summary":
        protocol = where.get("protocol") or cfg.judge_pairwise.protocol
        named = _PAIRWISE.get(protocol)
        if named and protocol == "both_orders":
            judge = cfg.judge_pairwise
            form = ("G-Eval's form: per-criterion evaluation steps (ours), the reasoning before the verdict"
                    if judge.reason_first else "the verdict first, then a one-sentence reason (no evaluation steps)")
            named += f"; {form}; {judge.samples or 1} sample(s) per order"
        return named
    if table == "memory_summary":
        return "CREEM's scorer: App. B.2 memory G-Eval, 1-5 per criterion, samples averaged per (episode, speaker)"
    if table == "method_summary":
        return _COUNTS.get(column)
    if table == "evolution_summary":
        return "CREEM's scorer: Table 5's share of refined insights per label (New / Redundant / Updated), counted"
    if table == "segmentation_summary":
        return "SeCom's scorer: SuperDialseg's evaluation convention (Pk, WindowDiff, F1; segment score = SeCom Eq. 3)"
    return None
