"""MemoryAgentBench's two GPT-4o judges (Hu, Wang and McAuley 2025, llm_based_eval/), as the
`memoryagentbench` judge of judge_answers. Two tasks of the benchmark are judged by a model; every other
task is scored by match (stages/metrics/memoryagentbench.py) and this judge leaves it alone (rows with
`skipped`, SKIP_OTHER_TASK).

- The LongMemEval subset (source "longmemeval..."), as longmem_qa_evaluate.py judges it: LongMemEval's
  own yes/no judge with its prompt per question type (the type the loader keeps in the QA row's judge
  notes, pipeline/corpus/memoryagentbench.py JUDGE_NOTES; abstention for a question id containing
  "_abs"), reused from stages/judging/longmemeval.py, whose prompts carry the same elements as the
  script's get_anscheck_prompt. The bare question, the gold and the
  response are shown; the verdict is yes when "yes" is anywhere in the lower-cased reply (1, else 0).
  Official sampling: gpt-4o, temperature 0, at most 10 tokens, one sample (the run's judge settings).

- InfBench summarisation (source "infbench_sum..."), as summarization_evaluate.py judges it, HELMET's
  summary judge for novels: three independent calls per summary, each reasoning step by step before a
  JSON score (fluency alone is asked for the score only):
  - fluency, 0 or 1: 0 for a text that is incoherent, repetitive (in meaning, not only in words),
    incomplete or gibberish, even when it is otherwise coherent; 1 for a coherent, non-repetitive, fluent
    and grammatical text, even when its last sentence is cut off; {"fluency": n};
  - recall: for each numbered key point of the reference summary, whether the summary mostly supports
    its facts (a point of several facts counts when most of them are there); the count of such points,
    with their numbers; {"supported_key_points": [...], "recall": n};
  - precision: for each sentence of the summary, whether the expert (gold) summary supports it: its main
    facts agree with it (missing minor details such as dates, names or places do not matter), and not
    when its main facts are absent or contradicted, or when it adds what the expert summary lacks, such
    as analysis or commentary; the count of supported sentences and of all sentences;
    {"precision": n, "sentence_count": m}.
  Each call's reply is read as the script's parse_json reads it: the last {...} span without nested
  braces, as JSON; when that fails, the last ```json fenced block; otherwise unreadable. The per-item
  score (`summary_f1`): recall = found / key points (0 with none), precision = supported / sentences (0
  with none), F1 = fluency x 2 recall precision / (recall + precision) (0 when both are 0). The task
  score is the mean F1 over the judged summaries (the script also averages recall, precision and
  fluency; each row keeps them in its `reason`). The key points come with the data (metadata
  "keypoints", kept by the loader in the judge notes); the expert summary is the first gold string. A
  summary any of whose three replies is unreadable (no JSON, or without the score it asks for) gets no
  score, as the script leaves it out of every average: its row is written with `skipped`
  (SKIP_UNREADABLE) and the replies kept in `reason`, never a failed row; a call that fails fails the
  row. Official sampling: gpt-4o-2024-05-13, temperature 0.1, top_p 0.9, at most 4096 tokens, seed 42,
  no system message (SUMMARY_SAMPLING, fixed here: one judge_answers section cannot name two samplings).

The script's few-shot examples are long excerpts of two novels; ours are short made-up ones, one per
score or case. All wording is ours.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.corpus.memoryagentbench import DATASET, gold_answers, source_of
from pipeline.llm.types import ChatLLM, LLMResult, Messages
from stages.judging.calls import JudgeCall, RunRequests

JUDGE = "memoryagentbench"
LONGMEMEVAL_TASK = "longmemeval"
SUMMARY_TASK = "infbench_sum"
SUMMARY = "summary"  # the `judge_prompt` of a summary's rows
PARTS = ("fluency", "recall", "precision")
# summarization_evaluate.py's OpenAIModel("gpt-4o-2024-05-13", temperature=0.1, generation_max_length=4096)
SUMMARY_SAMPLING: dict[str, float | int] = {"temperature": 0.1, "top_p": 0.9, "max_tokens": 4096}

SKIP_OTHER_DATASET = "not a MemoryAgentBench question (the memoryagentbench judge judges no other dataset)"
SKIP_OTHER_TASK = ("a MemoryAgentBench task scored by match, not by a model (only longmemeval and infbench_sum "
                   "are judged)")
SKIP_UNREADABLE = ("a judge reply without its score (summarization_evaluate.py leaves such a summary out of "
                   "every average)")

_JUDGE = "You are a fair, impartial judge of a summary of a novel written by a model."
_THINK = ("Reason about it step by step first, then give your score on the last line as JSON in exactly "
          "this form: %s")
SYSTEMS = {
    "fluency": _JUDGE + " Rate how fluent the text is: whether it hangs together, does not repeat itself, "
               "reads smoothly and is grammatical.\n\n"
               "Scale:\n"
               "- 0: the text is incoherent, repeats itself (saying the same thing again counts, even in other "
               "words), is incomplete, or is gibberish. A text that hangs together still gets 0 when it is "
               "repetitive or incomplete.\n"
               "- 1: the text is coherent, free of repetition, fluent and grammatical. It still gets 1 when "
               "only its last sentence is cut off.\n\n"
               "Made-up examples:\n"
               "- Incomplete, 0: \"Summary:\"\n"
               "- Incoherent, 0: \"Summary: the the ship ship of of ###### and and\"\n"
               "- Repetitive, 0: \"Anna leaves the farm. She goes away from the farm. Anna leaves the farm "
               "behind. She goes away from the farm.\"\n"
               "- Fluent, 1: \"Anna, a farmer's daughter, leaves home for the city, where she trains as a "
               "nurse. When the war comes she returns to care for her father, and the novel ends as she "
               "reopens the\"\n\n"
               "Give your score as JSON in exactly this form: {\"fluency\": 1}",
    "recall": _JUDGE + " The summary should cover the plot and the characters of the story, and contain "
              "every key point of the reference summary, listed for you by number.\n\n"
              "Recall: go through the key points one by one and decide whether the summary contains each. A "
              "key point counts as present when the summary mostly supports its facts; a key point made of "
              "several facts still counts when most of those facts are in the summary. Your score is the "
              "number of key points present.\n\n"
              "Made-up example:\n"
              "Key points:\n1. Anna grows up on her father's farm.\n2. Anna trains as a nurse in the city.\n"
              "3. Anna marries the village doctor.\n"
              "Summary: \"Raised on a farm, Anna moves to the city to study nursing.\"\n"
              "Reasoning: the summary says Anna was raised on a farm (point 1, present) and studies nursing in "
              "the city (point 2, present); it never mentions a marriage (point 3, missing). Two points are "
              "present.\n"
              "Score: {\"supported_key_points\": [1, 2], \"recall\": 2}\n\n"
              + _THINK % "{\"supported_key_points\": [1, 3], \"recall\": 2}"
              + " (\"supported_key_points\" lists the numbers of the key points present, \"recall\" is how "
                "many they are).",
    "precision": _JUDGE + " You also see an expert's summary of the same novel.\n\n"
                 "Precision: go through the model's summary sentence by sentence and decide whether the "
                 "expert summary supports each. A sentence is supported when its main facts agree with the "
                 "expert summary; minor details the expert summary does not state, such as dates, names or "
                 "places, do not count against it. A sentence is not supported when its main facts are "
                 "missing from the expert summary or contradicted by it, nor when it adds information the "
                 "expert summary does not have, such as analysis of or commentary on the story. Your score is "
                 "the number of supported sentences, given with the number of sentences in the model's "
                 "summary.\n\n"
                 "Made-up example:\n"
                 "Expert summary: \"Anna grows up on a farm, trains as a nurse in the city and returns home "
                 "when war breaks out.\"\n"
                 "Model's summary: \"Anna leaves her family's farm for the city. There she becomes a teacher. "
                 "The novel is a moving meditation on duty.\"\n"
                 "Reasoning: sentence 1 agrees with the expert summary (supported); sentence 2 contradicts it, "
                 "she trains as a nurse (not supported); sentence 3 is commentary the expert summary does not "
                 "have (not supported). One of three sentences is supported.\n"
                 "Score: {\"precision\": 1, \"sentence_count\": 3}\n\n"
                 + _THINK % "{\"precision\": 4, \"sentence_count\": 9}",
}
ASKS = {
    "fluency": "Rate the fluency of the text above.",
    "recall": "Decide which key points the summary above contains, reasoning first, then give the JSON score.",
    "precision": "Decide which sentences of the model's summary the expert summary supports, reasoning first, "
                 "then give the JSON score.",
}
# The keys each part's JSON must carry for the script's arithmetic (recall's list of numbers is not used).
SCORE_KEYS = {"fluency": ("fluency",), "recall": ("recall",), "precision": ("precision", "sentence_count")}
PROMPTS = {**{f"system.{JUDGE}.{k}": v for k, v in SYSTEMS.items()}, **{f"ask.{JUDGE}.{k}": v for k, v in ASKS.items()}}

_LAST_OBJECT = re.compile(r"\{.*?\}", re.DOTALL)
_FENCED = re.compile(r"(?:```json)(.+)(?:```)", re.DOTALL)


def judged_task(dataset: str | None, category: str | None) -> str | None:
    """Which judge a probe gets: LONGMEMEVAL_TASK, SUMMARY_TASK, or None (not judged by a model)."""
    if dataset != DATASET:
        return None
    source = source_of(category)
    for task in (LONGMEMEVAL_TASK, SUMMARY_TASK):
        if source is not None and source.startswith(task):
            return task
    return None


def question_type(notes: Sequence[str] | None) -> str | None:
    """A LongMemEval question's type from its QA row's judge notes (the loader's JUDGE_NOTES: the type
    alone); None without one (the judge's standard prompt)."""
    return notes[0] if notes and len(notes) == 1 else None


def numbered(keypoints: Sequence[str]) -> str:
    """The key points one a line, numbered from 1 ("1. ..."), as the script lists them."""
    return "\n".join(f"{i}. {point}" for i, point in enumerate(keypoints, 1))


def build_messages(part: str, summary: str, keypoints: Sequence[str], expert: str) -> Messages:
    """The system prompt of `part` (fluency, recall, precision), then what it reads: the text alone
    (fluency), the numbered key points and the summary (recall), the expert and the model's summaries
    (precision); the summary stripped, as the script strips it."""
    text = summary.strip()
    if part == "fluency":
        material = f"Text: \"{text}\""
    elif part == "recall":
        material = f"Key points:\n{numbered(keypoints)}\n\nSummary: \"{text}\""
    else:
        material = f"Expert summary: \"{expert}\"\n\nModel's summary: \"{text}\""
    return [{"role": "system", "content": SYSTEMS[part]}, {"role": "user", "content": f"{material}\n\n{ASKS[part]}"}]


def parse_json(text: str | None) -> object:
    """The script's parse_json: the last {...} span (the shortest from each brace, so no nested
    braces) as JSON; if that is not JSON, the last ```json fenced block; None when neither reads (or the
    reply has no {...} span at all)."""
    raw = text or ""
    spans = _LAST_OBJECT.findall(raw)
    if not spans:
        return None
    try:
        return json.loads(spans[-1])
    except ValueError:
        fenced = _FENCED.findall(raw)
        try:
            return json.loads(fenced[-1])
        except (ValueError, IndexError):
            return None


def read_scores(part: str, text: str | None) -> dict[str, float] | None:
    """The numbers `part`'s reply gives (SCORE_KEYS), or None when the reply is unreadable: no JSON
    object, or one without a number under each key (the script would stop on such a reply)."""
    parsed = parse_json(text)
    if not isinstance(parsed, dict):
        return None
    values = {k: parsed.get(k) for k in SCORE_KEYS[part]}
    if not all(isinstance(v, (int, float)) for v in values.values()):
        return None
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float))}


