"""HaluMem's operation-level scorer (MemTensor/HaluMem eval/, commit 59402b9): four LLM judgments and
the aggregation of evaluation.py's `aggregate_eval_results`, as pure functions over plain inputs, and
the QA judgment as the `halumem` judge of judge_answers.

The four judge prompts (eval_tools.py) are ours in wording; each carries every element of the release's:
- memory integrity (`integrity_call`, INTEGRITY_PROMPT): the judge as a strict evaluator of whether the
  system missed key memory points (its resistance to amnesia / omission); the extracted memories (all the
  system stored) and the one expected point; look in the memories for matching or related information,
  ignoring the rest; the 0 / 1 / 2 rubric (2 every piece of the point covered or logically implied by one
  or more memories, 1 part of it mentioned with key information missing, inaccurate or slightly wrong,
  0 absent or entirely wrong); the notes: a compound point (person, event, time, place, preference ...)
  all right 2, some right or uncertain 1, key elements missing or wrong 0; meaning, not wording; with
  conflicting memories the best coverage score, the conflict named in the reasoning; extra or differently
  styled memories cost nothing; hedged wording ("might", "probably", "tends to") against a definite point
  usually 1; critical fields (time, entity name, relationship) partly wrong with the rest right 1, all key
  fields wrong or missing 0; a ```json block {"reasoning", "score": "2|1|0"}.
- memory accuracy (`accuracy_call`, ACCURACY_PROMPT): the judge of one extracted memory against the
  dialogue and the gold points of the session (the annotated correct memories); support: an atomic fact is
  supported when the dialogue or the gold points state or entail it (synonym, paraphrase, equivalent
  form), those two sources only, no outside knowledge or assumption, unsupported otherwise; watch
  negation, quantities, time and subjects, a contradiction being a conflict; accuracy_score 2 all
  supported with no contradiction or hallucination, 1 at least one supported fact with unsupported or
  contradictory content, 0 entirely unsupported or contradictory (a hallucinated memory), any unsupported
  element barring 2 and a mix giving 1; inclusion: the atomic fact (the smallest factual unit, e.g. name,
  age, place, preference, budget, meeting time, tool) and its field or slot (its semantic dimension);
  true when every fact's field has a counterpart field among the gold points (synonyms allowed; value,
  polarity and quantity ignored; one gold field may cover several facts), false when any field has none;
  independent of correctness; only fields explicit or recognisable in the gold points, none added from
  outside knowledge; values, polarity and exact numbers / times do not matter; the procedure (decompose,
  search for support or contradiction, score, find each fact's field and decide inclusion, explain); the
  reason a brief explanation in Chinese citing key evidence (short quotes allowed) and naming unsupported
  or contradictory parts; only one JSON object of three fields ("accuracy_score" "0" / "1" / "2",
  "is_included_in_golden_memories" "true" / "false", "reason"), no other text or fields, not repeating the
  candidate, in a ```json code block.
- memory update (`update_call`, UPDATE_PROMPT): judge whether the system's memories correctly include the
  target updated point; the system's memories (what it holds after the dialogue: the release's top-10
  search hits for the point), the target (the correct updated version, the focus) and the original
  memories (the version before the update); judge strictly on the target's update; Correct: every
  information point of the target present, accurately and completely, key fields (date, time, values,
  proper nouns) exactly matching, the original replaced or marked outdated, synonyms and light
  rephrasing fine; Hallucination: a related new memory with factual mistakes or contradictions against
  the correct update; Omission: no related new memory (complete), or a related one missing key
  information (partial); Other: a failed update that is neither; a ```json block {"reason" (brief, why
  this category), "evaluation_result": "Correct | Hallucination | Omission | Other"}.
- QA (`qa_call`, `judge_call`, QA_PROMPT): the judge as an expert of memory-system QA, from the question,
  the reference answer and the key memory points (the facts needed to reach the reference) only, no
  outside knowledge or subjective inference, classifying the response Correct / Hallucination / Omission;
  Correct: answers the question, equivalent in meaning to the reference, no contradiction with the points
  or the reference, no unsupported detail beyond the points that could change the conclusion, synonyms,
  paraphrase and fair summarising allowed; Hallucination: contradicts or disagrees with the reference or
  the points; a concrete fact where the reference is unknown / uncertain; irrelevant extras alone are not
  one, unless they change or mislead the conclusion or contradict the points; Omission: incomplete against
  the reference; "don't know" / "can't remember" / "no related memory" while the points hold the answer;
  any missing element of a multi-element question; priorities: missing and fabricated together is
  Hallucination, missing without fabrication Omission, Correct only when fully equivalent; tolerance:
  equivalent forms of numbers, times and units, never different values; a definite answer to an
  unknown reference is Hallucination, "unknown" without guessing may be Correct; only the reference, the
  points and the response count; a ```json block {"reasoning" (the response against the points: used,
  missing, fabricated or contradicted; then against the reference; then the basis of the class),
  "evaluation_result": "Correct | Hallucination | Omission"} and nothing outside it.

Inputs are shown as the release shows them: a list joined by newlines (`lines`), the dialogue as
`[timestamp]role: content` lines with a blank line after each assistant turn (`dialogue_text`). Each
prompt is one user message, as llms.py sends it.

Reading a reply (`reply_object`, llms.py's llm_request_for_json): the first ```json fenced {...} block
parsed as JSON; a reply without one, or whose block is not JSON, is unreadable. Then, as evaluation.py
reads the object: int() of "score" / "accuracy_score" (so "2" and 2.0 read 2; "2.0", "2|1|0", a missing
key read None); "is_included_in_golden_memories" counts only as the strings "true" / "True" (a JSON
true does not, as there); "evaluation_result" as the string it is. An unreadable reply, or a value int()
refuses, gives None: the release's invalid judgment (counted in each "(all)" denominator, left out of
"(valid)"), never an exception. The release retries the request (RETRY_TIMES, 3 in .env-example) when the
reply has no ```json block before it records None; a call here is asked once (its reply is cached), so
such a reply is None at once.

Where the stage that scores methods' memories decides what to judge (evaluation.py process_user): a gold
point with is_update "True" and memories from the system goes to the update judgment (`goes_to_update`),
every other point (interference points included) to integrity; a session with nothing extracted scores
each integrity point 0 without a call (`nothing_extracted`, NO_EXTRACTION_SCORE); the accuracy prompt's
gold points are the session's non-interference points; the QA prompt's key points the evidence's contents.

The aggregation (`aggregate`, over IntegrityRecord / AccuracyRecord / UpdateRecord / QARecord): recall
counts the non-interference points scored 2; weighted recall sums 0.5 * score * importance over the
importance; interference accuracy counts interference points scored 0; target accuracy sums 0.5 * score over
the memories judged included, weighted accuracy over all; memory_extraction_f1 is the F1 of
target_accuracy(all) and recall(all); the update and QA ratios count each label. Each "(all)" divides by
every record of its kind (importance: every non-interference point's), each "(valid)" by those whose
judgment read (a score; a label among the release's); per memory type, integrity points scored 2 and updates
judged Correct over all that type's records of both kinds. A ratio whose denominator is empty is None where
the release raises ZeroDivisionError; a memory type other than the release's three is added (a KeyError
there).

Official sampling (eval/.env-example): gpt-4o, temperature 0, max_tokens 16384; HALUMEM_SAMPLING fixes
temperature 0 and a 4096-token cap, far above a verdict's length (the reasoning comes first).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pipeline.llm.types import LLMResult, Messages
from stages.judging.calls import JudgeCall

JUDGE = DATASET = "halumem"
QA_JUDGE_PROMPT = "qa"  # judge_answers rows' judge_prompt
UPDATE_LABELS = ("Correct", "Hallucination", "Omission", "Other")
QA_LABELS = ("Correct", "Hallucination", "Omission")
# evaluation.py's main() starts the per-type table with these three (other types: KeyError there)
MEMORY_TYPES = ("Event Memory", "Persona Memory", "Relationship Memory")
INTERFERENCE = "interference"  # a gold point's memory_source when the system should not store it
NO_EXTRACTION_SCORE = 0  # an integrity point of a session with nothing extracted, given without a call
HALUMEM_SAMPLING: dict[str, float | int] = {"temperature": 0.0, "max_tokens": 4096}
SKIP_OTHER_DATASET = "not a HaluMem question (the halumem judge reads HaluMem's evidence memory points)"

_JSON_REPLY = """Reply with this JSON in a ```json code block:
```json
{fields}
```"""

INTEGRITY_PROMPT = """You are a strict judge of memory integrity. An AI memory system has processed a conversation; \
decide whether it missed a memory point it should have kept. This measures how well it resists forgetting and \
omission (amnesia).

THE MEMORIES THE SYSTEM EXTRACTED (everything it stored):
{memories}

THE EXPECTED MEMORY POINT (what it should have extracted):
{point}

WHAT TO DO
1. Look through the extracted memories for anything that matches the expected point or relates to it; leave \
unrelated memories aside.
2. Score how well the system captured the expected point on the scale below, and explain why.

SCALE
- 2: covered. One or more extracted memories state, or logically imply, everything in the expected point.
- 1: partly covered. The memories mention part of the point, but key information is missing, inaccurate or \
slightly wrong.
- 0: missing or wrong. Nothing in the memories mentions the point, or what they say about it is entirely wrong.

NOTES
- A compound point (several elements: person, event, time, place, preference and so on): every element right \
gives 2; some right, or uncertain, gives 1; key elements missing or wrong give 0.
- Judge meaning: matching words are not required.
- If the memories contradict each other, give the best coverage score any of them earns, and mention the \
conflict in your reasoning.
- Extra memories, or memories written in another style, do not lower the score: only the coverage of the \
expected point counts.
- Hedged wording ("might", "probably", "tends to") against an expected point stated as definite usually \
gives 1.
- Critical fields (a time, an entity's name, a relationship) partly wrong while the rest matches gives 1; \
every key field wrong or missing gives 0.

""" + _JSON_REPLY.format(fields='{{"reasoning": "<a short justification of the score>", "score": "<2, 1 or 0>"}}')

ACCURACY_PROMPT = """You judge the accuracy of one memory that an AI memory system extracted from a dialogue. \
You are given the dialogue, the gold memory points (the correct memories annotated for this dialogue in the \
benchmark) and the candidate memory to judge, and you return a structured result.

DIALOGUE:
{dialogue}

GOLD MEMORY POINTS (annotated as correct for this dialogue):
{gold}

CANDIDATE MEMORY (extracted by the system, the one to judge):
{candidate}

SUPPORT
- An atomic fact of the candidate is supported when the dialogue or the gold points state it or entail it \
(through a synonym, a paraphrase or an equivalent expression).
- Use only the dialogue and the gold points: no outside knowledge and no assumptions. A fact that neither \
states nor lets you infer is unsupported.
- Watch negation, quantities, times and who the subject is. A fact that goes against the dialogue or the gold \
points is a conflict.

ACCURACY SCORE (0, 1 or 2)
- 2: every fact of the candidate is supported; nothing contradicts the sources and nothing is invented.
- 1: partly right: at least one fact is supported, but some content is unsupported or contradictory.
- 0: nothing is supported, or it contradicts the sources: a hallucinated memory.
A candidate with several facts cannot score 2 if any one of them is unsupported or contradictory; supported \
and unsupported or conflicting content together scores 1.

INCLUDED IN THE GOLD MEMORIES (true or false, decided field by field)
- An atomic fact is the smallest unit of information in the candidate (for example name = Li Si, age = 25, \
place = Beijing, preference = coffee, budget at most 2000, meeting time = Wednesday 10:00, tool = Zoom).
- Its field (slot) is the dimension it fills (name, age, place of residence, food preference, budget, meeting \
time, meeting tool and so on).
- true: each atomic fact's field has a matching field in the gold points (synonyms, paraphrases and \
equivalent expressions count; the value, the polarity and the quantity are ignored). One gold field may match \
several facts of the candidate (several drink preferences, one drink-preference field).
- false: the field of any one atomic fact has no match in the gold points.
- This is independent of whether the candidate is correct. Only fields explicit or recognisable in the gold \
points count: do not add fields from outside knowledge. Different values ("Zhang San" and "Li Si"), opposite \
polarity (likes and dislikes) and different exact numbers or times do not change this answer.

STEPS, for the candidate
1. Break it into atomic facts (name, number, place, preference and so on).
2. For each fact, look in the dialogue and the gold points for support or contradiction.
3. Give accuracy_score by the rules above.
4. Decide is_included_in_golden_memories: name the field of each fact; true when every field is found in \
the gold points, else false.
5. Write a short explanation in Chinese as "reason", quoting the key evidence (brief quotes are fine) and \
naming any unsupported or contradictory part.

ANSWER
Return exactly one JSON object with exactly these three fields and nothing else: no other text, no other \
fields, and not the candidate's text. accuracy_score is "0", "1" or "2"; is_included_in_golden_memories is \
"true" or "false"; reason is the short explanation in Chinese.

""" + _JSON_REPLY.format(fields='{{"accuracy_score": "<2, 1 or 0>", "is_included_in_golden_memories": '
                                '"<true or false>", "reason": "<short explanation in Chinese>"}}')

UPDATE_PROMPT = """Judge how accurately an AI memory system updated its memory. From what follows, decide whether \
the system's memories correctly contain the target memory after its update.

THE SYSTEM'S MEMORIES (the memory points the system holds after the current dialogue):
{memories}

THE TARGET MEMORY AFTER THE UPDATE (the correct, updated memory point the system should now hold; this is \
what you judge):
{updated}

THE ORIGINAL MEMORY (the target's version before the update):
{original}

HOW TO JUDGE
Judge strictly by how the target memory's content was updated, and choose one category.

Correct
- The system's memories contain every information point of the target, reflecting the update accurately and \
completely.
- Key fields (dates, times, values, proper names and the like) match exactly.
- The original memory has in effect been replaced, or marked as out of date.
- Synonyms and light rephrasing are acceptable.

Hallucination
- A factual error: the system's memories hold a new memory related to the target, but it contains factual \
mistakes or contradicts the correct update.

Omission
- Entirely missed: the system's memories hold no new memory related to the target.
- Partly missed: a related new memory is there, but it lacks key information it should carry.

Other
- A failed update that does not clearly belong to Hallucination or Omission.

""" + _JSON_REPLY.format(fields='{{"reason": "<a short account of your reasoning and why this category fits>", '
                                '"evaluation_result": "<Correct, Hallucination, Omission or Other>"}}')

QA_PROMPT = """You are an expert judge of question answering by AI memory systems. Using only the question, the \
reference answer and the key memory points (the facts needed to arrive at the reference answer), strictly \
judge how accurate the memory system's response is, and classify it as Correct, Hallucination or Omission. \
Use no outside knowledge and no subjective inference. Give your verdict strictly in the JSON format asked for \
at the end.

CATEGORIES

1. Correct
- The response answers the question accurately and means the same as the reference answer.
- It contradicts neither the key memory points nor the reference answer.
- It adds no detail the key memory points do not support that could change the conclusion.
- Synonyms, paraphrase and a reasonable summary are acceptable.

2. Hallucination
- The response contains information or facts that contradict, or disagree with, the reference answer or the \
key memory points.
- The reference answer is marked unknown or uncertain, yet the response gives a specific, checkable fact or \
conclusion.
- Extra, irrelevant information that leaves the conclusion unchanged is not a hallucination in itself; if it \
changes or misleads the conclusion, or contradicts the key memory points, it is a Hallucination.

3. Omission
- The response is incomplete compared with the reference answer.
- It says it does not know, cannot remember or has no related memory, although the key memory points hold the \
relevant information.
- A question with several elements needs every element present and right; leaving out any one is an Omission.

WHEN CATEGORIES CONFLICT
- Missing necessary information together with invented or contradictory information: Hallucination.
- Necessary information missing, with nothing invented or contradictory: Omission.
- Correct only when the meaning is fully equivalent to the reference answer.

TOLERANCE AND DETAILS
- Equivalent ways of writing numbers, times and units are acceptable; the values themselves must not differ.
- For a question with several elements, every element must be complete and accurate; a missing one is an \
Omission.
- If the reference answer is "unknown" or "cannot be determined" and the response states a definite fact, it \
is a Hallucination; if the response also says it is unknown, without guessing, it can be Correct.
- Rely only on the reference answer, the key memory points and the response: no other context, no world \
knowledge, no speculation.

WHAT TO JUDGE

Question:
{question}

Reference answer:
{reference}

Key memory points:
{evidence}

Memory system's response:
{response}

ANSWER
Give your verdict strictly in this JSON, with no explanation or comment outside the JSON block; in \
"reasoning", first compare the response with the key memory points (which it used correctly, which it missed, \
whether it invented or contradicted anything), then check it against the reference answer, and last state \
why this category.

""" + _JSON_REPLY.format(fields='{{"reasoning": "<the comparison with the key memory points, then with the '
                                'reference answer, then the basis of the category>", "evaluation_result": '
                                '"<Correct, Hallucination or Omission>"}}')

# judge_answers' prompts (the QA judge); the operation judges' prompts for the stage that runs them
PROMPTS = {f"user.{JUDGE}.qa": QA_PROMPT}
OPERATION_PROMPTS = {f"user.{JUDGE}.integrity": INTEGRITY_PROMPT, f"user.{JUDGE}.accuracy": ACCURACY_PROMPT,
                     f"user.{JUDGE}.update": UPDATE_PROMPT}

# llms.py's extraction: the first ```json block's {...}, shortest first (so nested objects still read whole)
_JSON_BLOCK = re.compile(r"```json\s*(\{.*?\})\s*```", re.DOTALL)


