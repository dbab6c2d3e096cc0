"""G-Eval head-to-head: which of two responses is better on one criterion.

The judge sees the dialogue so far, the speaker who responds and the two responses as A and B
(CREEM's protocol also shows the raw past sessions). Criteria are Theanine's (App. D):
specificity, memorability, consistency; CREEM (App. B.1) keeps the last two. The wording is ours.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from pipeline.llm.types import ChatLLM, Messages

CRITERIA = {
    "specificity": "Specificity: the response is concrete and particular to this conversation and this "
                   "person, rather than generic small talk that would fit any chat.",
    "memorability": "Memorability: the response shows that the speaker remembers what was shared in "
                    "earlier conversations (events, plans, preferences) and uses it where it fits.",
    "consistency": "Consistency: the response agrees with everything known from the earlier "
                   "conversations and the current one; it invents nothing that contradicts them.",
}

SYSTEM = ("You compare two candidate replies in a long-term conversation between the same people. Judge "
          "only the criterion you are given; length alone is not a merit. Answer with the better reply, "
          "or tie when neither is better on this criterion.")

PROMPTS = {"system": SYSTEM, **{f"criterion.{k}": v for k, v in CRITERIA.items()}}


class PairChoice(BaseModel):
    better: Literal["A", "B", "tie"]


class PairVerdict(PairChoice):
    reason: str = Field(default="", max_length=400)


def build_messages(criterion: str, dialogue: str, speaker: str, response_a: str, response_b: str,
                   past_sessions: str | None = None, explain: bool = True) -> Messages:
    """Messages asking which of A and B is better on `criterion` for `speaker`'s next turn."""
    past = f"Earlier sessions:\n{past_sessions}\n\n" if past_sessions else ""
    user = (f"{past}Current conversation:\n{dialogue}\n\n"
            f"Two candidate next replies by {speaker}:\n[A] {response_a}\n[B] {response_b}\n\n"
            f"Criterion. {CRITERIA[criterion]}\n\n"
            'Reply in JSON: {"better": "A" | "B" | "tie"' + (', "reason": one short sentence}.' if explain else "}."))
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


async def judge_pair(llm: ChatLLM, criterion: str, dialogue: str, speaker: str, reference: str, other: str,
                     *, reference_first: bool, past_sessions: str | None = None, explain: bool = True,
                     sample: int = 0, **params: Any) -> tuple[str, str | None, str]:
    """One judgment of (reference, other) shown in the given order. Returns the preferred side
    ("reference" | "other" | "tie"), the judge's reason (None unless `explain`), and the judge model."""
    a, b = (reference, other) if reference_first else (other, reference)
    result = await llm.chat(build_messages(criterion, dialogue, speaker, a, b, past_sessions, explain),
                            schema=PairVerdict if explain else PairChoice, sample=sample, **params)
    verdict = result.parsed
    reason = getattr(verdict, "reason", None)
    if verdict.better == "tie":
        return "tie", reason, result.model
    picked_first = verdict.better == "A"
    return ("reference" if picked_first == reference_first else "other"), reason, result.model
