"""Memory-quality G-Eval (CREEM App. B.2): one method's memory of an episode, scored 1-5 per
criterion about one speaker, from the dialogue and the memory, averaged over N samples.
Evolutionary criteria judge how memory grows (integration, consistency, sophistication,
conciseness); fundamental ones what it holds (relevance, concreteness, diversity).

Each definition carries every element of B.2's, reworded, about `{speaker}`. B.2 says each
criterion's prompt has its own evaluation steps but does not print them: the steps below are ours
(G-Eval style, 3-4 per criterion). The wording is ours throughout.

`build_messages` is B.2's one prompt per criterion, in G-Eval's order (criterion and steps before
the input); `build_all_messages` (ours, for small runs) asks for every criterion at once, each with
its definition and steps, in one call."""

from __future__ import annotations

from typing import Any, Literal, Sequence

from pydantic import BaseModel, Field, create_model

from pipeline.llm.types import ChatLLM, LLMError, Messages
from stages.judging.calls import RunSamples, ask_runs

# criterion -> (group, definition). B.2's elements, in our words.
CRITERIA = {
    "integration": ("evolutionary",
                    "Integration (1-5): whether the memory effectively links what was learned about {speaker} "
                    "across the different sessions and correctly reflects how details about {speaker} changed "
                    "over time. Memories that organise their content into one cohesive account spanning the "
                    "sessions should be preferred."),
    "consistency": ("evolutionary",
                    "Consistency (1-5): whether the memory holds any pieces of information about {speaker} "
                    "that contradict or conflict with each other. What it says about {speaker} should stay "
                    "coherent and free of contradictions across the whole conversation."),
    "sophistication": ("evolutionary",
                       "Sophistication (1-5): whether what the memory holds about {speaker} is advanced, going "
                       "beyond one-dimensional information about {speaker} taken directly from the conversation."),
    "conciseness": ("evolutionary",
                    "Conciseness (1-5): whether the memory about {speaker} is well organised and avoids needless "
                    "repetition and extraneous information."),
    "relevance": ("fundamental",
                  "Relevance (1-5): whether the memory is closely tied to {speaker}, the participant of this "
                  "conversation, so that its content contributes meaningfully to the conversation as it "
                  "goes on."),
    "concreteness": ("fundamental",
                     "Concreteness (1-5): whether the memory holds substantial, specific information about "
                     "{speaker}: how detailed and precise its picture of {speaker} is."),
    "diversity": ("fundamental",
                  "Diversity (1-5): whether the memory holds varied information about {speaker}, not one kind."),
}

# Ours: B.2 omits its evaluation steps ("omitted due to length").
STEPS = {
    "integration": [
        "Read the dialogue session by session; note what {speaker} reveals in each session and every detail "
        "about {speaker} that changes from one session to a later one.",
        "Read the memory and check whether it links information about {speaker} from different sessions into "
        "one account, or keeps each session's facts apart.",
        "Check that each change you noted appears correctly: the newer state as current, the older one as past "
        "or replaced.",
        "Score 5 for a cohesive account across sessions that tracks the changes correctly, 1 for scattered "
        "pieces that miss or garble them.",
    ],
    "consistency": [
        "List the statements the memory makes about {speaker}.",
        "Compare them with one another and mark every pair that contradicts or conflicts, including an old and "
        "a new state both presented as current.",
        "Use the dialogue to check whether an apparent conflict is a change the memory records as such (not a "
        "contradiction).",
        "Score 5 when nothing conflicts; lower the score for each contradiction, down to 1 when they are many "
        "or central.",
    ],
    "sophistication": [
        "Read the dialogue and note what can be understood about {speaker} beyond single statements: motives, "
        "preferences behind choices, patterns across sessions, how they relate to the other person.",
        "Sort the memory's content about {speaker} into flat restatements of one utterance and content that "
        "combines or interprets several.",
        "Check that the interpreted content is supported by the dialogue.",
        "Score 5 when much of the memory goes beyond one-dimensional, directly stated facts and is supported, "
        "1 when it only copies surface facts.",
    ],
    "conciseness": [
        "Read the memory about {speaker} and mark repeated entries, entries that restate another in other "
        "words, and content that adds nothing about {speaker}.",
        "Judge how the memory is organised: related content together, easy to follow.",
        "Score 5 for a well-organised memory with no needless repetition or extraneous content, 1 when "
        "repetition and filler dominate.",
    ],
    "relevance": [
        "Read the dialogue and note who {speaker} is in it and what matters in the conversation they are having.",
        "For each part of the memory, ask whether it concerns {speaker} as they appear in this dialogue, and "
        "whether knowing it would add something meaningful when the conversation goes on.",
        "Score 5 when nearly all of it is closely tied to {speaker} and useful for continuing the conversation, "
        "1 when most of it is unrelated or of no use.",
    ],
    "concreteness": [
        "Read the dialogue and note the specific details about {speaker}: names, places, times, quantities, "
        "particular events.",
        "Check how many of them the memory keeps, and whether its entries are specific and precise rather than "
        "vague generalisations.",
        "Score 5 when the memory gives a substantial, detailed and precise picture of {speaker}, 1 when it is "
        "vague or nearly empty.",
    ],
    "diversity": [
        "Read the dialogue and list the different sides of {speaker} that come up (for example work, family, "
        "hobbies, health, plans, opinions).",
        "Check which of these sides the memory covers.",
        "Score 5 when the memory covers a wide variety of information about {speaker}, 1 when it keeps to one "
        "narrow topic.",
    ],
}

