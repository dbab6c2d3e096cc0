"""report: the score tables per dataset, and a Markdown report with plots comparing settings."""

from __future__ import annotations

import pyarrow as pa
import polars as pl

from pipeline.stage import GlobalStage, StageContext
from stages.metrics import segmentation as smetrics
from stages.metrics.segmentation import segment_score
from stages.respond import RESPONSES

REPORT_FILE = "report.md"

SEGMENTATION_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("sessions", pa.int64()),
        pa.field("pk", pa.float64()),
        pa.field("window_diff", pa.float64()),
        pa.field("f1", pa.float64()),
        pa.field("segment_score", pa.float64()),  # SeCom Eq. 3 on the mean Pk, WD and F1
        pa.field("fallback_sessions", pa.int64()),
    ]
)

RETRIEVAL_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("granularity", pa.string()),
        pa.field("compressed", pa.bool_()),
        pa.field("retriever", pa.string()),
        pa.field("k", pa.int32()),
        pa.field("questions", pa.int64()),
        pa.field("recall", pa.float64()),
        pa.field("dcg", pa.float64()),
    ]
)

RESPONSE_SUMMARY = pa.schema(
    [
        pa.field("method", pa.string()),
        pa.field("probes", pa.int64()),
        pa.field("failed", pa.int64()),
        pa.field("mean_context_tokens", pa.float64()),
        pa.field("mean_response_words", pa.float64()),
    ]
)


def segmentation_summary(scores: pl.DataFrame) -> pl.DataFrame:
    if scores.is_empty():
        return pl.DataFrame(schema=pl.from_arrow(SEGMENTATION_SUMMARY.empty_table()).schema)
    out = scores.group_by("dataset").agg(
        pl.len().alias("sessions"), pl.col("pk").mean(), pl.col("window_diff").mean(), pl.col("f1").mean(),
        pl.col("fallback").sum().alias("fallback_sessions"),
    )
    out = out.with_columns(
        pl.struct(["pk", "window_diff", "f1"]).map_elements(
            lambda r: segment_score(r["pk"], r["window_diff"], r["f1"]), return_dtype=pl.Float64
        ).alias("segment_score")
    )
    return out.sort("dataset")


def retrieval_summary(scores: pl.DataFrame) -> pl.DataFrame:
    if scores.is_empty():
        return pl.DataFrame(schema=pl.from_arrow(RETRIEVAL_SUMMARY.empty_table()).schema)
    keys = ["dataset", "granularity", "compressed", "retriever", "k"]
    return scores.group_by(keys).agg(
        pl.col("qa_id").n_unique().alias("questions"), pl.col("recall").fill_nan(None).mean(),
        pl.col("dcg").fill_nan(None).mean(),
    ).sort(keys)


def response_summary(responses: pl.DataFrame) -> pl.DataFrame:
    if responses.is_empty():
        return pl.DataFrame(schema=pl.from_arrow(RESPONSE_SUMMARY.empty_table()).schema)
    return responses.group_by("method").agg(
        pl.len().alias("probes"), pl.col("error").is_not_null().sum().alias("failed"),
        pl.col("context_tokens").cast(pl.Float64).mean().alias("mean_context_tokens"),
        pl.col("response").str.split(" ").list.len().cast(pl.Float64).mean().alias("mean_response_words"),
    ).sort("method")


def _markdown(df: pl.DataFrame) -> str:
    if df.is_empty():
        return "_no rows_\n"
    cols = df.columns
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.iter_rows():
        cells = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _plot_retrieval(df: pl.DataFrame, path: str) -> bool:
    if df.is_empty():
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for (gran, comp, retr), part in df.sort("k").group_by(["granularity", "compressed", "retriever"], maintain_order=True):
        label = f"{gran} / {retr}{' + compression' if comp else ''}"
        ax.plot(part["k"].to_list(), part["recall"].to_list(), marker="o", label=label)
    ax.set_xlabel("k (retrieved units)")
    ax.set_ylabel("evidence recall")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _cast(df: pl.DataFrame, schema: pa.Schema) -> pa.Table:
    return df.select(schema.names).to_arrow().cast(schema)


class ReportStage(GlobalStage):
    """Reads the scores and every `respond_<method>` stage of the run."""

    name = "report"
    code = (smetrics,)
    outputs = {
        "segmentation_summary": SEGMENTATION_SUMMARY,
        "retrieval_summary": RETRIEVAL_SUMMARY,
        "response_summary": RESPONSE_SUMMARY,
    }

    def __init__(self, respond_stages: tuple[str, ...] = ()) -> None:
        self.respond_stages = respond_stages
        self.inputs = ("score", *respond_stages)

    async def run(self, ctx: StageContext, inputs: dict[str, pa.Table]) -> dict[str, pa.Table]:
        seg = segmentation_summary(pl.from_arrow(inputs["score.segmentation_scores"]))
        ret = retrieval_summary(pl.from_arrow(inputs["score.retrieval_scores"]))
        responses = pa.concat_tables([inputs[f"{s}.responses"] for s in self.respond_stages] or [RESPONSES.empty_table()])
        resp = response_summary(pl.from_arrow(responses))
        ctx.out_dir.mkdir(parents=True, exist_ok=True)
        plotted = _plot_retrieval(ret, str(ctx.out_dir / "retrieval_recall.png"))
        text = [
            f"# Run `{ctx.cfg.run_name}`", "",
            f"Generator `{ctx.cfg.llm.model}` ({ctx.cfg.llm.provider}); corpus `{ctx.cfg.corpus.format}`.", "",
            "## Responses per method", "", _markdown(resp),
            "## Segmentation (per dataset)", "", _markdown(seg),
            "## Retrieval against gold evidence", "", _markdown(ret),
        ]
        if plotted:
            text += ["![evidence recall by k](retrieval_recall.png)", ""]
        (ctx.out_dir / REPORT_FILE).write_text("\n".join(text))
        return {
            "segmentation_summary": _cast(seg, SEGMENTATION_SUMMARY),
            "retrieval_summary": _cast(ret, RETRIEVAL_SUMMARY),
            "response_summary": _cast(resp, RESPONSE_SUMMARY),
        }
