"""BEAM's rubric judge and its event-ordering score (Tavakoli et al., ICLR 2026; src/evaluation/ of
mohammadtavakoli78/BEAM at b2a3ee8), as the `beam` judge of judge_answers. Every probing question comes
with a rubric, a list of nuggets (the loader keeps them in the QA row's judge notes, one string each).

- Nuggets (all ten abilities, compute_metrics.py's evaluate_<ability>): one call per nugget, a single user
  message (NUGGET_PROMPT) showing the question, the nugget (one rubric criterion) and the response, with
  the scale 1.0 / 0.5 / 0.0, positive requirements and negative constraints, the response's duty to answer
  the question, tolerance of paraphrase and of equal numbers in other forms, indifference to style, how
  to grade a compound criterion, and a JSON reply {"score", "reason"}. The official leaves the prompt's
  question placeholder unfilled, so its judge sees the literal "<question>" where the question belongs;
  so does ours (`nugget_messages(question=None)`).
- Reading a reply (`read_nugget`): the stripped reply as JSON (a reply opening with a ``` fence: the
  fenced object or array), else the first {...} or [...] span, shortest first; a reply neither reads is
  mended as json_repair mends it, here approximated by the value after the first "score" key past the
  first brace. The nugget's value is int(score) on nine abilities, so a 0.5 counts as 0, as the script
  reads it; float(score) on event ordering. A reply with no score (not JSON, no "score" key, a value
  int() / float() refuses) stops the official run for that conversation: we write the question's rows
  with `skipped` (SKIP_UNREADABLE) and the replies in `reason`.
- A question's score (`nugget_mean`): the sum of its nugget values over the rubric's length (report_results.py
  averages it per ability within a conversation, then over the conversations of one size).
- Event ordering (evaluate_event_ordering): the answer's items are its lines (response.split("\\n"),
  blank lines included; the script also asks its fact-extraction prompt and discards the reply, a call
  we leave out). Each item in turn is aligned to the first not yet used rubric item the LLM calls the
  same event (align_with_llm; EQUIVALENCE_SYSTEM: YES or NO, "yes" anywhere in the lower-cased reply), one
  call per pair until a YES; an aligned item takes the rubric item's text. Then (`order_scores`) precision,
  recall and F1 of the aligned items, and Kendall's tau-b (scipy.stats.kendalltau, variant "b") between
  the ranks of the union of both lists in the rubric's order and in the answer's (an item missing from a
  list ranked last, tied: len(union) + 1), normalised to (tau_b + 1) / 2. report_results.py reports this
  normalised tau-b as the ability's score (not the F1-scaled final_score, nor the nugget mean), so it is
  the row's score here; the nugget calls are still made, as the script makes them, and their mean, the
  F1 and the alignment are kept in `reason`. Where tau-b is undefined (a list of one distinct item: the
  script's NaN would make the ability's mean NaN) the question is written with `skipped` (SKIP_NO_ORDER).

Official sampling (src/llm.py): gpt-4.1-mini through langchain's ChatOpenAI, temperature 0, no max_tokens
sent; BEAM_SAMPLING fixes temperature 0 and a 4096-token cap, far above a verdict's length. All wording ours.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import warnings
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass

from scipy.stats import kendalltau

from pipeline.llm.types import ChatLLM, LLMError, LLMResult, Messages, ask_samples
from stages.judging.calls import JudgeCall, RunRequests

JUDGE = DATASET = "beam"
EVENT_ORDERING = "event_ordering"
ABILITIES = ("abstention", "contradiction_resolution", "event_ordering", "information_extraction",
             "instruction_following", "knowledge_update", "multi_session_reasoning", "preference_following",
             "summarization", "temporal_reasoning")
RUBRIC = "rubric"  # the `judge_prompt` of a nugget-scored question's rows, and their reference_source
ORDER = "event_ordering"  # the `judge_prompt` of an event-ordering question's rows (scored by tau-b)
QUESTION_PLACEHOLDER = "<question>"  # what the official judge is shown in the question's place
BEAM_SAMPLING: dict[str, float | int] = {"temperature": 0.0, "max_tokens": 4096}

SKIP_OTHER_DATASET = "not a BEAM question (the beam judge judges no other dataset)"
SKIP_OTHER_ABILITY = "not one of BEAM's ten abilities"
SKIP_NO_RUBRIC = "no rubric to judge against (the official would divide by an empty rubric)"
SKIP_UNREADABLE = "a judge reply without a score the official could read (its run stops on such a reply)"
SKIP_NO_ORDER = "tau-b undefined: fewer than two distinct items to order (the official's NaN)"

NUGGET_PROMPT = """You are an expert grader. Decide whether a model's response satisfies one criterion taken from a \
grading rubric.

