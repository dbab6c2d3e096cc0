"""LongMemEval's correctness judge (Wu et al. 2024: GPT-4o answers yes or no), as the
`longmemeval` judge of judge_answers.

One yes/no verdict per answer, with a prompt chosen by the question's type:
- standard (single-session-user, single-session-assistant, multi-session, and any other category):
  yes when the response contains the correct answer or an equivalent of it, or every intermediate
  step that leads to it; no when it gives only part of what is needed;
- temporal-reasoning: as standard, and a count of days (weeks, months, ...) that is off by one is
  still correct;
- knowledge-update: as standard, and a response that also repeats the older information is correct
  as long as it gives the updated answer;
- single-session-preference: judged against a rubric of the personalised response the user would
  want; it need not cover every point of the rubric, only recall and use the user's personal
  information correctly;
- abstention (question ids ending in "_abs", or a question without a reference answer that the
  conversation cannot answer): correct when the response says the question cannot be answered: the
  information is missing or incomplete, or something related was mentioned but not what is asked.
The judge replies with yes or no only. All wording is ours.
"""

from __future__ import annotations

import re
from typing import Any

from pipeline.llm.types import ChatLLM, InvalidAnswer, Messages

JUDGE = "longmemeval"

_CORE = ("You will see a question about a user's past conversations with a chat assistant, the correct answer, "
         "and a model's response. Reply yes if the response contains the correct answer. A response that is "
         "equivalent to the correct answer, or that works through every intermediate step needed to reach it, "
         "also counts as yes. A response that gives only part of the information the question needs counts as "
         "no.")
_YES_NO = " Reply with yes or no only."

SYSTEMS = {
    "standard": _CORE + _YES_NO,
    "temporal": _CORE + " Do not hold an off-by-one error in a count of days, weeks or months against the "
                        "response: when the question asks how long ago or how long between two events and the "
                        "response is off by one (say 19 days where the answer is 18), still reply yes." + _YES_NO,
    "knowledge_update": _CORE + " The user's information changed over time and the correct answer is the latest "
                                "one. A response that also mentions the earlier information is still correct, "
                                "as long as the answer it gives is the updated one." + _YES_NO,
    "preference": "You will see a request from a user to a chat assistant, a rubric describing the personalised "
                  "response this user would want given what they said about themselves in earlier "
                  "conversations, and a model's response. Reply yes if the response satisfies the rubric. It "
                  "does not have to reflect every point of the rubric: it is correct as long as it remembers "
                  "the user's personal information and uses it correctly." + _YES_NO,
    "abstention": "You will see a question that the user's past conversations with a chat assistant cannot "
                  "answer, an explanation of why, and a model's response. Reply yes if the response recognises "
                  "that the question cannot be answered: for example it says the information is missing or "
                  "incomplete, or that something related was mentioned but not what the question asks. Reply no "
                  "if it gives an answer as if the conversations contained one." + _YES_NO,
}
# The second item names what the reference is to the judge.
LABELS = {"standard": "Correct answer", "temporal": "Correct answer", "knowledge_update": "Correct answer",
          "preference": "Rubric", "abstention": "Explanation"}
PROMPT_FOR_TYPE = {"temporal-reasoning": "temporal", "knowledge-update": "knowledge_update",
                   "single-session-preference": "preference"}
PROMPTS = {f"system.{JUDGE}.{k}": v for k, v in SYSTEMS.items()}

_VERDICT = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def prompt_kind(category: str | None, abstention: bool) -> str:
    """Which prompt judges a question: abstention first, then by LongMemEval's question type;
    every other type (and any other dataset's category) gets the standard one."""
    if abstention:
        return "abstention"
    return PROMPT_FOR_TYPE.get(str(category), "standard")


def build_messages(kind: str, question: str, reference: str, response: str) -> Messages:
    """System prompt of `kind`, then the question, the reference (answer, rubric or explanation) and the
    response to judge."""
    user = (f"Question: {question}\n{LABELS[kind]}: {reference}\nModel response: {response}\n\n"
            "Is the model response correct? Answer yes or no only.")
    return [{"role": "system", "content": SYSTEMS[kind]}, {"role": "user", "content": user}]


def parse_verdict(text: str) -> bool:
    """The first "yes" or "no" of the reply, as a word; ValueError when it has neither."""
    m = _VERDICT.search(text or "")
    if m is None:
        raise ValueError("the judge's reply has no yes or no")
    return m.group(1).lower() == "yes"


async def judge(llm: ChatLLM, kind: str, question: str, reference: str, response: str,
                **params: Any) -> tuple[float, str, str]:
    """(1.0 correct / 0.0 incorrect, the prompt kind used, judge model); a reply without yes or no
    raises InvalidAnswer with the reply kept as `raw`."""
    result = await llm.chat(build_messages(kind, question, reference, response), **params)
    try:
        correct = parse_verdict(result.text)
    except ValueError as e:
        raise InvalidAnswer(f"LongMemEval judge: {e}", raw=result.text) from None
    return float(correct), kind, result.model
