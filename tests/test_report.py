"""Judges, reference metrics and the report end to end through the runner, on Ray, against the
fake OpenAI-compatible server."""

from __future__ import annotations

from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

from pipeline.artifacts import StageDir
from stages.cli import main
from pipeline.runner import Runner
from stages import registry
from stages.judging.judge_pairwise import reference_shown_first

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
    methods = {r["method"]: r for r in report.read_table("method_summary").to_pylist()}
    assert set(methods) == set(METHODS)
    assert all(m["llm_calls"] >= m["probes"] and m["prompt_tokens"] > 0 for m in methods.values())
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
    assert all(" ep=" in cell for row in board[1:] for cell in row[1:] if cell and cell != "reference")

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
    assert {s for s, what in out.items() if what == "ran"} == JUDGES | {"report"}
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
