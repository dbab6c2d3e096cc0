"""Judges, reference metrics and the report end to end through the runner, on Ray, against the
fake OpenAI-compatible server."""

from __future__ import annotations

from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest

from pipeline.artifacts import StageDir
from stages.cli import main
from pipeline.engine.runner import Runner
from stages import registry
from stages.judging.pairwise import reference_shown_first

METHODS = ["secom", "turn", "full_history"]
# The judges as the papers run them, not as the default job sizes them.
SETS = ("corpus.limit=2", "compress.method=none", f"methods=[{','.join(METHODS)}]", "judge_memory.samples=2",
        "judge_memory.episodes=null", "judge_memory.max_speakers=null", "judge_pairwise.explain=true",
        "judge_pairwise.per_call=criterion", "judge_answers.correctness=[strict,lenient]")
JUDGES = {"judge_pairwise", "judge_answers", "judge_memory"}


class Tables(HTMLParser):
    """Rows of every <table>, by its class, from the report's HTML."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[tuple[str, list[list[str]]]] = []
        self.images: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "table":
            self.tables.append((a.get("class") or "", []))
        elif tag == "tr":
            self.tables[-1][1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.images.append(a["src"])

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][1][-1].append("".join(self._cell))
            self._cell = None


@pytest.mark.heavy(seconds=6)
def test_every_method_is_judged_scored_and_reported(run_cfg, fake_llm, capsys):
    cfg = run_cfg(*SETS)
    out = Runner(cfg, registry(cfg)).run()
    assert set(out.values()) == {"ran"}
    run = cfg.run_dir
    probes = StageDir(run, "probes").read_table("probes").to_pylist()
    next_response = [p for p in probes if p["kind"] == "next_response"]
    qa = [p for p in probes if p["kind"] == "qa" and p["gold"] is not None]
    assert next_response and qa

    # Head-to-head: the reference (first method) against each other method, every criterion, both orders.
    pairs = StageDir(run, "judge_pairwise").read_table("pairwise_judgments").to_pylist()
    assert {r["reference"] for r in pairs} == {"secom"} and {r["other"] for r in pairs} == {"turn", "full_history"}
    orders = Counter((r["probe_id"], r["episode_id"], r["other"], r["criterion"], r["reference_first"]) for r in pairs)
    assert len(orders) == len(next_response) * 2 * 3 * 2 and set(orders.values()) == {1}
    assert all(r["error"] is None and r["preferred"] in ("reference", "other", "tie") for r in pairs)
    assert len({r["prompt_fingerprint"] for r in pairs}) == 1

    answers = StageDir(run, "judge_answers").read_table("answer_judgments").to_pylist()
    assert Counter(r["judge"] for r in answers) == {j: len(qa) * len(METHODS) for j in ("gpt4score", "strict", "lenient")}
    assert all(0 <= r["score"] <= 100 for r in answers if r["judge"] == "gpt4score")
    assert all(r["score"] in (0.0, 1.0) for r in answers if r["judge"] != "gpt4score")

    # Memory quality: methods with a memory of their own, each speaker, 7 criteria, 2 samples.
    memory = StageDir(run, "judge_memory").read_table("memory_judgments").to_pylist()
    assert {r["method"] for r in memory} == {"secom", "turn"}
    assert len(memory) == 2 * 2 * 2 * 7 * 2 and all(1 <= r["score"] <= 5 for r in memory)

    metrics = StageDir(run, "response_metrics").read_table("response_metrics").to_pylist()
    assert len(metrics) == len([p for p in probes if p["gold"] is not None]) * len(METHODS)
    assert all(0 <= r["bleu1"] <= 1 and 0 <= r["rougeL"] <= 1 for r in metrics)

    report = StageDir(run, "report")
    # One row per dataset, probe kind and method; the run's two kinds pooled as `all` (one dataset: no pooled one).
    method_rows = report.read_table("method_summary").to_pylist()
    assert Counter((r["dataset"], r["kind"]) for r in method_rows) == {
        ("sample", k): len(METHODS) for k in ("next_response", "qa", "all")}
    methods = {r["method"]: r for r in method_rows if r["kind"] == "all"}
    assert set(methods) == set(METHODS)
    assert all(m["llm_calls"] >= m["probes"] and m["prompt_tokens"] > 0 for m in methods.values())
    for m in METHODS:
        by_kind = {r["kind"]: r for r in method_rows if r["method"] == m}
        assert by_kind["next_response"]["probes"] == len(next_response) and by_kind["qa"]["probes"] == len(
            [p for p in probes if p["kind"] == "qa"]) and by_kind["all"]["probes"] == len(probes)
        assert by_kind["qa"]["llm_calls"] is None and by_kind["qa"]["gpt4score"] is not None
        assert by_kind["next_response"]["gpt4score"] is None  # only questions are judged alone
    assert methods["full_history"]["memory_quality"] is None and methods["secom"]["memory_quality"] is not None
    summary = report.read_table("pairwise_summary").to_pylist()
    overall = [r for r in summary if r["session_idx"] is None]
    assert {(r["other"], r["criterion"]) for r in overall} == {(o, c) for o in ("turn", "full_history")
                                                              for c in ("specificity", "memorability", "consistency")}
    assert all(r["wins"] + r["ties"] + r["losses"] == r["pairs"] == len(next_response) for r in overall)
    assert all(r["episodes"] == len({p["episode_id"] for p in next_response}) for r in overall)

    html = (run / "report" / "report.html").read_text()
    parsed = Tables()
    parsed.feed(html)
    probe_table = next(rows for cls, rows in parsed.tables if cls == "probes")
    header, body = probe_table[0], probe_table[1:]
    assert len(body) == len(probes) * len(METHODS)
    assert {row[header.index("method")] for row in body} == set(METHODS)
    for img in parsed.images:
        assert (run / "report" / img).is_file(), img
    assert {"win_rates.png", "cost_quality.png", "memory_quality.png"} <= set(parsed.images)
    assert "judge = " in html and (run / "report" / "report.md").read_text().count("| secom |") >= 1
    board = next(rows for cls, rows in parsed.tables if cls == "leaderboard")
    # Several answer judges: the methods each one beats under every judge (robust_pairs), "-" for none.
    robust = board[0].index("beats, under every judge")
    assert all(" ep=" in cell for row in board[1:] for i, cell in enumerate(row) if i not in (0, robust)
               and cell and cell != "reference")
    assert all(row[robust] == "-" or set(row[robust].split(", ")) <= set(METHODS) for row in board[1:])

    # `mempipe report` says where it is.
    assert main(["report", "-c", str(Path(__file__).parents[1] / "configs" / "default.yaml"),
                 *[a for s in cfg_sets(cfg) for a in ("--set", s)]]) == 0
    assert str(run / "report" / "report.html") in capsys.readouterr().out


def cfg_sets(cfg) -> list[str]:
    return [f"artifacts_dir={cfg.artifacts_dir}", f"run_name={cfg.run_name}"]


def test_changing_only_the_judge_reruns_only_the_judges_and_the_report(run_cfg, fake_llm):
    cfg = run_cfg(*SETS, "judge_memory.enabled=false")
    Runner(cfg, registry(cfg)).run()
    moved = run_cfg(*SETS, "judge_memory.enabled=false", "roles.judge.model=another-judge")
    out = Runner(moved, registry(moved)).run()
    # A disabled judge is not in the run's graph at all; diagnose's written check calls the judge role too.
    assert {s for s, what in out.items() if what == "ran"} == (JUDGES - {"judge_memory"}) | {"diagnose", "report"}
    assert "judge_memory" not in out
    pairs = StageDir(moved.run_dir, "judge_pairwise").read_table("pairwise_judgments").to_pylist()
    assert {r["judge_model"] for r in pairs} == {"another-judge"}


def test_creem_protocol_takes_a_majority_of_n_samples_with_seeded_positions(run_cfg, fake_llm):
    cfg = run_cfg(*SETS, "judge_pairwise.protocol=creem", "judge_pairwise.samples=3", "judge_memory.enabled=false",
                  "judge_pairwise.temperature=1.0")
    Runner(cfg, registry(cfg)).run(until="judge_pairwise")
    pairs = StageDir(cfg.run_dir, "judge_pairwise").read_table("pairwise_judgments").to_pylist()
    assert {r["criterion"] for r in pairs} == {"consistency", "memorability"}
    assert {r["reference_first"] for r in pairs} == {True, False}  # CREEM: the position is drawn per sample (seeded)
    assert all(r["reference_first"] == reference_shown_first(0, r["episode_id"], r["probe_id"], r["other"],
                                                             r["criterion"], r["sample"]) for r in pairs)
    per_item = Counter((r["episode_id"], r["probe_id"], r["other"], r["criterion"]) for r in pairs)
    assert set(per_item.values()) == {3} and {r["sample"] for r in pairs} == {0, 1, 2}
    judged = [r["body"] for r in fake_llm.requests if "Two candidate next replies" in str(r["body"]["messages"])]
    assert judged and all("Earlier sessions" in b["messages"][1]["content"] for b in judged)
    assert {b["temperature"] for b in judged} == {1.0} and len({b["seed"] for b in judged}) == 3


def test_method_summary_has_a_row_per_dataset_and_probe_kind_and_labels_the_pooled_ones_all():
    """Hand-built frames: two datasets, three probe kinds. A probe no scored row names still finds
    its kind (the id's prefix) and dataset (its episode's other rows); cost sits on the whole-run row
    only, memory quality on the rows of every kind; words are whitespace words of answered responses."""
    import polars as pl

    from stages.report.tables import METHOD_SUMMARY, method_summary

    probes = [("msc-1", "nr:3:1", 10, "I  went  home"), ("msc-1", "nr:4:1", 20, "Yes"), ("msc-1", "qa:q1", 30, "Oslo"),
              ("cc-1", "tf:cc-1:tb0", 40, "No, Rome.")]
    responses = pl.DataFrame([{"episode_id": e, "probe_id": p, "method": m, "context_tokens": t, "context_turns": 1,
                               "response": None if (m, p) == ("m2", "qa:q1") else text,
                               "error": "timeout" if (m, p) == ("m2", "qa:q1") else None}
                              for m in ("m1", "m2") for e, p, t, text in probes])
    answers = pl.DataFrame([
        {"episode_id": "msc-1", "probe_id": "qa:q1", "dataset": "msc", "kind": "qa", "method": "m1", "judge": "strict",
         "score": 1.0}, {"episode_id": "msc-1", "probe_id": "qa:q1", "dataset": "msc", "kind": "qa", "method": "m2",
                         "judge": "strict", "score": None},
        *[{"episode_id": "cc-1", "probe_id": "tf:cc-1:tb0", "dataset": "cc", "kind": "teafarm", "method": m,
           "judge": "teafarm", "score": s} for m, s in (("m1", 1.0), ("m2", 0.0))]])
    metrics = pl.DataFrame([{"episode_id": "msc-1", "probe_id": "nr:3:1", "dataset": "msc", "kind": "next_response",
                             "method": m, "token_f1": f, "rougeL": r} for m, f, r in (("m1", 0.5, 0.4), ("m2", 0.1, 0.2))])
    memory = pl.DataFrame([{"episode_id": "msc-1", "dataset": "msc", "method": "m1", "score": s} for s in (4, 2)])
    usage = {"m1": {"calls": 9, "cached_calls": 1, "prompt_tokens": 100, "completion_tokens": 10, "cost_usd": 0.5,
                    "batch_calls": 0}, "m2": {"calls": 5}}
    out = method_summary(responses, usage, answers, metrics, memory)
    assert out.columns == METHOD_SUMMARY.names
    rows = {(r["dataset"], r["kind"], r["method"]): r for r in out.iter_rows(named=True)}
    assert len(rows) == out.height  # one row per dataset, kind and method
    scopes = {(d, k) for d, k, _ in rows}
    assert scopes == {("msc", "next_response"), ("msc", "qa"), ("msc", "all"), ("cc", "teafarm"), ("cc", "all"),
                      ("all", "next_response"), ("all", "qa"), ("all", "teafarm"), ("all", "all")}
    nr = rows[("msc", "next_response", "m1")]  # nr:4:1 is named by no scored row
    assert (nr["probes"], nr["episodes"], nr["mean_context_tokens"]) == (2, 1, 15.0)
    assert nr["mean_response_words"] == 2.0  # "I  went  home" is 3 words, not 5
    assert (nr["token_f1"], nr["rougeL"]) == (0.5, 0.4) and nr["strict_accuracy"] is None
    qa2 = rows[("msc", "qa", "m2")]
    assert (qa2["probes"], qa2["failed"], qa2["mean_response_words"], qa2["strict_accuracy"]) == (1, 1, None, None)
    assert rows[("msc", "qa", "m1")]["strict_accuracy"] == 1.0
    assert rows[("all", "teafarm", "m2")]["teafarm_correctness"] == 0.0 == rows[("cc", "teafarm", "m2")]["teafarm_correctness"]
    whole = rows[("all", "all", "m1")]
    assert (whole["probes"], whole["episodes"], whole["failed"], whole["mean_context_tokens"]) == (4, 2, 0, 25.0)
    assert (whole["llm_calls"], whole["cached_calls"], whole["prompt_tokens"], whole["cost_usd"]) == (9, 1, 100, 0.5)
    assert (whole["strict_accuracy"], whole["teafarm_correctness"], whole["token_f1"]) == (1.0, 1.0, 0.5)
    assert rows[("all", "all", "m2")]["llm_calls"] == 5 and rows[("all", "all", "m2")]["failed"] == 1
    # the stages' usage is the whole run's: no share of it is put on a dataset's or a kind's row
    assert all(r["llm_calls"] is None for (d, k, _), r in rows.items() if (d, k) != ("all", "all"))
    assert rows[("msc", "all", "m1")]["memory_quality"] == 3.0 == whole["memory_quality"]
    assert rows[("msc", "qa", "m1")]["memory_quality"] is None and rows[("cc", "all", "m1")]["memory_quality"] is None
    # the pooled rows come last
    assert [(r["dataset"], r["kind"]) for r in out.iter_rows(named=True)][-2:] == [("all", "all")] * 2


def test_a_run_of_one_dataset_and_one_kind_has_one_method_summary_row_per_method():
    """No `all` row when there is nothing to pool, so a sheet's `where: {method: ...}` names one row."""
    import polars as pl

    from stages.report.tables import method_summary

    responses = pl.DataFrame([{"episode_id": "locomo-1", "probe_id": f"qa:{i}", "method": m, "context_tokens": 5,
                               "context_turns": 2, "response": "a b", "error": None} for m in ("s", "t") for i in range(3)])
    answers = pl.DataFrame([{"episode_id": "locomo-1", "probe_id": f"qa:{i}", "dataset": "locomo", "kind": "qa",
                             "method": m, "judge": "gpt4score", "score": 50.0} for m in ("s", "t") for i in range(3)])
    out = method_summary(responses, {"s": {"calls": 3}, "t": {"calls": 4}}, answers, pl.DataFrame(), pl.DataFrame())
    assert out.select("dataset", "kind", "method", "probes", "llm_calls", "gpt4score").rows() == [
        ("locomo", "qa", "s", 3, 3, 50.0), ("locomo", "qa", "t", 3, 4, 50.0)]