# --- inputs as the release renders them -------------------------------------------------------------------

def lines(items: Sequence[str]) -> str:
    """A list as the release puts it in a prompt: its items joined by newlines."""
    return "\n".join(items)


def dialogue_text(turns: Iterable[Mapping[str, object]]) -> str:
    """The dialogue as evaluation.py renders it for the accuracy prompt: one `[timestamp]role: content`
    line per turn (dicts with those keys; a missing one shows empty), a blank line after each assistant
    turn."""
    out: list[str] = []
    for turn in turns:
        out.append(f"[{turn.get('timestamp', '')}]{turn.get('role', '')}: {turn.get('content', '')}")
        if turn.get("role") == "assistant":
            out.append("")
    return "\n".join(out)


def goes_to_update(is_update: object, system_memories: Sequence[str]) -> bool:
    """Whether a gold point is judged as an update (else for integrity): is_update "True" (the release's
    string; a bool True too) with memories the system returned when searched with the point."""
    return str(is_update) == "True" and bool(system_memories)


def nothing_extracted(extracted: Sequence[str]) -> bool:
    """A session whose extracted memories join to blank text: its integrity points score
    NO_EXTRACTION_SCORE without a call, as evaluation.py scores them."""
    return lines(extracted).strip() == ""


# --- reading a reply ---------------------------------------------------------------------------------------

