"""Single-answer judges: one response judged alone.

- `gpt4score`: SeCom's GPT4Score (seed 001 Sec. 4.1: an integer from 0, poor, to 100, excellent), in
  one of two modes:
  - `reference` (ours): the response against the reference answer, 0-100, the reason first;
  - `memochat`: MemoChat's judge (LuJunru/MemoChat data/prompts.json, "judge"), the one SeCom
    App. A.4 says it reuses: the related conversation history, the user's question and the bot's
    response; is the response faithful to that history in answering the question; a short
    explanation first, then an integer 1-100 written as [[rating]]. No reference answer is shown.
- `strict` / `lenient`: correct or incorrect against the reference answer, both asked and both reported
  (ours: in no seed paper). `lenient` carries the elements of the generous LLM judge commonly run on
  LoCoMo (mem0's evaluation/metrics/llm_judge.py: a longer answer on the reference's topic is correct,
  and so is a date in another format or given relative to the conversation), in our words; it is an
  upper bound that inflates memory benchmarks, which is why `strict` is reported beside it;
- `teafarm`: TeaFarm correctness on a counterfactual question (Theanine Sec. 5.1, step 6, "assess
  the correctness of its response"): correct only when the response does not go along with the
  false premise and agrees with the correct answer. The judge is told the false premise.
- `locomo_j`: the community LoCoMo judge, the "J" (LLM-as-a-Judge) score of the mem0 paper
  (Chhikara et al. 2025, arXiv:2504.19413, Sec. 3.2 and App. A) and of its evaluation code
  (mem0ai/mem0 evaluation/metrics/llm_judge.py, gpt-4o-mini, temperature 0, JSON reply), which Zep,
  LangMem, MemMachine, Memobase and others reuse to report LoCoMo: the judge is shown the question
  (one speaker asking the other about something from their past conversations), the gold answer and
  the generated answer; it grades generously (a longer answer about the same thing as the gold answer
  is CORRECT; for a question about time, an answer naming the same date or period is CORRECT, also
  when written in another format or relative to the conversation); it gives a one-sentence reason
  first, then one label, CORRECT or WRONG, never both; the score is 1 when the label is CORRECT and 0
  otherwise, as llm_judge.py scores it. Our wording and our example; the reason is a JSON field before
  the label (their prompt asks for the explanation first and the label under the JSON key "label"),
  asked for whatever `judge_answers.explain` says, as theirs always asks for it.

A question the conversation cannot answer (LoCoMo's adversarial category, no reference answer) is
judged by the reference-based judges against `NOT_MENTIONED` as the expected answer (`reference=None`).
All wording is ours; MemoChat's judge keeps every element of the original.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field

from pipeline.llm.types import ChatLLM, InvalidAnswer, LLMResult, Messages
from stages.judging.calls import JudgeCall

# The expected answer to a question the conversation cannot answer (LoCoMo's category-5 option text).
NOT_MENTIONED = "Not mentioned in the conversation"

SYSTEMS = {
    "gpt4score": "You grade an answer to a question about a long conversation against the reference answer. "
                 "Give a score from 0 (wrong or unrelated) to 100 (fully correct and complete), judging "
                 "meaning, not wording.",
    "strict": "You decide whether an answer to a question about a long conversation is correct. It is "
              "correct only if it states the same facts as the reference answer, with nothing that "
              "contradicts it; vague, partial or hedged answers are incorrect, and so is an answer that "
              "lists several candidates.",
    "lenient": "You decide whether an answer to a question about a long conversation is correct, and you grade "
               "generously. The answer may be much longer than the reference answer: it is correct when it is "
               "about what the reference answer names and says nothing against it. For a question about when "
               "something happened it is correct when it points to the same day, month or period as the "
               "reference answer, even written another way or relative to the conversation (such as 'the week "
               "before').",
    "teafarm": "A speaker asked a question built on a false premise about their shared past. You decide "
               "whether the reply is correct: it must not go along with the false premise, and what it says "
               "must agree with the correct answer.",
}
# MemoChat's judge, in our words: the three materials, faithfulness to the history, explanation
# first, then the 1-100 rating in double brackets.
MEMOCHAT_SYSTEM = (
    "You are a neutral judge, favouring no one. You are shown three things: the related conversation history, a user "
    "question, and the bot's response to that question. Judge whether the bot's response answers the user "
    "question faithfully to what the related conversation history says. Start with a short explanation of "
    "your judgment. Then rate the bot's response with an integer from 1 to 100, written in exactly this "
    "form: [[rating]], for example [[57]]."
)
# The community LoCoMo judge (mem0's J), in our words: the three materials, what the question is about
# and the shape of a gold answer (our example), generous on wording and on dates, a one-sentence reason
# first, then exactly one of the two labels.
LOCOMO_J = "locomo_j"
LOCOMO_J_SYSTEM = (
    "You grade a generated reply against the truth and call it CORRECT or WRONG. You are given three "
    "things: (1) a question that one person asks another about something from their earlier conversations, "
    "which the other should remember; "
    "(2) the gold answer, the ground truth; (3) a generated answer, the one you label. The gold answer is "
    "usually brief and names what the question is about (asked \"Which plant did I repot last spring?\", the "
    "gold answer might be \"A fiddle-leaf fig\"). Grade generously: the generated answer may be much longer "
    "than the gold answer, and it is CORRECT as long as it is about the same thing the gold answer names. "
    "When the question is about time, the gold answer is a particular date, month, year or period; the "
    "generated answer may be longer or refer to the time relative to the conversation (such as \"the Friday "
    "before\" or \"the following month\"), and it is CORRECT as long as it points to the same date or period. "
    "The same date written in another format (\"3 June\" or \"June 3rd\") is CORRECT. First give your "
    "reasoning in one short sentence, then the label: exactly one of CORRECT or WRONG, never both."
)
UNANSWERABLE_NOTE = ("(the conversation does not contain this information; a correct answer says so instead "
                     "of giving an answer)")
PROMPTS = {**{f"system.{k}": v for k, v in SYSTEMS.items()}, "system.gpt4score.memochat": MEMOCHAT_SYSTEM,
           f"system.{LOCOMO_J}": LOCOMO_J_SYSTEM, "unanswerable_reference": f"{NOT_MENTIONED} {UNANSWERABLE_NOTE}"}
JUDGES = tuple(SYSTEMS)
GPT4SCORE_MODES = ("reference", "memochat")


class Score(BaseModel):
    score: int = Field(ge=0, le=100)


class Correctness(BaseModel):
    correct: bool


# With an explanation, the reason comes first in the schema, so the model reasons before its verdict.
class ExplainedScore(BaseModel):
    reason: str = Field(default="", max_length=400)
    score: int = Field(ge=0, le=100)


class ExplainedCorrectness(BaseModel):
    reason: str = Field(default="", max_length=400)
    correct: bool


class LocomoVerdict(BaseModel):
    """The community LoCoMo judge's reply: the one-sentence reason first, then the label."""

    reason: str = Field(default="", max_length=600)
    label: Literal["CORRECT", "WRONG"]


