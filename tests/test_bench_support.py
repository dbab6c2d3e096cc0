"""The pure helpers of the fault and crash benchmarks (bench/faults.py, bench/crash.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import crash  # noqa: E402
import faults  # noqa: E402


def test_retries_exhausted_reads_attempts_against_the_config() -> None:
    assert faults.retries_exhausted("HTTP 429: fake rate limit (gave up after 3 attempts)", 2, 0)
    assert not faults.retries_exhausted("HTTP 429: fake rate limit (gave up after 3 attempts)", 5, 0)
    assert faults.retries_exhausted("invalid structured output after 1 attempts: not valid JSON", 2, 0)
    assert not faults.retries_exhausted("invalid structured output after 1 attempts: x", 2, 2)
    assert not faults.retries_exhausted("HTTP 400: fake bad request", 2, 0)  # never retried
    assert not faults.retries_exhausted("", 2, 0)


def test_retries_exhausted_needs_every_window_of_a_segment_row() -> None:
    ok = "window 1/2: timeout after 1 s (gave up after 3 attempts); window 2/2: invalid structured output after 1 attempts: x"
    assert faults.retries_exhausted(ok, 2, 0)
    assert not faults.retries_exhausted("window 1/2: timeout after 1 s (gave up after 3 attempts); window 2/2: HTTP 400", 2, 0)


def test_stage_of_reads_the_prompt() -> None:
    assert faults.stage_of({"structured": True, "head": "anything"}) == "segment"
    assert faults.stage_of({"structured": False, "head": "You maintain the memory of a long"}) == "memory_rsum"
    assert faults.stage_of({"structured": False, "head": "You answer questions about past conversations"}) == "respond_full_history"
    head = "You are Ann, talking with someone you have had earlier conversations with. Your memory of those conversations"
    assert faults.stage_of({"structured": False, "head": head}) == "respond_rsum"
    assert faults.stage_of({"structured": False, "head": "?"}) == "other"


def test_short_reason_blanks_numbers_and_windows() -> None:
    assert faults.short_reason("window 2/3: timeout after 1.5 s (gave up after 3 attempts)") == \
        "timeout after N s (gave up after N attempts)"


def test_answered_keys_are_the_replies_that_got_cached() -> None:
    entries = [{"key": "a", "outcome": None}, {"key": "b", "outcome": "malformed"}, {"key": "c", "outcome": "429"},
               {"key": "d", "outcome": "badjson"}, {"key": "e", "outcome": "timeout"}]
    assert faults.answered_keys(entries) == {"a", "b"}


def test_call_accounting_splits_finished_and_in_flight() -> None:
    killed = [{"key": "a", "done": 1.0, "outcome": None}, {"key": "b", "done": 2.0, "outcome": None},
              {"key": "c", "done": 5.5, "outcome": None},  # answered after the kill: was in flight
              {"key": "d", "done": None, "outcome": None},
              {"key": "a", "done": 1.2, "outcome": None}]  # the same body asked twice at once
    rerun = [{"key": "b", "done": 9.0, "outcome": None}, {"key": "c", "done": 9.0, "outcome": None},
             {"key": "e", "done": 9.0, "outcome": None}]
    acc = crash.call_accounting(killed, rerun, t_kill=5.0)
    assert (acc["killed_requests"], acc["killed_calls"]) == (5, 4)
    assert (acc["finished"], acc["repeated"], acc["repeated_ms_before_kill"]) == (2, 1, [3000.0])
    assert (acc["in_flight"], acc["in_flight_resent"]) == (2, 1)
    assert (acc["rerun_requests"], acc["rerun_calls"], acc["rerun_new"]) == (3, 3, 1)


def test_cache_accounting_tells_lost_answers_from_cached_ones_sent_again() -> None:
    acc = {"finished": 100, "in_flight": 5, "in_flight_resent": 4, "repeated": 3}
    # one in-flight call got cached just before dying; 3 finished answers never reached the cache
    assert crash.cache_accounting(acc, cached_at_kill=98) == {"cached_at_kill": 98, "not_cached": 3,
                                                              "resent_despite_cache": 0}
    # every answer cached, yet 3 sent again: the rerun ignored the cache
    assert crash.cache_accounting(acc, cached_at_kill=101)["resent_despite_cache"] == 3


def test_server_report_counts_twins_answered_differently() -> None:
    head = {"structured": False, "head": "You maintain the memory"}
    entries = [{**head, "key": "a", "outcome": None}, {**head, "key": "a", "outcome": "malformed"},
               {**head, "key": "b", "outcome": "429"}, {**head, "key": "b", "outcome": None},
               {**head, "key": "c", "outcome": None}, {**head, "key": "c", "outcome": None}]
    r = faults.server_report(entries)["memory_rsum"]
    assert (r["requests"], len(r["keys"]), r["ok"], r["429"], r["malformed"]) == (6, 3, 4, 1, 1)
    assert (r["answered_twice"], r["answered_differently"]) == (2, 1)


def test_write_lags_pair_answers_with_cache_writes() -> None:
    entries = [{"answer": "a", "done": 1.0, "outcome": None, "structured": False},
               {"answer": "b", "done": 2.0, "outcome": None, "structured": False},
               {"answer": "b", "done": 2.5, "outcome": None, "structured": False},  # its twin
               {"answer": "c", "done": 3.0, "outcome": None, "structured": False},  # never cached
               {"answer": "d", "done": 3.0, "outcome": "429", "structured": False},
               {"answer": "e", "done": 3.0, "outcome": None, "structured": True}]
    stored = {"a": 1.25, "b": 2.75, "d": 9.0, "e": 9.0}
    assert crash.write_lags(entries, stored) == [0.25, 0.25]
    assert crash.percentiles([1.0, 2.0, 3.0, 4.0]) == [2.0, 4.0, 4.0, 4.0]


def test_compare_tables_ignores_row_order_and_named_columns() -> None:
    a = pa.table({"id": ["x", "y"], "v": [1, 2], "wall_s": [0.1, 0.2]})
    b = pa.table({"id": ["y", "x"], "v": [2, 1], "wall_s": [0.9, 0.8]})
    assert crash.compare_tables(a, b, ignore=("wall_s",)) is None
    assert crash.compare_tables(a, b) is not None
    c = pa.table({"id": ["y", "x"], "v": [2, 3], "wall_s": [0.2, 0.1]})
    assert "1 only in the resumed run" in crash.compare_tables(a, c, ignore=("wall_s",))


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_kill_run_leaves_no_process_of_the_session() -> None:
    # A session leader with a child and a grandchild, as mempipe with its Ray processes.
    script = "import subprocess, time; subprocess.Popen(['sh', '-c', 'sleep 60 & sleep 60']); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    end = time.time() + 10
    while len(crash.run_processes(proc.pid)) < 3 and time.time() < end:
        time.sleep(0.05)
    pids = crash.run_processes(proc.pid)
    assert len(pids) >= 3
    killed, left = crash.kill_run(proc)
    assert killed >= 3 and left == []
    assert all(not Path(f"/proc/{p}").exists() or crash._proc_stat(p) is None for p in pids)
    assert os.getsid(os.getpid()) != proc.pid