@dataclass(frozen=True)
class SummaryScores:
    """One summary's judgment: what each call found and the F1 they make."""

    fluency: float
    recall_found: float
    recall_total: int
    precision_found: float
    precision_total: float
    recall: float
    precision: float
    f1: float


def summary_f1(fluency: float, recall_found: float, keypoints: int, precision_found: float,
               sentence_count: float) -> SummaryScores:
    """The script's combination: recall over the key points (0 with none), precision over the summary's
    sentences (0 with none), F1 scaled by fluency (0 when recall and precision are both 0)."""
    recall = recall_found / keypoints if keypoints > 0 else 0.0
    precision = precision_found / sentence_count if sentence_count > 0 else 0.0
    f1 = fluency * 2 * recall * precision / (recall + precision) if recall + precision > 0 else 0.0
    return SummaryScores(fluency, recall_found, keypoints, precision_found, sentence_count, recall, precision, f1)


def summary_calls(summary: str, keypoints: Sequence[str], expert: str) -> dict[str, JudgeCall]:
    """The three calls of one summary's judgment, by part; each reads its reply into (scores or None,
    the reply, the judge model)."""
    def reader(part: str) -> JudgeCall:
        def read(result: LLMResult) -> tuple[dict[str, float] | None, str, str]:
            return read_scores(part, result.text), result.text or "", result.model

        return JudgeCall(build_messages(part, summary, keypoints, expert), None, read)

    return {part: reader(part) for part in PARTS}


