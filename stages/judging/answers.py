"""Single-answer judges: a response against its reference answer.

- `gpt4score`: 0-100 (SeCom's GPT4Score);
- `strict` / `lenient`: correct or incorrect. Lenient wordings inflate memory benchmarks (one
  published re-scoring of identical answers fell from 91% lenient to 35% strict), so both are
  asked and both reported;
- `teafarm`: TeaFarm correctness on a counterfactual question (Theanine Sec. 4): correct only when
  the response rejects the false premise and agrees with the correct answer.
All wording is ours.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from pipeline.llm.types import ChatLLM, Messages

SYSTEMS = {
    "gpt4score": "You grade an answer to a question about a long conversation against the reference answer. "
                 "Give a score from 0 (wrong or unrelated) to 100 (fully correct and complete), judging "
                 "meaning, not wording.",
    "strict": "You decide whether an answer to a question about a long conversation is correct. It is "
              "correct only if it states the same facts as the reference answer, with nothing that "
              "contradicts it; vague, partial or hedged answers are incorrect, and so is an answer that "
              "lists several candidates.",
    "lenient": "You decide whether an answer to a question about a long conversation is correct. Count it "
               "correct if it touches the same topic as the reference answer and does not contradict it.",
    "teafarm": "A speaker asked a question built on a false premise about their shared past. You decide "
               "whether the reply is correct: it must not go along with the false premise, and what it says "
               "must agree with the correct answer.",
}
PROMPTS = {f"system.{k}": v for k, v in SYSTEMS.items()}
JUDGES = tuple(SYSTEMS)


class Score(BaseModel):
    score: int = Field(ge=0, le=100)


class Correctness(BaseModel):
    correct: bool


class ExplainedScore(Score):
    reason: str = Field(default="", max_length=400)


class ExplainedCorrectness(Correctness):
    reason: str = Field(default="", max_length=400)


def build_messages(judge: str, question: str, reference: str, answer: str, explain: bool = True) -> Messages:
    field = '"score": 0-100' if judge == "gpt4score" else '"correct": true | false'
    reply = "{" + field + (', "reason": one short sentence}' if explain else "}")
    label = "Correct answer" if judge == "teafarm" else "Reference answer"
    user = f"Question: {question}\n{label}: {reference}\nAnswer to grade: {answer}\n\nReply in JSON: {reply}."
    return [{"role": "system", "content": SYSTEMS[judge]}, {"role": "user", "content": user}]


async def judge_answer(llm: ChatLLM, judge: str, question: str, reference: str, answer: str, *,
                       explain: bool = True, **params: Any) -> tuple[float, str | None, str]:
    """(score, reason, judge model): 0-100 for gpt4score, 1.0 / 0.0 for the correctness judges;
    the reason is None unless `explain`."""
    if judge == "gpt4score":
        schema: type[BaseModel] = ExplainedScore if explain else Score
    else:
        schema = ExplainedCorrectness if explain else Correctness
    result = await llm.chat(build_messages(judge, question, reference, answer, explain), schema=schema, **params)
    parsed = result.parsed
    value = float(parsed.score) if judge == "gpt4score" else float(parsed.correct)
    return value, getattr(parsed, "reason", None), result.model


def judges_for(kind: str, correctness: list[Literal["strict", "lenient"]], score_0_100: bool) -> list[str]:
    """Which judges a probe of this kind gets: TeaFarm questions get TeaFarm correctness."""
    if kind == "teafarm":
        return ["teafarm"]
    return (["gpt4score"] if score_0_100 else []) + list(correctness)