def reply_object(text: str | None) -> dict[str, object] | None:
    """The reply's first ```json block as a JSON object, as llms.py reads it; None when there is none or it
    does not parse."""
    m = _JSON_BLOCK.search(text or "")
    if m is None:
        return None
    try:
        obj = json.loads(m.group(1).strip())
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def as_int(value: object) -> int | None:
    """int() of a reply's value as evaluation.py takes it; None where int() refuses (the release's except)."""
    if not isinstance(value, (str, int, float)):
        return None  # None, a list or an object: int() raises TypeError there
    try:
        return int(value)
    except (ValueError, OverflowError):
        return None


def read_score(text: str | None, key: str = "score") -> int | None:
    """The 0 / 1 / 2 score under `key` of a reply, None when unreadable."""
    obj = reply_object(text)
    return None if obj is None else as_int(obj.get(key))


def read_accuracy(text: str | None) -> tuple[int | None, bool]:
    """(accuracy_score, included) of an accuracy reply: included only when the score reads and
    is_included_in_golden_memories is the string "true" or "True" (what aggregate_eval_results counts);
    an unreadable reply is (None, False), as the release records it."""
    obj = reply_object(text)
    score = None if obj is None else as_int(obj.get("accuracy_score"))
    if obj is None or score is None:
        return None, False
    return score, obj.get("is_included_in_golden_memories", "false") in ("true", "True")


