"""The report's figures (matplotlib, Agg): each function takes a summary frame and a path, draws
one PNG, and returns whether there was anything to draw."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from pipeline.figures import pyplot, save
from stages.judging.diagnose import BUCKETS


def win_rates(pairwise: pl.DataFrame, path: Path) -> bool:
    """Stacked win / tie / loss bars of the reference against each method and criterion, with the
    sign-test p-value at the end of each bar (dataset level)."""
    df = pairwise.filter(pl.col("session_idx").is_null()) if not pairwise.is_empty() else pairwise
    if df.is_empty():
        return False
    plt = pyplot()
    labels = [f"{r['dataset']}: {r['reference']} vs {r['other']} · {r['criterion']}" for r in df.iter_rows(named=True)]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(labels) + 1.2))
    y = list(range(len(labels)))
    win, tie, loss = df["win_rate"].to_list(), df["tie_rate"].to_list(), df["loss_rate"].to_list()
    ax.barh(y, win, color="#2a9d8f", label="reference wins")
    ax.barh(y, tie, left=win, color="#cccccc", label="tie")
    ax.barh(y, loss, left=[w + t for w, t in zip(win, tie)], color="#e76f51", label="reference loses")
    for i, p in enumerate(df["p_value"].to_list()):
        ax.text(1.01, i, "p=n/a" if p is None else f"p={p:.3g}", va="center", fontsize=7)
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xlim(0, 1.15)
    ax.invert_yaxis()
    ax.set_xlabel("share of judged pairs")
    ax.legend(fontsize=7, loc="lower right")
    return save(fig, path)


def bars_by_method(values: dict[str, float], path: Path, ylabel: str, ymax: float | None = None) -> bool:
    values = {k: v for k, v in values.items() if v is not None}
    if not values:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4, 0.9 * len(values) + 1.5), 3.2))
    ax.bar(list(values), list(values.values()), color="#457b9d")
    ax.set_ylabel(ylabel)
    if ymax is not None:
        ax.set_ylim(0, ymax)
    ax.tick_params(axis="x", labelsize=8, rotation=20)
    return save(fig, path)


def cost_quality(methods: pl.DataFrame, quality: str, path: Path) -> bool:
    """Memory tokens in the context against a quality score, one point per method."""
    if methods.is_empty() or quality not in methods.columns:
        return False
    df = methods.filter(pl.col(quality).is_not_null() & pl.col("mean_context_tokens").is_not_null())
    if df.is_empty():
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.scatter(df["mean_context_tokens"].to_list(), df[quality].to_list(), color="#1d3557")
    for r in df.iter_rows(named=True):
        ax.annotate(r["method"], (r["mean_context_tokens"], r[quality]), fontsize=8, xytext=(4, 4),
                    textcoords="offset points")
    ax.set_xlabel("mean memory tokens in the context (cl100k)")
    ax.set_ylabel(quality)
    return save(fig, path)


def accuracy_per_cost(costs: pl.DataFrame, path: Path) -> bool:
    """Accuracy against dollars per correct answer (memory built and answers given), a point per method."""
    df = costs.filter(pl.col("accuracy").is_not_null() & pl.col("usd_per_correct").is_not_null()) \
        if not costs.is_empty() else costs
    if df.is_empty():
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.scatter(df["usd_per_correct"].to_list(), df["accuracy"].to_list(), color="#1d3557")
    for r in df.iter_rows(named=True):
        ax.annotate(r["method"], (r["usd_per_correct"], r["accuracy"]), fontsize=8, xytext=(4, 4),
                    textcoords="offset points")
    ax.set_xlabel("USD per correct answer (memory built + answers)")
    ax.set_ylabel(f"accuracy ({df['judge'][0]})")
    return save(fig, path)


# Right answers green, each place a wrong one was lost its own warm colour, the untraceable grey.
_BUCKET_COLOURS = {"correct": "#2a9d8f", "correct_without_evidence": "#a8dadc", "missed_write": "#e63946",
                   "missed_retrieval": "#f4a261", "misread": "#9b5de5", "no_evidence": "#cccccc",
                   "failed": "#555555"}


def diagnosis(whole_run: pl.DataFrame, path: Path) -> bool:
    """One stacked horizontal bar per method: its probes' shares of each bucket (BUCKETS order), from
    the diagnosis table's whole-run rows (stages/report/diagnosis.py `whole_run`)."""
    if whole_run.is_empty():
        return False
    plt = pyplot()
    methods = whole_run["method"].to_list()
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(methods) + 1.6))
    y = list(range(len(methods)))
    left = [0.0] * len(methods)
    for bucket in BUCKETS:
        shares = [v or 0.0 for v in whole_run[f"{bucket}_share"].to_list()]
        ax.barh(y, shares, left=left, color=_BUCKET_COLOURS[bucket], label=bucket)
        left = [a + b for a, b in zip(left, shares)]
    for i, n in enumerate(whole_run["probes"].to_list()):
        ax.text(1.01, i, f"n={n}", va="center", fontsize=7)
    ax.set_yticks(y, methods, fontsize=8)
    ax.set_xlim(0, 1.12)
    ax.invert_yaxis()
    ax.set_xlabel("share of questions")
    ax.legend(fontsize=7, ncol=4, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    return save(fig, path)


def memory_quality(summary: pl.DataFrame, path: Path) -> bool:
    if summary.is_empty():
        return False
    plt = pyplot()
    df = summary.group_by(["method", "criterion"]).agg(pl.col("score").mean()).sort(["criterion", "method"])
    criteria = df["criterion"].unique(maintain_order=True).to_list()
    methods = sorted(df["method"].unique().to_list())
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for i, m in enumerate(methods):
        part = {r["criterion"]: r["score"] for r in df.filter(pl.col("method") == m).iter_rows(named=True)}
        ax.bar([c + i * width for c in range(len(criteria))], [part.get(c, 0) for c in criteria], width, label=m)
    ax.set_xticks([c + 0.4 - width / 2 for c in range(len(criteria))], criteria, fontsize=8, rotation=20)
    ax.set_ylim(0, 5)
    ax.set_ylabel("mean rating (1-5)")
    ax.legend(fontsize=7)
    return save(fig, path)


def segmentation(summary: pl.DataFrame, path: Path) -> bool:
    if summary.is_empty():
        return False
    plt = pyplot()
    metrics = ["pk", "window_diff", "f1", "segment_score"]
    datasets = summary["dataset"].to_list()
    width = 0.8 / len(datasets)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for i, r in enumerate(summary.iter_rows(named=True)):
        ax.bar([m + i * width for m in range(len(metrics))], [r[k] or 0 for k in metrics], width, label=datasets[i])
    ax.set_xticks([m + 0.4 - width / 2 for m in range(len(metrics))], ["Pk ↓", "WindowDiff ↓", "F1 ↑", "score ↑"])
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    return save(fig, path)


def retrieval_recall(summary: pl.DataFrame, path: Path) -> bool:
    if summary.is_empty():
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for (gran, comp, retr), part in summary.sort("k").group_by(["granularity", "compressed", "retriever"],
                                                                maintain_order=True):
        label = f"{gran} / {retr}{' + compression' if comp else ''}"
        ax.plot(part["k"].to_list(), part["recall"].to_list(), marker="o", label=label)
    ax.set_xlabel("k (retrieved units)")
    ax.set_ylabel("evidence recall")
    ax.legend(fontsize=6)
    return save(fig, path)
