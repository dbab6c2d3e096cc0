"""Benchmark: LLM stages against an endpoint that fails often, then a second run that retries only
the failed rows.

The fake server injects, per request (a retry draws again): 10% 429 with Retry-After, 5% 500, 2%
timeouts (the server hangs longer than `llm.timeout_s`), 5% `malformed` (HTTP 200 with a valid body
whose structured answer is broken JSON: the client re-asks with the error; a plain-text call cannot
tell it from an answer and keeps it) and 5% `badjson` (HTTP 200 whose body is not JSON at all: a
transport error, retried). The run's LLM stages: `segment` (structured JSON), `memory_rsum` (RSum's
memory, plain), `respond_full_history` and `respond_rsum` (plain answers to every QA probe). No
stage embeds anything, so the runs spend their time on LLM calls.

Three runs share the server (its fault draws go on, so a retried request can succeed):
  A  few retries (llm.max_retries=2, llm.structured_retries=0): some rows fail;
  A2 on A's artifacts and cache, `mempipe run --retry-failed segment` (new samples for answers that
     stayed invalid), then a forced rerun of the plain stages (`--force memory_rsum --force
     respond_full_history --force respond_rsum`): only A's failed rows may be re-sent, and what A
     answered replays from the cache;
  B  default retries (5 transport retries, 2 re-asks), fresh artifacts and cache: retries absorb
     the faults.

Then an outage: run O, fresh artifacts and cache, default retries, against a second server with no
random faults that goes down (every request a 500) for `--outage` seconds (default 60) once the run
has had a few answers. The shared circuit breaker must pause every call and resume when the server
answers again, with no second command: target 0 failed and 0 lost rows. Reported: rows, the
requests the server refused during the outage (the first failures and the probes), and the longest
pause between two answers.

Per LLM stage: rows in (sessions or probes the stage must produce), answered, failed with a reason
(top reasons), lost (expected minus present), and failures whose reason does not say retries ran
out. Targets: 0 lost and 0 failures without a reason in every run; 0 failures with retries left;
A2 re-sends no request that A had answered. Run B's failures are reported, not a target (a row
fails there only after 6 faults in a row).

    python bench/faults.py                                  # 60 episodes: about 2,200 requests per run
    python bench/faults.py --episodes 12 --questions 4      # a quick look
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from harness import FakeServer, fake_sets, mempipe, table, temp_workdir, write_results
from make_corpus import write_corpus

FAULTS = "429=0.1,500=0.05,timeout=0.02,malformed=0.05,badjson=0.05"
STAGES = "stages=[ingest,guidance,segment,probes,memory_rsum,respond_full_history,respond_rsum]"
LLM_STAGES = ("segment", "memory_rsum", "respond_full_history", "respond_rsum")
OUTCOMES = ("ok", "429", "500", "timeout", "malformed", "badjson")
FEW_RETRIES = {"max_retries": 2, "structured_retries": 0}
DEFAULT_RETRIES = {"max_retries": 5, "structured_retries": 2}  # LLMConfig's defaults
BROKEN_TEXT = "malformed {"  # what the fake server answers a plain call with a `malformed` fault
_GAVE_UP = re.compile(r"gave up after (\d+) attempts")
_INVALID = re.compile(r"invalid structured output after (\d+) attempts")


# ---------------------------------------------------------------- pure helpers (tested)

def retries_exhausted(reason: str, max_retries: int, structured_retries: int) -> bool:
    """True when every failure named in `reason` ran out of its retries: transport errors after
    1 + max_retries attempts, invalid structured answers after 1 + structured_retries. A segment
    row joins one reason per window with '; ', so each part must say so."""
    parts = [p for p in reason.split("; ") if p.strip()]
    if not parts:
        return False
    for part in parts:
        gave_up, invalid = _GAVE_UP.search(part), _INVALID.search(part)
        if gave_up:
            if int(gave_up.group(1)) != 1 + max_retries:
                return False
        elif invalid:
            if int(invalid.group(1)) != 1 + structured_retries:
                return False
        else:
            return False  # e.g. a 400 that was never retried
    return True


def stage_of(entry: dict[str, Any]) -> str:
    """Which LLM stage sent a chat request, from the server's record of it (its prompt's start)."""
    if entry.get("structured"):
        return "segment"
    head = entry.get("head") or ""
    if head.startswith("You maintain the memory"):
        return "memory_rsum"
    if head.startswith("You answer questions about past"):  # SeCom's QA frame, which full_history uses
        return "respond_full_history"
    if "Your memory of those conversations" in head:
        return "respond_rsum"
    return "other"


def short_reason(reason: str) -> str:
    """A failure reason with its variable parts (numbers, windows) blanked, for counting."""
    reason = re.sub(r"window \d+/\d+: ", "", reason)
    return re.sub(r"\d+(\.\d+)?", "N", reason)[:90]


# ---------------------------------------------------------------- reading a run

def read_table(run_dir: Path, stage: str, name: str) -> list[dict[str, Any]]:
    """Every row of a finished stage's table ([] when the stage or table is missing)."""
    files = sorted((run_dir / stage / name).glob("part-*.parquet"))
    if not files:
        return []
    return pa.concat_tables([pq.read_table(f) for f in files]).to_pylist()


