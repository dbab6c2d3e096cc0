"""The report's figures (matplotlib, Agg): each function takes a summary frame and a path, draws
one PNG, and returns whether there was anything to draw."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> bool:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return True


def win_rates(pairwise: pl.DataFrame, path: Path) -> bool:
    """Stacked win / tie / loss bars of the reference against each method and criterion, with the
    sign-test p-value at the end of each bar (dataset level)."""
    df = pairwise.filter(pl.col("session_idx").is_null()) if not pairwise.is_empty() else pairwise
    if df.is_empty():
        return False
    plt = _pyplot()
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
    ax.set_xlabel("share of judged pairs (both orders)")
    ax.legend(fontsize=7, loc="lower right")
    return _save(fig, path)


def bars_by_method(values: dict[str, float], path: Path, ylabel: str, ymax: float | None = None) -> bool:
    values = {k: v for k, v in values.items() if v is not None}
    if not values:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4, 0.9 * len(values) + 1.5), 3.2))
    ax.bar(list(values), list(values.values()), color="#457b9d")
    ax.set_ylabel(ylabel)
    if ymax is not None:
        ax.set_ylim(0, ymax)
    ax.tick_params(axis="x", labelsize=8, rotation=20)
    return _save(fig, path)


def cost_quality(methods: pl.DataFrame, quality: str, path: Path) -> bool:
    """Memory tokens in the context against a quality score, one point per method."""
    if methods.is_empty() or quality not in methods.columns:
        return False
    df = methods.filter(pl.col(quality).is_not_null() & pl.col("mean_context_tokens").is_not_null())
    if df.is_empty():
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.scatter(df["mean_context_tokens"].to_list(), df[quality].to_list(), color="#1d3557")
    for r in df.iter_rows(named=True):
        ax.annotate(r["method"], (r["mean_context_tokens"], r[quality]), fontsize=8, xytext=(4, 4),
                    textcoords="offset points")
    ax.set_xlabel("mean memory tokens in the context (cl100k)")
    ax.set_ylabel(quality)
    return _save(fig, path)


def memory_quality(summary: pl.DataFrame, path: Path) -> bool:
    if summary.is_empty():
        return False
    plt = _pyplot()
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
    return _save(fig, path)


def segmentation(summary: pl.DataFrame, path: Path) -> bool:
    if summary.is_empty():
        return False
    plt = _pyplot()
    metrics = ["pk", "window_diff", "f1", "segment_score"]
    datasets = summary["dataset"].to_list()
    width = 0.8 / len(datasets)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for i, r in enumerate(summary.iter_rows(named=True)):
        ax.bar([m + i * width for m in range(len(metrics))], [r[k] or 0 for k in metrics], width, label=datasets[i])
    ax.set_xticks([m + 0.4 - width / 2 for m in range(len(metrics))], ["Pk ↓", "WindowDiff ↓", "F1 ↑", "score ↑"])
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    return _save(fig, path)


def retrieval_recall(summary: pl.DataFrame, path: Path) -> bool:
    if summary.is_empty():
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for (gran, comp, retr), part in summary.sort("k").group_by(["granularity", "compressed", "retriever"],
                                                                maintain_order=True):
        label = f"{gran} / {retr}{' + compression' if comp else ''}"
        ax.plot(part["k"].to_list(), part["recall"].to_list(), marker="o", label=label)
    ax.set_xlabel("k (retrieved units)")
    ax.set_ylabel("evidence recall")
    ax.legend(fontsize=6)
    return _save(fig, path)


def memory_graph(nodes: list[dict], edges: list[dict], highlight: list[str], path: Path, title: str) -> bool:
    """One episode's memory graph: memories as nodes in columns by session, directed edges labelled
    with their relation, and one retrieved timeline highlighted."""
    if not nodes:
        return False
    plt = _pyplot()
    from matplotlib.patches import FancyArrowPatch

    pos = {n["memory_id"]: (n["session_idx"], -n["memory_idx"]) for n in nodes}
    sessions = sorted({n["session_idx"] for n in nodes})
    depth = max(n["memory_idx"] for n in nodes) + 1
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(sessions)), max(3, 0.7 * depth + 1.5)))
    on_path = set(zip(highlight, highlight[1:]))
    for e in edges:
        if e["source"] not in pos or e["target"] not in pos:
            continue
        (x0, y0), (x1, y1) = pos[e["source"]], pos[e["target"]]
        hot = (e["source"], e["target"]) in on_path
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=10,
                                     connectionstyle="arc3,rad=0.08", color="#d62828" if hot else "#8d99ae",
                                     lw=2 if hot else 0.8, shrinkA=8, shrinkB=8))
        ax.text((x0 + x1) / 2, (y0 + y1) / 2 + 0.12, e["relation"], fontsize=6, ha="center",
                color="#d62828" if hot else "#555")
    for n in nodes:
        x, y = pos[n["memory_id"]]
        hot = n["memory_id"] in highlight
        ax.scatter([x], [y], s=90, color="#d62828" if hot else "#1d3557", zorder=3)
        label = n["event"] if len(n["event"]) <= 38 else n["event"][:36] + "…"
        ax.text(x + 0.06, y - 0.22, label, fontsize=5.5, color="#222")
    ax.set_xticks(sessions, [f"session {s}" for s in sessions], fontsize=8)
    ax.set_yticks([])
    ax.set_xlim(min(sessions) - 0.4, max(sessions) + 0.9)
    ax.set_ylim(-depth + 0.3, 0.6)
    ax.set_title(title, fontsize=9)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    return _save(fig, path)