def read_label(text: str | None) -> str | None:
    """The "evaluation_result" string of a reply, as given (an unknown label is kept: the aggregation counts
    it invalid); None when unreadable or not a string."""
    obj = reply_object(text)
    label = None if obj is None else obj.get("evaluation_result")
    return label if isinstance(label, str) else None


# --- the judge calls --------------------------------------------------------------------------------------

def _user(text: str) -> Messages:
    return [{"role": "user", "content": text}]


def integrity_call(extracted: Sequence[str], point: str) -> JudgeCall:
    """One gold point's integrity judgment against the session's extracted memories: (score 0 / 1 / 2 or
    None, the reply, judge model). An interference point is judged the same way (0: correctly not kept)."""
    def read(result: LLMResult) -> tuple[int | None, str, str]:
        return read_score(result.text), result.text or "", result.model

    return JudgeCall(_user(INTEGRITY_PROMPT.format(memories=lines(extracted), point=point)), None, read)


def accuracy_call(dialogue: str, gold_points: Sequence[str], candidate: str) -> JudgeCall:
    """One extracted memory's accuracy judgment: `dialogue` as `dialogue_text` renders it, `gold_points`
    the session's non-interference point contents; (score 0 / 1 / 2 or None, included, the reply, judge
    model)."""
    def read(result: LLMResult) -> tuple[int | None, bool, str, str]:
        score, included = read_accuracy(result.text)
        return score, included, result.text or "", result.model

    prompt = ACCURACY_PROMPT.format(dialogue=dialogue, gold=lines(gold_points), candidate=candidate)
    return JudgeCall(_user(prompt), None, read)


