"""LongMemEval's correctness judge (Wu et al. 2024: GPT-4o answers yes or no), as the
`longmemeval` judge of judge_answers.

One yes/no verdict per answer, with a prompt chosen by the question's type; each prompt carries the
elements of LongMemEval's evaluate_qa.py prompt for that type, and no others:
- standard (single-session-user, single-session-assistant, multi-session, and any other category):
  yes when the response contains the correct answer or an equivalent of it, or every intermediate
  step that leads to it; no when it gives only part of what is needed;
- temporal-reasoning: as standard, and any asked-for count of days, weeks, months or the like that
  is off by one is still correct (whatever the count measures, as the official clause);
- knowledge-update: yes when the response contains the correct answer; a response that also repeats
  older information is correct as long as its updated answer is the correct one (no equivalence or
  partial-answer clause: the official prompt for this type has neither);
- single-session-preference: judged against a rubric of the personalised response the user would
  want; it need not cover every point of the rubric, only recall and use the user's personal
  information correctly;
- abstention (question ids ending in "_abs", or a question without a reference answer that the
  conversation cannot answer): correct when the response says the question cannot be answered: the
  information is missing or incomplete, or something related was mentioned but not what is asked
  (and no added clause on when it is no: the official prompt has none).
The judge is shown the bare question and replies with yes or no. As evaluate_qa.py reads it, the
verdict is yes when "yes" appears anywhere in the lower-cased reply; everything else (a no, or a reply
with neither word) is no, scored 0 with the reply kept, never a failed row. All wording is ours.
"""

from __future__ import annotations

from typing import Any

from pipeline.llm.types import ChatLLM, LLMResult, Messages
from stages.judging.calls import JudgeCall

JUDGE = "longmemeval"

_OPENING = ("You will see a question about a user's past conversations with a chat assistant, the correct "
            "answer, and a model's response.")
_HAS_ANSWER = " The verdict is yes when the correct answer can be found in the response, and no otherwise."
_EQUIVALENT = (" It is also yes when the response means the same as the correct answer, or walks "
               "through all the intermediate steps that arrive at it. A response that covers only part of what "
               "the answer requires is a no.")
_YES_NO = " Your whole reply is one word: yes or no."

SYSTEMS = {
    "standard": _OPENING + _HAS_ANSWER + _EQUIVALENT + _YES_NO,
    "temporal": _OPENING + _HAS_ANSWER + _EQUIVALENT
                + " Do not hold an off-by-one error in a count of days against the response: whenever the "
                  "question asks for a number of days, weeks, months or the like and the response misses it by "
                  "one (say 19 days where the answer is 18), it still gets a yes." + _YES_NO,
    "knowledge_update": _OPENING + _HAS_ANSWER
                        + " A response that brings up older information next to an updated answer still gets a "
                          "yes, provided its updated answer is the correct answer." + _YES_NO,
    "preference": "You will see a request from a user to a chat assistant, a rubric describing the personalised "
                  "response this user would want given what they said about themselves in earlier "
                  "conversations, and a model's response. The verdict is yes when the response satisfies the "
                  "rubric. It does not have to reflect every point of the rubric: it counts as right so long as it "
                  "remembers the user's personal information and uses it correctly." + _YES_NO,
    "abstention": "You will see a question that the user's past conversations with a chat assistant cannot "
                  "answer, an explanation of why, and a model's response. The verdict is yes when the response "
                  "recognises that the question cannot be answered: for example it says the information is "
                  "missing or incomplete, or that something related was mentioned but not what the question "
                  "asks." + _YES_NO,
}
# The second item names what the reference is to the judge.
LABELS = {"standard": "Correct answer", "temporal": "Correct answer", "knowledge_update": "Correct answer",
          "preference": "Rubric", "abstention": "Explanation"}
PROMPT_FOR_TYPE = {"temporal-reasoning": "temporal", "knowledge-update": "knowledge_update",
                   "single-session-preference": "preference"}
# The closing question of the user message: whether the response is right (whether it declines, for
# an abstention question).
ASKS = {"abstention": "Does the response recognise that this question cannot be answered? Give one word, yes or no.",
        **{k: "Does the response count as correct? Give one word, yes or no." for k in SYSTEMS if k != "abstention"}}
PROMPTS = {**{f"system.{JUDGE}.{k}": v for k, v in SYSTEMS.items()}, **{f"ask.{JUDGE}.{k}": v for k, v in ASKS.items()}}


def prompt_kind(category: str | None, abstention: bool) -> str:
    """Which prompt judges a question: abstention first, then by LongMemEval's question type;
    every other type (and any other dataset's category) gets the standard one."""
    if abstention:
        return "abstention"
    return PROMPT_FOR_TYPE.get(str(category), "standard")


def build_messages(kind: str, question: str, reference: str, response: str) -> Messages:
    """System prompt of `kind`, then the question, the reference (answer, rubric or explanation), the
    response to judge and the closing question."""
    user = f"Question: {question}\n{LABELS[kind]}: {reference}\nModel response: {response}\n\n{ASKS[kind]}"
    return [{"role": "system", "content": SYSTEMS[kind]}, {"role": "user", "content": user}]


def parse_verdict(text: str | None) -> bool:
    """evaluate_qa.py's reading of the reply: yes when "yes" occurs in it, lower-cased, anywhere (so
    "Yesterday" reads as yes, as there); everything else, a reply without either word included, is no."""
    return "yes" in (text or "").lower()


def judge_call(kind: str, question: str, reference: str, response: str) -> JudgeCall:
    """(1.0 correct / 0.0 incorrect, the prompt kind used, the judge's raw reply, judge model). A reply
    that says neither yes nor no scores 0.0, as in LongMemEval, and keeps its text."""
    def read(result: LLMResult) -> tuple[float, str, str, str]:
        return float(parse_verdict(result.text)), kind, result.text, result.model

    return JudgeCall(build_messages(kind, question, reference, response), None, read)


async def judge(llm: ChatLLM, kind: str, question: str, reference: str, response: str,
                **params: Any) -> tuple[float, str, str, str]:
    """`judge_call`'s judgment, once."""
    return await judge_call(kind, question, reference, response).once(llm, **params)