def expected_rows(run_dir: Path) -> dict[str, set[tuple]]:
    """What each LLM stage must produce a row for: sessions (segment, memory) or probes (respond)."""
    sessions = {(r["episode_id"], r["session_idx"]) for r in read_table(run_dir, "ingest", "turns")}
    probes = {(r["probe_id"],) for r in read_table(run_dir, "probes", "probes")}
    return {"segment": sessions, "memory_rsum": sessions, "respond_full_history": probes, "respond_rsum": probes}


def stage_rows(run_dir: Path, stage: str) -> dict[tuple, dict[str, Any]]:
    """Row id -> {"error": reason or None, "row": what the row says}; segment rows are per session."""
    if stage == "segment":
        out: dict[tuple, dict[str, Any]] = {}
        for r in read_table(run_dir, "segment", "segments"):
            k = (r["episode_id"], r["session_idx"])
            seen = out.setdefault(k, {"error": r["fallback_reason"] if r["fallback"] else None, "row": []})
            seen["row"].append((r["segment_idx"], r["turn_start"], r["turn_end"]))
        return out
    if stage == "memory_rsum":
        return {(r["episode_id"], r["snapshot_session"]): {"error": r["error"], "row": r["memory"]}
                for r in read_table(run_dir, stage, "summary")}
    return {(r["probe_id"],): {"error": r["error"], "row": r["response"]}
            for r in read_table(run_dir, stage, "responses")}