def update_call(system_memories: Sequence[str], new_point: str, original_memories: Sequence[str]) -> JudgeCall:
    """One update point's judgment: the system's memories found for it (top 10 searched with the point), the
    updated point, its original memories; (label or None, the reply, judge model)."""
    def read(result: LLMResult) -> tuple[str | None, str, str]:
        return read_label(result.text), result.text or "", result.model

    prompt = UPDATE_PROMPT.format(memories=lines(system_memories), updated=new_point,
                                  original=lines(original_memories))
    return JudgeCall(_user(prompt), None, read)


def qa_messages(question: str, reference: str, evidence: Sequence[str], response: str) -> Messages:
    """The QA judgment's single user message: the question, reference, evidence contents and response."""
    return _user(QA_PROMPT.format(question=question, reference=reference, evidence=lines(evidence),
                                  response=response))


def qa_call(question: str, reference: str, evidence: Sequence[str], response: str) -> JudgeCall:
    """One answer's QA judgment: (label or None, the reply, judge model)."""
    def read(result: LLMResult) -> tuple[str | None, str, str]:
        return read_label(result.text), result.text or "", result.model

    return JudgeCall(qa_messages(question, reference, evidence, response), None, read)


def verdict(label: str | None) -> float:
    """judge_answers' score of a QA label: Correct 1; Hallucination, Omission, any other or none 0."""
    return 1.0 if label == "Correct" else 0.0


