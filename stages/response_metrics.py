"""response_metrics: reference metrics of every method's responses against the gold text of their
probe (the real next turn, or the reference answer): BLEU-1..4, ROUGE-1/2/L, token F1, distinct-1..3,
words; LoCoMo's own QA F1 per official category; BERTScore when asked for (SeCom reports it)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pydantic import Field

from pipeline.config import Section
from pipeline.errors import ConfigError
from pipeline.stage import GlobalStage, StageContext
from stages.metrics import locomo_qa, text
from stages.method_stages import respond_stage_name
from stages.probes import PROBE_KEY_FIELDS

_SCORES = ["bleu1", "bleu2", "bleu3", "bleu4", "rouge1", "rouge2", "rougeL", "token_f1",
           "distinct1", "distinct2", "distinct3", "locomo_f1", "bertscore"]

RESPONSE_METRICS = pa.schema(
    [
        *PROBE_KEY_FIELDS,
        pa.field("words", pa.int32(), nullable=False),  # length of the response
        *[pa.field(name, pa.float64()) for name in _SCORES],  # locomo_f1 only on LoCoMo questions
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


def score_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Metric rows from (probe, response) rows; reference metrics where there is gold text, LoCoMo
    F1 on LoCoMo questions (adversarial ones have no gold and are scored by abstention)."""
    out = []
    for r in rows:
        scores: dict[str, Any] = ({f"distinct{n}": text.distinct([r["response"]], n) for n in (1, 2, 3)}
                                  if r["gold"] is None else text.reference_scores(r["response"], r["gold"]))
        if r["dataset"] == "locomo" and r["kind"] == "qa" and r["category"] in locomo_qa.CATEGORY_IDS:
            scores["locomo_f1"] = locomo_qa.locomo_f1(r["response"], r["gold"], r["category"])
        out.append({k: r[k] for k in ("episode_id", "dataset", "probe_id", "kind", "category", "method")}
                   | {name: None for name in _SCORES} | {"words": len(r["response"].split())} | scores)
    return out


class ResponseMetricsStage(GlobalStage):
    name = section = "response_metrics"
    settings = ResponseMetricsSettings
    outputs = {"response_metrics": RESPONSE_METRICS, "metric_implementations": METRIC_IMPLEMENTATIONS}

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
                scorable = p is not None and (p["gold"] is not None or p["category"] == "adversarial")
                if r["error"] is None and r["response"] is not None and scorable:
                    rows.append({**p, "method": m, "response": r["response"], "dataset": datasets[r["episode_id"]]})
        scored = score_rows(rows)
        with_gold = [i for i, r in enumerate(rows) if r["gold"] is not None]
        if settings.bertscore and with_gold:
            try:
                f1 = text.bertscore([rows[i]["response"] for i in with_gold], [rows[i]["gold"] for i in with_gold],
                                    settings.bertscore_model, settings.bertscore_layers, settings.bertscore_batch_size)
            except text.BertScoreUnavailable as e:
                raise ConfigError(f"response_metrics.bertscore: {e}") from None
            for i, v in zip(with_gold, f1):
                scored[i]["bertscore"] = v
        used = [k for k in text.IMPLEMENTATIONS if k != "bertscore" or settings.bertscore]
        impl = {"metric": used, "implementation": [text.IMPLEMENTATIONS[k] for k in used]}
        return {"response_metrics": pa.Table.from_pylist(scored, schema=RESPONSE_METRICS),
                "metric_implementations": pa.Table.from_pydict(impl, schema=METRIC_IMPLEMENTATIONS)}