def row_report(run_dir: Path, retries: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Per LLM stage: rows in / answered / failed with and without a reason / lost / retries left."""
    expected = expected_rows(run_dir)
    out = {}
    for stage in LLM_STAGES:
        rows = stage_rows(run_dir, stage)
        failed = {k: v["error"] for k, v in rows.items() if v["error"] is not None}
        with_reason = [e for e in failed.values() if e.strip()]
        left = [e for e in with_reason
                if not retries_exhausted(e, retries["max_retries"], retries["structured_retries"])]
        out[stage] = {"rows_in": len(expected[stage]), "present": len(rows), "answered": len(rows) - len(failed),
                      "failed": len(with_reason), "failed_no_reason": len(failed) - len(with_reason),
                      "lost": len(expected[stage] - set(rows)), "extra": len(set(rows) - expected[stage]),
                      "retries_left": len(left), "retries_left_examples": left[:3],
                      # a plain-text call keeps an injected `malformed` reply as its answer
                      "broken_answers": sum(1 for v in rows.values() if v["error"] is None
                                            and isinstance(v["row"], str) and BROKEN_TEXT in v["row"]),
                      "top_reasons": Counter(short_reason(e) for e in with_reason).most_common(3)}
    return out


def server_report(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per stage: chat requests the server got, by injected outcome; distinct request bodies; bodies
    answered more than once (identical requests of two rows sent at once: an answer ends a retry
    chain) and, of those, the ones answered differently (one got a `malformed` text)."""
    out: dict[str, dict[str, Any]] = {}
    answers: dict[str, dict[str, list[str]]] = {}
    for e in entries:
        stage = stage_of(e)
        s = out.setdefault(stage, {"requests": 0, "keys": set(), **{o: 0 for o in OUTCOMES}})
        s["requests"] += 1
        s["keys"].add(e["key"])
        s[e["outcome"] or "ok"] += 1
        if e["outcome"] in (None, "malformed"):
            answers.setdefault(stage, {}).setdefault(e["key"], []).append(e["outcome"] or "ok")
    for stage, s in out.items():
        twice = [a for a in answers.get(stage, {}).values() if len(a) > 1]
        s["answered_twice"] = len(twice)
        s["answered_differently"] = sum(1 for a in twice if len(set(a)) > 1)
    return out


def answered_keys(entries: list[dict[str, Any]]) -> set[str]:
    """Request bodies the client got an answer for (then cached): HTTP 200 with a JSON body."""
    return {e["key"] for e in entries if e["outcome"] in (None, "malformed")}


# ---------------------------------------------------------------- running

class Bench:
    """One fake server, one corpus; runs `mempipe` and slices the server's log per run."""

    def __init__(self, srv: FakeServer, workdir: Path, corpus: Path, timeout_s: float, run_timeout: float) -> None:
        self.srv, self.workdir, self.corpus = srv, workdir, corpus
        self.timeout_s, self.run_timeout = timeout_s, run_timeout

    def sets(self, name: str, retries: dict[str, int]) -> list[str]:
        return fake_sets(self.workdir, self.srv.base_url, self.corpus, run_name=name) + [
            "methods=[full_history,rsum]", STAGES, "probes.next_response=false", "probes.max_qa_per_episode=null",
            "llm.max_concurrency=16", "ray.episodes_per_shard=8", f"llm.timeout_s={self.timeout_s}",
            f"llm.max_retries={retries['max_retries']}", f"llm.structured_retries={retries['structured_retries']}"]

    def run(self, args: list[str], name: str, retries: dict[str, int]) -> tuple[list[dict[str, Any]], float]:
        """Run mempipe; the chat requests the server logged meanwhile, and the wall time."""
        before = len(self.srv.stats()["chat"])
        wall, _ = mempipe(args, self.sets(name, retries), timeout=self.run_timeout)
        return self.srv.stats()["chat"][before:], wall


def retry_report(first: dict[str, dict[str, Any]], second: dict[str, dict[str, Any]],
                 a_entries: list[dict[str, Any]], a2_entries: list[dict[str, Any]],
                 a_rows: dict[str, dict[tuple, dict[str, Any]]], a2_rows: dict[str, dict[tuple, dict[str, Any]]]
                 ) -> dict[str, dict[str, Any]]:
    """Per stage: A's failed rows, those A2 answered, rows A2 changed, request bodies A2 sent, and
    requests A had answered that A2 sent again."""
    answered = answered_keys(a_entries)
    by_stage: dict[str, list[dict[str, Any]]] = {}
    for e in a2_entries:
        by_stage.setdefault(stage_of(e), []).append(e)
    out = {}
    for stage in LLM_STAGES:
        before, after = a_rows[stage], a2_rows[stage]
        sent = by_stage.get(stage, [])
        out[stage] = {
            "failed_before": first[stage]["failed"],
            "retried_answered": sum(1 for k, v in before.items() if v["error"] is not None
                                    and k in after and after[k]["error"] is None),
            "changed": sum(1 for k, v in after.items() if before.get(k) != v),
            "requests": len(sent), "new_bodies": len({e["key"] for e in sent}),
            "resent_answered": sum(1 for e in sent if e["key"] in answered),
            "failed_after": second[stage]["failed"], "lost_after": second[stage]["lost"]}
    return out


# ---------------------------------------------------------------- the report

def rows_table(report: dict[str, dict[str, Any]]) -> str:
    rows = [[s, r["rows_in"], r["answered"], r["broken_answers"], r["failed"], r["failed_no_reason"], r["lost"],
             r["retries_left"], "; ".join(f"{n}x {why}" for why, n in r["top_reasons"]) or "-"]
            for s, r in report.items()]
    return table(["stage", "rows in", "answered", "of them with a `malformed` reply as text", "failed with reason",
                  "failed without reason", "lost (target 0)", "failed with retries left (target 0)", "top reasons"],
                 rows)


def server_table(report: dict[str, dict[str, Any]]) -> str:
    order = [s for s in (*LLM_STAGES, "other") if s in report]
    rows = [[s, report[s]["requests"], len(report[s]["keys"]), *(report[s][o] for o in OUTCOMES),
             f"{report[s]['answered_twice']} / {report[s]['answered_differently']}"] for s in order]
    return table(["stage", "requests", "distinct bodies", "ok", "429", "500", "timeout",
                  "malformed (bad JSON answer in a valid reply)", "badjson (reply body not JSON)",
                  "bodies answered twice / differently"], rows)


def retry_table(report: dict[str, dict[str, Any]]) -> str:
    rows = [[s, r["failed_before"], r["retried_answered"], r["changed"], r["requests"], r["new_bodies"],
             r["resent_answered"], r["failed_after"], r["lost_after"]] for s, r in report.items()]
    return table(["stage", "failed rows in A", "of them answered by A2", "rows A2 changed", "requests A2 sent",
                  "distinct bodies A2 sent", "A's answers re-sent (target 0)", "failed after A2", "lost after A2"],
                 rows)


def targets(runs: dict[str, dict[str, dict[str, Any]]], retry: dict[str, dict[str, Any]]) -> list[tuple[str, int]]:
    """(target, how much it is missed by: 0 = met)."""
    out = []
    for label, report in runs.items():
        out.append((f"run {label}: 0 rows lost", sum(r["lost"] + r["extra"] for r in report.values())))
        out.append((f"run {label}: 0 failed rows without a reason",
                    sum(r["failed_no_reason"] for r in report.values())))
        out.append((f"run {label}: 0 failed rows with retries left", sum(r["retries_left"] for r in report.values())))
    out.append(("run A2: 0 requests A had answered re-sent", sum(r["resent_answered"] for r in retry.values())))
    if "O" in runs:
        out.append(("run O: 0 failed rows through the outage", sum(r["failed"] for r in runs["O"].values())))
    out.append(("run A: some rows failed (else A2 tests nothing)",
                int(sum(r["failed_before"] for r in retry.values()) == 0)))
    return out


RUN_TITLES = {"A": "few retries (llm.max_retries=2, llm.structured_retries=0)",
              "A2": "A's artifacts and cache after `--retry-failed segment` and a forced rerun of the other LLM stages",
              "B": "default retries (llm.max_retries=5, llm.structured_retries=2), fresh artifacts and cache",
              "O": "an endpoint outage mid-run (no random faults), default retries, fresh artifacts and cache"}
RETRY_NOTE = ("Rows A2 changed beyond A's failed rows: (1) RSum's memory of the sessions after a retried one is "
              "built on it, and `respond_rsum` answers from that memory (new requests); (2) twins: rows with the same "
              "prompt share one request while it is in flight, but only within a worker's client; identical "
              "prompts asked at once from two shards are sent twice, and when answered differently (one a "
              "`malformed` text) the cache keeps one answer, which the rerun replays for both rows (no request; "
              "see \"bodies answered twice / differently\").")


def render(a: argparse.Namespace, r: dict[str, Any], checks: list[tuple[str, int]]) -> str:
    """The Markdown report of the three runs."""
    sections = [f"### Run {k}: {title}; {r['walls'][k]:.0f} s\n\n{rows_table(r['runs'][k])}\n\n"
                f"Requests the server got during run {k}:\n\n{server_table(server_report(r['entries'][k]))}"
                for k, title in RUN_TITLES.items()]
    return (f"{a.episodes} synthetic episodes x {a.sessions} sessions x {a.turns} turns, {a.questions} questions "
            f"each; faults `{a.faults}` per request (a retry draws again), Retry-After {a.retry_after:g} s, an "
            f"injected timeout hangs {a.timeout_sleep:g} s against llm.timeout_s={a.llm_timeout:g}; latency "
            f"{a.latency:g} s. `malformed`: a valid reply whose structured answer is broken JSON (re-asked; a "
            "plain-text call keeps it as its answer); `badjson`: a reply body that is not JSON (retried like a "
            "5xx). Segment rows are sessions (a failed one falls back to fixed chunks and keeps the reason).\n\n"
            + "\n\n".join(sections)
            + "\n\n### Run A2 against A: only failed rows re-sent\n\n" + retry_table(r["retry"])
            + "\n\n" + RETRY_NOTE
            + "\n\n### Run O: the outage\n\n" + table(
                ["outage s", "requests during it", "refused (500)", "longest pause between answers s", "run wall s"],
                [[r["outage"]["outage_s"], r["outage"]["requests_during"], r["outage"]["refused_during"],
                  r["outage"]["longest_pause_s"], f"{r['walls']['O']:.0f}"]])
            + "\n\n### Targets\n\n"
            + "\n".join(f"- {t}: {'met' if not n else f'MISSED by {n}'}" for t, n in checks))


def outage_report(entries: list[dict[str, Any]], down: tuple[float, float]) -> dict[str, Any]:
    """Requests refused while the server was down, and the longest gap between two answers."""
    answered = sorted(e["t"] for e in entries if e["outcome"] is None)
    gaps = [b - a for a, b in zip(answered, answered[1:])]
    during = [e for e in entries if down[0] <= e["t"] < down[1]]
    return {"outage_s": round(down[1] - down[0], 1), "requests_during": len(during),
            "refused_during": sum(1 for e in during if e["outcome"] == "500"),
            "longest_pause_s": round(max(gaps, default=0.0), 1)}


def take_down_after(srv: FakeServer, answers: int, seconds: float, out: dict[str, float]) -> threading.Thread:
    """Take the server down for `seconds` (POST /outage) once it has answered `answers` chat requests."""
    def watch() -> None:
        deadline = time.time() + 600
        while len(srv.stats()["chat"]) < answers and time.time() < deadline:
            time.sleep(0.2)
        req = urllib.request.Request(srv.base_url.removesuffix("/v1") + "/outage", method="POST",
                                     data=json.dumps({"seconds": seconds}).encode(),
                                     headers={"Content-Type": "application/json"})
        out["until"] = json.loads(urllib.request.urlopen(req, timeout=30).read())["outage_until"]
        out["since"] = out["until"] - seconds

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=60)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--questions", type=int, default=10)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--retry-after", type=float, default=1.0, help="Retry-After of the injected 429s")
    ap.add_argument("--timeout-sleep", type=float, default=3.0, help="how long an injected timeout hangs")
    ap.add_argument("--llm-timeout", type=float, default=1.0, help="llm.timeout_s (below --timeout-sleep)")
    ap.add_argument("--faults", default=FAULTS)
    ap.add_argument("--run-timeout", type=float, default=900, help="seconds before one mempipe run is abandoned")
    ap.add_argument("--outage", type=float, default=60.0, help="seconds the server is down in run O")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    if a.llm_timeout >= a.timeout_sleep + a.latency:
        ap.error("--llm-timeout must be below --timeout-sleep, or injected timeouts are just slow answers")
    return a