def judge_call(question: str, reference: str, evidence: Sequence[str], response: str) -> JudgeCall:
    """The `halumem` judge of judge_answers: (score 1 / 0, judge_prompt "qa", reason JSON {"label", "reply"},
    judge model); an unreadable reply scores 0 with label null and the reply kept, never a failed row."""
    def read(result: LLMResult) -> tuple[float, str, str, str]:
        label = read_label(result.text)
        reason = json.dumps({"label": label, "reply": result.text or ""}, ensure_ascii=False)
        return verdict(label), QA_JUDGE_PROMPT, reason, result.model

    return JudgeCall(qa_messages(question, reference, evidence, response), None, read)


def skip_reason(dataset: str | None) -> str | None:
    """Why the halumem judge leaves a question alone (another dataset: its judge notes are not evidence
    memory points), or None."""
    return None if str(dataset or "").startswith(DATASET) else SKIP_OTHER_DATASET


def row_label(reason: str | None) -> str | None:
    """The QA label a `halumem` judge row keeps in its reason (None: unreadable, or not such a row)."""
    try:
        kept = json.loads(reason or "")
    except ValueError:
        return None
    label = kept.get("label") if isinstance(kept, dict) else None
    return label if isinstance(label, str) else None


# --- the aggregation -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class IntegrityRecord:
    """One gold point judged for integrity (an update point without system memories included)."""

    score: int | None  # 0 / 1 / 2; None: unreadable
    importance: float
    memory_type: str  # Event Memory | Persona Memory | Relationship Memory
    interference: bool = False  # memory_source "interference": the system should not have stored it