WHAT YOU ARE GIVEN
- The user's question: {question}
- The criterion to check: {criterion}
- The response being graded: {response}

ABOUT THE CRITERION
A criterion names something the response should contain or do (a positive requirement), or something it must \
leave out (a negative constraint, usually signalled by words such as "no", "not", "avoid" or "absent"). Work out \
which kind it is before you grade.

THE RESPONSE MUST ANSWER THE QUESTION
Only a response that stays on the question and tries to answer it can comply. A response that does not address \
the question scores 0.0, and nothing else needs checking. A negative constraint is met only when both hold: the \
response answers the question, and the prohibited element is absent from it.

JUDGE MEANING, NOT WORDING
- Paraphrases and synonyms that keep the intent count as matches.
- Differences of letter case, punctuation or spacing do not matter.
- Amounts, currencies and dates may be written in different but equal forms ("$1,200", "1.2k", "1200 dollars", \
"twelve hundred dollars"); they are the same when their values agree.
- When the criterion expects a number or a duration, extract the values and compare them, not the strings.

IGNORE STYLE
Tone, politeness, length and embellishment do not matter unless the criterion explicitly asks for a form or \
structure (for example numbered steps, no code, at most two sentences).
- Do not mark a response down for hedging, for its voice or for wordiness when its content meets the criterion.
- Check the format only when the criterion explicitly demands one.

SCORES
- 1.0, fully met. Positive: the required element is there, correct and carried out properly (equivalent \
wording allowed). Negative: the prohibited element is absent and the response answers the question.
- 0.5, partly met. Positive: the element is there but with small errors, or carried out incompletely. Negative: \
the response broadly answers the question and mostly avoids the prohibited element, with minor or borderline \
lapses.
- 0.0, not met. Positive: the required element is missing or wrong. Negative: the prohibited element is present, \
or the response dodges or fails to answer the question even though the element is absent.

HOW TO GRADE
1. Decide whether the criterion asks for something to be present (positive) or absent (negative).
2. If the criterion joins several elements (with "and" or with commas): every element present is 1.0, some of \
them present is 0.5, none present is 0.0.
3. Check the response: for a positive requirement, whether the element is there and how well it is done; for a \
negative constraint, whether the element is absent.
4. Give the score the scale above assigns.
5. Explain whether the criterion was met and why that score follows.

ANSWER FORMAT
Reply with a JSON object of two fields, and nothing before or after it:
{{"score": <1.0, 0.5 or 0.0>, "reason": "<whether the criterion is met, and why this score>"}}"""

EQUIVALENCE_SYSTEM = ("You classify pairs of text snippets. Answer YES when the two snippets describe the same event "
                      "or fact, and NO when they do not. Reply with that one word only: no other words and no "
                      "explanation.")
PROMPTS = {f"user.{JUDGE}.nugget": NUGGET_PROMPT, f"system.{JUDGE}.equivalence": EQUIVALENCE_SYSTEM}

_FENCED = re.compile(r"```(?:json)?\s*(\{.*\}|\[.*\])\s*```", re.DOTALL)
_FIRST_SPAN = re.compile(r"\{.*?\}|\[.*?\]", re.DOTALL)
# the value after a "score" key, quoted or not: a quoted string, a number, or a JSON literal
_SCORE_VALUE = re.compile(r"""["']?score["']?\s*:\s*("[^"]*"|'[^']*'|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null)""")


def nugget_messages(criterion: str, response: str, question: str | None = None) -> Messages:
    """One nugget's judge call: a single user message showing the question (the official's unfilled
    placeholder when None), the criterion and the response."""
    text = NUGGET_PROMPT.format(question=QUESTION_PLACEHOLDER if question is None else question,
                                criterion=criterion, response=response)
    return [{"role": "user", "content": text}]


def equivalence_messages(reference_item: str, answer_item: str) -> Messages:
    """One alignment call: is the rubric's item (first) the same event or fact as the answer's (second)?"""
    return [{"role": "system", "content": EQUIVALENCE_SYSTEM},
            {"role": "user", "content": f"Snippet 1: {reference_item}\n\nSnippet 2: {answer_item}"}]


def is_equivalent(reply: str | None) -> bool:
    """An alignment reply as the script reads it: YES when "yes" is anywhere in the lower-cased reply."""
    return "yes" in (reply or "").lower()


def _strict_json(text: str) -> object:
    """The script's parse_json_response: the text (a ```-fenced reply: its fenced object or array) as
    JSON, else its first {...} or [...] span, shortest first; raises ValueError when neither reads."""
    fenced = _FENCED.search(text) if text.startswith("```") else None
    body = fenced.group(1).strip() if fenced else text
    try:
        return json.loads(body)
    except ValueError:
        pass
    span = _FIRST_SPAN.search(body)
    if span is None:
        raise ValueError("no JSON in the reply")
    return json.loads(span.group(0))


def _mended_score(text: str) -> object:
    """What json_repair would mend out of a reply the strict reading refused (a cut-off object, single
    quotes, a brace inside the reason), approximated: {"score": v} for the value after the first
    "score" key past the first brace; None when there is none (json_repair mends such text to nothing)."""
    brace = text.find("{")
    found = _SCORE_VALUE.search(text, brace) if brace >= 0 else None
    if found is None:
        return None
    raw = found.group(1)
    return {"score": raw[1:-1] if raw[0] in "\"'" else json.loads(raw)}


def read_nugget(reply: str | None, ability: str) -> float | None:
    """A nugget's value from its judge's reply, as compute_metrics.py reads it: the JSON's "score" as
    int() (nine abilities: 0.5 becomes 0) or float() (event ordering); None when there is none to read."""
    text = (reply or "").strip()
    try:
        parsed = _strict_json(text)
    except ValueError:
        parsed = _mended_score(text)
    if not isinstance(parsed, dict) or "score" not in parsed:
        return None
    convert = float if ability == EVENT_ORDERING else int
    try:
        return float(convert(parsed["score"]))
    except (TypeError, ValueError, OverflowError):
        return None


def stated_score(reply: str | None) -> float | None:
    """The score a reply states, read as a float whatever the ability (kept beside the official value)."""
    return read_nugget(reply, EVENT_ORDERING)


def nugget_mean(values: Sequence[float]) -> float:
    """A question's score from its nugget values: their sum over the rubric's length."""
    return sum(values) / len(values)


def answer_items(response: str) -> list[str]:
    """The answer's items to order: its lines, blank ones included, as the script splits it."""
    return response.split("\n")


