"""Benchmark: `llm.rpm` and `llm.tpm` held across several Ray workers.

A real LLM stage (`respond_turn` over a synthetic corpus, small shards so that up to 8 shard tasks
are in flight on 2 CPUs, each with 8 requests in flight) runs against the fake server (small
latency, no concurrency cap) twice: once with `llm.rpm`, once with `llm.tpm`. Each run has more
requests than the limit lets through in `--duration` seconds, so the limiter is the bottleneck.

Measured where the requests arrive (the fake server's clock, every chat request including
retries): the peak count in any 60 s window [t, t + 60) (exact: the maximum is reached by a
window starting at an arrival), and the share of the limit used: the mean count of the 60 s
windows lying wholly between the first and the last arrival (one per second), over the limit.
For tpm, requests are weighted by the tokens the limiter budgets for them
(`pipeline.llm.ratelimit.estimate_tokens`: prompt characters / 4 + max_tokens, recomputed by the
server as `est_tokens`), and, for information, by what a server counts (here: prompt words +
max_tokens).

Targets: peak <= 105% of the limit, share used >= 90%, for rpm and for tpm (budgeted tokens).

    python bench/rate_limit.py                         # rpm 600 for ~120 s, then tpm for ~120 s
    python bench/rate_limit.py --duration 70 --rpm 900
"""

from __future__ import annotations

import argparse
import math
import shutil
import tempfile
from bisect import bisect_left
from itertools import accumulate
from pathlib import Path
from statistics import mean
from typing import Any, Iterable, Sequence

from harness import FakeServer, fake_sets, manifest, mempipe, table, write_results
from make_corpus import write_corpus

WINDOW_S = 60.0  # what "per minute" means: any 60 s window, not calendar minutes
STAGES = "stages=[ingest,guidance,segment,compress,banks,probes,respond_turn]"
PREP_STAGES = "stages=[ingest,guidance,segment,compress,banks,probes]"
MAX_OVER = 1.05  # target: peak <= 105% of the limit
MIN_USED = 0.90  # target: share used >= 90%


# ---------------------------------------------------------------- window counting (pure)

def window_sums(times: Sequence[float], weights: Sequence[float], starts: Iterable[float],
                width: float) -> list[float]:
    """For each start s, the total weight of the events with s <= time < s + width.

    `times` must be sorted ascending, `weights` aligned with them.
    """
    prefix = list(accumulate(weights, initial=0.0))
    out = []
    for s in starts:
        out.append(prefix[bisect_left(times, s + width)] - prefix[bisect_left(times, s)])
    return out


def peak_window(times: Sequence[float], weights: Sequence[float], width: float) -> float:
    """The largest total weight in any half-open window of `width` seconds (0 without events).

    Exact: moving a window's start right up to its first event loses nothing, so the maximum is
    reached by a window starting at an event.
    """
    return max(window_sums(times, weights, times, width), default=0.0)