class MemoChatRating(BaseModel):
    """MemoChat's judge reply: the explanation, then the rating given as [[rating]]."""

    explanation: str
    rating: int = Field(ge=1, le=100)


def build_messages(judge: str, question: str, reference: str | None, answer: str, explain: bool = True, *,
                   false_premise: str | None = None) -> Messages:
    """Messages of a reference-based judge. reference None: the conversation cannot answer the question,
    and the expected answer is `NOT_MENTIONED`. false_premise: what a TeaFarm question wrongly assumes."""
    field = '"score": 0-100' if judge == "gpt4score" else '"correct": true | false'
    reply = '{"reason": one or two short sentences, ' + field + "}" if explain else "{" + field + "}"
    label = "Correct answer" if judge == "teafarm" else "Reference answer"
    expected = reference if reference is not None else f"{NOT_MENTIONED} {UNANSWERABLE_NOTE}"
    premise = f"The question wrongly assumes: {false_premise}\n" if false_premise else ""
    user = f"Question: {question}\n{premise}{label}: {expected}\nAnswer to grade: {answer}\n\nReply in JSON: {reply}."
    return [{"role": "system", "content": SYSTEMS[judge]}, {"role": "user", "content": user}]


def build_memochat_messages(history: str, question: str, response: str) -> Messages:
    """MemoChat's judge: the related conversation history, the user question and the bot response."""
    user = (f"Related conversation history:\n```\n{history}\n```\n\n"
            f"User question:\n```\n{question}\n```\n\n"
            f"Bot response:\n```\n{response}\n```")
    return [{"role": "system", "content": MEMOCHAT_SYSTEM}, {"role": "user", "content": user}]


