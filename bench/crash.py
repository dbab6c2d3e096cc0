"""Benchmark: SIGKILL a run in the middle of an LLM stage, rerun it, and compare with a run that was
never interrupted.

`mempipe run` (segment, then `respond_turn` answering every QA probe of a synthetic corpus) runs
against the fake server (fixed latency) in its own session; once a share of `respond_turn`'s shards
have finished, every process of the run (the driver and the local Ray it started: GCS, raylet,
workers, the cache actor; Ray gives workers and actors process groups of their own, so they are
found by session) is frozen and then gets SIGKILL, so all die at the same instant. The same command
then runs to the end. A third run, from scratch with its own artifacts and cache,
is the reference.

From the server's log of chat requests (each with the hash of its body):
  - finished before the kill: answered (200) before the kill;
  - repeated: of those, sent again by the rerun (target 0: their answers were cached);
  - in flight at the kill: not yet answered; the rerun sends them again (expected).
Then every table of every stage (Parquet, rows sorted, all columns) and the manifests' rows,
errors and per-table row counts are compared with the reference (target: all equal).

    python bench/crash.py                                  # 80 episodes x 25 questions: 2,000 probes
    python bench/crash.py --episodes 16 --questions 10     # a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.llm.cache import cache_stats

from harness import (KEY_ENV, ROOT, FakeServer, fake_sets, manifest, mempipe, mempipe_cmd, table, temp_workdir,
                     write_results)
from make_corpus import write_corpus

STAGES = "stages=[ingest,guidance,segment,compress,banks,probes,respond_turn]"
KILL_STAGE = "respond_turn"
MANIFEST_KEYS = ("rows", "errors", "tables", "shards")


# ---------------------------------------------------------------- pure helpers (tested)

def call_accounting(killed: list[dict[str, Any]], rerun: list[dict[str, Any]], t_kill: float) -> dict[str, Any]:
    """What the rerun sent again, from the server's chat log of the killed run and of the rerun.

    An entry: {"key" (hash of the body), "done" (None while in flight), "outcome" (None: answered)}.
    Counts are of distinct request bodies ("calls": two questions with the same prompt are one
    call, sent twice if asked at once). Finished = answered before `t_kill`; every other call of
    the killed run was in flight at the kill."""
    sent_again = {e["key"] for e in rerun}
    finished = [e for e in killed if e["outcome"] is None and e["done"] is not None and e["done"] < t_kill]
    finished_keys = {e["key"] for e in finished}
    in_flight = {e["key"] for e in killed} - finished_keys
    last_answer = {}  # key -> when the server last answered it before the kill
    for e in finished:
        last_answer[e["key"]] = max(last_answer.get(e["key"], 0.0), e["done"])
    repeated = finished_keys & sent_again
    return {"killed_requests": len(killed), "killed_calls": len(finished_keys | in_flight),
            "finished": len(finished_keys), "repeated": len(repeated),
            "in_flight": len(in_flight), "in_flight_resent": len(in_flight & sent_again),
            # how long before the kill the server had answered each repeated call
            "repeated_ms_before_kill": sorted(round((t_kill - last_answer[k]) * 1000, 1) for k in repeated),
            "rerun_requests": len(rerun), "rerun_calls": len(sent_again),
            "rerun_new": len(sent_again - finished_keys - in_flight)}


def cache_accounting(acc: dict[str, Any], cached_at_kill: int) -> dict[str, int]:
    """From the cache's chat entries after the kill: finished calls whose answer never reached the
    cache, and calls the rerun sent again although the cache held their answer (a resume bug).

    In-flight calls the rerun did not send again were answered and cached in the last instant."""
    cached_late = acc["in_flight"] - acc["in_flight_resent"]
    not_cached = max(0, acc["finished"] + cached_late - cached_at_kill)
    return {"cached_at_kill": cached_at_kill, "not_cached": not_cached,
            "resent_despite_cache": max(0, acc["repeated"] - not_cached)}


def write_lags(entries: list[dict[str, Any]], stored: dict[str, float]) -> list[float]:
    """Seconds from the server's answer to the call cache's write of it, per answer found in the
    cache (`stored`: answer id -> store time); the window in which a SIGKILL loses an answer.
    Twins (one answer asked twice) pair the cache's last write with the latest answer before it."""
    done: dict[str, list[float]] = {}
    for e in entries:
        if e["outcome"] is None and e["done"] is not None and not e["structured"]:
            done.setdefault(e["answer"], []).append(e["done"])
    lags = []
    for answer, times in done.items():
        if answer in stored:
            before = [t for t in times if t <= stored[answer]]
            if before:
                lags.append(stored[answer] - max(before))
    return sorted(lags)