SYSTEM = ("You evaluate the long-term memory that a dialogue agent built from a conversation between two "
          "people, to see how well the memory reflects the conversation. You are given the dialogue, the "
          "memory kept about one of the two people, one criterion and the steps to follow. Follow the steps, "
          "then rate the memory about that person on the criterion from 1 (very poor) to 5 (excellent).")
# Every criterion in one call (ours): the same definitions and steps, about "the person" so that the
# criteria are a prompt prefix shared by every memory and speaker rated.
ALL_SYSTEM = ("You evaluate the long-term memory that a dialogue agent built from a conversation between two "
              "people, to see how well the memory reflects the conversation. You are given the dialogue, several "
              "criteria with the steps to follow for each, and the memory kept about one of the two people. For "
              "each criterion, follow its steps, then rate the memory about that person on it from 1 (very poor) "
              "to 5 (excellent).")
PERSON = "the person"
PROMPTS = {"system": SYSTEM, "all_system": ALL_SYSTEM, **{f"criterion.{k}": v[1] for k, v in CRITERIA.items()},
           **{f"steps.{k}": "\n".join(v) for k, v in STEPS.items()}}


class Rating(BaseModel):
    score: int = Field(ge=1, le=5)


def build_messages(criterion: str, speaker: str, memory: str, dialogue: str) -> Messages:
    """Messages rating `speaker`'s memory on one criterion, in G-Eval's order (which B.2 follows):
    the criterion and its steps, then the dialogue, then the memory rated. The methods' memories of
    one speaker rated on one criterion share the prefix up to the memory (the whole dialogue)."""
    user = (f"Person: {speaker}\n\n{criterion_text(criterion, speaker)}\n\nDialogue:\n{dialogue or '(empty)'}"
            f"\n\nMemory about {speaker}:\n{memory or '(empty)'}\n\n" + 'Reply in JSON: {"score": 1-5}.')
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def criterion_text(criterion: str, speaker: str) -> str:
    """One criterion's definition and its numbered evaluation steps, about `speaker`."""
    steps = "\n".join(f"{i}. {s.format(speaker=speaker)}" for i, s in enumerate(STEPS[criterion], 1))
    return f"Criterion. {CRITERIA[criterion][1].format(speaker=speaker)}\n\nEvaluation steps:\n{steps}"


def build_all_messages(criteria: Sequence[str], speaker: str, memory: str, dialogue: str) -> Messages:
    """Messages rating `speaker`'s memory on every criterion in `criteria` at once. The dialogue and
    the criteria (about "the person", numbered) come first, so every rating of a run shares them as a
    prompt prefix; then who the person is, the memory and the reply format: the scores as a list in
    the criteria's order (half the tokens of named fields, which a small local model writes one
    by one)."""
    blocks = "\n\n".join(f"{i}. {criterion_text(c, PERSON)}" for i, c in enumerate(criteria, 1))
    order = ", ".join(criteria)
    user = (f"Dialogue:\n{dialogue or '(empty)'}\n\nThe criteria, each with its evaluation steps:\n\n{blocks}\n\n"
            f"The person is {speaker}.\n\nMemory about {speaker}:\n{memory or '(empty)'}\n\n"
            f'Reply in JSON: {{"scores": [...]}}, {len(criteria)} scores from 1 to 5, one per criterion in the '
            f"order above ({order}).")
    return [{"role": "system", "content": ALL_SYSTEM}, {"role": "user", "content": user}]


Score = Literal[1, 2, 3, 4, 5]  # an enum, which a grammar-constrained endpoint keeps to (a bare range it may not)


def ratings_schema(n: int) -> type[BaseModel]:
    """Exactly `n` scores of 1-5."""
    return create_model("Ratings", scores=(list[Score], Field(min_length=n, max_length=n)))


Judgment = tuple[Any, str]  # (score or {criterion: score}, the judge model)


async def rate_memory_all(llm: ChatLLM, criteria: Sequence[str], speaker: str, memory: str, dialogue: str, *,
                          samples: int | Sequence[int] | RunSamples = 1, **params: Any) -> list[Judgment | LLMError]:
    """Each sample's 1-5 rating of `memory` on every criterion in one call: ({criterion: score}, the
    judge model), or the sample's LLMError. The samples of one prompt go as one request with `n`
    where the endpoint takes it (pipeline.llm.client); `samples` may group them by judge run
    (`calls.RunSamples`)."""
    results = await ask_runs(llm, build_all_messages(criteria, speaker, memory, dialogue), samples,
                             schema=ratings_schema(len(criteria)), **params)
    return [r if isinstance(r, LLMError) else (dict(zip(criteria, r.parsed.scores)), r.model) for r in results]


async def rate_memory(llm: ChatLLM, criterion: str, speaker: str, memory: str, dialogue: str, *,
                      samples: int | Sequence[int] | RunSamples = 1, **params: Any) -> list[Judgment | LLMError]:
    """Each sample's 1-5 rating of `memory` (the lines about `speaker`) against `dialogue`: (score, the
    judge model), or the sample's LLMError (B.2's 20 ratings: one prompt, 20 samples)."""
    results = await ask_runs(llm, build_messages(criterion, speaker, memory, dialogue), samples, schema=Rating,
                             **params)
    return [r if isinstance(r, LLMError) else (r.parsed.score, r.model) for r in results]
