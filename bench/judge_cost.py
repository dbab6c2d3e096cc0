"""Benchmark: what CREEM's config costs on one LoCoMo-sized conversation, before and after sampling
with `n` and billing the endpoint's prompt cache.

One conversation in LoCoMo's own file layout (locomo10.json: a list with one sample; 19 sessions of
18-26 turns of 14-30 words, about 9k; generated deterministically from `--seed` into a temporary folder),
run twice with `mempipe run -c configs/creem_msc.yaml` against the fake OpenAI server (`python -m
pipeline.testing.fake_openai`, its own process: it serves `n` and reports cached prompt tokens by OpenAI's
rule), each run with its own server, artifacts and LLM call cache:

- before: `llm.sample_with_n=false` (one chat request per sample) and every prompt token billed at
  the input price (no `cached_input`): the client as it was;
- after: the defaults (a prompt's k samples in one request with `n=k`) and the prompt tokens the
  endpoint served from its cache billed at `cached_input`.

Both at 2.5 / 10 USD per 1M input / output tokens (the issue's measurement), cached input 1.25
(after only). Offline embedding as the config's comments say (all-MiniLM-L6-v2, normalized, each
CREEM variant's similarity cosine); the rest of the config as it is (probes.from_session: 5,
max_per_episode: 5). The config's rpm / tpm limits are lifted (`--rate-limits off`, the default:
the fake server is local and the limits change only the wall time; `config` keeps them).

Prints per stage with LLM usage and in total, before and after: samples (calls), chat requests
sent, samples per request, prompt tokens sent, of them cached (reported by the endpoint), those
billed at the full input price, completion tokens and cost; the ratio after / before of the total
cost, and of the money spent (calls replayed from the run's own LLM cache left out: the issue's
target, at most 0.1), of the judges alone, and two what-ifs from the tokens (no prompt cache reported;
before's cached tokens billed at cached_input); judge_memory's samples per request (target: at least
10); and checks that both runs wrote the same rows to judge_memory's and judge_pairwise's tables.
The endpoint's prompt-cache hits depend on the order concurrent requests arrive in, so the cached
prompt tokens (and the after cost) vary a little from run to run.

    python bench/judge_cost.py            # both runs: about 4-6 minutes on 2 cores
    python bench/judge_cost.py --keep     # keep the runs' folders (the path is printed)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import EXIT_ROWS_FAILED, KEY_ENV, ROOT, FakeServer, table, write_results

CONFIG = ROOT / "configs" / "creem_msc.yaml"
MODEL = "gpt-3.5-turbo"  # the config's model, every role's
PRICE_IN, PRICE_CACHED, PRICE_OUT = 2.5, 1.25, 10.0  # USD per 1M tokens
JUDGES = ("judge_memory", "judge_pairwise", "judge_answers")
JUDGED_TABLES = {"judge_memory": "memory_judgments", "judge_pairwise": "pairwise_judgments"}
COST_TARGET = 0.1  # after / before, at most
SAMPLES_TARGET = 10  # judge_memory's samples per request, at least

# ---------------------------------------------------------------- the conversation

SPEAKERS = ("Maya", "Tom")
WORDS = ("the garden was quiet this morning and I walked to the market with my sister after work we talked "
         "about the new job a trip to the coast next summer my brother still plays guitar in a small band "
         "on weekends I have been reading a book about old ships and baking bread every sunday the dog "
         "loves the park near our house it rained all week so we stayed home and watched films my mother "
         "called about the family dinner I want to learn to paint with water colors the class starts in "
         "june our neighbor fixed the fence and gave us fresh tomatoes from his garden I feel tired but "
         "happy about the progress at the studio we should meet for coffee at the corner shop soon").split()
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")


def sentence(rng: random.Random, n: int) -> str:
    words = [rng.choice(WORDS) for _ in range(n)]
    return " ".join(words).capitalize() + "."


def make_conversation(seed: int, sessions: int = 19) -> list[dict[str, Any]]:
    """One LoCoMo sample (locomo10.json's layout): `sessions` sessions of 18-26 turns of 14-30 words
    (about 9k words, LoCoMo's size), alternating speakers, dated two weeks apart, and a few QA items
    with evidence."""
    rng = random.Random(seed)
    conv: dict[str, Any] = {"speaker_a": SPEAKERS[0], "speaker_b": SPEAKERS[1]}
    dia_ids: list[str] = []
    for s in range(1, sessions + 1):
        turns = []
        for t in range(1, rng.randint(18, 26) + 1):
            dia_id = f"D{s}:{t}"
            dia_ids.append(dia_id)
            turns.append({"speaker": SPEAKERS[(t - 1) % 2], "dia_id": dia_id, "text": sentence(rng, rng.randint(14, 30))})
        conv[f"session_{s}"] = turns
        day = 1 + 14 * (s - 1)  # two weeks apart from 1 January 2023
        month, dom = divmod(day - 1, 28)  # 28-day months keep every date valid
        conv[f"session_{s}_date_time"] = f"{rng.randint(1, 11)}:{rng.choice(['00', '15', '30', '45'])} pm on " \
                                         f"{dom + 1} {MONTHS[month % 12]}, {2023 + month // 12}"
    qa = [{"question": f"What did {SPEAKERS[i % 2]} say about the {w}?", "answer": sentence(rng, 6),
           "evidence": sorted(rng.sample(dia_ids, 2)), "category": 1 + i % 4}
          for i, w in enumerate(("garden", "band", "bread", "trip", "fence"))]
    return [{"sample_id": "bench-1", "conversation": conv, "qa": qa}]


def words_in(sample: dict[str, Any]) -> tuple[int, int, int]:
    conv = sample["conversation"]
    sessions = [v for k, v in conv.items() if k.startswith("session_") and isinstance(v, list)]
    turns = [t for s in sessions for t in s]
    return len(sessions), len(turns), sum(len(t["text"].split()) for t in turns)


# ---------------------------------------------------------------- the runs

def run_sets(workdir: Path, label: str, base_url: str, corpus: Path, after: bool, limits: bool) -> list[str]:
    prices = (f"{{{MODEL}: {{input: {PRICE_IN}, cached_input: {PRICE_CACHED}, output: {PRICE_OUT}}}}}" if after
              else f"{{{MODEL}: {{input: {PRICE_IN}, output: {PRICE_OUT}}}}}")
    sets = [f"run_name=judge-cost-{label}", f"artifacts_dir={workdir / 'artifacts'}",
            "corpus.format=locomo", f"corpus.path={corpus}", "corpus.limit=1",
            f"llm.base_url={base_url}", f"llm.api_key_env={KEY_ENV}", f"llm.cache_dir={workdir / 'llm-cache'}",
            f"llm.prices={prices}", f"llm.sample_with_n={'true' if after else 'false'}",
            "embedding.model=all-MiniLM-L6-v2", "embedding.normalize=true",
            f"embedding.vector_cache_dir={workdir / 'vectors'}",
            "method.creem.similarity=cosine", "method.creem_no_refine.similarity=cosine",
            "method.creem_no_preblend.similarity=cosine"]
    if not limits:
        sets += ["llm.rpm=null", "llm.tpm=null"]
    return sets


def run_job(workdir: Path, label: str, corpus: Path, after: bool, limits: bool, timeout: float) -> dict[str, Any]:
    """`mempipe run -c configs/creem_msc.yaml` against a fresh fake server; the run's folder, wall
    seconds and the server's request counts."""
    workdir.mkdir(parents=True)
    with FakeServer() as server:
        cmd = [sys.executable, "-m", "stages.cli", "run", "-c", str(CONFIG)]
        for s in run_sets(workdir, label, server.base_url, corpus, after, limits):
            cmd += ["--set", s]
        env = {**os.environ, KEY_ENV: "sk-bench-not-a-secret"}
        print(f"[{label}] mempipe run -c configs/creem_msc.yaml ({workdir}) ...", flush=True)
        started = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - started
        (workdir / "mempipe.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
        if proc.returncode not in (0, EXIT_ROWS_FAILED):
            raise RuntimeError(f"[{label}] mempipe run failed ({proc.returncode}) after {wall:.0f} s; log: "
                               f"{workdir / 'mempipe.log'}\n{proc.stderr[-4000:]}")
        stats = server.stats()
    print(f"[{label}] done in {wall:.0f} s", flush=True)
    return {"run_dir": workdir / "artifacts" / f"judge-cost-{label}", "wall_s": wall,
            "server": {k: v for k, v in stats.items() if isinstance(v, (int, float, str))}}


# ---------------------------------------------------------------- the figures

FIELDS = ("calls", "cached_calls", "failed_calls", "requests", "sampled_requests", "sampled_choices",
          "prompt_tokens", "cached_prompt_tokens", "completion_tokens", "cost_usd", "cached_cost_usd")


def stage_usage(run_dir: Path, cached_input_billed: bool) -> dict[str, dict[str, Any]]:
    """Per stage with LLM usage (every role summed), in the order they ran; `full_price_prompt_tokens`:
    the prompt tokens billed at the input price (all of them without a cached_input price)."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(run_dir.glob("*/_manifest.json"), key=lambda p: p.stat().st_mtime):
        m = json.loads(path.read_text())
        if not m.get("llm_usage"):
            continue
        roles = m["llm_usage"]
        u = {k: sum(r.get(k, 0) for r in roles.values()) for k in FIELDS}
        u["roles"] = sorted(roles)
        u["rows"] = m.get("rows")
        u["full_price_prompt_tokens"] = u["prompt_tokens"] - (u["cached_prompt_tokens"] if cached_input_billed else 0)
        # the cost again from the tokens, at the prices this run was given (a check of the manifest's)
        u["recomputed_cost_usd"] = (u["full_price_prompt_tokens"] * PRICE_IN
                                    + (u["prompt_tokens"] - u["full_price_prompt_tokens"]) * PRICE_CACHED
                                    + u["completion_tokens"] * PRICE_OUT) / 1e6
        out[m["stage"]] = u
    return out


def total(stages: dict[str, dict[str, Any]]) -> dict[str, Any]:
    keys = [*FIELDS, "full_price_prompt_tokens", "recomputed_cost_usd"]
    return {k: sum(s[k] for s in stages.values()) for k in keys}


def per_request(u: dict[str, Any]) -> float | None:
    fresh = u["calls"] - u["cached_calls"]
    return fresh / u["requests"] if u["requests"] else None


def table_rows(run_dir: Path, stage: str, name: str) -> int | None:
    import pyarrow.dataset as ds

    folder = run_dir / stage / name
    if not folder.is_dir():
        return None
    return ds.dataset(str(folder), format="parquet").count_rows()


def probe_where(run_dir: Path) -> list[str]:
    """The probes' "session:turn" (probes.from_session on a 19-session conversation)."""
    import pyarrow.dataset as ds

    rows = ds.dataset(str(run_dir / "probes" / "probes"), format="parquet").to_table(
        columns=["session_idx", "turn_idx"]).to_pylist()
    return [f"{s}:{t}" for s, t in sorted((r["session_idx"], r["turn_idx"]) for r in rows)]


def at_prices(u: dict[str, Any], cached_price: float) -> float:
    """USD of these tokens with the cached prompt tokens at `cached_price` (the rest at input / output)."""
    return ((u["prompt_tokens"] - u["cached_prompt_tokens"]) * PRICE_IN + u["cached_prompt_tokens"] * cached_price
            + u["completion_tokens"] * PRICE_OUT) / 1e6


def fmt_n(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def fmt_ratio(a: float | None, b: float | None, digits: int = 3) -> str:
    return "-" if not b or a is None else f"{a / b:.{digits}f}"


def stage_order(stages: list[str]) -> list[str]:
    """memory_*, respond_*, then the judges, then the rest, each group in run order."""
    groups = [[s for s in stages if s.startswith("memory_")], [s for s in stages if s.startswith("respond_")],
              [s for s in JUDGES if s in stages]]
    seen = {s for g in groups for s in g}
    return [s for g in groups for s in g] + [s for s in stages if s not in seen]


def compare(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    names = stage_order(list(dict.fromkeys([*before, *after])))
    zero = {k: 0 for k in [*FIELDS, "full_price_prompt_tokens", "recomputed_cost_usd"]}
    header = ["stage", "run", "samples (calls)", "of them LLM-cache replays", "requests sent", "samples / request",
              "prompt tokens sent", "cached prompt tokens", "prompt tokens billed at full price", "completion tokens",
              "cost USD", "cost after / before", "spent USD (fresh calls)", "spent after / before"]
    rows, data = [], []
    for name, b, a in [*[(n, before.get(n, zero), after.get(n, zero)) for n in names],
                       ("**total**", total(before), total(after))]:
        for label, u in (("before", b), ("after", a)):
            spr = per_request(u)
            spent, spent_b = u["cost_usd"] - u["cached_cost_usd"], b["cost_usd"] - b["cached_cost_usd"]
            rows.append([name if label == "before" else "", label, fmt_n(u["calls"]), fmt_n(u["cached_calls"]),
                         fmt_n(u["requests"]),
                         "-" if spr is None else f"{spr:.2f}", fmt_n(u["prompt_tokens"]),
                         fmt_n(u["cached_prompt_tokens"]), fmt_n(u["full_price_prompt_tokens"]),
                         fmt_n(u["completion_tokens"]), f"{u['cost_usd']:.4f}",
                         fmt_ratio(a["cost_usd"], b["cost_usd"]) if label == "after" else "", f"{spent:.4f}",
                         fmt_ratio(spent, spent_b) if label == "after" else ""])
        data.append({"stage": name.strip("*"), "before": b, "after": a,
                     "cost_ratio": a["cost_usd"] / b["cost_usd"] if b["cost_usd"] else None})
    return table(header, rows), data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="the generated conversation's seed (default 0)")
    ap.add_argument("--rate-limits", choices=["off", "config"], default="off",
                    help="off (default): lift the config's rpm / tpm for the local fake; config: keep them")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per run before giving up (default 3600)")
    ap.add_argument("--keep", action="store_true", help="keep the runs' folder (its path is printed)")
    a = ap.parse_args()
    limits = a.rate_limits == "config"
    workdir = Path(tempfile.mkdtemp(prefix="mempipe-judge-cost-"))
    try:
        sample = make_conversation(a.seed)
        corpus = workdir / "locomo_bench.json"
        corpus.write_text(json.dumps(sample, indent=1))
        n_sessions, n_turns, n_words = words_in(sample[0])
        print(f"conversation: {n_sessions} sessions, {n_turns} turns, {n_words} words ({corpus})", flush=True)
        runs = {"before": run_job(workdir / "before", "before", corpus, False, limits, a.timeout),
                "after": run_job(workdir / "after", "after", corpus, True, limits, a.timeout)}
        usage = {k: stage_usage(r["run_dir"], cached_input_billed=(k == "after")) for k, r in runs.items()}
        judged = {f"{stage}.{name}": {k: table_rows(r["run_dir"], stage, name) for k, r in runs.items()}
                  for stage, name in JUDGED_TABLES.items()}
        probes = {k: table_rows(r["run_dir"], "probes", "probes") for k, r in runs.items()}
        probe_sessions = probe_where(runs["after"]["run_dir"])
    finally:
        if a.keep:
            print(f"runs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    text, data = compare(usage["before"], usage["after"])
    tb, ta = total(usage["before"]), total(usage["after"])
    ratio = ta["cost_usd"] / tb["cost_usd"] if tb["cost_usd"] else None
    spent_b, spent_a = tb["cost_usd"] - tb["cached_cost_usd"], ta["cost_usd"] - ta["cached_cost_usd"]
    spent_ratio = spent_a / spent_b if spent_b else None
    judges_b = total({k: v for k, v in usage["before"].items() if k in JUDGES})
    judges_a = total({k: v for k, v in usage["after"].items() if k in JUDGES})
    # What-ifs from the tokens: after with no prompt cache reported (n alone: every prompt token at
    # input), and before with its reported cached tokens billed at cached_input too.
    after_no_cache = at_prices(ta, PRICE_IN)
    before_cache_billed = at_prices(tb, PRICE_CACHED)
    whatif = {"judges_cost_ratio": fmt_ratio(judges_a["cost_usd"], judges_b["cost_usd"], 4),
              "after_without_prompt_cache_usd": after_no_cache,
              "after_without_prompt_cache_ratio": after_no_cache / tb["cost_usd"] if tb["cost_usd"] else None,
              "before_with_cached_input_usd": before_cache_billed,
              "after_over_before_with_cached_input": ta["cost_usd"] / before_cache_billed if before_cache_billed else None}
    jm = usage["after"].get("judge_memory")
    jm_spr = per_request(jm) if jm else None
    same_rows = all(v["before"] == v["after"] and v["before"] is not None for v in judged.values())
    mismatched_cost = [f"{run}/{s}: manifest {u['cost_usd']:.6f} vs tokens {u['recomputed_cost_usd']:.6f}"
                       for run, stages in usage.items() for s, u in stages.items()
                       if abs(u["cost_usd"] - u["recomputed_cost_usd"]) > 1e-6 + 1e-4 * u["cost_usd"]]
    # The target is on the money paid: cost_usd also prices the calls the run's own LLM cache replays
    # (identical prompts of two methods), whose share moves with the order concurrent requests arrive.
    cost_ok = spent_ratio is not None and spent_ratio <= COST_TARGET
    spr_ok = jm_spr is not None and jm_spr >= SAMPLES_TARGET
    rows_table = table(["table", "rows before", "rows after", "same"],
                       [[t, fmt_n(v["before"]), fmt_n(v["after"]), "yes" if v["before"] == v["after"] else "NO"]
                        for t, v in [*judged.items(), ("probes.probes", probes)]])
    rows_table += f"\n\nprobes (session:turn, after; probes.from_session 5, max_per_episode 5): {', '.join(probe_sessions)}"
    body = (f"configs/creem_msc.yaml on one generated LoCoMo-layout conversation ({n_sessions} sessions, {n_turns} "
            f"turns, {n_words} words; seed {a.seed}), against the fake OpenAI server (serves `n`; reports cached "
            f"prompt tokens by OpenAI's rule), each run with its own server, artifacts and LLM cache. Prices per 1M "
            f"tokens: input {PRICE_IN}, output {PRICE_OUT}; after also cached input {PRICE_CACHED}. Before: "
            f"`llm.sample_with_n=false`, no cached_input price (every prompt token at input). After: the defaults. "
            f"Offline embedding (all-MiniLM-L6-v2, normalized, CREEM similarity cosine); rpm / tpm limits "
            f"{'kept' if limits else 'lifted'}. Wall s: before {runs['before']['wall_s']:.0f}, after "
            f"{runs['after']['wall_s']:.0f}.\n\n"
            "Samples (calls) = answered calls, one per sample; samples / request = fresh calls / chat requests "
            "sent; prompt tokens billed at full price = sent - cached where cached_input is priced, else all. "
            "Cost USD is the manifests' cost_usd, which counts calls replayed from the run's own LLM cache "
            "(identical prompts of two methods: creem_no_preblend builds creem's memory) at what they would "
            "cost; spent USD leaves those out (cost_usd - cached_cost_usd).\n\n"
            + text + "\n\n"
            + f"- money spent (fresh calls) after / before: {fmt_ratio(spent_a, spent_b, 4)} "
              f"(target <= {COST_TARGET}: {'met' if cost_ok else 'NOT MET'})\n"
            + f"- cost_usd (cache replays priced too) after / before: {fmt_ratio(ta['cost_usd'], tb['cost_usd'], 4)}\n"
            + f"- the judges alone (judge_*): {judges_b['cost_usd']:.4f} -> {judges_a['cost_usd']:.4f} USD, after / "
              f"before {whatif['judges_cost_ratio']}; the memory_* and respond_* stages are unchanged\n"
            + f"- what if the endpoint reported no prompt cache (`n` alone; every prompt token at input): after "
              f"{after_no_cache:.4f} USD, {fmt_ratio(after_no_cache, tb['cost_usd'], 4)} of before\n"
            + f"- what if before's reported cached prompt tokens were billed at cached_input too: before "
              f"{before_cache_billed:.4f} USD; after / that {fmt_ratio(ta['cost_usd'], before_cache_billed, 4)}\n"
            + f"- judge_memory samples per request after: {'-' if jm_spr is None else f'{jm_spr:.2f}'} "
              f"(target >= {SAMPLES_TARGET}: {'met' if spr_ok else 'NOT MET'})\n"
            + f"- same judged rows in both runs: {'yes' if same_rows else 'NO'}\n"
            + ("- cost in the manifests matches the tokens at these prices\n" if not mismatched_cost else
               "- manifest cost differs from the tokens at these prices: " + "; ".join(mismatched_cost) + "\n")
            + "\n" + rows_table + "\n")
    write_results("judge_cost", "CREEM's config on one LoCoMo conversation: cost before and after `n` sampling "
                  "and prompt-cache billing", body,
                  {"conversation": {"sessions": n_sessions, "turns": n_turns, "words": n_words, "seed": a.seed},
                   "prices": {"input": PRICE_IN, "cached_input": PRICE_CACHED, "output": PRICE_OUT},
                   "rate_limits": a.rate_limits, "runs": {k: {"wall_s": r["wall_s"], "server": r["server"]}
                                                          for k, r in runs.items()},
                   "stages": data, "cost_ratio": ratio, "spent_ratio": spent_ratio, "judge_memory_samples_per_request": jm_spr,
                   "judged_rows": judged, "probe_rows": probes, "probe_sessions": probe_sessions, "what_if": whatif, "same_rows": same_rows,
                   "cost_mismatches": mismatched_cost,
                   "targets_met": {"cost_ratio": cost_ok, "judge_memory_samples_per_request": spr_ok,
                                   "same_rows": same_rows}})
    return 0 if cost_ok and spr_ok and same_rows and not mismatched_cost else 1


if __name__ == "__main__":
    sys.exit(main())