async def align(reference: Sequence[str], items: Sequence[str],
                same: Callable[[int, int], Awaitable[bool]]) -> list[int | None]:
    """The rubric item each answer item matches (its index), else None: in turn, each item j is compared
    with the unused rubric items i in order (`same(i, j)`, one call each) until the first match, which it
    takes and uses up."""
    used: set[int] = set()
    matches: list[int | None] = []
    for j in range(len(items)):
        match = None
        for i in range(len(reference)):
            if i not in used and await same(i, j):
                match = i
                used.add(i)
                break
        matches.append(match)
    return matches


def aligned_items(reference: Sequence[str], items: Sequence[str], matches: Sequence[int | None]) -> list[str]:
    """The answer's items with each matched one replaced by the text of the rubric item it matched."""
    return [item if m is None else reference[m] for item, m in zip(items, matches, strict=True)]


@dataclass(frozen=True)
class OrderScores:
    """An event-ordering answer against the rubric's order."""

    precision: float
    recall: float
    f1: float
    tau_b: float | None  # None where undefined (fewer than two distinct items)
    tau_norm: float | None  # (tau_b + 1) / 2: the reported score
    final_score: float | None  # tau_norm x F1 (computed by the script, not reported)


def _ranks(order: Sequence[str], union: Sequence[str]) -> list[int]:
    """Each union item's 1-based position in `order` (a repeated item: its last), else len(union) + 1."""
    position = {item: i for i, item in enumerate(order, 1)}
    return [position.get(item, len(union) + 1) for item in union]


def order_scores(reference: Sequence[str], aligned: Sequence[str]) -> OrderScores:
    """Precision, recall and F1 of the aligned answer items against the rubric's, and Kendall's tau-b
    of their ranks over the union of both lists (rubric first, each item once)."""
    ref, got = list(reference), list(aligned)
    tp = len(set(ref) & set(got))
    fp = sum(item not in ref for item in got)
    fn = sum(item not in got for item in ref)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    union = list(dict.fromkeys(ref + got))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns where tau-b is undefined; NaN says so
        tau = float(kendalltau(_ranks(ref, union), _ranks(got, union), variant="b").statistic)
    if math.isnan(tau):
        return OrderScores(precision, recall, f1, None, None, None)
    tau_norm = (tau + 1) / 2
    return OrderScores(precision, recall, f1, tau, tau_norm, tau_norm * f1)


def skip_reason(dataset: str | None, category: str | None, rubric: Sequence[str] | None) -> str | None:
    """Why the beam judge leaves a probe alone (another dataset, no ability of BEAM's, no rubric), or None."""
    if dataset != DATASET:
        return SKIP_OTHER_DATASET
    if category not in ABILITIES:
        return SKIP_OTHER_ABILITY
    return None if rubric else SKIP_NO_RUBRIC