def percentiles(values: list[float], qs: tuple[float, ...] = (0.5, 0.9, 0.99, 1.0)) -> list[float]:
    """Nearest-rank percentiles of sorted `values` (empty: NaN)."""
    if not values:
        return [float("nan")] * len(qs)
    return [values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))] for q in qs]


def cache_store_times(directory: Path) -> dict[str, float]:
    """Answer id -> when the call cache stored the fake server's plain reply ("fake reply <id>"),
    read-only from diskcache's SQLite file (it keeps each entry's store_time)."""
    out: dict[str, float] = {}
    with contextlib.closing(sqlite3.connect(f"file:{directory / 'cache.db'}?mode=ro", uri=True)) as db:
        for value, stored in db.execute("SELECT value, store_time FROM Cache"):
            if isinstance(value, str):
                text = json.loads(value).get("text") or ""
                if text.startswith("fake reply "):
                    out[text.split()[-1]] = stored
    return out


def sorted_rows(tbl: pa.Table, ignore: tuple[str, ...] = ()) -> list[str]:
    """The table's rows as canonical JSON, sorted: equal lists = equal tables up to row order."""
    keep = [c for c in tbl.column_names if c not in ignore]
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in tbl.select(keep).to_pylist())


def compare_tables(a: pa.Table, b: pa.Table, ignore: tuple[str, ...] = ()) -> str | None:
    """None when equal (schema, and rows in any order); else what differs, briefly."""
    if a.schema != b.schema:
        return f"schemas differ: {a.schema} vs {b.schema}"
    ra, rb = sorted_rows(a, ignore), sorted_rows(b, ignore)
    if ra == rb:
        return None
    only_a, only_b = sorted(set(ra) - set(rb)), sorted(set(rb) - set(ra))
    return (f"{len(ra)} vs {len(rb)} rows; {len(only_a)} only in the resumed run, {len(only_b)} only in the "
            f"reference; e.g. {(only_a or only_b or ['(duplicates differ)'])[0][:300]}")


# ---------------------------------------------------------------- processes (Linux /proc)

def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, session id) of a live process, None if gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[3])


def run_processes(leader: int) -> set[int]:
    """Live processes of the run started as session leader `leader`: its session, and every
    descendant (in case something called setsid)."""
    stats = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            st = _proc_stat(int(d.name))
            if st is not None:
                stats[int(d.name)] = st
    found = {pid for pid, (_, sid) in stats.items() if sid == leader}
    if leader in stats:
        found.add(leader)
    grew = True
    while grew:
        more = {pid for pid, (ppid, _) in stats.items() if ppid in found} - found
        found |= more
        grew = bool(more)
    return found


