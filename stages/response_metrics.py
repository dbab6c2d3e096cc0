"""response_metrics: reference metrics of every method's responses against the gold text of their
probe (the real next turn, or the reference answer).

- `response_metrics`, one row per (probe, method): sentence BLEU-1..4, ROUGE-1/2/L, token F1,
  distinct-1..3 of the response, words; LoCoMo's own QA F1 per official category; BERTScore when
  asked for (SeCom reports it). A failed response (no text) keeps its row, `failed` set: it scores
  0.0 on every reference metric, as an empty answer would, and has no words or distinct-n.
- `corpus_metrics`, one row per (dataset, kind, method) and per category and, for next-response
  probes, per session (LD-Agent's Table 1 is per session): the statistics that exist only over a
  set of responses, corpus BLEU-1..4 (SeCom's official scorer, LD-Agent's nlg-eval) and corpus
  distinct-1..3 (RSum's DIST-n). Failed responses enter as empty responses.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pyarrow as pa
from pydantic import Field

from pipeline.config import Section
from pipeline.errors import ConfigError
from pipeline.stage import GlobalStage, StageContext
from stages.metrics import locomo_qa, text
from stages.method_stages import respond_stage_name
from stages.probes import PROBE_KEY_FIELDS

# Scores of a response against its gold text: 0.0 for a failed response.
_REFERENCE = ["bleu1", "bleu2", "bleu3", "bleu4", "rouge1", "rouge2", "rougeL", "token_f1"]
_DISTINCT = ["distinct1", "distinct2", "distinct3"]
_SCORES = [*_REFERENCE, *_DISTINCT, "locomo_f1", "bertscore"]
ORDERS = (1, 2, 3, 4)  # corpus BLEU-n
DISTINCT_ORDERS = (1, 2, 3)
# Probe kinds whose probes sit inside a corpus session, so that a per-session row means something
# (a question's session_idx is only "after the whole history").
SESSION_KINDS = ("next_response",)

RESPONSE_METRICS = pa.schema(
    [
        *PROBE_KEY_FIELDS,
        pa.field("session_idx", pa.int32(), nullable=False),  # the probe's session
        pa.field("failed", pa.bool_(), nullable=False),  # no response: reference scores 0.0, no words / distinct
        pa.field("words", pa.int32()),  # length of the response; null when it failed
        *[pa.field(name, pa.float64()) for name in _SCORES],  # locomo_f1 only on LoCoMo questions
    ]
)

CORPUS_METRICS = pa.schema(
    [
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("category", pa.string()),  # null: every category
        pa.field("session_idx", pa.int32()),  # null: every session
        pa.field("method", pa.string(), nullable=False),
        pa.field("responses", pa.int64(), nullable=False),  # failed ones included
        pa.field("failed", pa.int64(), nullable=False),
        *[pa.field(f"corpus_bleu{n}", pa.float64()) for n in ORDERS],  # null: no gold text in the group
        *[pa.field(f"corpus_distinct{n}", pa.float64()) for n in DISTINCT_ORDERS],  # null: no n-gram
    ]
)

METRIC_IMPLEMENTATIONS = pa.schema(
    [pa.field("metric", pa.string(), nullable=False), pa.field("implementation", pa.string(), nullable=False)]
)


class ResponseMetricsSettings(Section):
    bertscore: bool = False  # needs bert-score and a model from the hub or a local path
    bertscore_model: str = "roberta-large"  # bert-score's default for English
    bertscore_layers: int | None = Field(default=None, ge=1)  # required for a model bert-score does not know
    bertscore_batch_size: int = Field(default=16, ge=1)


def _is_locomo_question(r: dict[str, Any]) -> bool:
    return r["dataset"] == "locomo" and r["kind"] == "qa" and r["category"] in locomo_qa.CATEGORY_IDS


def score_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Metric rows from (probe, response) rows, `response` None for a failed one; reference metrics
    where there is gold text, LoCoMo F1 on LoCoMo questions (adversarial ones have no gold and are
    scored by abstention). A failed response scores 0.0 wherever a scored one would have a score."""
    out = []
    for r in rows:
        failed = r["response"] is None
        scores: dict[str, Any]
        if failed:
            scores = {name: 0.0 for name in _REFERENCE} if r["gold"] is not None else {}
        elif r["gold"] is None:
            scores = {f"distinct{n}": text.distinct([r["response"]], n) for n in DISTINCT_ORDERS}
        else:
            scores = text.reference_scores(r["response"], r["gold"])
        if _is_locomo_question(r):
            scores["locomo_f1"] = 0.0 if failed else locomo_qa.locomo_f1(r["response"], r["gold"], r["category"])
        keys = {k: r[k] for k in ("episode_id", "dataset", "probe_id", "kind", "category", "method", "session_idx")}
        out.append(keys | {name: None for name in _SCORES} | scores
                   | {"failed": failed, "words": None if failed else len(r["response"].split())})
    return out