def build_locomo_j_messages(question: str, gold: str, answer: str) -> Messages:
    """The community LoCoMo judge: the question, the gold answer and the generated answer, and the
    reply asked for (the reason, then the label)."""
    user = (f"Question: {question}\nGold answer: {gold}\nGenerated answer: {answer}\n\n"
            'Reply in JSON: {"reason": one short sentence, "label": "CORRECT" | "WRONG"}.')
    return [{"role": "system", "content": LOCOMO_J_SYSTEM}, {"role": "user", "content": user}]


def locomo_j_score(label: str) -> float:
    """1.0 when the label is CORRECT, 0.0 otherwise (llm_judge.py: `1 if label == "CORRECT" else 0`)."""
    return 1.0 if label == "CORRECT" else 0.0


_RATING = re.compile(r"\[\[\s*(\d{1,3})\s*\]\]")


def parse_memochat(text: str) -> MemoChatRating:
    """The explanation (the text before the first [[rating]]) and the rating: the first [[n]] of the
    reply, as MemoChat's llm_judge.py reads it (`re.search`); ValueError when the reply holds no
    [[rating]] or its first one is outside 1-100."""
    first = _RATING.search(text)
    if first is None:
        raise ValueError("the judge's reply has no [[rating]]")
    return MemoChatRating(explanation=text[: first.start()].strip(), rating=int(first.group(1)))


def answer_call(judge: str, question: str, reference: str | None, answer: str, *, explain: bool = True,
                false_premise: str | None = None) -> JudgeCall:
    """gpt4score / strict / lenient / teafarm: (score, reason, judge model), 0-100 for gpt4score, 1.0 /
    0.0 for the correctness judges; the reason is None unless `explain`. reference None: judged
    against `NOT_MENTIONED`."""
    if judge == "gpt4score":
        schema: type[BaseModel] = ExplainedScore if explain else Score
    else:
        schema = ExplainedCorrectness if explain else Correctness

    def read(result: LLMResult) -> tuple[float, str | None, str]:
        parsed = result.parsed
        value = float(parsed.score) if judge == "gpt4score" else float(parsed.correct)
        return value, getattr(parsed, "reason", None), result.model

    return JudgeCall(build_messages(judge, question, reference, answer, explain, false_premise=false_premise),
                     schema, read)


def locomo_j_call(question: str, gold: str, answer: str) -> JudgeCall:
    """The community LoCoMo judge: (1.0 CORRECT / 0.0 WRONG, its reason, judge model); a reply that is
    not a reason and one of the two labels is re-asked as any structured answer."""
    def read(result: LLMResult) -> tuple[float, str, str]:
        return locomo_j_score(result.parsed.label), result.parsed.reason, result.model

    return JudgeCall(build_locomo_j_messages(question, gold, answer), LocomoVerdict, read)


def memochat_call(history: str, question: str, response: str) -> JudgeCall:
    """MemoChat's judge: (rating 1-100, explanation, judge model); a reply without a valid [[rating]]
    is refused with InvalidAnswer, the reply kept as `raw`."""
    def read(result: LLMResult) -> tuple[float, str, str]:
        try:
            parsed = parse_memochat(result.text)
        except ValueError as e:  # pydantic's ValidationError is a ValueError too
            raise InvalidAnswer(f"MemoChat judge: {e}".splitlines()[0], raw=result.text) from None
        return float(parsed.rating), parsed.explanation, result.model

    return JudgeCall(build_memochat_messages(history, question, response), None, read)


async def judge_answer(llm: ChatLLM, judge: str, question: str, reference: str | None, answer: str, *,
                       explain: bool = True, false_premise: str | None = None,
                       **params: Any) -> tuple[float, str | None, str]:
    """`answer_call`'s judgment, once."""
    return await answer_call(judge, question, reference, answer, explain=explain,
                             false_premise=false_premise).once(llm, **params)


async def judge_locomo_j(llm: ChatLLM, question: str, gold: str, answer: str,
                         **params: Any) -> tuple[float, str, str]:
    """`locomo_j_call`'s judgment, once."""
    return await locomo_j_call(question, gold, answer).once(llm, **params)


async def judge_memochat(llm: ChatLLM, history: str, question: str, response: str,
                         **params: Any) -> tuple[float, str, str]:
    """`memochat_call`'s judgment, once."""
    return await memochat_call(history, question, response).once(llm, **params)
