"""`mempipe plan`'s printed tables (its --json is `Plan.to_json`)."""

from __future__ import annotations

from pipeline.plan.estimates import Plan


def _fmt_int(v: float) -> str:
    return f"{int(round(v)):,}"


def _how(method: dict[str, str]) -> str:
    """calls / prompt / completion methods, said once where they agree."""
    calls, prompt = method.get("calls", ""), method.get("prompt_tokens", "")
    if prompt.startswith(calls) and calls:
        head = f"calls, prompt{prompt[len(calls):]}: {calls}"
    else:
        head = f"calls: {calls}; prompt: {prompt}"
    return f"{head}; completion: {method.get('completion_tokens', '')}"


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def render_views(plan: Plan) -> list[str]:
    """Where the money goes: a table per method (memory, respond, each judge stage's share, other,
    total; left out when no row has a price), one per stage and one per LLM role (with cached prompt
    tokens), over the stages that run; nothing when no stage has an LLM role."""
    methods, roles = plan.by_method(), plan.by_role()
    if not roles:
        return []
    lines: list[str] = []
    if methods:  # none when no model of the run has a price (a local or fake one): no table
        judges = sorted({j for row in methods.values() for j in row["judges"]})
        rows = [["method", "memory $", "respond $", *(f"{j} $" for j in judges), "other $", "total $"]]
        for m, row in methods.items():
            rows.append([m, *(f"{v:.4f}" for v in (row["memory"], row["respond"],
                                                    *(row["judges"].get(j, 0.0) for j in judges),
                                                    row["other"], row["total"]))])
        lines = ["", "where the money goes, per method (a judge stage split by the method each judged row is for):",
                 *_aligned(rows)]

    def totals(name: str, t: dict[str, float]) -> list[str]:
        return [name, _fmt_int(t["calls"]), _fmt_int(t["prompt_tokens"]), _fmt_int(t["cached_prompt_tokens"]),
                _fmt_int(t["completion_tokens"]), f"{t['cost_usd']:.4f}"]

    head = ["calls", "prompt tok", "cached prompt tok", "completion tok", "cost $"]
    stages = [totals(s.name, s.total()) for s in plan.stages if s.runs and s.roles]
    return [*lines, "", "per stage:", *_aligned([["stage", *head], *stages]),
            "", "per role:", *_aligned([["role", *head], *(totals(r, t) for r, t in roles.items())])]


def render(plan: Plan) -> str:
    """The plan as a table per stage and role, with a total line, then the cost per method and per
    role (`render_views`) and the method."""
    header = ["stage", "state", "why", "role", "model", "calls", "prompt tok", "completion tok", "cost $", "how"]
    rows: list[list[str]] = []
    for s in plan.stages:
        if not s.runs:
            rows.append([s.name, s.state, s.why, "", "", "", "", "", "", ""])
            continue
        if not s.roles:
            rows.append([s.name, s.state, s.why, "-", "", "0", "0", "0", "0", ""])
            continue
        for i, r in enumerate(s.roles):
            how = _how(r.method)
            cost = "no price" if r.cost_usd is None else f"{r.cost_usd:.4f}"
            rows.append([s.name if i == 0 else "", s.state if i == 0 else "", s.why if i == 0 else "", r.role,
                         r.model, _fmt_int(r.calls), _fmt_int(r.prompt_tokens), _fmt_int(r.completion_tokens), cost,
                         how])
    t = plan.total()
    rows.append(["total", "", "", "", "", _fmt_int(t["calls"]), _fmt_int(t["prompt_tokens"]),
                 _fmt_int(t["completion_tokens"]), f"{t['cost_usd']:.4f}", ""])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = [f"plan for run {plan.run_name} at {plan.run_dir}"]
    for cells in [header, *rows]:
        last = "  " + cells[-1] if cells[-1] else ""
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells[:-1], widths)) + last)
    lines += render_views(plan)
    graph = [[f"  {s.name}", s.in_graph] for s in plan.stages if s.in_graph]
    if graph:
        lines += ["", "the run's stage graph, each stage with why it is in it (`stages:` restricts it):", *_aligned(graph)]
    m = plan.method
    lines.append("")
    lines.append(f"how: dry run: {m.get('dry_run')}; calibration: {m.get('calibration') or 'none'}"
                 f"; episodes in the run: {m.get('episodes')}")
    if m.get("models"):
        lines.append("no model run: " + "; ".join(f"{k}: {v}" for k, v in m["models"].items()))
    lines.append(f"prices: {m['prices']}; {m['cache']}")
    if "by_method" in m:  # (a plan made before these notes has none)
        lines.append(f"cached prompt tokens: {m.get('cached_prompt_tokens')}; per method: {m['by_method']}")
    if plan.calibration_run:
        c = plan.calibration_run
        lines.append(f"calibration run: {c['calls']} calls ({c['fresh_calls']} fresh), ${c['cost_usd']:.4f} at these "
                     f"prices, in {c['run_dir']}; {c['note']}")
    return "\n".join(lines)