def run_all(a: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Runs A, A2 and B against one faulty server: row reports, server logs, walls, A2 against A."""
    corpus = write_corpus(workdir / "corpus.jsonl", a.episodes, sessions=a.sessions, turns=a.turns,
                          questions=a.questions)
    entries: dict[str, list[dict[str, Any]]] = {"A": [], "A2": [], "B": [], "O": []}
    walls = {"A": 0.0, "A2": 0.0, "B": 0.0, "O": 0.0}
    with FakeServer(latency=a.latency, faults=a.faults, retry_after=a.retry_after,
                    timeout_sleep=a.timeout_sleep) as srv:
        bench = Bench(srv, workdir, corpus, a.llm_timeout, a.run_timeout)
        run_a, run_b = workdir / "artifacts" / "few", workdir / "artifacts" / "default"
        entries["A"], walls["A"] = bench.run(["run"], "few", FEW_RETRIES)
        report_a = row_report(run_a, FEW_RETRIES)
        a_rows = {s: stage_rows(run_a, s) for s in LLM_STAGES}
        forced = [flag for s in LLM_STAGES[1:] for flag in ("--force", s)]
        for args in (["--retry-failed", "segment"], forced):  # together they rebuild every LLM stage
            got, wall = bench.run(["run", *args], "few", FEW_RETRIES)
            entries["A2"] += got
            walls["A2"] += wall
        report_a2 = row_report(run_a, FEW_RETRIES)
        a2_rows = {s: stage_rows(run_a, s) for s in LLM_STAGES}
        entries["B"], walls["B"] = bench.run(["run"], "default", DEFAULT_RETRIES)
        report_b = row_report(run_b, DEFAULT_RETRIES)
    with FakeServer(latency=a.latency) as clean:
        down: dict[str, float] = {}
        watcher = take_down_after(clean, 20, a.outage, down)
        outage = Bench(clean, workdir, corpus, a.llm_timeout, a.run_timeout)
        entries["O"], walls["O"] = outage.run(["run"], "outage", DEFAULT_RETRIES)
        watcher.join(timeout=5)
        report_o = row_report(workdir / "artifacts" / "outage", DEFAULT_RETRIES)
    retry = retry_report(report_a, report_a2, entries["A"], entries["A2"], a_rows, a2_rows)
    return {"runs": {"A": report_a, "A2": report_a2, "B": report_b, "O": report_o}, "entries": entries,
            "walls": walls, "retry": retry,
            "outage": outage_report(entries["O"], (down.get("since", 0.0), down.get("until", 0.0)))}


def main() -> int:
    a = parse_args()
    with temp_workdir("mempipe-faults-", a.keep) as workdir:
        r = run_all(a, workdir)
    checks = targets(r["runs"], r["retry"])
    missed = any(n for _, n in checks)
    server = {k: {s: {**v, "keys": len(v["keys"])} for s, v in server_report(e).items()}
              for k, e in r["entries"].items()}
    write_results("faults", "Faults: every row answered or failed with a reason; retries re-send only failures",
                  render(a, r, checks), {"args": vars(a), "runs": r["runs"], "retry": r["retry"], "walls": r["walls"],
                                         "outage": r["outage"],
                                         "server": server, "targets": dict(checks), "target_met": not missed})
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