def nugget_calls(ability: str, rubric: Sequence[str], response: str) -> list[JudgeCall]:
    """One judge call per nugget, each reading its reply into (value or None, the reply, judge model)."""
    def read(result: LLMResult) -> tuple[float | None, str, str]:
        return read_nugget(result.text, ability), result.text or "", result.model

    return [JudgeCall(nugget_messages(criterion, response), None, read) for criterion in rubric]


Judgment = tuple[float | None, str, str, str | None, str]  # score, judge_prompt, reason, skipped, judge model


def judgment(ability: str, rubric: Sequence[str], nuggets: Sequence[tuple[float | None, str]],
             order: OrderScores | None = None, alignment: list[dict[str, object]] | None = None,
             model: str = "") -> Judgment:
    """One question's judgment from its nugget readings (value or None, reply) and, on event ordering,
    its order scores and alignment: (score, judge_prompt, reason JSON, skipped or None, judge model)."""
    kept: dict[str, object] = {"nuggets": [{"criterion": c, "value": v, "stated": stated_score(reply), "reply": reply}
                                           for c, (v, reply) in zip(rubric, nuggets)]}
    prompt = ORDER if ability == EVENT_ORDERING else RUBRIC
    values = [v for v, _ in nuggets if v is not None]
    unreadable = [i for i, (v, _) in enumerate(nuggets) if v is None]
    if not unreadable:
        kept["nugget_mean"] = nugget_mean(values)
    if order is not None:
        kept["order"] = asdict(order)
        kept["alignment"] = alignment or []
    if unreadable:
        kept["unreadable"] = unreadable
        return None, prompt, json.dumps(kept, ensure_ascii=False), SKIP_UNREADABLE, model
    if order is None:
        return nugget_mean(values), prompt, json.dumps(kept, ensure_ascii=False), None, model
    if order.tau_norm is None:
        return None, prompt, json.dumps(kept, ensure_ascii=False), SKIP_NO_ORDER, model
    return order.tau_norm, prompt, json.dumps(kept, ensure_ascii=False), None, model


async def ordered(llm: ChatLLM, rubric: Sequence[str], response: str, run: int,
                  **sampling: float | int) -> tuple[OrderScores, list[dict[str, object]]]:
    """Run `run`'s alignment of the answer's lines to the rubric (sample index `run`) and its order
    scores; the alignment kept per line: the rubric item it took (index or None) and the replies asked."""
    items = answer_items(response)
    replies: list[list[str]] = [[] for _ in items]

    async def same(i: int, j: int) -> bool:
        result = (await ask_samples(llm, equivalence_messages(rubric[i], items[j]), [run], **sampling))[0]
        if isinstance(result, LLMError):
            raise result
        replies[j].append(result.text or "")
        return is_equivalent(result.text)

    matches = await align(rubric, items, same)
    scores = order_scores(rubric, aligned_items(rubric, items, matches))
    return scores, [{"item": item, "matched": m, "replies": r} for item, m, r in zip(items, matches, replies)]


async def judge_runs(llm: ChatLLM, ability: str, rubric: Sequence[str], response: str, runs: int,
                     mode: RunRequests = "samples", **params: float | int) -> list[Judgment | Exception]:
    """Each run's judgment of one answer, in run order (`judgment`), or the LLMError of a call that failed
    (the run's row then fails): one call per nugget and, on event ordering, the alignment calls.
    Sampling: BEAM_SAMPLING over `params`."""
    sampling = {**params, **BEAM_SAMPLING}
    calls = nugget_calls(ability, rubric, response)
    per_nugget = await asyncio.gather(*(call.runs(llm, runs, mode, **sampling) for call in calls))
    orders: list[tuple[OrderScores, list[dict[str, object]]] | Exception] = []
    if ability == EVENT_ORDERING:
        got = await asyncio.gather(*(ordered(llm, rubric, response, r, **sampling) for r in range(runs)),
                                   return_exceptions=True)
        for g in got:
            if isinstance(g, BaseException) and not isinstance(g, LLMError):
                raise g  # not a failed call: the item fails (rows_or_failed), or the run stops
            orders.append(g)
    out: list[Judgment | Exception] = []
    for r in range(runs):
        readings = [nugget[r] for nugget in per_nugget]
        failed = next((x for x in readings if isinstance(x, Exception)), None)
        order = orders[r] if orders else None
        if failed is None and isinstance(order, Exception):
            failed = order
        if failed is not None:
            out.append(failed)
            continue
        nuggets = [(x[0], x[1]) for x in readings if isinstance(x, tuple)]
        model = next((x[2] for x in readings if isinstance(x, tuple) and x[2]), "")
        scores, alignment = order if isinstance(order, tuple) else (None, None)
        out.append(judgment(ability, rubric, nuggets, scores, alignment, model))
    return out
