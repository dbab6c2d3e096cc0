"""The report's per-probe views: one row per (probe, method) for the tables, the probe browser's
records (every response, judgment and diagnosis of a probe) and the TeaBag questions."""

from __future__ import annotations

from typing import Any

import polars as pl

from stages.report import diagnosis


def probe_rows(probes: pl.DataFrame, responses: pl.DataFrame, answers: pl.DataFrame, metrics: pl.DataFrame,
               limit: int, chars: int, buckets: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per (probe, method): what was asked, the gold, the response, its scores and (`buckets`:
    the diagnose stage's rows, when the run has them) its bucket."""
    if responses.is_empty():
        return pl.DataFrame()
    keys = ["episode_id", "probe_id", "method"]
    out = responses.select([*keys, "response", "context_tokens", "error"]).join(
        probes.select(["episode_id", "probe_id", "kind", "request", "gold"]), on=["episode_id", "probe_id"], how="left")
    if not answers.is_empty():
        wide = answers.pivot(on="judge", index=keys, values="score", aggregate_function="first")
        out = out.join(wide, on=keys, how="left")
    if not metrics.is_empty():
        out = out.join(metrics.select([*keys, "token_f1", "rougeL"]), on=keys, how="left")
    if buckets is not None and not buckets.is_empty():
        out = out.join(buckets.select([*keys, "bucket"]), on=keys, how="left")
    cut = [pl.col(c).str.slice(0, chars) for c in ("request", "gold", "response") if c in out.columns]
    ordered = ["episode_id", "probe_id", "kind", "request", "gold", "method", "response"]
    out = out.with_columns(cut).sort(["episode_id", "probe_id", "method"])
    return out.select(ordered + [c for c in out.columns if c not in ordered]).head(limit)


def _cut(v: Any, chars: int) -> Any:
    return v[:chars] + "…" if isinstance(v, str) and len(v) > chars else v


def _answer_verdict(r: dict[str, Any]) -> str:
    """An answer judgment as the browser shows and filters it: "secom strict correct", "secom gpt4score 70"."""
    if r.get("error") or (r["score"] is None and not r.get("skipped")):
        return f"{r['method']} {r['judge']} failed"
    if r.get("skipped"):
        return f"{r['method']} {r['judge']} skipped"
    if r["judge"] == "gpt4score":
        return f"{r['method']} gpt4score {r['score']:.0f}"
    return f"{r['method']} {r['judge']} {'correct' if r['score'] >= 1 else 'incorrect'}"


def _pair_verdict(r: dict[str, Any]) -> str:
    if r.get("error") or r["preferred"] is None:
        return f"{r['reference']} vs {r['other']} failed"
    return {"reference": f"{r['reference']} beats {r['other']}", "other": f"{r['other']} beats {r['reference']}"}.get(
        r["preferred"], f"{r['reference']} ties {r['other']}")


def probe_browser_data(probes: pl.DataFrame, responses: pl.DataFrame, answers: pl.DataFrame,
                       pairwise: pl.DataFrame, limit: int, chars: int, context_turns: int = 6,
                       buckets: pl.DataFrame | None = None) -> list[dict[str, Any]]:
    """The probe browser's records, one per probe that has a response (the first `limit` by episode and
    probe): its context (last `context_turns` turns the probe carries), request, gold, each method's
    response with its memory ids, `details_json` excerpt and (`buckets`: the diagnose stage's rows) its
    bucket with the shares of evidence written and retrieved, and every answer and head-to-head judgment
    with its reason. `verdicts` lists the outcomes the browser filters on ("secom bucket misread" among
    them). Text is cut to `chars`."""
    if responses.is_empty() or probes.is_empty():
        return []
    keys = ["episode_id", "probe_id"]

    def by_probe(df: pl.DataFrame) -> dict[tuple[str, str], list[dict[str, Any]]]:
        out: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in df.iter_rows(named=True) if not df.is_empty() else ():
            out.setdefault((r["episode_id"], r["probe_id"]), []).append(r)
        return out

    answered, judged, paired = by_probe(responses), by_probe(answers), by_probe(pairwise)
    diagnosed = diagnosis.by_response(buckets if buckets is not None else pl.DataFrame())
    no_bucket = {"bucket": None, "evidence_written": None, "evidence_retrieved": None}
    datasets = {r["episode_id"]: r["dataset"] for rows in (*judged.values(), *paired.values()) for r in rows}
    records: list[dict[str, object]] = []
    for p in probes.sort(keys).iter_rows(named=True):
        key = (p["episode_id"], p["probe_id"])
        if key not in answered:
            continue
        if len(records) >= limit:
            break
        ans = [{"method": r["method"], "judge": r["judge"], "score": r["score"], "verdict": _answer_verdict(r),
                "reason": _cut(r.get("reason") or r.get("error") or r.get("skipped"), chars)}
               for r in sorted(judged.get(key, []), key=lambda r: (r["method"], r["judge"]))]
        pw = [{"reference": r["reference"], "other": r["other"], "criterion": r["criterion"],
               "first": r["reference"] if r["reference_first"] else r["other"], "sample": r["sample"],
               "preferred": r["preferred"] or "failed", "verdict": _pair_verdict(r),
               "reason": _cut(r.get("reason") or r.get("error"), chars)}
              for r in sorted(paired.get(key, []), key=lambda r: (r["other"], r["criterion"], not r["reference_first"]))]
        resp = [{"method": r["method"], "response": _cut(r["response"], chars), "error": _cut(r.get("error"), chars),
                 "memory_ids": (r.get("memory_ids") or [])[:20], "context_tokens": r.get("context_tokens"),
                 "details": _cut(r.get("details_json"), chars),
                 **diagnosed.get((*key, r["method"]), no_bucket)}
                for r in sorted(answered[key], key=lambda r: r["method"])]
        records.append({
            "episode_id": p["episode_id"], "probe_id": p["probe_id"], "dataset": datasets.get(p["episode_id"], ""),
            "session": p["session_idx"], "kind": p["kind"], "category": p.get("category"),
            "request": _cut(p["request"], chars), "gold": _cut(p.get("gold"), chars),
            "context": [[t["speaker"], _cut(t["text"], chars)] for t in (p.get("context") or [])[-context_turns:]],
            "responses": resp, "answers": ans, "pairwise": pw,
            "verdicts": sorted({a["verdict"] for a in ans if "gpt4score" not in a["verdict"]}
                               | {x["verdict"] for x in pw} | {f"{r['method']} failed" for r in resp if r["error"]}
                               | {f"{r['method']} bucket {r['bucket']}" for r in resp if r["bucket"]})})
    return records


def teabag_rows(questions: pl.DataFrame, limit: int, chars: int) -> pl.DataFrame:
    """The TeaBag questions of the run, one row each (failed ones with their reason)."""
    if questions.is_empty():
        return questions
    cols = ["question_id", "asker", "answerer", "question", "false_premise", "answer", "evidence_sessions",
            "checked", "attempts", "error"]
    cut = [pl.col(c).str.slice(0, chars) for c in ("question", "false_premise", "answer", "error")]
    return questions.select(cols).with_columns(cut).sort("question_id").head(limit)
