"""`mempipe export predictions`: a run's answers in the files each benchmark's official scorer reads.

- LoCoMo (`--format locomo`): `<out>/locomo_predictions.json`, the run's samples as LoCoMo's own
  file holds them (read back from the ingested file, so every key and value is the release's), each
  QA item carrying `<method>_prediction` (the response) and, where the method records which turns
  entered its context, `<method>_prediction_context` (their dia_ids, "D3:7"; or session ids, "S3",
  where its memories only name their session): the layout LoCoMo's `task_eval` writes and
  `evaluation.eval_question_answering(qas, "<method>_prediction")` scores, recall included.
- LongMemEval (`--format longmemeval`): `<out>/<method>.jsonl`, one `{"question_id", "hypothesis"}`
  line per answered question in the input file's order, as `src/evaluation/evaluate_qa.py` reads it.
- LoCoMo-Plus (`--format locomo_plus`): `<out>/<method>.json`, one record per answered question, the
  cognitive items then LoCoMo's, in the layout the release's `task_eval/evaluate_qa.py` writes and
  `llm_as_judge.py` reads (`stages/judging/locomo_plus.py`'s `release_record`).
- MemoryAgentBench (`--format memoryagentbench`): `<out>/<method>/<competency>/<task>_results.json`,
  one file per method and task (`metadata.source`), laid out as the official main.py saves a run's
  results (`{agent_config, dataset_config, data, metrics, time_cost, averaged_metrics}`), which its
  llm_based_eval/longmem_qa_evaluate.py and summarization_evaluate.py read from
  `outputs/<method>/<competency>/`: `data` holds one record per answered question in the input
  file's order, `output` (the response), `answer` (the release's gold value as the official passes it:
  the question's entry of `answers`, or the whole list for a context's one question), `query` (our
  question text; the official's is its prompt template filled in), `query_id` (its place in the file)
  and `qa_pair_id` (the release's `metadata.qa_pair_ids` entry, null without one); where the run has a
  finished response_metrics stage, each record also carries the official per-task scores by their
  official names (exact_match, f1, ..., recsys_recall@5), `metrics` their lists and
  `averaged_metrics` their means x 100, as main.py writes them. LongMemEval's judge pairs the records
  with the release's questions by position, so it needs every question of the task answered.

Where the run has a finished `diagnose` stage, each prediction also carries the bucket it diagnosed
(why the answer failed: write, retrieval or read; docs/judges-and-metrics.md): LoCoMo's QA item a
`<method>_bucket` key beside `<method>_prediction`, LongMemEval's line a `"bucket"` key (the
official scorers read only their own keys), and `predictions_summary.json` each method's count per
bucket under `buckets` (method -> bucket -> questions). A question the stage did not diagnose (it
samples with `diagnose.max_probes_per_episode`) gets no bucket. Without the stage, nothing changes.

A question the run did not probe gets no prediction (no key, no line). A response that failed is
exported as an empty answer, so the official scorers count it wrong, as our report does: the
token scorers (metric_summary) score it 0, and the correct / wrong judges' rows (answer_summary,
teafarm_summary) score it wrong and also count it in `failed` (LongMemEval's own run_generation.py
would leave its line out instead). `<out>/predictions_summary.json` counts both per method. The
prediction is the method's response as stored: under LongMemEval's reader (and mem0's rag.py frame)
that is the raw completion, stripped, as the official code stores it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pipeline.artifacts import StageDir
from pipeline.config import RunConfig
from pipeline.corpus import locomo
from pipeline.corpus.memoryagentbench import gold_answers, split_category
from pipeline.corpus.reader import iter_records
from pipeline.errors import PipelineError
from stages.judging import locomo_plus
from stages.judging.diagnose import BUCKETS, DiagnoseStage
from stages.method_stages import memory_stage_name, respond_stage_name
from stages.methods import METHODS
from stages.scoring.response_metrics import MAB_SCORES

Format = Literal["locomo", "longmemeval", "locomo_plus", "memoryagentbench"]
QAKey = tuple[str, str]  # (episode_id, qa_id)
_DATASETS = {"locomo_plus": ("locomo_plus", "locomo")}  # the datasets a format's run ingests (default: its own)
LOCOMO_FILE = "locomo_predictions.json"
SUMMARY_FILE = "predictions_summary.json"
PREDICTION, CONTEXT = "{}_prediction", "{}_prediction_context"  # LoCoMo task_eval's key names
BUCKET = "{}_bucket"  # ours, beside them: the diagnose stage's bucket
DIAGNOSE = DiagnoseStage.name  # the stage whose buckets the predictions carry
# The id column of a memory table whose rows a response's `memory_ids` name.
_MEMORY_ID_COLUMNS = ("memory_id", "memo_id", "fact_id", "event_id", "unit_id")


@dataclass(frozen=True)
class Prediction:
    text: str  # "" where the response failed
    context: list[str] | None  # dia_ids ("D3:7") or session ids ("S3"); None: not recorded
    failed: bool = False
    bucket: str | None = None  # the diagnose stage's bucket; None: the run did not diagnose it
    probe_id: str | None = None  # the probe that asked it


def export_predictions(cfg: RunConfig, fmt: Format, methods: list[str] | None, out: Path) -> Path:
    """Write the predictions of `methods` (default: the run's) on the run's `fmt` questions under
    the folder `out`; returns `out`."""
    names = list(methods or cfg.methods)
    if not names:
        raise PipelineError("export predictions: the run names no methods (give --method)")
    for stage in ("ingest", "probes", *(respond_stage_name(m) for m in names)):
        if StageDir(cfg.run_dir, stage).manifest() is None:
            raise PipelineError(f"export predictions: stage {stage} of {cfg.run_dir} is not finished: "
                                "run `mempipe run` first")
    ingest = StageDir(cfg.run_dir, "ingest")
    episodes = [e for e in ingest.read_table("episodes").to_pylist() if e["dataset"] in _DATASETS.get(fmt, (fmt,))]
    if not episodes:
        raise PipelineError(f"export predictions: the run ingested no {fmt} episodes")
    ids = [e["episode_id"] for e in episodes]
    qa = ingest.read_table("qa", episode_ids=ids).to_pylist()  # ingest order: the input file's
    buckets = _buckets(cfg, ids)
    with_context = fmt in ("locomo", "locomo_plus")
    predictions = {m: _predictions(cfg, m, ids, turns=_turn_ids(ingest, ids) if with_context else None,
                                   buckets=buckets) for m in names}
    out.mkdir(parents=True, exist_ok=True)
    if fmt == "locomo":
        _write_json(out / LOCOMO_FILE, _locomo_samples(episodes, qa, ingest, ids, predictions))
    elif fmt == "locomo_plus":
        turns = ingest.read_table("turns", episode_ids=ids).to_pylist()
        for m, preds in predictions.items():
            _write_json(out / f"{m}.json", [locomo_plus.release_record(q, preds[_key(q)].text, m, turns)
                                            for q in qa if _key(q) in preds])
    elif fmt == "memoryagentbench":
        _write_memoryagentbench(cfg, out, episodes, qa, ids, predictions)
    else:
        for m, preds in predictions.items():
            with (out / f"{m}.jsonl").open("w", encoding="utf-8") as f:
                for q in qa:
                    p = preds.get(_key(q))
                    if p is not None:
                        line = {"question_id": q["qa_id"], "hypothesis": p.text}
                        if p.bucket is not None:
                            line["bucket"] = p.bucket
                        f.write(json.dumps(line) + "\n")  # ASCII: the scorer opens it in the locale's encoding
    summary = {"format": fmt, "run_dir": str(cfg.run_dir), "questions": len(qa),
               "methods": {m: _counts(p, qa) for m, p in predictions.items()}}
    if buckets is not None:
        summary["buckets"] = {m: _bucket_counts(p, qa) for m, p in predictions.items()}
    _write_json(out / SUMMARY_FILE, summary)
    return out


def _key(q: Mapping[str, object]) -> QAKey:
    return str(q["episode_id"]), str(q["qa_id"])


def _counts(preds: dict[QAKey, Prediction], qa: list[dict[str, Any]]) -> dict[str, int]:
    asked = [preds[_key(q)] for q in qa if _key(q) in preds]
    return {"predicted": sum(not p.failed for p in asked), "failed": sum(p.failed for p in asked),
            "not_probed": len(qa) - len(asked),
            "with_context": sum(not p.failed and bool(p.context) for p in asked)}


def _bucket_counts(preds: dict[QAKey, Prediction], qa: list[dict[str, Any]]) -> dict[str, int]:
    """Questions per diagnose bucket (every bucket named, in the stage's order) among those exported."""
    asked = [preds[_key(q)].bucket for q in qa if _key(q) in preds]
    return {b: sum(a == b for a in asked) for b in BUCKETS}


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")  # a crash never leaves half a file under the final name
    # ASCII escapes, as locomo10.json itself: the official scorers open files in the locale's encoding.
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


# --- our side: responses and what entered each one's context ------------------------------------

def _turn_ids(ingest: StageDir, ids: list[str]) -> dict[tuple[str, int, int], str]:
    """(episode, session, turn_idx) -> the corpus's own turn id (LoCoMo's dia_id)."""
    return {(t["episode_id"], t["session_idx"], t["turn_idx"]): t["source_turn_id"]
            for t in ingest.read_table("turns", episode_ids=ids).to_pylist() if t["source_turn_id"]}


def _buckets(cfg: RunConfig, ids: list[str]) -> dict[tuple[str, str, str], str] | None:
    """(episode, probe, method) -> its bucket, from a finished `diagnose` stage; None without one."""
    stage = StageDir(cfg.run_dir, DIAGNOSE)
    if stage.manifest() is None:
        return None
    return {(r["episode_id"], r["probe_id"], r["method"]): r["bucket"]
            for r in stage.read_table("buckets", episode_ids=ids).to_pylist()}


def _predictions(cfg: RunConfig, method: str, ids: list[str], turns: dict[tuple[str, int, int], str] | None,
                 buckets: dict[tuple[str, str, str], str] | None = None) -> dict[QAKey, Prediction]:
    """(episode, qa_id) -> the method's prediction (a question id is unique only within its episode);
    with `turns`, each one's context ids too; with `buckets` (`_buckets`), each one's bucket."""
    probes = {(p["episode_id"], p["probe_id"]): p["qa_id"]
              for p in StageDir(cfg.run_dir, "probes").read_table("probes", episode_ids=ids).to_pylist()
              if p["kind"] == "qa" and p["qa_id"] is not None}
    rows = StageDir(cfg.run_dir, respond_stage_name(method)).read_table("responses", episode_ids=ids).to_pylist()
    sources = _memory_sources(cfg, method, ids, turns) if turns is not None else {}
    out: dict[QAKey, Prediction] = {}
    for r in rows:
        qa_id = probes.get((r["episode_id"], r["probe_id"]))
        if qa_id is None:
            continue  # a next-response or TeaFarm probe
        failed = r.get("error") is not None or r["response"] is None
        context = None if turns is None or failed else _context(r, turns, sources)
        bucket = (buckets or {}).get((r["episode_id"], r["probe_id"], method))
        out[(r["episode_id"], qa_id)] = Prediction("" if failed else r["response"], context, failed, bucket,
                                                   r["probe_id"])
    return out


def _memory_sources(cfg: RunConfig, method: str, ids: list[str],
                    turns: dict[tuple[str, int, int], str]) -> dict[tuple[str, str], list[str]]:
    """(episode, memory id) -> the dia_ids its row names as its source, else the dia_id of the turn it
    was written at, else its session as "S<n>" (LoCoMo's session context ids)."""
    m = METHODS.get(method)
    if m is None or not m.memory:
        return {}
    stage = StageDir(cfg.run_dir, memory_stage_name(method))
    if stage.manifest() is None:
        return {}
    out: dict[tuple[str, str], list[str]] = {}
    # A method lists its memory table first; later tables naming the same id (logs of operations or
    # evolution steps) never replace the memory's own source.
    for table, schema in m.memory.items():
        key = next((c for c in _MEMORY_ID_COLUMNS if c in schema.names), None)
        if key is None:
            continue
        for row in stage.read_table(table, episode_ids=ids).to_pylist():
            where = (row["episode_id"], str(row[key]))
            if where in out:
                continue  # the same memory in a later snapshot: same source
            if row.get("source_turn_ids"):
                out[where] = list(row["source_turn_ids"])
            elif row.get("session_idx") is not None and row.get("turn_idx") is not None:
                tid = turns.get((row["episode_id"], row["session_idx"], row["turn_idx"]))
                out[where] = [tid] if tid else [f"S{row['session_idx']}"]
            elif row.get("session_idx") is not None:
                out[where] = [f"S{row['session_idx']}"]
    return out


def _context(r: dict[str, Any], turns: dict[tuple[str, int, int], str],
             sources: dict[tuple[str, str], list[str]]) -> list[str] | None:
    """The ids of what entered a response's context: the turn spans the shared response frame records
    (`context_spans`: [session, first turn_idx, last turn_idx]), else the sources of the memories it
    used. All dia_ids, or all session ids when any memory names only its session (LoCoMo's recall
    reads the list as one or the other by its first id). None when nothing is recorded."""
    details = json.loads(r["details_json"]) if r.get("details_json") else {}
    ids: list[str] = []
    if details.get("context_spans") is not None:
        for s, first, last in details["context_spans"]:
            ids += [tid for t in range(first, last + 1) if (tid := turns.get((r["episode_id"], s, t)))]
    else:
        for mid in r.get("memory_ids") or []:
            ids += sources.get((r["episode_id"], str(mid)), [])
    if not ids:
        return None
    if any(i.startswith("S") for i in ids):
        ids = [i if i.startswith("S") else f"S{_session_of(i)}" for i in ids]
    return list(dict.fromkeys(ids))


def _session_of(dia_id: str) -> str:
    return dia_id.split(":")[0][1:]  # "D3:7" -> "3", as LoCoMo's recall reads an evidence id


# --- LoCoMo's layout -----------------------------------------------------------------------------

def _locomo_samples(episodes: list[dict[str, Any]], qa: list[dict[str, Any]], ingest: StageDir, ids: list[str],
                    predictions: dict[str, dict[QAKey, Prediction]]) -> list[dict[str, Any]]:
    """The run's samples in LoCoMo's layout, in ingest order, each QA item with its predictions."""
    originals = dict(_original_samples(episodes))
    questions = {q["qa_id"]: q for q in qa}
    rebuilt = {} if len(originals) == len(episodes) else _rebuilt_samples(episodes, qa, ingest, ids)
    samples = []
    for e in episodes:
        eid = e["episode_id"]
        sample = originals[eid] if eid in originals else rebuilt[eid]
        for i, item in enumerate(sample["qa"]):
            qa_id = f"{eid}-q{i}"  # the loader's id: episode id and the item's index in `qa`
            if qa_id not in questions or questions[qa_id]["question"] != item["question"]:
                raise PipelineError(f"export predictions: {e['source_file']} no longer holds the questions "
                                    f"the run ingested (sample {sample['sample_id']!r}, qa[{i}])")
            for m, preds in predictions.items():
                p = preds.get((eid, qa_id))
                if p is None:
                    continue  # not probed: no key, so no score is made up for it
                item[PREDICTION.format(m)] = p.text
                if p.context:
                    item[CONTEXT.format(m)] = p.context
                if p.bucket is not None:
                    item[BUCKET.format(m)] = p.bucket
        samples.append(sample)
    return samples


def _original_samples(episodes: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(episode id, the sample as its file holds it) for the run's episodes whose file is readable."""
    wanted = {e["episode_id"] for e in episodes}
    for path in dict.fromkeys(e["source_file"] for e in episodes):
        if not Path(path).is_file():
            continue
        for rec in iter_records(path):
            if isinstance(rec.data, dict) and (eid := f"{locomo.DATASET}-{rec.data.get('sample_id')}") in wanted:
                yield eid, rec.data


def _rebuilt_samples(episodes: list[dict[str, Any]], qa: list[dict[str, Any]], ingest: StageDir,
                     ids: list[str]) -> dict[str, dict[str, Any]]:
    """Samples rebuilt from the run's tables when the ingested file is gone: the keys the scorer and
    its statistics read (sample_id, conversation with speakers, sessions of {speaker, dia_id, text} and
    their dates, qa). A turn's text keeps the "[shares <caption>]" the loader appended; dates are
    written as LoCoMo writes them; a numeric answer comes back as text (same tokens, same F1)."""
    category_ids = {name: cid for cid, name in locomo.CATEGORIES.items()}
    turns = sorted(ingest.read_table("turns", episode_ids=ids).to_pylist(),
                   key=lambda t: (t["episode_id"], t["session_idx"], t["turn_idx"]))
    out: dict[str, dict[str, Any]] = {}
    for e in episodes:
        conv: dict[str, Any] = {"speaker_a": e["speakers"][0], "speaker_b": e["speakers"][1]}
        for t in (t for t in turns if t["episode_id"] == e["episode_id"]):
            key = f"session_{t['session_idx']}"
            if key not in conv and t["session_time"] is not None:
                conv[f"{key}_date_time"] = _locomo_date(t["session_time"])
            conv.setdefault(key, []).append({"speaker": t["speaker"], "dia_id": t["source_turn_id"], "text": t["text"]})
        items = sorted((q for q in qa if q["episode_id"] == e["episode_id"]),
                       key=lambda q: int(q["qa_id"].rsplit("-q", 1)[1]))
        out[e["episode_id"]] = {"sample_id": e["episode_id"][len(locomo.DATASET) + 1:], "conversation": conv,
                                "qa": [_locomo_item(q, category_ids) for q in items]}
    return out


def _locomo_item(q: dict[str, Any], category_ids: dict[str, int]) -> dict[str, Any]:
    item: dict[str, Any] = {"question": q["question"]}
    if q["answer"] is not None:
        item["answer"] = q["answer"]
    item["evidence"] = list(q["evidence"] or [])
    item["category"] = category_ids[q["category"]]
    if q["adversarial_answer"] is not None:
        item["adversarial_answer"] = q["adversarial_answer"]
    return item


def _locomo_date(when: datetime) -> str:
    hour = when.hour % 12 or 12  # "1:56 pm on 8 May, 2023", as locomo10.json writes a session's date
    return f"{hour}:{when:%M} {'am' if when.hour < 12 else 'pm'} on {when.day} {when:%B}, {when.year}"


# --- MemoryAgentBench's layout -------------------------------------------------------------------

MAB_FILE = "{method}/{competency}/{source}_results.json"  # under --out: main.py's outputs/ layout
# response_metrics' columns -> the official post_process's metric names
_MAB_METRICS = {column: column.removeprefix("mab_").replace("_at_", "@") for column in MAB_SCORES}


def _mab_task(category: object) -> tuple[str, str]:
    """(competency, task) of a question's category "<competency>/<source>"."""
    parts = split_category(category)
    if parts is None:
        raise PipelineError(f"export predictions: a MemoryAgentBench question of category {category!r} names no task")
    return parts


def _write_memoryagentbench(cfg: RunConfig, out: Path, episodes: Sequence[Mapping[str, object]],
                            qa: Sequence[Mapping[str, object]], ids: list[str],
                            predictions: dict[str, dict[QAKey, Prediction]]) -> None:
    """Each method's answers, one official results file per task (`MAB_FILE`), questions in ingest order."""
    originals = _mab_originals(episodes)
    scores = _mab_scores(cfg, ids)
    tasks: dict[tuple[str, str], list[Mapping[str, object]]] = defaultdict(list)
    for q in qa:
        tasks[_mab_task(q["category"])].append(q)
    for m, preds in predictions.items():
        for (competency, source), questions in tasks.items():
            data: list[dict[str, object]] = []
            for q in questions:
                p = preds.get(_key(q))
                if p is None:
                    continue  # not probed: no record
                # the release's own values where its file is still there, else the gold strings we ingested
                question, answer, pair_id = originals.get(_key(q), (q["question"], gold_answers(str(q["answer"])),
                                                                    q["qa_id"]))
                if question != q["question"]:
                    raise PipelineError(f"export predictions: the file of {q['episode_id']} no longer holds the "
                                        f"questions the run ingested (question {q['qa_id']})")
                record: dict[str, object] = {"output": p.text, "answer": answer, "query": q["question"],
                                             "query_id": len(data), "qa_pair_id": pair_id}
                record |= scores.get((str(q["episode_id"]), str(p.probe_id), m), {})
                if p.bucket is not None:
                    record["bucket"] = p.bucket
                data.append(record)
            if not data:
                continue
            metrics = {name: [v for r in data if isinstance(v := r.get(name), float)] for name in _MAB_METRICS.values()}
            metrics = {name: values for name, values in metrics.items() if values}
            path = out / MAB_FILE.format(method=m, competency=competency, source=source)
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_json(path, {"agent_config": {"agent_name": m}, "dataset_config": {"dataset": competency,
                                                                                     "sub_dataset": source},
                               "data": data, "metrics": metrics, "time_cost": [],
                               "averaged_metrics": {name: 100 * sum(v) / len(v) for name, v in metrics.items()}})


def _mab_originals(episodes: Sequence[Mapping[str, object]]) -> dict[QAKey, tuple[object, object, object]]:
    """(episode, qa_id) -> (the question, the gold value the official passes as `answer`, the
    question's `qa_pair_ids` entry or None), read back from the ingested files that are still there
    (an episode's id ends in its record's place in its file)."""
    wanted: dict[str, dict[int, str]] = defaultdict(dict)
    for e in episodes:
        eid = str(e["episode_id"])
        wanted[str(e["source_file"])][int(eid.rsplit("-", 1)[1])] = eid
    out: dict[QAKey, tuple[object, object, object]] = {}
    for path, by_index in wanted.items():
        if not Path(path).is_file():
            continue
        for rec in iter_records(path):
            found = by_index.get(rec.index)
            if found is None or not isinstance(rec.data, dict):
                continue
            questions, answers = rec.data.get("questions") or [], rec.data.get("answers") or []
            pair_ids = (rec.data.get("metadata") or {}).get("qa_pair_ids")
            for i in range(len(questions)):
                qa_id = pair_ids[i] if pair_ids else str(i + 1)  # the loader's qa_id
                # main.py pairs questions with answers one to one, else gives a context's one question them all
                answer = answers[i] if len(questions) > 1 and len(answers) > 1 else answers
                out[(found, qa_id)] = (questions[i], answer, pair_ids[i] if pair_ids else None)
    return out


def _mab_scores(cfg: RunConfig, ids: list[str]) -> dict[tuple[str, str, str], dict[str, float]]:
    """(episode, probe, method) -> the official per-task scores by their official names, from a
    finished response_metrics stage; {} without one."""
    stage = StageDir(cfg.run_dir, "response_metrics")
    if stage.manifest() is None:
        return {}
    return {(r["episode_id"], r["probe_id"], r["method"]):
            {name: r[column] for column, name in _MAB_METRICS.items() if r.get(column) is not None}
            for r in stage.read_table("response_metrics", episode_ids=ids).to_pylist()}
