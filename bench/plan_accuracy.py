"""Benchmark: how close `mempipe plan`'s estimate comes to the calls and tokens of the real run.

(a) stub: every method of stages/methods on the first 2 episodes of the sample corpus, TeaFarm and
    the three judges on, against the fake server (`python -m pipeline.testing.fake_openai`, its own process). In
    order: `plan --json` with no calibration source, `plan --json --calibrate 1` (a real run of the
    first episode against the fake, into <run>-calibrate-1, sharing the LLM cache), then the real run.
(b) default job: configs/default.yaml (the embedded SmolLM2-135M through llama.cpp) scaled up to
    `--episodes` episodes of the sample corpus (2: corpus.limit=2), `plan --json` with no calibration
    source, `plan --json --calibrate K` (`--calibrate`, 1: a real run of the first episode), then the
    real run (whose first K episodes' calls the calibration run already cached).

(c) wall time of plan on a LoCoMo-sized corpus (10 generated conversations in locomo10.json's layout,
    19 sessions of 18-26 turns and 199 questions each, `judge_cost.make_conversation`'s text), offline
    (HF_HUB_OFFLINE=1, an empty HF_HOME: no model can load or download): `mempipe plan --json` on
    configs/secom_locomo.yaml and on configs/creem_msc.yaml (with the offline overrides its comments
    name), timed as a user runs it (a fresh process); its estimate against the same plan's dry run
    unbounded (every episode and probe: what plan did before it sampled by turns and probes).

For each stage with an LLM role, estimated against real (the manifests: calls + failed calls,
prompt and completion tokens over the roles), and the relative error (estimate - real) / real;
the target is |error| < 15% on the run's totals. Fresh artifacts and LLM caches in a temporary folder.

    python bench/plan_accuracy.py              # (a), (b) and (c): about 55 minutes on 2 cores
    python bench/plan_accuracy.py --part a     # the stub run only (about 5 minutes)
    python bench/plan_accuracy.py --part b     # the default job only (about 40 minutes)
    python bench/plan_accuracy.py --part c     # plan's wall time on full LoCoMo (about 9 minutes)
    python bench/plan_accuracy.py --keep       # keep the runs' folders (paths printed)

A plan's dry run runs no model: compression and local embeddings are simulated (pipeline/plan.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import EXIT_ROWS_FAILED, KEY_ENV, ROOT, FakeServer, mempipe_cmd, table, write_results

sys.path.insert(0, str(ROOT))
from stages.methods import METHODS  # noqa: E402

TARGET = 0.15
KEYS = ("calls", "prompt_tokens", "completion_tokens")
PLAN_WALL_TARGET_S = 30.0  # (c): secom_locomo.yaml on full LoCoMo
CREEM_OFFLINE = ["embedding.model=all-MiniLM-L6-v2", "embedding.normalize=true",
                 *(f"method.{m}.similarity=cosine" for m in ("creem", "creem_no_refine", "creem_no_preblend"))]


def mempipe_out(args: list[str], sets: list[str]) -> tuple[str, float]:
    """`mempipe ARGS` with the default config and `sets`: (stdout, wall seconds); raises on failure."""
    started = time.perf_counter()
    # RAY_AUTH_MODE set before Ray is imported: a local Ray's token auth, which the client side reads
    # only at import (setting it later leaves the driver without the token its GCS asks for).
    env = {"RAY_AUTH_MODE": "token", **os.environ, KEY_ENV: "sk-bench-not-a-secret"}
    proc = subprocess.run(mempipe_cmd(args, sets), cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode not in (0, EXIT_ROWS_FAILED):
        raise RuntimeError(f"mempipe {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout, time.perf_counter() - started


def real_usage(run_dir: Path) -> dict[str, dict[str, float]]:
    """Per stage with LLM usage: calls (answered + failed), prompt and completion tokens."""
    out: dict[str, dict[str, float]] = {}
    for path in sorted(run_dir.glob("*/_manifest.json")):
        m = json.loads(path.read_text())
        if not m.get("llm_usage"):
            continue
        u = list(m["llm_usage"].values())
        out[m["stage"]] = {"calls": sum(x["calls"] + x["failed_calls"] for x in u),
                           "prompt_tokens": sum(x["prompt_tokens"] for x in u),
                           "completion_tokens": sum(x["completion_tokens"] for x in u)}
    return out


def episode_facts(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Per episode: probes by kind, and TeaBag questions that failed (their `error` set): the work a
    model's answers decide, which a plan can only learn from its calibration episodes."""
    import pyarrow.dataset as ds

    out: dict[str, dict[str, Any]] = {}
    probes = run_dir / "probes" / "probes"
    if probes.is_dir():
        for r in ds.dataset(str(probes), format="parquet").to_table(columns=["episode_id", "kind"]).to_pylist():
            kinds = out.setdefault(r["episode_id"], {}).setdefault("probes", {})
            kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    questions = run_dir / "teabag" / "questions"
    if questions.is_dir():
        for r in ds.dataset(str(questions), format="parquet").to_table(columns=["episode_id", "error"]).to_pylist():
            e = out.setdefault(r["episode_id"], {})
            e["teabag_questions"] = e.get("teabag_questions", 0) + 1
            e["teabag_failed"] = e.get("teabag_failed", 0) + int(r["error"] is not None)
    return out