def test_a_sheet_row_on_method_summary_that_names_no_dataset_or_kind_reads_the_whole_run_row():
    """The SeCom sheets look `# Turns` up by method alone: with the table split by dataset and kind,
    that is the whole-run row (`all`, or the run's only dataset and kind), never an ambiguous match."""
    from types import SimpleNamespace

    import polars as pl

    from pipeline.reproduction import PaperSheet
    from stages.report.tables import reproduction_summary

    table = pl.DataFrame({"dataset": ["locomo"] * 3, "kind": ["next_response", "qa", "all"],
                          "method": ["secom"] * 3, "probes": [4, 6, 10], "episodes": [2, 2, 2],
                          "mean_context_turns": [1.0, 3.0, 2.2]})
    sheet = PaperSheet.model_validate({"title": "T", "seed": "001", "reproduces": "Table 6", "results": [
        {"name": "turns", "paper": 56.49, "source": "Table 6", "table": "method_summary",
         "where": {"method": "secom"}, "column": "mean_context_turns"},
        {"name": "qa turns", "paper": 56.49, "source": "Table 6", "table": "method_summary",
         "where": {"method": "secom", "kind": "qa"}, "column": "mean_context_turns"}]})
    cfg = SimpleNamespace(judge_answers=SimpleNamespace(gpt4score_mode="memochat"),
                          judge_pairwise=SimpleNamespace(protocol="both_orders"))
    rows = reproduction_summary(cfg, [("secom.yaml", sheet)], {"method_summary": table}).filter(
        pl.col("kind") == "result")
    assert rows["run"].to_list() == [2.2, 3.0] and rows["episodes"].to_list() == [2, 2]
    assert rows["looked_up"].to_list() == ["method_summary.mean_context_turns where method=secom, dataset=locomo, kind=all",
                                           "method_summary.mean_context_turns where method=secom, kind=qa, dataset=locomo"]
