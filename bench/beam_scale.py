"""Benchmark: one huge BEAM-layout conversation (1M / 3M / 10M tokens) through the pipeline, local Ray.

Per size, a synthetic conversation in the release's layout (`<size>/1/chat.json` + `probing_questions/
probing_questions.json`, read by corpus.format beam) in a temporary folder:

- tokens estimated as words x 1.3 (no tokenizer: cheap, and the same rule at every size);
- messages of ~240 tokens on average (user ~120, assistant ~360: BEAM's 10M chats, 10M tokens over
  ~41,700 messages, i.e. ~20,900 user-assistant exchanges), so 1M tokens ~4,200 messages;
- batches of 20 exchanges (a batch = a session), each with a time anchor ("January-05-2024"), the user's
  messages carrying BEAM's "->-> b,n" plan markers;
- words drawn from 3,000 synthetic words with Zipf weights (so BM25 has a realistic spread of term
  frequencies), a few planted facts the probing questions cite;
- ten probing questions, one per ability, each with a 2-item rubric and `source_chat_ids` of real messages.

Then one `mempipe run -c configs/beam.yaml` with `stages=[ingest, guidance, segment, compress, banks, probes,
memory_turn, memory_rsum, respond_turn, respond_rsum]` (no judges, no metrics, no report), methods `turn`
(BM25, `method.turn.retriever=bm25`) and `rsum`, the packaged all-MiniLM-L6-v2 embeddings (banks embeds every
unit, whatever the retriever), every LLM role on `pipeline.testing.fake_openai` (a fixed latency), Ray local.
Killed (the whole process tree) past `--time-limit-s`; the stages that finished are still reported.

Measured per size: wall time per stage (its `_manifest.json`), the run's wall, seconds per million tokens,
LLM calls, peak RSS of the driver and of the largest Ray worker (psutil over the process tree every 0.5 s),
and which stage was running when each peak was reached.

Targets: time linear in tokens (s per M tokens at the largest size within 1.5x of the smallest), the
driver's peak under 1 GB, no worker over 2 GB.

    python bench/beam_scale.py --sizes 1000000 3000000 10000000 --latency 0.05 --time-limit-s 900
    python bench/beam_scale.py --render /tmp/mempipe-beam-scale-*.json   # re-render kept raw results
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psutil
from harness import EXIT_ROWS_FAILED, KEY_ENV, ROOT, FakeServer, mempipe_cmd, table, write_results
from scale_e2e import cpu_model

TOKENS_PER_WORD = 1.3
EXCHANGES_PER_BATCH = 20
USER_WORDS = (40, 145)  # uniform: mean 92.5 words ~ 120 tokens
ASSISTANT_WORDS = (140, 414)  # mean 277 words ~ 360 tokens
VOCAB = 3000
SAMPLE_S = 0.5
DRIVER_LIMIT_MB = 1024
WORKER_LIMIT_MB = 2048
LINEAR_LIMIT = 1.5
STAGES = ["ingest", "guidance", "segment", "compress", "banks", "probes", "memory_turn", "memory_rsum",
          "respond_turn", "respond_rsum"]
ABILITIES = ["abstention", "contradiction_resolution", "event_ordering", "information_extraction",
             "instruction_following", "knowledge_update", "multi_session_reasoning", "preference_following",
             "summarization", "temporal_reasoning"]
ANSWER_FIELDS = {"abstention": "ideal_response", "contradiction_resolution": "ideal_answer",
                 "instruction_following": "expected_compliance", "preference_following": "expected_compliance",
                 "summarization": "ideal_summary"}


def size_label(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}K"


def vocabulary(rng: random.Random) -> tuple[list[str], list[float]]:
    syll = "ba be bi bo bu ka ke ki ko ku la le li lo lu ma me mi mo mu na ne ni no nu ra re ri ro ru " \
           "sa se si so su ta te ti to tu va ve vi vo vu za ze zi zo zu".split()
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < VOCAB:
        w = "".join(rng.choice(syll) for _ in range(rng.randint(1, 4)))
        if w not in seen:
            seen.add(w)
            words.append(w)
    cum, total = [], 0.0
    for rank in range(1, VOCAB + 1):
        total += 1.0 / rank
        cum.append(total)
    return words, cum


def write_conversation(root: Path, n_tokens: int, seed: int = 0) -> dict[str, Any]:
    """`root/<size>/1/chat.json` and its probing questions: ~n_tokens (words x 1.3). Returns its shape."""
    rng = random.Random(seed)
    words, cum = vocabulary(rng)
    folder = root / size_label(n_tokens) / "1"
    (folder / "probing_questions").mkdir(parents=True)
    start = datetime(2024, 1, 1)
    batches: list[dict[str, Any]] = []
    facts: list[tuple[int, int, str]] = []  # (message id, batch number, fact)
    n_words = mid = 0
    b = 0
    while n_words * TOKENS_PER_WORD < n_tokens:
        b += 1
        anchor = (start + timedelta(days=b)).strftime("%B-%d-%Y")
        turns = []
        for e in range(1, EXCHANGES_PER_BATCH + 1):
            if n_words * TOKENS_PER_WORD >= n_tokens:
                break
            u = rng.choices(words, cum_weights=cum, k=rng.randint(*USER_WORDS))
            a = rng.choices(words, cum_weights=cum, k=rng.randint(*ASSISTANT_WORDS))
            if e == 1 and b % 50 == 1:  # a planted fact every 50 batches, for the questions
                fact = f"my {words[100 + b % 2000]} project is due on {anchor}"
                u[:0] = fact.split()
                facts.append((mid, b, fact))
            n_words += len(u) + len(a)
            user = {"role": "user", "id": mid, "index": f"{b},{e}",
                    "question_type": "main_question" if e == 1 else "followup_question",
                    "content": " ".join(u).capitalize() + f". ->-> {b},{e}"}
            if e == 1:
                user["time_anchor"] = anchor
            turns.append([user, {"role": "assistant", "id": mid + 1, "content": " ".join(a).capitalize() + "."}])
            mid += 2
        batches.append({"batch_number": b, "time_anchor": anchor, "turns": turns})
    with (folder / "chat.json").open("w") as f:
        json.dump(batches, f)
    del batches
    questions: dict[str, list[dict[str, Any]]] = {}
    for i, ability in enumerate(ABILITIES):
        m, fb, fact = facts[i % len(facts)]
        m2, _, fact2 = facts[(i + 1) % len(facts)]
        q: dict[str, Any] = {"question": f"({ability}) What did I say about {fact.split()[1]} in batch {fb}?",
                             ANSWER_FIELDS.get(ability, "answer"): fact,
                             "rubric": [f"LLM response should state: {fact}", f"LLM response should mention: {fact2}"]}
        if ability in ("contradiction_resolution", "knowledge_update"):
            q["source_chat_ids"] = {"first_statement": [m], "second_statement": [m2]}
        elif ability != "abstention":
            q["source_chat_ids"] = [m, m2]
        questions[ability] = [q]
    (folder / "probing_questions" / "probing_questions.json").write_text(json.dumps(questions, indent=1))
    return {"tokens_est": round(n_words * TOKENS_PER_WORD), "words": n_words, "messages": mid, "batches": b,
            "chat_mb": (folder / "chat.json").stat().st_size / 2**20, "questions": len(questions)}


def job_sets(workdir: Path, base_url: str, corpus: Path, a: argparse.Namespace) -> list[str]:
    return [f"artifacts_dir={workdir / 'artifacts'}", "run_name=beam_scale", f"corpus.path={corpus}",
            "corpus.episode_ids=null", "methods=[turn,rsum]", "method.turn.retriever=bm25",
            "embedding.model=all-MiniLM-L6-v2", f"embedding.vector_cache_dir={workdir / 'vectors'}",
            "llm.provider=openai", f"llm.base_url={base_url}", "llm.model=fake-model", f"llm.api_key_env={KEY_ENV}",
            f"llm.cache_dir={workdir / 'llm-cache'}", "roles={}", f"llm.max_concurrency={a.cap}",
            f"stages=[{','.join(STAGES)}]"]


def kill_tree(proc: psutil.Process) -> None:
    """End `proc` (a run this script started) and every process under it, by pid."""
    try:
        procs = [*proc.children(recursive=True), proc]
    except psutil.Error:
        procs = [proc]
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass


def run_job(cmd: list[str], log: Path, limit_s: float) -> dict[str, Any]:
    """Run `cmd`, sampling RSS of the driver and its Ray workers every SAMPLE_S; killed past `limit_s`."""
    env = {**os.environ, KEY_ENV: "sk-bench-not-a-secret", "PYTHONPATH": str(ROOT)}
    samples: list[tuple[float, float, float, str, float]] = []  # (t, driver MB, largest worker MB, its name, all)
    peak_by_name: dict[str, float] = {}
    started = time.perf_counter()
    t0 = time.time()
    timed_out = False
    with log.open("w") as out:
        proc = psutil.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            if time.perf_counter() - started > limit_s:
                timed_out = True
                kill_tree(proc)
                break
            try:
                driver = proc.memory_info().rss / 2**20
                best, best_name, total = 0.0, "", 0.0
                for child in proc.children(recursive=True):
                    try:
                        name = child.name()
                        if not (name.startswith("ray::") or "default_worker.py" in " ".join(child.cmdline())):
                            continue
                        rss = child.memory_info().rss / 2**20
                    except psutil.Error:
                        continue
                    total += rss
                    peak_by_name[name] = max(peak_by_name.get(name, 0.0), rss)
                    if rss > best:
                        best, best_name = rss, name
                samples.append((time.time(), driver, best, best_name, total))
            except psutil.Error:
                pass
            time.sleep(SAMPLE_S)
        proc.wait()
    wall = time.perf_counter() - started
    if not timed_out and proc.returncode not in (0, EXIT_ROWS_FAILED):
        raise RuntimeError(f"{' '.join(cmd[:4])} failed ({proc.returncode}); log {log}:\n{log.read_text()[-3000:]}")
    return {"wall_s": wall, "t0": t0, "timed_out": timed_out, "returncode": proc.returncode,
            "driver_peak_mb": max((s[1] for s in samples), default=0.0),
            "worker_peak_mb": max((s[2] for s in samples), default=0.0),
            "workers_total_peak_mb": max((s[4] for s in samples), default=0.0),
            "worker_peak_by_name": dict(sorted(peak_by_name.items(), key=lambda kv: -kv[1])[:6]),
            "samples": samples}


def stage_rows(run_dir: Path, samples: list[tuple[float, float, float, str, float]], latency: float,
               t0: float) -> list[dict[str, Any]]:
    """Per finished stage (in the order they finished): wall s, rows, shards, LLM calls, peak RSS while it ran."""
    out = []
    for path in sorted(run_dir.glob("*/_manifest.json"), key=lambda p: p.stat().st_mtime):
        m = json.loads(path.read_text())
        usage = list((m.get("llm_usage") or {}).values())
        calls = sum(u.get("calls", 0) - u.get("cached_calls", 0) for u in usage)
        wall = m["timings"]["wall_s"]
        end = datetime.fromisoformat(m["timings"]["finished_at"]).timestamp()
        during = [s for s in samples if end - wall - SAMPLE_S <= s[0] <= end + SAMPLE_S]
        top = max(during, key=lambda s: s[2], default=None)
        out.append({"stage": m["stage"], "wall_s": wall, "start_at_s": end - wall - t0, "end_at_s": end - t0, "rows": m["rows"], "shards": m["shards"], "llm": bool(usage),
                    "calls": calls, "failed_calls": sum(u.get("failed_calls", 0) for u in usage),
                    "calls_x_latency_s": calls * latency,
                    "driver_peak_mb": max((s[1] for s in during), default=None),
                    "worker_peak_mb": top[2] if top else None, "worker_peak_name": top[3] if top else None})
    return out


def one_size(n: int, a: argparse.Namespace, limit_s: float) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"mempipe-beam-scale-{size_label(n)}-"))
    try:
        t0 = time.perf_counter()
        shape = write_conversation(workdir / "corpus", n)
        gen_s = time.perf_counter() - t0
        print(f"{size_label(n)}: wrote {shape} in {gen_s:.0f} s; running (limit {limit_s:.0f} s)", flush=True)
        with FakeServer(latency=a.latency, max_concurrency=a.server_cap) as srv:
            sets = job_sets(workdir, srv.base_url, workdir / "corpus", a)
            cmd = mempipe_cmd(["run"], sets)
            cmd[cmd.index("-c") + 1] = str(ROOT / "configs" / "beam.yaml")
            run = run_job(cmd, workdir / "run.log", limit_s)
            try:
                stats = srv.stats()
            except OSError:
                stats = {}
        samples = run.pop("samples")
        stages = stage_rows(workdir / "artifacts" / "beam_scale", samples, a.latency, run["t0"])
        log_tail = (workdir / "run.log").read_text()[-2000:]
        done = {s["stage"] for s in stages}
        return {"tokens": n, "label": size_label(n), **shape, "generate_s": gen_s, "time_limit_s": limit_s, **run,
                "stages": stages, "missing_stages": [s for s in STAGES if s not in done],
                "server_calls": len(stats.get("chat", [])), "max_in_flight": stats.get("max_in_flight"),
                "log_tail": log_tail if run["timed_out"] else None, "workdir": str(workdir) if a.keep else None}
    finally:
        if not a.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def hhmm_today(text: str | None) -> float | None:
    """'19:20' (UTC, today) as a timestamp."""
    if not text:
        return None
    h, m = (int(x) for x in text.split(":"))
    now = datetime.now(timezone.utc)
    return now.replace(hour=h, minute=m, second=0, microsecond=0).timestamp()


def verdicts(results: list[dict[str, Any]], stated_s: float) -> tuple[list[str], bool]:
    out, ok = [], True

    def say(met: bool, text: str) -> None:
        nonlocal ok
        ok &= met
        out.append(f"- {'met' if met else 'MISSED'}: {text}")

    complete = [r for r in results if not r["timed_out"]]
    cut = [r for r in results if r["timed_out"]]
    if len(complete) > 1:
        first, last = complete[0], complete[-1]
        per = [r["wall_s"] / (r["tokens_est"] / 1e6) for r in (first, last)]
        before = {s["stage"]: s["wall_s"] / first["tokens_est"] for s in first["stages"] if s["wall_s"] >= 2}
        grew = [(s["stage"], s["wall_s"] / last["tokens_est"] / before[s["stage"]]) for s in last["stages"]
                if s["stage"] in before]
        say(per[1] <= LINEAR_LIMIT * per[0],
            f"time linear in tokens: {per[0]:.0f} s/M tokens at {first['label']} -> {per[1]:.0f} s/M tokens at "
            f"{last['label']} ({per[1] / per[0]:.2f}x; target <= {LINEAR_LIMIT}x); per stage (those of >= 2 s), "
            "s per token at the largest over the smallest: " + ", ".join(f"{n} {g:.2f}x" for n, g in grew))
    else:
        out.append("- not measured: time linear in tokens (fewer than two sizes finished)")
    for r in complete:  # against the stated limit (the first pass's --time-limit-s), whatever this run's own was
        say(r["wall_s"] <= stated_s, f"{r['label']} within the stated time limit of {stated_s:.0f} s: "
            f"{r['wall_s']:.0f} s" + (f" (this size was run under a limit of {r['time_limit_s']:.0f} s to measure it "
                                      "to the end)" if r["time_limit_s"] != stated_s else ""))
    for r in cut:
        s_per_m = r["wall_s"] / (r["tokens_est"] / 1e6)
        say(False, f"{r['label']} did not finish within its time limit of {r['time_limit_s']:.0f} s "
            f"(killed at {r['wall_s']:.0f} s, already {s_per_m:.0f} s/M tokens; stages not finished: "
            f"{', '.join(r['missing_stages'])})")
    for r in results:
        cut_note = " (run cut at its time limit: a lower bound)" if r["timed_out"] else ""
        say(r["driver_peak_mb"] < DRIVER_LIMIT_MB,
            f"{r['label']}: driver peak {r['driver_peak_mb']:.0f} MB (target < {DRIVER_LIMIT_MB} MB){cut_note}")
        say(r["worker_peak_mb"] <= WORKER_LIMIT_MB,
            f"{r['label']}: largest Ray worker {r['worker_peak_mb']:.0f} MB "
            f"({next(iter(r['worker_peak_by_name']), '?')}; target <= {WORKER_LIMIT_MB} MB){cut_note}")
    return out, ok


def render(results: list[dict[str, Any]], a: argparse.Namespace, notes: list[str]) -> int:
    summary = [[r["label"], f"{r['tokens_est']:,}", f"{r['messages']:,}", r["batches"], f"{r['chat_mb']:.0f}",
                f"{r['time_limit_s']:.0f}", f"{r['wall_s']:.0f}" + (" (cut)" if r["timed_out"] else ""),
                f"{r['wall_s'] / (r['tokens_est'] / 1e6):.0f}", sum(s["calls"] for s in r["stages"]),
                f"{r['driver_peak_mb']:.0f}", f"{r['worker_peak_mb']:.0f}", f"{r['workers_total_peak_mb']:.0f}"]
               for r in results]
    sections = ["### Per size\n\n" + table(
        ["size", "tokens (est.)", "messages", "batches (sessions)", "chat.json MB", "limit s", "run s",
         "s per M tokens", "LLM calls", "driver peak MB", "largest worker MB", "all workers MB"], summary)]
    for r in results:
        rows = [[s["stage"], f"{s['start_at_s']:.0f}-{s['end_at_s']:.0f}", f"{s['wall_s']:.1f}", s["rows"], s["shards"], s["calls"] if s["llm"] else "-",
                 f"{s['calls_x_latency_s']:.1f}" if s["llm"] else "-",
                 f"{s['driver_peak_mb']:.0f}" if s["driver_peak_mb"] is not None else "-",
                 f"{s['worker_peak_mb']:.0f} ({s['worker_peak_name']})" if s["worker_peak_mb"] else "-"]
                for s in r["stages"]]
        head = (f"### {r['label']} tokens\n\n{r['tokens_est']:,} tokens (est.), {r['messages']:,} messages in "
                f"{r['batches']} batches, {r['questions']} probing questions; corpus written in {r['generate_s']:.0f} s "
                f"(not counted). Run {r['wall_s']:.1f} s"
                + (f", KILLED at its limit of {r['time_limit_s']:.0f} s; stages not finished: "
                   f"{', '.join(r['missing_stages'])}" if r["timed_out"] else "")
                + f"; {r['server_calls']} requests reached the server (at most {r['max_in_flight']} at once); "
                f"peak RSS driver {r['driver_peak_mb']:.0f} MB, largest Ray worker {r['worker_peak_mb']:.0f} MB, all "
                f"workers {r['workers_total_peak_mb']:.0f} MB. Largest workers by process name: "
                + ", ".join(f"{k} {v:.0f} MB" for k, v in r["worker_peak_by_name"].items()) + ".\n\n")
        sections.append(head + table(["stage", "ran (s after the run's start)", "wall s", "rows", "shards", "LLM calls", "calls x latency s",
                                      "driver peak MB while it ran", "largest worker MB while it ran"], rows))
    lines, ok = verdicts(results, a.time_limit_s)
    body = (f"Machine: {os.cpu_count()} cores, {cpu_model()}, {psutil.virtual_memory().total / 2**30:.0f} GiB "
            "(shared with other users' jobs).\n\n"
            f"One synthetic BEAM-layout conversation per size (bench/beam_scale.py's docstring): tokens estimated as "
            f"words x {TOKENS_PER_WORD}; user messages {USER_WORDS[0]}-{USER_WORDS[1]} words, assistant "
            f"{ASSISTANT_WORDS[0]}-{ASSISTANT_WORDS[1]} (mean ~240 tokens a message, as BEAM's 10M chats: 10M tokens / "
            f"~41,700 messages); {EXCHANGES_PER_BATCH} exchanges a batch (a session) with a time anchor; 10 probing "
            "questions (one per ability, 2-item rubric). `mempipe run -c configs/beam.yaml` with "
            f"`stages=[{', '.join(STAGES)}]` (no judges, metrics or report; the respond stages are included: 10 "
            "questions each), `methods=[turn,rsum]`, `method.turn.retriever=bm25`, `corpus.episode_ids=null`, "
            "`embedding.model=all-MiniLM-L6-v2` (packaged, CPU, a cold vector cache of the run's own), `roles={}` "
            f"and every role on the fake endpoint `pipeline.testing.fake_openai` (latency {a.latency:g} s, at most "
            f"{a.server_cap} requests served at once), `llm.max_concurrency={a.cap}` (beam.yaml's rpm 3000 / tpm 2M "
            "kept), local Ray (default executor, beam.yaml's `ray.episodes_per_shard`). Peak RSS sampled every "
            f"{SAMPLE_S:g} s over the driver's process tree (psutil; Ray workers = `ray::*` / default_worker.py). "
            "Time limit per size: column 'limit s' (`--time-limit-s`, cut shorter where the clock required); a run "
            "past it is killed and what finished is reported. Stages of the DAG run side by side (see 'ran'): a stage's "
            "'while it ran' peaks are the whole tree's while it ran, another stage's work included.\n\n"
            + ("".join(f"Note: {n}\n\n" for n in notes))
            + "\n\n".join(sections) + "\n\nTargets:\n\n" + "\n".join(lines))
    write_results("beam_scale", "One huge BEAM conversation through the pipeline (1M / 3M / 10M tokens)", body,
                  {"results": results, "targets_met": ok, "targets": lines, "notes": notes, "cpu": cpu_model(),
                   "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()}})
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[1_000_000, 3_000_000, 10_000_000])
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--time-limit-s", type=float, default=900.0)
    ap.add_argument("--cap", type=int, default=16, help="llm.max_concurrency (beam.yaml's 16)")
    ap.add_argument("--server-cap", type=int, default=64, help="requests the fake server serves at once")
    ap.add_argument("--no-start-after", default=None, metavar="HH:MM",
                    help="UTC: start no size after this time (the sizes left are said to be cut)")
    ap.add_argument("--kill-at", default=None, metavar="HH:MM", help="UTC: no run goes past this time")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--render", type=Path, nargs="*", default=None,
                    help="raw JSON files of earlier passes (one size each, say), rendered as one result")
    ap.add_argument("--note", action="append", default=[], help="with --render: a note to add to the result")
    a = ap.parse_args()
    if a.render:
        raws = [json.loads(f.read_text()) for f in a.render]
        return render(sorted((r for raw in raws for r in raw["results"]), key=lambda r: r["tokens"]),
                      argparse.Namespace(**raws[0]["args"]), [n for raw in raws for n in raw.get("notes", [])] + a.note)
    results: list[dict[str, Any]] = []
    notes: list[str] = []
    raw_path = Path(tempfile.gettempdir()) / f"mempipe-beam-scale-{os.getpid()}.json"
    no_start, kill_at = hhmm_today(a.no_start_after), hhmm_today(a.kill_at)
    for n in a.sizes:
        if no_start is not None and time.time() > no_start:
            notes.append(f"{size_label(n)} not run: the clock was past {a.no_start_after} UTC, the last start allowed")
            continue
        limit = a.time_limit_s
        if kill_at is not None and kill_at - time.time() - 60 < limit:  # ~a minute for the corpus
            limit = max(kill_at - time.time() - 60, 1.0)
            notes.append(f"{size_label(n)}: its time limit cut to {limit:.0f} s by the clock (no run past "
                         f"{a.kill_at} UTC)")
        r = one_size(n, a, limit)
        results.append(r)
        print(f"{r['label']}: {r['wall_s']:.1f} s{' (KILLED at limit)' if r['timed_out'] else ''}, driver "
              f"{r['driver_peak_mb']:.0f} MB, largest worker {r['worker_peak_mb']:.0f} MB", flush=True)
        raw_path.write_text(json.dumps({"results": results, "notes": notes, "args": vars(a)}, default=str))
    raw_path.write_text(json.dumps({"results": results, "notes": notes, "args": vars(a)}, default=str))
    print(f"raw results: {raw_path}", flush=True)
    return render(results, a, notes)


if __name__ == "__main__":
    raise SystemExit(main())
