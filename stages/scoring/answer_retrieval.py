"""LongMemEval's retrieval measures of what each method's answer read: the memory an answer's
`memory_ids` name (or, for a method that shows turns rather than memories, the turn spans its
answer details record, `context_spans`) is read as the answer's ranking, each entry the turn ids it
holds, and scored at each k against the question's evidence (the `has_answer` user turns, and the
`answer_session_ids` holding them at session level) with LongMemEval's recall_any / recall_all /
ndcg_any (stages/metrics/retrieval.py: eval_utils.py's definitions).

The order is the order the answer recorded: LongMemEval's reader shows the retrieved units by date,
so ndcg_any reads the context's order, not the retriever's; recall_any / recall_all at a k no
smaller than the context are the same in any order. `score` measures the banks' own rankings."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

import pyarrow as pa

from pipeline.engine.stage import Rows
from stages.metrics import retrieval as rmetrics

ANSWER_RETRIEVAL_SCORES = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("qa_id", pa.string(), nullable=False),
        pa.field("method", pa.string(), nullable=False),
        pa.field("k", pa.int32(), nullable=False),
        pa.field("context_units", pa.int32(), nullable=False),  # entries the answer's context held
        # NaN where the question has no gold (LongMemEval's `_abs` questions are left out as there).
        *(pa.field(name, pa.float64()) for name in rmetrics.LONGMEMEVAL_MEASURES),
    ]
)


def context_units(memory_ids: Iterable[str] | None, details_json: str | None,
                  unit_sources: Mapping[str, Sequence[str]],
                  turn_ids: Mapping[tuple[int, int], str]) -> list[list[str]] | None:
    """The turn ids of each entry of an answer's context, in the answer's order: its `memory_ids`
    through `unit_sources` (memory id -> source turn ids), else its recorded `context_spans`
    ([session_idx, first turn_idx, last turn_idx]) through `turn_ids` ((session_idx, turn_idx) ->
    turn id). None when neither names a turn."""
    units = [list(unit_sources[m]) for m in memory_ids or [] if unit_sources.get(m)]
    if units:
        return units
    details = json.loads(details_json) if details_json else {}
    spans = details.get("context_spans") if isinstance(details, dict) else None
    for s, first, last in spans or []:
        unit = [tid for t in range(int(first), int(last) + 1) if (tid := turn_ids.get((int(s), t)))]
        if unit:
            units.append(unit)
    return units or None


def answer_retrieval_rows(episode_id: str, dataset: str, method: str, responses: Rows,
                          questions: Mapping[str, Mapping[str, object]], unit_sources: Mapping[str, Sequence[str]],
                          turn_ids: Mapping[tuple[int, int], str], ks: Sequence[int]) -> Rows:
    """One row per (answered question with recorded context, k): `questions` maps a probe id to its
    qa_id, `evidence` (gold turn ids) and `evidence_sessions`; failed answers and answers whose
    context names no turn have no row."""
    rows: Rows = []
    for r in responses:
        q = questions.get(r["probe_id"])
        if q is None or r.get("error") is not None or r.get("response") is None:
            continue
        units = context_units(r.get("memory_ids"), r.get("details_json"), unit_sources, turn_ids)
        if units is None:
            continue
        evidence = q.get("evidence")
        sessions = q.get("evidence_sessions")
        gold = [str(e) for e in evidence] if isinstance(evidence, list) else []
        answer_sessions = [str(s) for s in sessions] if isinstance(sessions, list) else None
        for k in ks:
            measures = rmetrics.longmemeval_retrieval(units, gold, answer_sessions, k)
            rows.append({"episode_id": episode_id, "dataset": dataset, "qa_id": str(q["qa_id"]), "method": method,
                         "k": k, "context_units": len(units),
                         **measures})
    return rows
