"""Theanine's memory graph as a figure (the report's panel for Theanine): one episode's memories
as nodes in columns by session, directed edges (older -> newer) labelled with their relation, and
one timeline a response retrieved highlighted."""

from __future__ import annotations

from pathlib import Path

from pipeline.figures import pyplot, save


def memory_graph(nodes: list[dict], edges: list[dict], highlight: list[str], path: Path, title: str) -> bool:
    """One episode's memory graph: memories as nodes in columns by session, directed edges labelled
    with their relation, and one retrieved timeline highlighted."""
    if not nodes:
        return False
    plt = pyplot()
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
    return save(fig, path)