def estimated(plan: dict[str, Any]) -> dict[str, dict[str, float]]:
    return {s["name"]: {k: s[k] for k in KEYS} for s in plan["stages"] if s["runs"] and s["roles"]}


def err(est: float, real: float) -> float | None:
    if real == 0:
        return None if est == 0 else float("inf")
    return (est - real) / real


def fmt_err(e: float | None) -> str:
    if e is None:
        return "-"
    if e == float("inf"):
        return "inf"
    return f"{e * 100:+.1f}%"


def compare(plans: dict[str, dict[str, Any]], real: dict[str, dict[str, float]]) -> tuple[str, dict[str, Any]]:
    """Per stage and over the run: each plan's estimate, the real figures, the error."""
    ests = {name: estimated(p) for name, p in plans.items()}
    stages = [s for s in real if real[s]["calls"] or any(e.get(s, {}).get("calls") for e in ests.values())]
    stages += [s for e in ests.values() for s in e if s not in stages and e[s]["calls"]]
    header = ["stage", *(f"{k.replace('_tokens', '')} real" for k in KEYS)]
    for name in plans:
        header += [f"{k.replace('_tokens', '')} {name}" for k in KEYS]
    rows, data = [], {"stages": {}, "total": {}}
    totals = {"real": {k: 0.0 for k in KEYS}, **{n: {k: 0.0 for k in KEYS} for n in plans}}
    for s in stages:
        r = real.get(s, {k: 0.0 for k in KEYS})
        row = [s, *(f"{int(r[k]):,}" for k in KEYS)]
        entry: dict[str, Any] = {"real": r}
        for k in KEYS:
            totals["real"][k] += r[k]
        for name in plans:
            e = ests[name].get(s, {k: 0.0 for k in KEYS})
            entry[name] = {**e, "error": {k: err(e[k], r[k]) for k in KEYS}}
            row += [f"{int(e[k]):,} ({fmt_err(err(e[k], r[k]))})" for k in KEYS]
            for k in KEYS:
                totals[name][k] += e[k]
        rows.append(row)
        data["stages"][s] = entry
    total_row = ["**total**", *(f"{int(totals['real'][k]):,}" for k in KEYS)]
    for name in plans:
        total_row += [f"{int(totals[name][k]):,} ({fmt_err(err(totals[name][k], totals['real'][k]))})" for k in KEYS]
        data["total"][name] = {**totals[name], "error": {k: err(totals[name][k], totals["real"][k]) for k in KEYS}}
    data["total"]["real"] = totals["real"]
    rows.append(total_row)
    return table(header, rows), data


def verdicts(data: dict[str, Any], plans: list[str]) -> tuple[str, dict[str, dict[str, bool]]]:
    lines, met = [], {}
    for name in plans:
        errors = data["total"][name]["error"]
        met[name] = {k: errors[k] is not None and abs(errors[k]) < TARGET for k in KEYS}
        cells = ", ".join(f"{k} {fmt_err(errors[k])} ({'met' if met[name][k] else 'not met'})" for k in KEYS)
        lines.append(f"- {name}: {cells}")
    return "\n".join(lines), met


def part(label: str, sets: list[str], run_dir: Path, calibrate: int) -> dict[str, Any]:
    """plan (no source), plan --calibrate K, then the run; returns the comparison."""
    print(f"[{label}] plan, no calibration source ...", flush=True)
    out, t_plain = mempipe_out(["plan", "--json"], sets)
    plain = json.loads(out)
    print(f"[{label}] plan --calibrate {calibrate} ...", flush=True)
    out, t_cal = mempipe_out(["plan", "--json", "--calibrate", str(calibrate)], sets)
    calibrated = json.loads(out)
    print(f"[{label}] the real run ...", flush=True)
    _, t_run = mempipe_out(["run"], sets)
    real = real_usage(run_dir)
    plans = {"uncalibrated": plain, f"calibrated ({calibrate} episode{'s' if calibrate > 1 else ''})": calibrated}
    text, data = compare(plans, real)
    verdict, met = verdicts(data, list(plans))
    return {"table": text, "data": data, "verdict": verdict, "met": met,
            "wall_s": {"plan": round(t_plain, 1), "plan_calibrate": round(t_cal, 1), "run": round(t_run, 1)},
            "dry_run_s": {"uncalibrated": plain["method"].get("dry_run_s"),
                          "calibrated": calibrated["method"].get("dry_run_s")},
            "calibration_run": calibrated.get("calibration_run"), "method": calibrated["method"],
            "episodes": episode_facts(run_dir),
            "plain_total": plain["total"], "calibrated_total": calibrated["total"]}


