"""A judge panel (`judge_answers.panel`): several judges of the same answers, each a prompt we have
(strict, lenient, LongMemEval's, the LoCoMo J, LoCoMo-Plus's, MemoryAgentBench's, BEAM's rubric judge,
HaluMem's QA judge, GPT4Score) on a role of
its own, or LoCoMo's F1 as a judge that calls no model. The report compares them: each method's score and
rank under each, their agreement, and which differences every judge of the panel confirms
(stages/report/agreement.py).

Without `panel` the judges are today's: GPT4Score (`score_0_100`) and the `correctness` list, each
named by its prompt, on the `judge` role.
"""

from __future__ import annotations

from typing import Any, Literal, Sequence

from pydantic import Field

from pipeline.config import Section
from stages.judging import longmemeval
from stages.judging.base import JUDGE_ROLE
from stages.metrics import locomo_qa

F1 = "f1"
# The prompts a panel judge can use; `f1` is LoCoMo's F1 (stages/metrics/locomo_qa.py), no model.
PanelPrompt = Literal["strict", "lenient", "longmemeval", "locomo_j", "locomo_plus", "memoryagentbench", "beam",
                      "halumem", "gpt4score", "f1"]
# LoCoMo's categories as LongMemEval's question types, so that LongMemEval's judge picks its
# per-type prompt on LoCoMo: temporal questions get its temporal prompt; adversarial ones, which
# have no answer in the conversation, its abstention prompt (by their missing gold); the others its
# standard prompt, as its own single- and multi-session types do.
LOCOMO_TO_LONGMEMEVAL = {"temporal": "temporal-reasoning"}


class PanelJudge(Section):
    """One judge of the panel."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.@-]+$")  # its rows' `judge`, its column in the report
    prompt: PanelPrompt
    role: str = JUDGE_ROLE  # the LLM role it calls (`roles.<role>` sets its endpoint and model)
    # f1 only: the F1 at which an answer counts as accepted, for agreement and robust verdicts (its
    # score and rank use the F1 itself).
    accept_at: float = Field(default=0.5, gt=0, le=1)


def default_panel(correctness: Sequence[str], score_0_100: bool) -> list[PanelJudge]:
    """The judges of a run without `panel`: GPT4Score when `score_0_100`, then `correctness`."""
    return [PanelJudge(name=p, prompt=p) for p in (["gpt4score"] if score_0_100 else []) + list(correctness)]


def panel_roles(panel: list[PanelJudge]) -> list[str]:
    """The LLM roles the panel calls, in order, each once (F1 calls none)."""
    return list(dict.fromkeys(j.role for j in panel if j.prompt != F1))


def shown_category(dataset: str, category: Any, prompt: str) -> Any:
    """The category a judge's prompt is chosen by: LongMemEval's judge on LoCoMo reads LoCoMo's category
    as its question type through LOCOMO_TO_LONGMEMEVAL; every other judge the category as it is."""
    if dataset == "locomo" and prompt == longmemeval.JUDGE:
        return LOCOMO_TO_LONGMEMEVAL.get(category, category)
    return category


def f1_score(dataset: str, category: Any, response: str, gold: str | None) -> float | None:
    """An answer's F1 against the gold: LoCoMo's own scoring on LoCoMo (its per-category rules, the
    adversarial category by abstention phrases), the stemmed token F1 elsewhere; None where there is
    no gold to score against (outside LoCoMo's adversarial category)."""
    if dataset == "locomo":
        if gold is None and str(category) not in ("adversarial", "5"):
            return None
        return locomo_qa.locomo_f1(response, gold, category)
    return None if gold is None else locomo_qa.f1(response, gold)


def accepted(score: float | None, prompt: str, accept_at: float = 0.5) -> bool | None:
    """A judgment as accept / reject, for agreement and robust verdicts: F1 at or above `accept_at`; a
    correct / wrong judge's share of runs at or above one half (the majority; a tie accepts);
    GPT4Score (0-100) has no verdict here (None)."""
    if score is None or prompt == "gpt4score":
        return None
    return score >= (accept_at if prompt == F1 else 0.5)
