"""The audited LoCoMo answer key (`corpus.answer_key: audited`): the gold answers that dial481/locomo-audit
finds wrong, replaced by its corrections.

The audit (CC BY-NC 4.0, non-commercial use only; fetched by `mempipe data fetch locomo-audit`, never
shipped here) gives one file per conversation, `errors_conv_<N>.json`: a JSON list of items with
`question_id` ("locomo_<N>_qa<i>": conversation N of locomo10.json, question i of its `qa` list, both
from 0), `question`, `golden_answer`, `category`, `error_type`, `cited_evidence`, `correct_evidence`,
`reasoning` and `correct_answer`. Ours: conversation N is the sample whose `sample_id` is
`SAMPLE_IDS[N]`, question i is qa_id `locomo-<sample_id>-q<i>` (pipeline/corpus/locomo.py numbers the
`qa` list from 0 too); every item's question and gold must equal the corpus's, so a corpus the audit did
not read fails with the item named instead of taking another question's answer.

Only the classes that corrupt a score change the gold (`SCORE_CLASSES`); WRONG_CITATION items keep
theirs (their answer is right, only the cited turns are not). A correction that is a remark rather than
an answer ("The question should ask about James, not John", "Unclear - D2:1 says ...") is dropped and
counted (`classify`); one that repeats the gold, or whose remark corrects the question, leaves it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pipeline.corpus.records import Rows
from pipeline.errors import InputError

AnswerKey = Literal["original", "audited"]
ANSWER_KEYS: tuple[str, ...] = ("original", "audited")
SOURCE = "locomo-audit"  # its `mempipe data fetch` name (pipeline/corpus/sources.py)
AUDIT_DIR = "locomo-audit"  # where that fetch puts the files, under its --dir
# The audit's conversations in the order of locomo10.json, as its audit/conv_<N>.json files name them
# (`sample_id`, at the commit sources.py pins).
SAMPLE_IDS: tuple[str, ...] = ("conv-26", "conv-30", "conv-41", "conv-42", "conv-43", "conv-44", "conv-47",
                               "conv-48", "conv-49", "conv-50")
SCORE_CLASSES: tuple[str, ...] = ("HALLUCINATION", "TEMPORAL_ERROR", "ATTRIBUTION_ERROR", "AMBIGUOUS", "INCOMPLETE")
CITATION_CLASS = "WRONG_CITATION"
ERROR_CLASSES: tuple[str, ...] = (*SCORE_CLASSES, CITATION_CLASS)
STATS_KEY = "audited_answer_key"  # the ingest manifest's counts
_AUDIT_ID = re.compile(r"^locomo_(\d+)_qa(\d+)$")
_FIELDS = ("question_id", "question", "golden_answer", "error_type", "correct_answer")

Outcome = Literal["changed", "commentary", "unchanged", "citation"]


@dataclass(frozen=True)
class Correction:
    """One audit item, with our qa_id."""

    qa_id: str  # ours: locomo-conv-26-q2
    audit_id: str  # the audit's: locomo_0_qa2
    error_class: str
    question: str
    gold: str  # the gold the audit read (its golden_answer)
    answer: str  # its correct_answer
    evidence: tuple[str, ...]  # its correct_evidence (may be empty)
    file: str
    record: str  # "item 3"


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    answer: str | None = None  # the new gold, when changed


def audit_files(directory: str | Path) -> list[Path]:
    """The files the audited key reads, in conversation order."""
    return [Path(directory) / f"errors_conv_{n}.json" for n in range(len(SAMPLE_IDS))]


def fetch_hint(directory: str | Path) -> str:
    """The command that puts the audit in `directory` (`corpus.audit_path`)."""
    d = Path(directory)
    if d.name != AUDIT_DIR:
        return (f"run `mempipe data fetch {SOURCE} --dir DIR` (it writes DIR/{AUDIT_DIR}/) and point "
                "corpus.audit_path there")
    parent = d.parent
    try:
        parent = parent.relative_to(Path.cwd())
    except ValueError:
        pass
    where = "" if parent.as_posix() == "data" else f" --dir {parent}"
    return f"run `mempipe data fetch {SOURCE}{where}`"


def our_qa_id(audit_id: str, file: str, record: str) -> str:
    """`locomo_0_qa2` -> `locomo-conv-26-q2`."""
    m = _AUDIT_ID.match(audit_id)
    if m is None:
        raise InputError(file, record, "question_id", f"{audit_id!r} is not locomo_<conversation>_qa<question>")
    n = int(m[1])
    if n >= len(SAMPLE_IDS):
        raise InputError(file, record, "question_id", f"{audit_id!r}: the audit has conversations 0 to "
                                                      f"{len(SAMPLE_IDS) - 1}")
    return f"locomo-{SAMPLE_IDS[n]}-q{int(m[2])}"


def read_corrections(directory: str | Path) -> dict[str, Correction]:
    """Every audit item of the ten files in `directory`, by our qa_id. A missing file is an InputError
    naming the fetch command; a malformed item one naming its file, item and field."""
    out: dict[str, Correction] = {}
    for n, path in enumerate(audit_files(directory)):
        if not path.is_file():
            raise InputError(str(path), None, None, "no such file: the audited LoCoMo answer key "
                             f"(corpus.answer_key: audited) reads dial481/locomo-audit's corrections; {fetch_hint(directory)}")
        for c in parse_file(path, n):
            if c.qa_id in out:
                raise InputError(c.file, c.record, "question_id", f"{c.audit_id} is given twice "
                                 f"(also {out[c.qa_id].file}, {out[c.qa_id].record})")
            out[c.qa_id] = c
    return out


def parse_file(path: Path, conversation: int) -> list[Correction]:
    """The items of one errors_conv_<N>.json (N = `conversation`)."""
    file = str(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(file, None, None, f"not a readable JSON file: {e}") from None
    if not isinstance(data, list):
        raise InputError(file, None, None, f"expected a JSON list of audit items, got {type(data).__name__}")
    return [_correction(item, file, f"item {i}", conversation) for i, item in enumerate(data)]


def _correction(item: Any, file: str, record: str, conversation: int) -> Correction:
    if not isinstance(item, dict):
        raise InputError(file, record, None, f"expected an object, got {type(item).__name__}")
    for name in _FIELDS:
        if name not in item:
            raise InputError(file, record, name, "missing")
    text = {name: item[name] for name in _FIELDS}
    for name in ("question_id", "question", "error_type", "correct_answer"):
        if not isinstance(text[name], str):
            raise InputError(file, record, name, f"expected a string, got {type(text[name]).__name__}")
    if not isinstance(text["golden_answer"], (str, int, float)) or isinstance(text["golden_answer"], bool):
        raise InputError(file, record, "golden_answer", f"expected a string or number, got "
                                                        f"{type(text['golden_answer']).__name__}")
    if text["error_type"] not in ERROR_CLASSES:
        raise InputError(file, record, "error_type", f"unknown class {text['error_type']!r} (known: "
                                                     f"{', '.join(ERROR_CLASSES)})")
    evidence = item.get("correct_evidence") or []
    if not isinstance(evidence, list) or not all(isinstance(e, str) for e in evidence):
        raise InputError(file, record, "correct_evidence", "expected a list of dialogue ids (\"D1:3\")")
    qa_id = our_qa_id(text["question_id"], file, record)
    if not text["question_id"].startswith(f"locomo_{conversation}_"):
        raise InputError(file, record, "question_id", f"{text['question_id']!r} is not a question of "
                                                      f"conversation {conversation}, which this file audits")
    return Correction(qa_id=qa_id, audit_id=text["question_id"], error_class=text["error_type"],
                      question=text["question"], gold=str(text["golden_answer"]), answer=text["correct_answer"],
                      evidence=tuple(evidence), file=file, record=record)


# -- what a correction does ------------------------------------------------------------------------------

# Words that make a correction a remark about the item (its question, evidence or speaker) rather than an
# answer to the question: "not Jolene", "never named", "the transcript", "the evidence is contradictory".
_REMARK = re.compile(r"\b(?:not|never|cannot|unclear|unknown|unspecified|indeterminable|unresolvable|"
                     r"contradictory|transcript|evidence|question|golden|answer|statement|should)\b|n't\b",
                     re.IGNORECASE)
# An answer followed by a remark in brackets: "fashion internship (but ... not May 23 as stated in the question)".
_TRAILING = re.compile(r"^(?P<head>.*?)\s*\((?P<remark>[^()]*)\)\s*\.?$", re.DOTALL)
_QUESTION = re.compile(r"\bquestion\b", re.IGNORECASE)


def classify(c: Correction) -> Verdict:
    """What the audited key does with one item: `changed` (the gold becomes the correction, a trailing
    bracketed remark cut), `commentary` (the correction explains instead of answering: dropped),
    `unchanged` (it repeats the gold, or its remark corrects the question: the gold stands) or
    `citation` (WRONG_CITATION: the gold is right, kept)."""
    if c.error_class == CITATION_CLASS:
        return Verdict("citation")
    text = " ".join(c.answer.split())
    m = _TRAILING.match(text)
    if m and (m["remark"].lower().startswith("but ") or _REMARK.search(m["remark"])):
        if _QUESTION.search(m["remark"]):
            return Verdict("unchanged")  # the question is what the audit corrects
        text = m["head"]
    if not text or _REMARK.search(text):
        return Verdict("commentary")
    if _norm(text) == _norm(c.gold):
        return Verdict("unchanged")
    return Verdict("changed", text)


def _norm(text: str) -> str:
    return re.sub(r"[^0-9a-z]+", "", text.lower())


def _same(a: str | None, b: str) -> bool:
    return a is not None and " ".join(a.split()) == " ".join(b.split())


def audited_qa(row: dict[str, Any], c: Correction | None, turn_ids: set[str]) -> dict[str, Any]:
    """One qa row under the audited key: `answer` (and `evidence`, where the audit gives turns of the
    episode) from the correction when `classify` says changed, with `answer_key_class` naming the class;
    the dataset's own gold stays in `gold_original` / `evidence_original`. An item whose question or
    gold differs from the audit's is an InputError naming the audit file, item and field."""
    out = {**row, "answer_key": "audited"}
    if c is None:
        return out
    if not _same(row["question"], c.question):
        raise InputError(c.file, c.record, "question", f"{c.audit_id} asks {c.question!r}, but {row['qa_id']} "
                         f"asks {row['question']!r}: the corpus is not the locomo10.json the audit read")
    original = row.get("gold_original", row["answer"])
    if not _same(original, c.gold):
        raise InputError(c.file, c.record, "golden_answer", f"{c.audit_id}'s gold is {c.gold!r}, but "
                         f"{row['qa_id']}'s is {original!r}: the corpus is not the locomo10.json the audit read")
    verdict = classify(c)
    if verdict.outcome != "changed":
        return out
    evidence = [e for e in c.evidence if e in turn_ids]  # ids naming no turn would only cap recall
    return {**out, "answer": verdict.answer, "evidence": evidence or row["evidence"], "answer_key_class": c.error_class}