@dataclass(frozen=True)
class AccuracyRecord:
    """One extracted memory judged for accuracy."""

    score: int | None  # 0 / 1 / 2; None: unreadable
    included: bool  # is_included_in_golden_memories read as "true" / "True" (False when unreadable)


@dataclass(frozen=True)
class UpdateRecord:
    """One update point judged: the judge's label (None: unreadable; a label outside UPDATE_LABELS: invalid)."""

    label: str | None
    memory_type: str


@dataclass(frozen=True)
class QARecord:
    """One answer judged: the judge's label (None: unreadable; a label outside QA_LABELS: invalid)."""

    label: str | None


Scores = dict[str, float | int | None]


def ratio(part: float, whole: float) -> float | None:
    """part / whole; None where the release would divide by zero."""
    return part / whole if whole else None


def f1(precision: float | None, recall: float | None) -> float | None:
    """evaluation.py's compute_f1 (0 when both are 0); None when either is missing."""
    if precision is None or recall is None:
        return None
    return 0.0 if precision + recall == 0 else 2 * (precision * recall) / (precision + recall)


def integrity_scores(records: Sequence[IntegrityRecord]) -> tuple[Scores, Scores]:
    """(memory_integrity, the interference part of memory_accuracy): recall counts a 2 as recalled, the
    weighted recall 0.5 * score * importance over the importance; an interference point is right when
    scored 0. "(all)" divides by every point, "(valid)" by those with a score."""
    recalled = weighted = 0.0
    valid = num = 0
    importance_valid = importance_all = 0.0
    kept = kept_valid = interference = 0
    for r in records:
        if not r.interference:
            num += 1
            importance_all += r.importance
        else:
            interference += 1
        if r.score is None:
            continue
        if not r.interference:
            recalled += r.score == 2
            weighted += 0.5 * r.score * r.importance
            valid += 1
            importance_valid += r.importance
        else:
            kept += r.score == 0
            kept_valid += 1
    integrity: Scores = {
        "recall(all)": ratio(recalled, num), "recall(valid)": ratio(recalled, valid),
        "weighted_recall(all)": ratio(weighted, importance_all),
        "weighted_recall(valid)": ratio(weighted, importance_valid),
        "memory_valid_importance_sum": importance_valid, "memory_importance_sum": importance_all,
        "memory_valid_num": valid, "memory_num": num}
    noise: Scores = {
        "interference_accuracy(all)": ratio(kept, interference),
        "interference_accuracy(valid)": ratio(kept, kept_valid),
        "interference_memory_valid_num": kept_valid, "interference_memory_num": interference}
    return integrity, noise


def accuracy_scores(records: Sequence[AccuracyRecord]) -> Scores:
    """memory_accuracy's target and weighted parts: 0.5 * score summed over the memories in the gold
    points (target) or over all (weighted); "(all)" by every such memory, "(valid)" by those with a score."""
    target = weighted = 0.0
    target_valid = target_num = valid = 0
    for r in records:
        target_num += r.included
        if r.score is None:
            continue
        if r.included:
            target += 0.5 * r.score
            target_valid += 1
        weighted += 0.5 * r.score
        valid += 1
    num = len(records)
    return {"target_accuracy(all)": ratio(target, target_num), "target_accuracy(valid)": ratio(target, target_valid),
            "target_memory_valid_num": target_valid, "target_memory_num": target_num,
            "weighted_accuracy(all)": ratio(weighted, num), "weighted_accuracy(valid)": ratio(weighted, valid),
            "memory_valid_num": valid, "memory_num": num}