def stub(workdir: Path) -> dict[str, Any]:
    with FakeServer() as server:
        methods = ",".join(METHODS)
        sets = ["run_name=stub", f"artifacts_dir={workdir / 'artifacts'}", "corpus.limit=2", "llm.provider=openai",
                f"llm.base_url={server.base_url}", "llm.model=gpt-4o-mini", f"llm.api_key_env={KEY_ENV}",
                f"llm.cache_dir={workdir / 'llm-cache-stub'}", f"methods=[{methods}]"]
        result = part("a: stub", sets, workdir / "artifacts" / "stub", 1)
        result["fake_requests"] = server.stats()["total"]
    return result


def default_job(workdir: Path, episodes: int, calibrate: int) -> dict[str, Any]:
    sets = ["run_name=default_scaled", f"artifacts_dir={workdir / 'artifacts'}", f"corpus.limit={episodes}",
            f"llm.cache_dir={workdir / 'llm-cache-default'}"]
    result = part("b: default job", sets, workdir / "artifacts" / "default_scaled", calibrate)
    result["episodes_run"], result["episodes_calibrated"] = episodes, calibrate
    return result


def locomo_corpus(path: Path, conversations: int = 10, questions: int = 199) -> dict[str, int]:
    """Full LoCoMo's size in its layout: `conversations` of judge_cost's generated conversations
    (19 sessions of 18-26 turns), each with `questions` questions, every fifth adversarial (category 5)."""
    import random

    from judge_cost import SPEAKERS, WORDS, make_conversation, sentence

    samples = []
    for c in range(conversations):
        sample = make_conversation(100 + c)[0]
        sample["sample_id"] = f"conv-{c + 1}"
        rng = random.Random(1000 + c)
        sessions = [v for k, v in sample["conversation"].items() if k.startswith("session_") and isinstance(v, list)]
        ids = [t["dia_id"] for turns in sessions for t in turns]
        qa = []
        for q in range(questions):
            item: dict[str, Any] = {"question": f"What did {SPEAKERS[q % 2]} say about the {rng.choice(WORDS)}?",
                                    "evidence": sorted(rng.sample(ids, 2)), "category": 1 + q % 5}
            item["adversarial_answer" if item["category"] == 5 else "answer"] = sentence(rng, 6)
            qa.append(item)
        sample["qa"] = qa
        samples.append(sample)
    path.write_text(json.dumps(samples))
    turns = sum(len(v) for x in samples for k, v in x["conversation"].items() if isinstance(v, list))
    return {"conversations": conversations, "turns": turns, "questions": conversations * questions}


def unbounded_plan(config: Path, sets: list[str]) -> tuple[dict[str, Any], float]:
    """The plan with its dry run unbounded (every episode and probe), in this process: (json, s)."""
    sys.path.insert(0, str(ROOT))
    from pipeline.config import resolve_paths
    from pipeline.plan import make_plan
    from stages import load_config, registry

    cfg = resolve_paths(load_config(config, sets))
    started = time.perf_counter()
    plan = make_plan(cfg, registry, write=False, max_turns=None, probe_cap=None)
    return plan.to_json(), time.perf_counter() - started