def summary_judgment(replies: dict[str, tuple[dict[str, float] | None, str, str]],
                     keypoints: int) -> tuple[float | None, str, str | None, str]:
    """(F1 or None, the reason, why it is skipped or None, judge model) of one summary from its three
    calls' readings: the reason is JSON of the parts (fluency, recall and precision found and their
    totals, recall, precision, F1) and the three replies; an unreadable reply leaves the F1 out."""
    scores = {part: replies[part][0] for part in PARTS}
    kept: dict[str, object] = {"replies": {part: replies[part][1] for part in PARTS}}
    model = replies["fluency"][2]
    f, r, p = scores["fluency"], scores["recall"], scores["precision"]
    if f is None or r is None or p is None:
        kept["unreadable"] = [part for part in PARTS if scores[part] is None]
        return None, json.dumps(kept, ensure_ascii=False), SKIP_UNREADABLE, model
    s = summary_f1(f["fluency"], r["recall"], keypoints, p["precision"], p["sentence_count"])
    parts = {"fluency": s.fluency, "recall_found": s.recall_found, "recall_total": s.recall_total,
             "precision_found": s.precision_found, "precision_total": s.precision_total, "recall": s.recall,
             "precision": s.precision, "f1": s.f1}
    return s.f1, json.dumps({**parts, **kept}, ensure_ascii=False), None, model