def label_ratios(labels: Sequence[str | None], names: Mapping[str, str], suffix: str, count_key: str) -> Scores:
    """The share of each label (`names`: label -> key stem) over all labels "(all)" and over the valid ones
    "(valid)" (a label among `names`), with `<count_key>_valid_num` and `<count_key>_num`."""
    valid = [x for x in labels if x in names]
    out: Scores = {}
    for label, stem in names.items():
        n = sum(x == label for x in valid)
        out[f"{stem}_{suffix}(all)"] = ratio(n, len(labels))
        out[f"{stem}_{suffix}(valid)"] = ratio(n, len(valid))
    out[f"{count_key}_valid_num"] = len(valid)
    out[f"{count_key}_num"] = len(labels)
    return out


def update_scores(records: Sequence[UpdateRecord]) -> Scores:
    """memory_update: the Correct / Hallucination / Omission / Other ratios, (all) and (valid)."""
    names = {label: label.lower() for label in UPDATE_LABELS}
    return label_ratios([r.label for r in records], names, "update_memory_ratio", "update_memory")


def qa_scores(labels: Sequence[str | None]) -> Scores:
    """question_answering: the Correct / Hallucination / Omission ratios, (all) and (valid)."""
    return label_ratios(list(labels), {label: label.lower() for label in QA_LABELS}, "qa_ratio", "qa")


def qa_ratios(rows: Iterable[Mapping[str, object]]) -> Scores:
    """question_answering from judge_answers rows of the halumem judge (`judge_kind` halumem), one record
    per row: its label from its reason; a failed row (its call raised) is invalid, as the release records
    a judge call that raised; skipped rows (other datasets) are left out."""
    labels = [None if r.get("error") is not None else row_label(_text(r.get("reason")))
              for r in rows if r.get("judge_kind", JUDGE) == JUDGE and r.get("skipped") is None]
    return qa_scores(labels)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def memory_type_scores(integrity: Sequence[IntegrityRecord], updates: Sequence[UpdateRecord]) -> dict[str, Scores]:
    """memory_type_accuracy: per memory type, the integrity points scored 2 and the updates judged Correct,
    each over all that type's points of both kinds (interference points and unreadable judgments
    included); memory_acc their sum. The release's three types always, others as they come."""
    counts: dict[str, list[int]] = {t: [0, 0, 0] for t in MEMORY_TYPES}  # integrity hits, update hits, total
    for r in integrity:
        c = counts.setdefault(r.memory_type, [0, 0, 0])
        c[0] += r.score == 2
        c[2] += 1
    for u in updates:
        c = counts.setdefault(u.memory_type, [0, 0, 0])
        c[1] += u.label == "Correct"
        c[2] += 1
    out: dict[str, Scores] = {}
    for kind, (hits, correct, total) in counts.items():
        integrity_acc, update_acc = ratio(hits, total), ratio(correct, total)
        memory_acc = None if integrity_acc is None or update_acc is None else integrity_acc + update_acc
        out[kind] = {"memory_integrity_acc": integrity_acc, "memory_update_acc": update_acc, "total_num": total,
                     "memory_acc": memory_acc}
    return out


def aggregate(integrity_records: Sequence[IntegrityRecord], accuracy_records: Sequence[AccuracyRecord],
              update_records: Sequence[UpdateRecord], qa_records: Sequence[QARecord]
              ) -> dict[str, float | None | Scores | dict[str, Scores]]:
    """evaluation.py's overall_score from the four kinds of record: memory_integrity, memory_accuracy
    (interference, target and weighted accuracy), memory_extraction_f1 (target_accuracy(all) as precision,
    recall(all) as recall), memory_update, question_answering and memory_type_accuracy, each value as
    aggregate_eval_results computes it; a ratio over an empty denominator is None (a ZeroDivisionError
    there)."""
    integrity, interference = integrity_scores(integrity_records)
    accuracy = {**interference, **accuracy_scores(accuracy_records)}
    target, recall = accuracy["target_accuracy(all)"], integrity["recall(all)"]
    return {"memory_integrity": integrity, "memory_accuracy": accuracy,
            "memory_extraction_f1": f1(None if target is None else float(target),
                                       None if recall is None else float(recall)),
            "memory_update": update_scores(update_records),
            "question_answering": qa_scores([q.label for q in qa_records]),
            "memory_type_accuracy": memory_type_scores(integrity_records, update_records)}