def full_window_starts(times: Sequence[float], width: float, step: float = 1.0) -> list[float]:
    """Starts first, first + step, ... of the windows lying wholly between the first and last event."""
    if not times or times[-1] - times[0] < width:
        return []
    n = int((times[-1] - times[0] - width) // step) + 1
    return [times[0] + k * step for k in range(n)]


def window_stats(times: Sequence[float], weights: Sequence[float] | None, limit: float,
                 width: float = WINDOW_S) -> dict[str, Any]:
    """Peak and mean load per `width` window against `limit` (per `width`); times need not be sorted.

    `used` is the mean over the windows wholly inside the run; a run shorter than one window
    falls back to the mean rate from the first to the last event (marked `used_from`).
    """
    pairs = sorted(zip(times, weights if weights is not None else [1.0] * len(times)))
    ts = [t for t, _ in pairs]
    ws = [w for _, w in pairs]
    peak = peak_window(ts, ws, width)
    peak10 = peak_window(ts, ws, 10.0) * width / 10.0  # short bursts, scaled to the window
    starts = full_window_starts(ts, width)
    span = ts[-1] - ts[0] if len(ts) > 1 else 0.0
    if starts:
        level, used_from = mean(window_sums(ts, ws, starts, width)), f"{len(starts)} full windows"
    else:
        # without a full window: the rate between first and last arrival (the last one's weight excluded)
        level = (sum(ws) - ws[-1]) / span * width if span else float("nan")
        used_from = "first-to-last rate (run shorter than one window)"
    return {"events": len(ts), "total": sum(ws), "span_s": span, "limit": limit, "peak": peak,
            "peak_ratio": peak / limit, "peak10_scaled": peak10, "peak10_ratio": peak10 / limit,
            "used": level / limit, "used_level": level, "full_windows": len(starts), "used_from": used_from}


# ---------------------------------------------------------------- runs

def base_sets(srv: FakeServer, workdir: Path, corpus: Path, episodes_per_shard: int) -> list[str]:
    """Config overrides: the fake server, the stages up to respond_turn, small shards, 0.25 CPU per task."""
    return fake_sets(workdir, srv.base_url, corpus, run_name="ratelimit") + [
        "methods=[turn]", STAGES, "compress.method=none", "compress.granularities=[turn]",
        "banks.granularities=[turn]", "probes.next_response=false", "probes.max_qa_per_episode=null",
        "llm.max_concurrency=8", f"ray.episodes_per_shard={episodes_per_shard}", "ray.llm_task_cpus=0.25"]


def limited_run(srv: FakeServer, workdir: Path, sets: list[str], name: str, limit: list[str]) -> dict[str, Any]:
    """`respond_turn` alone, rebuilt, with a cold cache of its own and the limit given; the server's
    chat log of the run and the stage's manifest."""
    srv.reset()
    wall, _ = mempipe(["run", "--only", "respond_turn", "--force", "respond_turn"],
                      sets + [f"llm.cache_dir={workdir / ('cache-' + name)}", *limit])
    stats = srv.stats()
    m = manifest(workdir / "artifacts" / "ratelimit", "respond_turn")
    return {"chat": stats["chat"], "outcomes": stats["outcomes"], "max_in_flight": stats["max_in_flight"],
            "command_wall_s": wall, "stage_wall_s": m["timings"]["wall_s"], "rows": m["rows"],
            "errors": m["errors"], "shards": m["shards"]}


def verdict(ratio: float, ok: bool, kind: str) -> str:
    """'met', or by how much of the limit a peak (kind 'peak') or share used missed its target."""
    if ok:
        return "met"
    if kind == "peak":
        return f"MISSED by {ratio - MAX_OVER:.1%} of the limit"
    return f"MISSED by {MIN_USED - ratio:.1%} of the limit"


def result_rows(label: str, unit: str, s: dict[str, Any], target: bool) -> list[list[Any]]:
    """A table row from `window_stats`; `target` False marks a row shown for information only."""
    peak_ok = s["peak_ratio"] <= MAX_OVER
    used_ok = s["used"] >= MIN_USED
    star = "" if target else " (information)"
    return [[label, unit + star, f"{s['limit']:.0f}", f"{s['peak']:.0f}", f"{s['peak_ratio']:.3f}",
             verdict(s["peak_ratio"], peak_ok, "peak") if target else "-",
             f"{s['used']:.3f}", verdict(s["used"], used_ok, "used") if target else "-",
             f"{s['peak10_ratio']:.2f}", s["full_windows"]]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rpm", type=int, default=600)
    ap.add_argument("--tpm", type=int, default=None,
                    help="default: rpm x the mean budgeted tokens of the rpm run's requests (same duration)")
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of requests in each run")
    ap.add_argument("--questions", type=int, default=30, help="questions per episode = calls per episode")
    ap.add_argument("--episodes-per-shard", type=int, default=2)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--skip-tpm", action="store_true")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    calls = math.ceil(a.rpm * a.duration / 60)
    episodes = math.ceil(calls / a.questions)
    workdir = Path(tempfile.mkdtemp(prefix="mempipe-ratelimit-"))
    try:
        corpus = write_corpus(workdir / "corpus.jsonl", episodes, sessions=3, turns=8, questions=a.questions)
        with FakeServer(latency=a.latency) as srv:
            sets = base_sets(srv, workdir, corpus, a.episodes_per_shard)
            # every stage before respond_turn, unlimited (respond_turn is the only one the limits pace)
            mempipe(["run"], sets + [PREP_STAGES, f"llm.cache_dir={workdir / 'cache-prep'}"])
            rpm_run = limited_run(srv, workdir, sets, "rpm", [f"llm.rpm={a.rpm}"])
            budget = [c["est_tokens"] for c in rpm_run["chat"]]
            tpm = a.tpm or round(mean(budget) * a.rpm)
            tpm_run = None if a.skip_tpm else limited_run(srv, workdir, sets, "tpm", [f"llm.tpm={tpm}"])
    finally:
        if a.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return report(a, episodes, rpm_run, tpm, tpm_run)


def report(a: argparse.Namespace, episodes: int, rpm_run: dict[str, Any], tpm: int,
           tpm_run: dict[str, Any] | None) -> int:
    """Window statistics of both runs, the table, the results files; the exit code."""
    times = [c["t"] for c in rpm_run["chat"]]
    rpm_s = window_stats(times, None, a.rpm)
    rows = result_rows("rpm run", "requests", rpm_s, True)
    data: dict[str, Any] = {"args": vars(a), "episodes": episodes, "rpm": rpm_s, "tpm_limit": tpm}
    runs = [("rpm", rpm_run)]
    ok = rpm_s["peak_ratio"] <= MAX_OVER and rpm_s["used"] >= MIN_USED
    if tpm_run is not None:
        t = [c["t"] for c in tpm_run["chat"]]
        budgeted = window_stats(t, [c["est_tokens"] for c in tpm_run["chat"]], tpm)
        counted = window_stats(t, [c["tokens"] for c in tpm_run["chat"]], tpm)
        rows += result_rows("tpm run", "budgeted tokens", budgeted, True)
        rows += result_rows("tpm run", "server-counted tokens", counted, False)
        data.update(tpm_budgeted=budgeted, tpm_counted=counted)
        runs.append(("tpm", tpm_run))
        ok = ok and budgeted["peak_ratio"] <= MAX_OVER and budgeted["used"] >= MIN_USED
    run_rows = [[name, len(r["chat"]), f"{r['stage_wall_s']:.1f}", f"{r['command_wall_s']:.1f}", r["shards"],
                 r["max_in_flight"], ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items())), r["errors"]]
                for name, r in runs]
    for name, r in runs:
        data[f"{name}_run"] = {k: v for k, v in r.items() if k != "chat"}
    body = (f"Stage `respond_turn` over {episodes} synthetic episodes x {a.questions} questions, "
            f"{a.episodes_per_shard} episodes per shard (up to 8 shard tasks at once, 8 requests in flight each), "
            f"fake server latency {a.latency} s, no concurrency cap. Limits: `llm.rpm={a.rpm}`, then "
            f"`llm.tpm={tpm}` (alone). Windows are any 60 s [t, t + 60) at the server; 'used' is the mean "
            f"over the 60 s windows wholly inside the run, over the limit; the 10 s peak is scaled x6 "
            f"(information: the limiter promises nothing per 10 s).\n\n"
            + table(["run", "counted", "limit / 60 s", "peak 60 s", "peak / limit", "target <= 1.05",
                     "used", "target >= 0.90", "peak 10 s x6 / limit", "full windows"], rows)
            + "\n\n" + table(["run", "chat requests", "stage wall s", "command wall s", "shards",
                              "max in flight", "server outcomes", "failed rows"], run_rows)
            + ("\n\nServer-counted tokens are prompt words + max_tokens; the limiter budgets prompt "
               "characters / 4 + max_tokens, so a server counting differently sees a different load."
               if tpm_run is not None else "")
            + f"\n\nAll targets: {'met' if ok else 'MISSED'}.")
    data["targets_met"] = ok
    write_results("rate_limit", "Rate limits across Ray workers", body, data)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
