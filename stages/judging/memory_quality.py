"""Memory-quality G-Eval (CREEM App. B.2): one method's memory of an episode, scored 1-5 per
criterion about one speaker, averaged over N samples. Evolutionary criteria judge how memory
grows (integration, consistency, sophistication, conciseness); fundamental ones what it holds
(relevance, concreteness, diversity). The wording is ours."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from pipeline.llm.types import ChatLLM, Messages

CRITERIA = {
    "integration": ("evolutionary", "Integration: related facts about the speaker are merged into coherent "
                                    "entries instead of scattered repeats."),
    "consistency": ("evolutionary", "Consistency: the entries about the speaker agree with each other; "
                                    "outdated facts are updated rather than left contradicting newer ones."),
    "sophistication": ("evolutionary", "Sophistication: the memory captures higher-level understanding of the "
                                       "speaker (motives, patterns, changes over time), not only surface facts."),
    "conciseness": ("evolutionary", "Conciseness: the memory about the speaker says what matters without "
                                    "redundancy or filler."),
    "relevance": ("fundamental", "Relevance: what is kept about the speaker is worth remembering for future "
                                 "conversations."),
    "concreteness": ("fundamental", "Concreteness: the entries about the speaker are specific (names, dates, "
                                    "details) rather than vague."),
    "diversity": ("fundamental", "Diversity: the memory covers the many sides of the speaker's life that "
                                 "came up, not one topic only."),
}

SYSTEM = ("You rate the long-term memory a dialogue agent keeps about a person, on one criterion, from 1 "
          "(very poor) to 5 (excellent). Rate only what the memory says about that person.")
PROMPTS = {"system": SYSTEM, **{f"criterion.{k}": v[1] for k, v in CRITERIA.items()}}


class Rating(BaseModel):
    score: int = Field(ge=1, le=5)


def build_messages(criterion: str, speaker: str, memory: str) -> Messages:
    user = (f"Person: {speaker}\n\nMemory:\n{memory}\n\nCriterion. {CRITERIA[criterion][1]}\n\n"
            'Reply in JSON: {"score": 1-5}.')
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


async def rate_memory(llm: ChatLLM, criterion: str, speaker: str, memory: str, *, sample: int = 0,
                      **params: Any) -> tuple[int, str]:
    """One sample's 1-5 rating and the judge model."""
    result = await llm.chat(build_messages(criterion, speaker, memory), schema=Rating, sample=sample, **params)
    return result.parsed.score, result.model