def _scopes(r: dict[str, Any]) -> list[tuple[str | None, int | None]]:
    """The (category, session_idx) groups a row counts in; None = every one."""
    scopes: list[tuple[str | None, int | None]] = [(None, None)]
    if r["category"] is not None:
        scopes.append((r["category"], None))
    if r["kind"] in SESSION_KINDS:
        scopes.append((None, r["session_idx"]))
    return scopes


def corpus_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Corpus BLEU-1..4 (over the rows with gold text) and corpus distinct-1..3 (over every
    response) per (dataset, kind, method), per category and per session (`_scopes`), from
    (probe, response) rows as `score_rows` takes them; a failed response counts as empty."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        for category, session in _scopes(r):
            groups[(r["dataset"], r["kind"], category, session, r["method"])].append(r)
    out = []
    for (dataset, kind, category, session, method), part in sorted(
            groups.items(), key=lambda kv: tuple((v is not None, v) for v in kv[0])):
        with_gold = [r for r in part if r["gold"] is not None]
        predictions = [r["response"] or "" for r in with_gold]
        golds = [r["gold"] for r in with_gold]
        responses = [r["response"] for r in part if r["response"] is not None]
        out.append({
            "dataset": dataset, "kind": kind, "category": category, "session_idx": session, "method": method,
            "responses": len(part), "failed": sum(r["response"] is None for r in part),
            **{f"corpus_bleu{n}": text.corpus_bleu(predictions, golds, n) for n in ORDERS},
            **{f"corpus_distinct{n}": text.distinct(responses, n) for n in DISTINCT_ORDERS},
        })
    return out


class ResponseMetricsStage(GlobalStage):
    name = section = "response_metrics"
    settings = ResponseMetricsSettings
    outputs = {"response_metrics": RESPONSE_METRICS, "corpus_metrics": CORPUS_METRICS,
               "metric_implementations": METRIC_IMPLEMENTATIONS}

    def __init__(self, methods: tuple[str, ...] = ()) -> None:
        self.methods = methods
        self.inputs = ("ingest", "probes", *(respond_stage_name(m) for m in methods))

    async def run(self, ctx: StageContext, inputs: dict[str, pa.Table]) -> dict[str, pa.Table]:
        settings: ResponseMetricsSettings = ctx.section
        datasets = dict(zip(*inputs["ingest.episodes"].select(["episode_id", "dataset"]).to_pydict().values()))
        probes = {(p["episode_id"], p["probe_id"]): p for p in inputs["probes.probes"].to_pylist()}
        rows = []
        for m in self.methods:
            for r in inputs[f"{respond_stage_name(m)}.responses"].to_pylist():
                p = probes.get((r["episode_id"], r["probe_id"]))
                # Adversarial LoCoMo questions have no gold text but are scored by abstention.
                if p is None or (p["gold"] is None and p["category"] != "adversarial"):
                    continue
                answered = r["error"] is None and r["response"] is not None
                rows.append({**p, "method": m, "response": r["response"] if answered else None,
                             "dataset": datasets[r["episode_id"]]})
        scored = score_rows(rows)
        if settings.bertscore:
            with_gold = [i for i, r in enumerate(rows) if r["gold"] is not None and r["response"] is not None]
            try:
                f1 = text.bertscore([rows[i]["response"] for i in with_gold], [rows[i]["gold"] for i in with_gold],
                                    settings.bertscore_model, settings.bertscore_layers,
                                    settings.bertscore_batch_size) if with_gold else []
            except text.BertScoreUnavailable as e:
                raise ConfigError(f"response_metrics.bertscore: {e}") from None
            for i, v in zip(with_gold, f1):
                scored[i]["bertscore"] = v
            for row, r in zip(scored, rows):
                if r["gold"] is not None and r["response"] is None:
                    row["bertscore"] = 0.0  # a failed response, as for the other reference metrics
        used = [k for k in text.IMPLEMENTATIONS if k != "bertscore" or settings.bertscore]
        impl = {"metric": used, "implementation": [text.IMPLEMENTATIONS[k] for k in used]}
        return {"response_metrics": pa.Table.from_pylist(scored, schema=RESPONSE_METRICS),
                "corpus_metrics": pa.Table.from_pylist(corpus_rows(rows), schema=CORPUS_METRICS),
                "metric_implementations": pa.Table.from_pydict(impl, schema=METRIC_IMPLEMENTATIONS)}
