"""A stage piped to a log is never silent: between its start and end lines it writes a progress line
at least every `LOG_EVERY_S` (shards, calls against the plan, tokens, spend, ETA); on a terminal the
live bar stays the only thing it draws."""

from __future__ import annotations

import io
import re
import time

from pipeline.engine import progress
from pipeline.engine.progress import StageProgress, log_line

LINE = re.compile(r"^(\w+): \d+:\d\d in, shards (\d+)/(\d+)")


class GrowingLedger:
    """A ledger whose stage counts grow by one call (100 tokens, $0.001) every time it is read."""

    def __init__(self, stage: str) -> None:
        self.stage, self.calls = stage, 0

    def snapshot(self) -> dict:
        self.calls += 1
        row = {"calls": self.calls, "failed_calls": 0, "prompt_tokens": 80 * self.calls,
               "completion_tokens": 20 * self.calls, "cost_usd": 0.001 * self.calls}
        return {"counts": {self.stage: {"creem": row}}}


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_a_stage_piped_to_a_log_writes_progress_lines_while_it_runs_and_none_after_its_end():
    out = io.StringIO()
    with StageProgress("memory_creem", 4, 0, GrowingLedger("memory_creem"), 400, stream=out, log_every_s=0.05) as p:
        time.sleep(0.3)
        p.shard_done()
        time.sleep(0.3)
    p.finish("memory_creem: done in 0.6 s, 4 rows")
    written = len(out.getvalue())
    time.sleep(0.2)
    assert len(out.getvalue()) == written  # nothing after the stage's end
    lines = _lines(out)
    assert lines[0].startswith("memory_creem: started, 4 of 4 shards to run, ~400 calls expected")
    assert lines[-1] == "memory_creem: done in 0.6 s, 4 rows"
    running = lines[1:-1]
    assert len(running) >= 6 and all(LINE.match(line) for line in running)
    assert LINE.match(running[0]).group(2, 3) == ("0", "4") and LINE.match(running[-1]).group(2, 3) == ("1", "4")
    assert re.search(r" · calls \d+/400 · [\d.]+k? tok · \$0\.\d{4} · ETA \d+:\d\d$", running[-1])


def test_a_stage_without_llm_calls_logs_shards_and_an_eta_from_them():
    out = io.StringIO()
    with StageProgress("ingest", 2, 0, None, None, stream=out, log_every_s=0.05) as p:
        p.shard_done()
        time.sleep(0.2)
    running = _lines(out)[1:]
    assert running and all(re.match(r"^ingest: 0:00 in, shards 1/2 · ETA 0:00$", line) for line in running)
    assert log_line("ingest", None, None, (0, 2), 3.0) == "ingest: 0:03 in, shards 0/2"


def test_on_a_terminal_the_live_bar_is_all_a_stage_draws():
    out = Terminal()
    with StageProgress("memory_creem", 2, 0, GrowingLedger("memory_creem"), None, stream=out, log_every_s=0.05):
        time.sleep(0.2)
    assert not any(LINE.match(line.strip("\r")) for line in re.split(r"[\r\n]", out.getvalue()))


def test_the_default_interval_is_thirty_seconds():
    assert progress.LOG_EVERY_S == 30.0
    assert StageProgress("s", 1, 0, None, None, stream=io.StringIO()).log_every_s == 30.0
    text = log_line("memory_creem", {"calls": 120, "prompt_tokens": 40000, "completion_tokens": 5100,
                                     "cost_usd": 0.1234}, 480, (3, 12), 30.0)
    assert text == "memory_creem: 0:30 in, shards 3/12 · calls 120/480 · 45.1k tok · $0.1234 · ETA 1:30"