def audited_rows(rows: Rows, corrections: Mapping[str, Correction]) -> tuple[Rows, dict[str, Any]]:
    """One episode's rows under the audited key, and the counts for the ingest manifest
    (`{STATS_KEY: {changed, dropped_commentary, unchanged, wrong_citation_kept, by_class}}`)."""
    turn_ids = {t["source_turn_id"] for t in rows.turns}
    ids = {q["qa_id"] for q in rows.qa}
    prefix = f"{rows.episode['episode_id']}-q"
    for c in corrections.values():  # an item the episode lacks: the corpus is another release
        if c.qa_id.startswith(prefix) and c.qa_id not in ids:
            raise InputError(c.file, c.record, "question_id", f"{c.audit_id} names question {c.qa_id}, which "
                             f"{rows.episode['episode_id']} does not have: the corpus is not the locomo10.json "
                             "the audit read")
    qa = [audited_qa(q, corrections.get(q["qa_id"]), turn_ids) for q in rows.qa]
    return Rows(rows.episode, rows.turns, qa, rows.memory_points), answer_key_stats(corrections.get(q["qa_id"]) for q in rows.qa)


_COUNT_NAMES: dict[Outcome, str] = {"changed": "changed", "commentary": "dropped_commentary",
                                    "unchanged": "unchanged", "citation": "wrong_citation_kept"}