def locomo_plans(workdir: Path) -> dict[str, Any]:
    corpus = workdir / "locomo_full.json"
    size = locomo_corpus(corpus)
    hf_home = workdir / "hf-home-empty"
    hf_home.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(hf_home),
           "OPENAI_API_KEY": "sk-bench-not-a-secret"}
    jobs = {"secom_locomo": (ROOT / "configs" / "secom_locomo.yaml", []),
            "creem_msc": (ROOT / "configs" / "creem_msc.yaml", ["corpus.format=locomo", "corpus.limit=null",
                                                                 *CREEM_OFFLINE])}
    out: dict[str, Any] = {"corpus": size, "plans": {}}
    for name, (config, extra) in jobs.items():
        sets = [f"artifacts_dir={workdir / 'artifacts'}", f"corpus.path={corpus}", *extra]
        cmd = [sys.executable, "-m", "stages.cli", "plan", "--json", "-c", str(config)]
        for x in sets:
            cmd += ["--set", x]
        print(f"[c: {name}] plan on full LoCoMo, offline ...", flush=True)
        started = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            raise RuntimeError(f"plan {name} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        plan = json.loads(proc.stdout)
        models_in_cache = sorted(str(p.relative_to(hf_home)) for p in hf_home.rglob("*") if p.is_file())
        print(f"[c: {name}] the same plan, dry run unbounded (reference) ...", flush=True)
        ref, ref_s = unbounded_plan(config, sets)
        text, data = compare({"plan": plan}, estimated(ref))
        out["plans"][name] = {"wall_s": round(wall, 1), "dry_run_s": plan["method"].get("dry_run_s"),
                              "dry_run": plan["method"].get("dry_run"), "models": plan["method"].get("models"),
                              "unbounded_s": round(ref_s, 1), "hf_home_files": models_in_cache,
                              "table": text, "data": data, "total": plan["total"], "unbounded_total": ref["total"]}
    return out


def locomo_section(r: dict[str, Any]) -> str:
    c = r["corpus"]
    rows = []
    for name, p in r["plans"].items():
        e = p["data"]["total"]["plan"]["error"]
        target = f"< {PLAN_WALL_TARGET_S:.0f} s: {'met' if p['wall_s'] < PLAN_WALL_TARGET_S else 'not met'}" \
            if name == "secom_locomo" else "well under 60 s: " + ("met" if p["wall_s"] < 45 else "not met")
        rows.append([name, f"{p['wall_s']}", f"{p['dry_run_s']}", target, f"{p['unbounded_s']}",
                     *(fmt_err(e[k]) for k in ("calls", "prompt_tokens")), str(len(p["hf_home_files"]))])
    head = ["config", "wall s of plan", "of it dry run s", "target", "dry run unbounded s", "calls vs unbounded",
            "prompt vs unbounded", "files in HF_HOME after"]
    body = [f"## (c) wall time of plan on full LoCoMo ({c['conversations']} conversations, {c['turns']:,} turns, "
            f"{c['questions']:,} questions), offline, no model\n\n" + table(head, rows)]
    for name, p in r["plans"].items():
        body.append(f"\n### {name}: per stage, the plan against its dry run unbounded (every episode and probe)\n\n"
                    + p["table"].replace("real", "unbounded") + f"\n\ndry run: {p['dry_run']}\n\n"
                    f"no model run: {json.dumps(p['models'])}\n")
    return "\n".join(body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["a", "b", "c", "both", "all"], default="all", help="both: (a) and (b)")
    ap.add_argument("--keep", action="store_true", help="keep the runs' folders")
    ap.add_argument("--episodes", type=int, default=2, help="(b): episodes of the sample corpus in the run (default 2; 4 is all)")
    ap.add_argument("--calibrate", type=int, default=1, help="(b): episodes of the calibration run (default 1)")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="mempipe-plan-bench-"))
    results: dict[str, Any] = {}
    try:
        if args.part in ("c", "all"):  # first: its wall times want an idle machine
            results["locomo_plans"] = locomo_plans(workdir)
        if args.part in ("a", "both", "all"):
            results["stub"] = stub(workdir)
        if args.part in ("b", "both", "all"):
            results["default_job"] = default_job(workdir, args.episodes, args.calibrate)
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    previous = ROOT / "bench" / "results" / "plan_accuracy.json"
    parts = ("stub", "default_job", "locomo_plans")
    if args.part != "all" and previous.exists():  # some parts rerun: keep the others' figures
        kept = json.loads(previous.read_text())
        results = {k: kept[k] for k in parts if k in kept and k not in results
                   and ("table" in kept[k] or "plans" in kept[k])} | results
    results = {k: results[k] for k in parts if k in results}
    body = []
    names = {"stub": f"(a) stub run of every method ({len(METHODS)}) on 2 episodes of the sample corpus, fake server, calibrated on 1",
             "default_job": "(b) default job on {run} episodes (embedded SmolLM2-135M), calibrated on {cal}"}
    for key, r in results.items():
        if key == "locomo_plans":
            body.append(locomo_section(r))
            continue
        names[key] = names[key].format(run=r.get("episodes_run", 2), cal=r.get("episodes_calibrated", 1))
        cal = r.get("calibration_run") or {}
        body.append(f"## {names[key]}\n\nestimated (error against real) per stage; real = the run's manifests "
                    "(calls answered + failed)\n\n" + r["table"] + "\n\nTotals against the 15% target:\n" + r["verdict"]
                    + f"\n\nwall time of plan, s: plan {r['wall_s']['plan']} (dry run {r['dry_run_s']['uncalibrated']}), plan "
                    f"--calibrate {r['wall_s']['plan_calibrate']} (its calibration run: {cal.get('calls')} calls, "
                    f"{cal.get('fresh_calls')} fresh), the real run {r['wall_s']['run']}\n\n"
                    f"per episode of the real run (probes by kind; TeaBag questions, failed): "
                    f"{json.dumps(r.get('episodes', {}), sort_keys=True)}\n")
    write_results("plan_accuracy", "mempipe plan: estimate against the real run", "\n".join(body),
                  results)


if __name__ == "__main__":
    main()
