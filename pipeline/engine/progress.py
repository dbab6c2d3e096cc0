"""What a person watching `mempipe run` sees of a stage while it runs, and when it ends.

On a terminal: one live line per running stage (tqdm), with shards, calls done / expected, tokens,
spend so far and an ETA, redrawn from the run's ledger every second. Elsewhere (logs, CI, `ray job
logs`): one line when a stage starts, one every `LOG_EVERY_S` while it runs (the live line's
counts: shards, calls done / expected, tokens, spend, ETA), and one when it ends, with its wall
time, calls and cost.
Expected calls come from `mempipe plan`'s estimate (`_plan.json`, when its fingerprint matches);
without one, from the calls per finished shard. An endpoint the shared breaker finds down shows on
the live line ("endpoint ... down since 12:01:03"), and in logs as a line when it goes down and
one when it answers again.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, TextIO

from tqdm import tqdm

from pipeline.llm.ledger import Ledger, stage_counts
from pipeline.llm.usage import Usage, describe_structured
from pipeline.storage import Location, join

PLAN_FILE = "_plan.json"
_REDRAW_S = 1.0
# Without a terminal, a running stage writes a progress line this often (seconds): a long stage
# piped to a log is never silent between its start and end lines.
LOG_EVERY_S = 30.0


def planned_calls(run_dir: Location, stage: str, fingerprint: str) -> int | None:
    """`mempipe plan`'s expected calls for this stage, when the plan was made for this fingerprint."""
    from pipeline.artifacts import read_text

    try:
        entry = json.loads(read_text(join(run_dir, PLAN_FILE)))["stages"][stage]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(entry, dict) or entry.get("fingerprint") != fingerprint:
        return None
    calls = entry.get("calls")
    return int(calls) if isinstance(calls, (int, float)) else None


def _tokens(n: float) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else f"{int(n)}"