def _signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_run(proc: subprocess.Popen, deadline_s: float = 20.0) -> tuple[int, list[int]]:
    """Kill every process of the run at once, as a power cut would: freeze them all (SIGSTOP), then
    SIGKILL. Ray puts each worker and actor in a process group of its own, so killing the driver's
    group alone would leave them working (and writing) for seconds. Returns (killed, survivors)."""
    frozen: set[int] = set()
    for _ in range(20):  # a process may fork while we freeze the others
        more = run_processes(proc.pid) - frozen
        if not more:
            break
        _signal_all(more, signal.SIGSTOP)
        frozen |= more
    _signal_all(frozen, signal.SIGKILL)
    proc.wait(deadline_s)
    end = time.time() + deadline_s
    left = {p for p in frozen | run_processes(proc.pid) if _proc_stat(p) is not None}
    while left and time.time() < end:
        _signal_all(left, signal.SIGKILL)
        time.sleep(0.2)
        left = {p for p in left | run_processes(proc.pid) if _proc_stat(p) is not None}
    return len(frozen), sorted(left)


# ---------------------------------------------------------------- the runs

def start_run(sets: list[str], log: Path) -> subprocess.Popen:
    """`mempipe run` as the leader of a new session, which every process it starts (Ray included) joins."""
    env = {**os.environ, KEY_ENV: "sk-bench-not-a-secret"}
    with log.open("w") as out:
        return subprocess.Popen(mempipe_cmd(["run"], sets), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def wait_for_shards(proc: subprocess.Popen, shards_dir: Path, want: int, timeout: float) -> int:
    """Poll until `want` shard markers exist; returns how many there were (-1: the run ended first)."""
    end = time.time() + timeout
    while time.time() < end:
        n = len(list(shards_dir.glob("*.json"))) if shards_dir.exists() else 0
        if n >= want:
            return n
        if proc.poll() is not None:
            return -1
        time.sleep(0.05)
    raise TimeoutError(f"{want} shards of {shards_dir.parent.name} did not finish within {timeout:.0f} s")


def compare_runs(resumed: Path, reference: Path, stages: list[str], ignore: tuple[str, ...]) -> list[list[str]]:
    """One row per table of every stage: rows, and whether it equals the reference."""
    out = []
    for stage in stages:
        ma, mb = manifest(resumed, stage), manifest(reference, stage)
        diff = [k for k in MANIFEST_KEYS if ma.get(k) != mb.get(k)]
        out.append([stage, "_manifest.json", "-", "equal" if not diff else f"DIFFERENT: {', '.join(diff)}"])
        names = sorted({p.parent.name for p in (reference / stage).glob("*/part-*.parquet")}
                       | {p.parent.name for p in (resumed / stage).glob("*/part-*.parquet")})
        for name in names:
            a, b = (read_all(d / stage / name) for d in (resumed, reference))
            why = "missing" if a is None or b is None else compare_tables(a, b, ignore)
            rows = str(0 if b is None else b.num_rows)
            out.append([stage, name, rows, "equal" if why is None else f"DIFFERENT: {why}"])
    return out


def read_all(folder: Path) -> pa.Table | None:
    files = sorted(folder.glob("part-*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]) if files else None


def side_files(run_dir: Path, stages: list[str]) -> list[str]:
    """Files of the stages that are neither Parquet parts nor manifests (not compared)."""
    return sorted(f"{s}/{p.name}" for s in stages for p in (run_dir / s).rglob("*")
                  if p.is_file() and p.suffix != ".parquet" and p.name != "_manifest.json")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=80)
    ap.add_argument("--sessions", type=int, default=3)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--questions", type=int, default=25)
    ap.add_argument("--latency", type=float, default=0.15)
    ap.add_argument("--cap", type=int, default=32, help="requests the server serves at once")
    ap.add_argument("--episodes-per-shard", type=int, default=4)
    ap.add_argument("--kill-at", type=float, default=0.4, help="share of the stage's shards finished at the kill")
    ap.add_argument("--ignore-columns", default="", help="comma-separated columns not compared (timings)")
    ap.add_argument("--run-timeout", type=float, default=900)
    ap.add_argument("--keep", action="store_true")
    return ap.parse_args()


def crash_and_compare(a: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Killed run, rerun, uninterrupted run; what the server saw and how the artifacts compare."""
    shards = math.ceil(a.episodes / a.episodes_per_shard)
    want = max(1, min(shards - 1, round(a.kill_at * shards)))
    ignore = tuple(c for c in a.ignore_columns.split(",") if c)
    stages = STAGES.split("[")[1].rstrip("]").split(",")
    corpus = write_corpus(workdir / "corpus.jsonl", a.episodes, sessions=a.sessions, turns=a.turns,
                          questions=a.questions)
    out: dict[str, Any] = {"shards": shards}
    with FakeServer(latency=a.latency, max_concurrency=a.cap) as srv:
        def sets(name: str) -> list[str]:
            return fake_sets(workdir, srv.base_url, corpus, run_name=name) + [
                "methods=[turn]", STAGES, "compress.method=none", "compress.granularities=[turn]",
                "banks.granularities=[turn]", "probes.next_response=false", "probes.max_qa_per_episode=null",
                "llm.max_concurrency=8", f"ray.episodes_per_shard={a.episodes_per_shard}"]

        run_dir, ref_dir = workdir / "artifacts" / "crash", workdir / "artifacts" / "ref"
        started = time.perf_counter()
        proc = start_run(sets("crash"), workdir / "killed.log")
        try:
            out["seen"] = wait_for_shards(proc, run_dir / f"{KILL_STAGE}.partial" / "_shards", want, a.run_timeout)
            if out["seen"] < 0:
                raise RuntimeError(f"the run ended before {want} shards of {KILL_STAGE} finished:\n"
                                   + (workdir / "killed.log").read_text()[-3000:])
            t_kill = time.time()
        finally:
            out["killed_procs"], out["survivors"] = kill_run(proc)  # also when something above failed
        out["killed_wall"] = time.perf_counter() - started
        time.sleep(2 * a.latency + 0.5)  # let the server finish (and log) what was in flight
        n_killed = len(srv.stats()["chat"])
        # answers the cache held after the kill (chat entries: one per distinct request)
        cached_at_kill = cache_stats(workdir / "llm-cache-crash")["per_kind"].get("chat", 0)
        stored_at_kill = cache_store_times(workdir / "llm-cache-crash")
        out["rerun_wall"], _ = mempipe(["run"], sets("crash"), timeout=a.run_timeout)
        chat = srv.stats()["chat"]
        n_rerun = len(chat)
        out["ref_wall"], _ = mempipe(["run"], sets("ref"), timeout=a.run_timeout)
        ref_chat = srv.stats()["chat"][n_rerun:]
    # how long answers wait for the cache write (the window a kill hits): killed run, uninterrupted run
    lags = {"killed": write_lags(chat[:n_killed], stored_at_kill),
            "ref": write_lags(ref_chat, cache_store_times(workdir / "llm-cache-ref"))}
    out["write_lag_ms"] = {k: [round(x * 1000, 1) for x in percentiles(v)] for k, v in lags.items()}
    out["calls"] = call_accounting(chat[:n_killed], chat[n_killed:], t_kill)
    out["calls"].update(cache_accounting(out["calls"], cached_at_kill))
    out["compared"] = compare_runs(run_dir, ref_dir, stages, ignore)
    out["not_compared"] = side_files(ref_dir, stages)
    out["resumed"] = manifest(run_dir, KILL_STAGE)["timings"]["resumed_shards"]
    return out


def calls_table(r: dict[str, Any]) -> str:
    acc = r["calls"]
    rows = [["killed run: chat requests / calls (distinct bodies)",
             f"{acc['killed_requests']} / {acc['killed_calls']}"],
            ["calls finished (answered by the server) before the kill", acc["finished"]],
            ["answers in the call cache after the kill", acc["cached_at_kill"]],
            ["finished calls whose answer did not reach the cache", acc["not_cached"]],
            ["finished calls sent again by the rerun (target 0)", acc["repeated"]],
            ["calls sent again although cached (target 0)", acc["resent_despite_cache"]],
            ["calls in flight at the kill", acc["in_flight"]],
            ["of them sent again by the rerun (expected)", acc["in_flight_resent"]],
            ["rerun: chat requests / calls", f"{acc['rerun_requests']} / {acc['rerun_calls']}"],
            ["rerun calls never sent before (work left at the kill)", acc["rerun_new"]],
            [f"shards of {KILL_STAGE} finished at the kill / resumed by the rerun / in all",
             f"{r['seen']} / {r['resumed']} / {r['shards']}"],
            ["processes of the run killed / left alive", f"{r['killed_procs']} / {len(r['survivors'])}"],
            *([f"{label}: ms from the server's answer to the cache write, p50 / p90 / p99 / max",
               " / ".join(f"{x:g}" for x in r["write_lag_ms"][k])]
              for k, label in (("killed", "killed run"), ("ref", "uninterrupted run")))]
    if acc["repeated"]:
        rows.append(["finished calls sent again: ms between the server's answer and the kill",
                     ", ".join(f"{ms:g}" for ms in acc["repeated_ms_before_kill"][:30])])
    return table(["", "count"], rows)


def render(a: argparse.Namespace, r: dict[str, Any], checks: list[tuple[str, int]]) -> str:
    ignore = [c for c in a.ignore_columns.split(",") if c]
    note = ("\n\nA call the server has answered is safe only once its answer is in the call cache; the client "
            "writes it there right after reading the reply (through the job's cache actor), so a SIGKILL in "
            "between loses it and the rerun asks again. The repeated calls above are those answers "
            "(answered within the milliseconds shown before the kill); the second target checks that no answer "
            "the cache held was asked again.") if r["calls"]["repeated"] else ""
    return (f"{a.episodes} synthetic episodes x {a.questions} questions; `{KILL_STAGE}` answers every question "
            f"({a.episodes * a.questions} probes in {r['shards']} shards of {a.episodes_per_shard} episodes; "
            "each question is worded differently, so each probe is one call); "
            f"server latency {a.latency:g} s, at most {a.cap} served at once. Killed after "
            f"{r['killed_wall']:.0f} s with {r['seen']} shards of `{KILL_STAGE}` finished; the rerun took "
            f"{r['rerun_wall']:.0f} s, the uninterrupted run {r['ref_wall']:.0f} s.\n\n" + calls_table(r) + note
            + "\n\nResumed run against the uninterrupted one (rows sorted, every column"
            + (f" but {', '.join(ignore)}" if ignore else "") + "; manifests: " + ", ".join(MANIFEST_KEYS) + "):\n\n"
            + table(["stage", "table", "rows", "resumed vs uninterrupted"], r["compared"])
            + (f"\n\nNot compared (side files, e.g. Lance banks): {len(r['not_compared'])} files."
               if r["not_compared"] else "")
            + "\n\n### Targets\n\n" + "\n".join(f"- {t}: {'met' if not n else f'MISSED by {n}'}" for t, n in checks))


def main() -> int:
    a = parse_args()
    with temp_workdir("mempipe-crash-", a.keep) as workdir:
        r = crash_and_compare(a, workdir)
    checks = [("calls finished before the kill that the rerun sent again: 0", r["calls"]["repeated"]),
              ("calls sent again although the cache held their answer at the kill: 0",
               r["calls"]["resent_despite_cache"]),
              ("tables and manifests equal to the uninterrupted run's", sum(x[3] != "equal" for x in r["compared"])),
              ("no process of the killed run left", len(r["survivors"]))]
    write_results("crash", "Crash: SIGKILL mid-stage, rerun, compare", render(a, r, checks),
                  {"args": vars(a), **r, "targets": dict(checks), "target_met": not any(n for _, n in checks)})
    return 0 if not any(n for _, n in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