def answer_key_stats(corrections: Iterable[Correction | None]) -> dict[str, Any]:
    """Counts of what the audited key did with these items (None: an item the audit does not name)."""
    counts = dict.fromkeys(_COUNT_NAMES.values(), 0)
    by_class = {cls: dict.fromkeys(_COUNT_NAMES.values(), 0) for cls in ERROR_CLASSES}
    for c in corrections:
        if c is None:
            continue
        name = _COUNT_NAMES[classify(c).outcome]
        counts[name] += 1
        by_class[c.error_class][name] += 1
    return {STATS_KEY: {**counts, "by_class": by_class}}


def add_counts(total: dict[str, Any], more: Mapping[str, Any]) -> dict[str, Any]:
    """`more`'s counts added into `total` (nested dicts key by key), as the manifest sums parts."""
    for k, v in more.items():
        if isinstance(v, Mapping):
            add_counts(total.setdefault(k, {}), v)
        else:
            total[k] = total.get(k, 0) + v
    return total


# -- reading a qa table under either key -----------------------------------------------------------------

def gold(row: Mapping[str, Any], key: AnswerKey) -> str | None:
    """A qa row's gold answer under `key`: `original` is the dataset's own (`gold_original`; a table
    written before that column: `answer`); `audited` is `answer` of a row read with
    `corpus.answer_key: audited` (ValueError for a row read with the original key)."""
    if key == "original":
        return row["gold_original"] if "gold_original" in row else row["answer"]
    if key == "audited":
        if row.get("answer_key") != "audited":
            raise ValueError(f"qa {row.get('qa_id')!r} was read with the {row.get('answer_key') or 'original'} "
                             "answer key: its audited gold needs a run with corpus.answer_key: audited")
        return row["answer"]
    raise ValueError(f"unknown answer key {key!r} (known: {', '.join(ANSWER_KEYS)})")


def evidence(row: Mapping[str, Any], key: AnswerKey) -> list[str] | None:
    """A qa row's gold evidence under `key`, as `gold` reads its answer."""
    gold(row, key)  # the same checks
    if key == "original" and "evidence_original" in row:
        return row["evidence_original"]
    return row["evidence"]