def _clock(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def live_text(counts: dict[str, float], expected: int | None, shards: tuple[int, int], elapsed: float) -> str:
    """calls 12/40 · 3.1k tok · $0.0123 · ETA 0:45 (expected from the plan, or ~ from shards)."""
    done_shards, total_shards = shards
    calls = int(counts.get("calls", 0) + counts.get("failed_calls", 0))
    guess = expected
    approx = ""
    if guess is None and done_shards and calls:
        guess, approx = round(calls * total_shards / done_shards), "~"
    parts = [f"calls {calls}/{approx}{guess}" if guess else f"calls {calls}",
             f"{_tokens(counts.get('prompt_tokens', 0) + counts.get('completion_tokens', 0))} tok",
             f"${counts.get('cost_usd', 0.0):.4f}"]
    if guess and calls:
        parts.append(f"ETA {_clock(elapsed * max(guess - calls, 0) / calls)}")
    elif done_shards:
        parts.append(f"ETA {_clock(elapsed * (total_shards - done_shards) / done_shards)}")
    return " · ".join(parts)


def log_line(stage: str, counts: dict[str, float] | None, expected: int | None, shards: tuple[int, int],
             elapsed: float) -> str:
    """A running stage's line in a log: `memory_creem: 0:30 in, shards 3/12 · calls 120/480 ·
    45.1k tok · $0.1234 · ETA 1:30` (no call counts for a stage without LLM calls)."""
    head = f"{stage}: {_clock(elapsed)} in, shards {shards[0]}/{shards[1]}"
    if counts is not None:
        return f"{head} · {live_text(counts, expected, shards, elapsed)}"
    done, total = shards
    return head + (f" · ETA {_clock(elapsed * (total - done) / done)}" if done else "")


def down_text(down: dict[str, float]) -> str:
    """`endpoint http://... down since 12:01:03 (62 s)` for each endpoint the breaker holds down."""
    now = time.time()
    return "; ".join(f"endpoint {e} down since {time.strftime('%H:%M:%S', time.localtime(t))} ({now - t:.0f} s)"
                     for e, t in sorted(down.items()))


def end_text(stage: str, wall_s: float, llm_usage: dict[str, Usage] | None, errors: int, rows: int) -> str:
    """The line a stage's end leaves in a log: wall time, rows, calls and cost, structured modes."""
    text = f"{stage}: done in {wall_s:.1f} s, {rows} rows" + (f", {errors} failed" if errors else "")
    if not llm_usage:
        return text
    total = Usage()
    for u in llm_usage.values():
        total.merge(u)
    fresh = total.calls - total.cached_calls
    text += (f"; {total.calls} calls ({fresh} fresh, {total.cached_calls} cached, {total.failed_calls} failed), "
             f"{_tokens(total.prompt_tokens + total.completion_tokens)} tokens, "
             f"${total.cost_usd - total.cached_cost_usd:.4f} spent")
    cut = [f"{role} {u.truncated_calls}" for role, u in llm_usage.items() if u.truncated_calls]
    if cut:
        text += "; outputs cut at max_tokens: " + ", ".join(cut)
    modes = [f"{role} {m}" for role, u in llm_usage.items() if (m := describe_structured(u))]
    if modes:
        text += "; structured: " + "; ".join(modes)
    return text


class StageProgress:
    """The progress of one stage: a tqdm line with live counts on a terminal, start and end lines
    elsewhere. `ledger` is the run's ledger, or None."""

    def __init__(self, stage: str, total_shards: int, done_shards: int, ledger: Ledger | None,
                 expected_calls: int | None, stream: TextIO | None = None, log_every_s: float | None = None) -> None:
        self.stage = stage
        self.ledger = ledger
        self.expected = expected_calls
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.started = time.time()
        self.shards = [done_shards, total_shards]
        self.log_every_s = LOG_EVERY_S if log_every_s is None else log_every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._was_down: dict[str, float] = {}  # endpoints the log last said were down
        # disable=not live: on a terminal only, so piped output and logs carry just the lines below.
        self.bar = tqdm(total=total_shards, initial=done_shards, desc=stage, unit="shard", disable=not self.live,
                        file=self.stream)

    def __enter__(self) -> StageProgress:
        if not self.live:
            expect = f", ~{self.expected} calls expected" if self.expected else ""
            print(f"{self.stage}: started, {self.shards[1] - self.shards[0]} of {self.shards[1]} shards to run{expect}",
                  file=self.stream, flush=True)
        if self.ledger is not None or not self.live:
            self._thread = threading.Thread(target=self._redraw_loop, name=f"progress-{self.stage}", daemon=True)
            self._thread.start()
        return self

    def shard_done(self) -> None:
        self.shards[0] += 1
        self.bar.update(1)

    def _snapshot(self) -> dict[str, Any]:
        if self.ledger is None:
            return {}
        try:
            return self.ledger.snapshot()
        except Exception:  # noqa: BLE001 - a missed redraw must never stop the run
            return {}

    def _redraw_loop(self) -> None:
        next_line = time.monotonic() + self.log_every_s
        while not self._stop.wait(min(_REDRAW_S, self.log_every_s)):
            snap = self.redraw() if self.ledger is not None else {}
            if self.live:
                continue
            # Stopped while reading: the end line is next, so no progress line (the endpoint's lines still go).
            if time.monotonic() >= next_line and not self._stop.is_set():
                next_line = time.monotonic() + self.log_every_s
                counts = (stage_counts(snap, self.stage) if snap else {}) if self.ledger is not None else None
                print(log_line(self.stage, counts, self.expected, (self.shards[0], self.shards[1]),
                               time.time() - self.started), file=self.stream, flush=True)
            self._log_endpoints(snap.get("down", {}))

    def _log_endpoints(self, down: dict[str, float]) -> None:
        """In a log: one line when an endpoint goes down, one when it answers again."""
        if down and down != self._was_down:
            print(f"{self.stage}: {down_text(down)}; calls wait, probing it", file=self.stream, flush=True)
        for endpoint in set(self._was_down) - set(down):
            print(f"{self.stage}: endpoint {endpoint} answers again after "
                  f"{time.time() - self._was_down[endpoint]:.0f} s; calls resumed", file=self.stream, flush=True)
        self._was_down = dict(down)

    def redraw(self) -> dict[str, Any]:
        snap = self._snapshot()
        counts = stage_counts(snap, self.stage) if snap else {}
        if counts and self.live:
            text = live_text(counts, self.expected, (self.shards[0], self.shards[1]), time.time() - self.started)
            if snap.get("down"):
                text += " · " + down_text(snap["down"])
            self.bar.set_postfix_str(text)
        return snap

    def finish(self, line: str, notable: bool = False) -> None:
        """The stage is published: `line` in the log; on a terminal, whose bar already shows the
        counts, only when it says something the bar cannot (a structured-mode step-down)."""
        if not self.live or notable:
            print(line, file=self.stream, flush=True)

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * _REDRAW_S)
        if exc_type is None and self.ledger is not None and self.live:
            self.redraw()  # the final counts stay on the line
        elif self._was_down and self.ledger is not None:
            self._log_endpoints(self._snapshot().get("down", {}))  # back between the last redraw and the end
        if exc_type is not None:
            self.bar.leave = False  # erase the bar so the error is the last thing on screen
        self.bar.close()