async def judge_summary_runs(llm: ChatLLM, summary: str, keypoints: Sequence[str], gold: str | None,
                             runs: int, mode: RunRequests = "samples",
                             **params: float | int) -> list[tuple[float | None, str, str, str | None, str] | Exception]:
    """Each run's judgment of one summary, in run order: (F1 or None, judge_prompt SUMMARY, reason,
    skipped or None, judge model), or the LLMError of a call that failed (the run's row then fails).
    `gold` is the probe's encoded gold: the expert summary is its first string. Sampling:
    SUMMARY_SAMPLING over `params`."""
    golds = gold_answers(gold)
    expert = golds[0] if golds else ""
    calls = summary_calls(summary, keypoints, expert)
    sampling = {**params, **SUMMARY_SAMPLING}
    asked = await asyncio.gather(*(calls[part].runs(llm, runs, mode, **sampling) for part in PARTS))
    answered = dict(zip(PARTS, asked))
    out: list[tuple[float | None, str, str, str | None, str] | Exception] = []
    for r in range(runs):
        got = {part: answered[part][r] for part in PARTS}
        failed = next((v for v in got.values() if isinstance(v, Exception)), None)
        if failed is not None:
            out.append(failed)
            continue
        readings = {part: (v[0], v[1], v[2]) for part, v in got.items() if isinstance(v, tuple)}
        f1, reason, skipped, model = summary_judgment(readings, len(keypoints))
        out.append((f1, SUMMARY, reason, skipped, model))
    return out
