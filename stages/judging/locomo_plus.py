"""LoCoMo-Plus's judge (Li et al. 2026, xjtuleeyf/Locomo-Plus evaluation_framework/task_eval), as the
`locomo_plus` judge of judge_answers.

One label per answer, correct (1), partial (0.5) or wrong (0), from a prompt chosen by the question's
category; each prompt carries the elements of the release's prompt.py for that category, in our words:
- single-hop, multi-hop: a fact check against the reference answer: correct when the entities match,
  partial when the main entity is right but details are missing or slightly off, wrong otherwise;
- temporal: the time, duration or order must match the reference (equivalent wording allowed); correct
  or wrong, no partial;
- open-domain (LoCoMo's category 3, the release's "common-sense"): whether the prediction's inference is
  sound and reaches the reference's conclusion; partial when mostly right but vague;
- adversarial: the prediction alone (no reference, no evidence): correct when it says the conversation
  does not mention it; correct or wrong;
- cognitive: the cue dialogue (the evidence) and the prediction, no question and no reference: correct
  when the prediction reflects or uses the remembered cue (a memory or a constraint), wrong otherwise;
- any other category: the reference check with partial.
The question is never shown (the release's judge prompts have no question). The fact categories show
the reference, the prediction and the evidence turns ("Speaker：text" lines, the release's layout).
The judge replies in JSON {"label", "reason"}; the reply is read as the release's llm_as_judge.py reads
it (`parse_label`), an unreadable label scoring 0 with the reply kept, never a failed row.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from pipeline.llm.types import LLMResult, Messages
from stages.judging.calls import JudgeCall

JUDGE = "locomo_plus"
COGNITIVE = "cognitive"
SCORES = {"correct": 1.0, "partial": 0.5, "wrong": 0.0}

_REPLY = ('Reply with JSON only: {"label": "<one of: %s>", "reason": "<a short explanation>"}.')
_FACT = ("You check a model's answer against the reference answer of a question about a long conversation. "
         "Label it \"correct\" when it names the same entities as the reference (names, places, times), "
         "\"partial\" when it gets the main entity right but leaves out details or has small inaccuracies, and "
         "\"wrong\" when it is factually incorrect or adds details the reference does not have.")
SYSTEMS = {
    "fact": _FACT + " " + _REPLY % "correct, partial, wrong",
    "temporal": ("You check a model's answer about time against the reference answer: a date, a duration, or "
                 "the order of events. Label it \"correct\" when the time, duration or date is the reference's "
                 "(the same meaning in other words counts), and \"wrong\" when the calculation is off, the order "
                 "is reversed or the time is not the reference's. " + _REPLY % "correct, wrong"),
    "common_sense": ("You check whether a model's answer applies sound commonsense or world knowledge and "
                     "reaches the reference answer's conclusion. Label it \"correct\" when its inference is sound "
                     "and agrees with the reference, \"partial\" when the reasoning mostly holds but the conclusion "
                     "is vague or a little off, and \"wrong\" when it goes against commonsense or the reference. "
                     + _REPLY % "correct, partial, wrong"),
    "adversarial": ("The question the model answered was misleading: it asks about something the conversation "
                    "never says. Label the model's answer \"correct\" when it makes clear that this was not "
                    "mentioned in the conversation or cannot be answered from it, and \"wrong\" when it does not, "
                    "for instance when it gives a concrete answer. " + _REPLY % "correct, wrong"),
    COGNITIVE: ("You judge whether a model's reply shows awareness of something said earlier in a conversation. "
                "You see that earlier exchange (a memory, or a constraint it sets) and the reply. Label the reply "
                "\"correct\" when it takes the earlier exchange into account or is clearly linked to it, openly or "
                "implicitly, and \"wrong\" when it shows no such link. " + _REPLY % "correct, wrong"),
    "default": ("You check a model's answer against the reference answer. Label it \"correct\" when it agrees "
                "with the reference on the facts, \"partial\" when what it says is right but incomplete, and "
                "\"wrong\" when it is factually incorrect. " + _REPLY % "correct, partial, wrong"),
}
PROMPT_FOR_CATEGORY = {"single-hop": "fact", "multi-hop": "fact", "temporal": "temporal",
                       "open-domain": "common_sense", "common-sense": "common_sense", "adversarial": "adversarial",
                       COGNITIVE: COGNITIVE}
PROMPTS = {f"system.{JUDGE}.{k}": v for k, v in SYSTEMS.items()}
_LABELLED = re.compile(r"\{[^{}]*\"label\"\s*:\s*[\"']([^\"']+)[\"'][^{}]*\"reason\"\s*:\s*[\"']([^\"']*)[\"']",
                       re.DOTALL)


def prompt_kind(category: str | None) -> str:
    """The prompt a category gets (LoCoMo's five, LoCoMo-Plus's cognitive); any other: default."""
    return PROMPT_FOR_CATEGORY.get(str(category), "default")


def build_messages(kind: str, response: str, reference: str, evidence: str) -> Messages:
    """The system prompt of `kind`, then what that prompt reads: the evidence and the reply (cognitive),
    the reply alone (adversarial), else the reference, the reply and the evidence."""
    if kind == COGNITIVE:
        user = f"Earlier exchange:\n{evidence}\n\nModel reply:\n{response}"
    elif kind == "adversarial":
        user = f"Model answer:\n{response}"
    else:
        user = f"Reference answer:\n{reference}\n\nModel answer:\n{response}\n\nEvidence from the conversation:\n{evidence}"
    return [{"role": "system", "content": SYSTEMS[kind]}, {"role": "user", "content": user}]


def parse_label(text: str | None) -> str:
    """The label as llm_as_judge.py reads a reply: a JSON object with "label" then "reason" anywhere in it;
    else the reply as JSON (its "label"); else, when that fails, the first of "correct", "wrong", "partial"
    found in the lower-cased reply in that order (so "incorrect" reads as correct, as there). "" when none."""
    raw = (text or "").strip()
    m = _LABELLED.search(raw)
    if m:
        return m[1].strip()
    try:
        obj = json.loads(raw)
        if not isinstance(obj, dict):
            raise TypeError("not an object")  # the release's .get on a non-object fails into the fallback
        label = obj.get("label") or ""
        if not isinstance(label, str):
            raise TypeError("label is not text")  # the release's .strip() on it fails into the fallback
        return label.strip()
    except (ValueError, TypeError):
        low = raw.lower()
        return next((w for w in ("correct", "wrong", "partial") if w in low), "")


def score(label: str) -> float:
    """correct 1, partial 0.5, wrong 0; any other label (or none) 0."""
    return SCORES.get(label.strip().lower(), 0.0)


def judge_call(kind: str, response: str, reference: str, evidence: str) -> JudgeCall:
    """(score, the prompt kind used, the judge's raw reply, judge model) of one answer."""
    def read(result: LLMResult) -> tuple[float, str, str, str]:
        return score(parse_label(result.text)), kind, result.text, result.model

    return JudgeCall(build_messages(kind, response, reference, evidence), None, read)


def evidence_text(evidence: Sequence[str], turns: Sequence[Mapping[str, object]]) -> str:
    """The evidence turns as "Speaker：text" lines in the order the ids are given (the release's
    unified_input.py layout, its full-width colon kept); an id naming no turn is left out (the release
    writes "[id] [Missing turn]" there)."""
    by_id = {t.get("source_turn_id"): t for t in turns}
    return "\n".join(f"{by_id[i].get('speaker')}：{by_id[i].get('text')}" for i in evidence if i in by_id)


# The release's category names (unified_input.py), where ours differ.
RELEASE_CATEGORIES = {"open-domain": "common-sense", COGNITIVE: "Cognitive"}


def release_record(qa: Mapping[str, object], prediction: str, model: str,
                   turns: Sequence[Mapping[str, object]]) -> dict[str, object]:
    """One answered question as the release's evaluate_qa.py writes it for llm_as_judge.py: the question
    (a cognitive item's trigger), the evidence as "Speaker：text" lines of that episode's turns, the
    release's category name, the reference ("" where none), the prediction and the model (our method)."""
    evidence = qa.get("evidence")
    ids = [str(i) for i in evidence] if isinstance(evidence, list) else []
    own = [t for t in turns if t.get("episode_id") == qa.get("episode_id")]
    category = str(qa.get("category"))
    answer = qa.get("answer")
    return {"question_input": qa.get("question"), "evidence": evidence_text(ids, own),
            "category": RELEASE_CATEGORIES.get(category, category),
            "ground_truth": "" if answer is None else str(answer), "prediction": prediction, "model": model}
