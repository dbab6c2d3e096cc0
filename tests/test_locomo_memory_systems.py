"""LoCoMo as the memory-systems community scores it (configs/locomo_memory_systems.yaml, the mem0
paper's protocol, arXiv:2504.19413 Tables 1-2) and LongMemEval_S against its paper's board
(configs/longmemeval.yaml): the configs load and plan, `mempipe check` lists no deviation, the
community J judge (`locomo_j`) is shown every element of its protocol and scores 1 / 0, LoCoMo's
category 5 is skipped, mem0's F1 and BLEU-1 (Table 1) are computed per LoCoMo question by mem0's scorer,
and every published number names a report table, row and column, shown beside ours (or as
`not produced` for the systems we do not run)."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pyarrow as pa
import pytest
from pipeline.testing.fake_chat import FakeChat
from sheets import CONFIGS, described, sheet_config

import stages
from pipeline.llm.types import LLMError
from pipeline.reproduction import deviations
from pipeline.engine.runner import Runner
from pipeline.engine.stage import StageContext
from stages.cli import main
from stages.judging import answers
from stages.judging.judge_answers import SKIP_UNANSWERABLE, JudgeAnswersStage
from stages.metrics import mem0_qa
from stages.report import reproduction_section
from stages.report.tables import SUMMARY_TABLES, answer_summary, metric_summary, reproduction_summary
from stages.scoring.response_metrics import COLUMN_SCORERS, RESPONSE_METRICS, score_rows

CONFIG = "locomo_memory_systems"
METHODS = ["mem0", "graphiti", "langmem", "a_mem", "mem0_style", "full_history", "turn", "secom", "theanine"]
# The systems of the mem0 paper's tables this config does not run: their rows stay `not produced`.
NOT_RUN = {"mem0_graph", "openai_memory"} | {
    f"rag_k{k}_chunk{c}" for k in (1, 2) for c in (128, 256, 512, 1024, 2048, 4096, 8192)} - {"rag_k2_chunk256"}
# mem0's table columns -> our name of the LoCoMo category each is (pipeline/corpus/locomo.py numbers them
# 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial).
MEM0_COLUMNS = {"Single Hop": "multi-hop", "Temporal": "temporal", "Multi-Hop": "open-domain",
                "Open Domain": "single-hop"}
# LoCoMo's questions per category (locomo10.json: 1,540 in categories 1-4, 446 adversarial).
COUNTS = {"multi-hop": 282, "temporal": 321, "open-domain": 96, "single-hop": 841}


def run(coro):
    return asyncio.run(coro)


def results(name: str = CONFIG):
    return sheet_config(name).paper.results


# --- the config --------------------------------------------------------------------------------

def test_the_config_loads_and_plans_every_method_it_names():
    cfg = sheet_config(CONFIG)
    assert cfg.methods == METHODS and cfg.corpus.format == "locomo" and cfg.corpus.path.endswith("data/locomo10.json")
    plan = [s.name for s in Runner(cfg, stages.registry(cfg)).plan]
    assert all(f"respond_{m}" in plan for m in METHODS) and "judge_answers" in plan and plan[-1] == "report"
    assert not cfg.judge_pairwise.enabled and not cfg.judge_memory.enabled  # J only
    text = (CONFIGS / f"{CONFIG}.yaml").read_text()
    assert "# Data: `mempipe data fetch locomo` (data/locomo10.json)." in text


def test_roles_models_and_the_judge_are_the_ones_mem0s_evaluation_ran():
    cfg = sheet_config(CONFIG)
    for role in ("generator", "memory", "judge"):
        assert (cfg.role(role).model, cfg.role(role).temperature) == ("gpt-4o-mini", 0.0), role
    assert cfg.role("judge").structured_mode == "json_object"  # llm_judge.py's response_format
    assert (cfg.embedding.provider, cfg.embedding.model) == ("openai", "text-embedding-3-small")
    ja = cfg.judge_answers
    assert ja.correctness == ["locomo_j"] and not ja.score_0_100 and ja.unanswerable == "skip"
    m0 = cfg.method.mem0_style
    assert (m0.extract_every, m0.recent_turns, m0.top_s, m0.top_k, m0.per_speaker, m0.answer_prompt) == \
        ("pair", 10, 10, 30, True, "mem0")
    assert cfg.method.full_history.token_budget is None  # the whole conversation
    assert (cfg.probes.qa, cfg.probes.next_response, cfg.probes.max_qa_per_episode) == (True, False, None)


def test_check_lists_no_deviation(capsys):
    path = CONFIGS / f"{CONFIG}.yaml"
    assert main(["check", "-c", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    settings = len(sheet_config(CONFIG).paper.protocol)
    # the sheet's line, wherever check prints it among its other sections
    assert any(line.endswith(f"(paper: block of {path}): matches the paper's protocol ({settings} settings)")
               for line in out)
    assert not [line for line in out if "differ" in line]
    assert deviations(sheet_config(CONFIG)) == []
    # mem0's F1 and BLEU-1 rows name mem0's scorer, 16 rows each: the 4 categories of the 4 systems the
    # run selects (check leaves out the sheet's rows of mem0_graph and openai_memory, which it does not)
    scored = {line.strip().split(" (")[0]: line for line in out if line.startswith("    metric_summary.")}
    assert set(scored) == {"metric_summary.mem0_f1", "metric_summary.mem0_bleu1"}
    for column, line in scored.items():
        assert f"{column} (16): {COLUMN_SCORERS[column.split('.')[1]]}" in line and "Mem0's scorer" in line
    assert "sentence_bleu" in scored["metric_summary.mem0_bleu1"] and "SETS" in scored["metric_summary.mem0_f1"]


def test_a_set_away_from_mem0s_protocol_is_exactly_that_deviation():
    devs = deviations(sheet_config(CONFIG, ["roles.judge.model=gpt-4o"]))
    assert [(d.path, d.paper, d.run) for d in devs] == [("roles.judge.model", "gpt-4o-mini", "gpt-4o")], described(devs)
    assert "llm_judge.py" in devs[0].source
    devs = deviations(sheet_config(CONFIG, ["judge_answers.unanswerable=not_mentioned"]))
    assert [d.path for d in devs] == ["judge_answers.unanswerable"] and "category 5" in devs[0].source


# --- the community J judge ---------------------------------------------------------------------

def test_the_judge_is_shown_question_gold_and_generated_answer_and_every_element_of_the_protocol():
    msgs = answers.build_locomo_j_messages("When did Ann move to Oslo?", "7 May 2023",
                                           "She moved the Sunday before her birthday, early in May 2023.")
    system, user = msgs[0]["content"], msgs[1]["content"]
    assert user.startswith("Question: When did Ann move to Oslo?\nGold answer: 7 May 2023\n"
                           "Generated answer: She moved the Sunday before her birthday, early in May 2023.\n")
    assert "CORRECT or WRONG" in system and "one person asks another" in system and "earlier conversations" in system
    assert "gold answer, the ground truth" in system and "usually brief" in system  # what a gold answer looks like
    assert "Grade generously" in system and "much longer" in system and "about the same thing" in system
    assert "about time" in system and "relative to the conversation" in system and "same date or period" in system
    assert "another format" in system  # "3 June" or "June 3rd"
    # a one-sentence reason first, then exactly one label, never both; the reply's reason comes first too
    assert system.index("reasoning in one short sentence") < system.index("then the label") < system.index("never both")
    assert user.index('"reason"') < user.index('"label"') and '"CORRECT" | "WRONG"' in user
    # the elements in our words: none of the reference prompt's sentences or its example
    flagged = ["touches on the same topic", "be generous with your grading", "do not include both",
               "break the evaluation script", "shell necklace", "hawaii", "time period as the gold answer"]
    assert not [f for f in flagged if f in system.lower() or f in user.lower()]
    assert answers.PROMPTS["system.locomo_j"] == system  # in the stage's prompt fingerprint


def test_the_judges_label_scores_one_for_correct_and_zero_otherwise():
    assert answers.locomo_j_score("CORRECT") == 1.0
    assert answers.locomo_j_score("WRONG") == answers.locomo_j_score("correct") == 0.0  # llm_judge.py: == "CORRECT"
    llm = FakeChat([{"reason": "Same month and year.", "label": "CORRECT"}, {"reason": "Another city.", "label": "WRONG"}])
    score, reason, _model = run(answers.judge_locomo_j(llm, "Q?", "Oslo", "Oslo, in May"))
    assert (score, reason) == (1.0, "Same month and year.")
    assert run(answers.judge_locomo_j(llm, "Q?", "Oslo", "Bergen"))[0] == 0.0
    assert llm.calls[0]["schema"] is answers.LocomoVerdict
    bad = FakeChat([{"reason": "?", "label": "MAYBE"}, {"reason": "?", "label": "BOTH"}])
    with pytest.raises(LLMError):  # neither label: re-asked, then a failed row (never a silent 0)
        run(answers.judge_locomo_j(bad, "Q?", "Oslo", "Oslo"))


TURNS = [{"session_idx": 1, "turn_idx": i, "speaker": "Ann" if i % 2 == 0 else "Bo", "text": f"t{i}",
          "session_time": None, "source_turn_id": f"D1:{i + 1}"} for i in range(4)]
CATEGORIES = ["multi-hop", "temporal", "open-domain", "single-hop", "adversarial"]


def _probes() -> list[dict]:
    return [{"probe_id": f"qa:q{i}", "kind": "qa", "category": c, "session_idx": 2, "turn_idx": None,
             "qa_id": f"q{i}", "request": f"Question {i}?", "gold": None if c == "adversarial" else f"gold {i}",
             "evidence": ["D1:1"]} for i, c in enumerate(CATEGORIES)]


def _judged(methods: list[str], verdicts) -> tuple[list[dict], FakeChat]:
    """judge_answers under the config's own settings over one episode of the five categories."""
    cfg = sheet_config(CONFIG)
    probes = _probes()
    inputs = {"ingest.episodes": [{"episode_id": "locomo-conv-1", "dataset": "locomo"}], "ingest.turns": TURNS,
              "ingest.qa": [{"qa_id": p["qa_id"], "question": p["request"]} for p in probes], "probes.probes": probes}
    for m in methods:
        inputs[f"respond_{m}.responses"] = [{"probe_id": p["probe_id"], "response": f"{m} answer", "error": None,
                                             "details_json": json.dumps({})} for p in probes]
    stage = JudgeAnswersStage(tuple(methods))
    llm = FakeChat(responder=verdicts)
    llm.cfg = SimpleNamespace(model="gpt-4o-mini")  # type: ignore[attr-defined]
    ctx = StageContext(cfg=SimpleNamespace(judge_answers=cfg.judge_answers, corpus=cfg.corpus),  # type: ignore[arg-type]
                       stage=stage, out_dir=None,
                       clients={"judge": llm})
    rows = run(stage.process_episode(ctx, "locomo-conv-1", inputs))["answer_judgments"]
    return rows, llm


def test_category_5_is_skipped_and_categories_1_to_4_are_judged_by_locomo_j_only():
    rows, llm = _judged(["mem0_style"], lambda messages, schema: {"reason": "ok", "label": "CORRECT"})
    runs = sheet_config(CONFIG).judge_answers.runs
    assert runs == 10  # the paper's 10 judge runs
    assert {r["judge"] for r in rows} == {"locomo_j"} and len(rows) == 5 * runs
    assert sorted(r["run"] for r in rows if r["category"] == "temporal") == list(range(runs))
    by_cat = {r["category"]: r for r in rows if r["run"] == 0}
    assert by_cat["adversarial"]["skipped"] == SKIP_UNANSWERABLE and by_cat["adversarial"]["score"] is None
    assert all(by_cat[c]["score"] == 1.0 and by_cat[c]["reference_source"] == "gold" for c in COUNTS)
    assert len(llm.calls) == 4 * runs  # the adversarial question costs no call
    shown = [c["messages"][1]["content"] for c in llm.calls[::runs]]
    assert all(s.startswith(f"Question: Question {i}?\nGold answer: gold {i}\n") for i, s in enumerate(shown))
    summary = answer_summary(pl.DataFrame(rows))
    overall = summary.filter((pl.col("dataset") == "locomo") & pl.col("category").is_null()).row(0, named=True)
    assert (overall["items"], overall["skipped"], overall["judged"], overall["score"]) == (5, 1, 4, 1.0)
    assert (overall["runs"], overall["run_sd"]) == (runs, 0.0)


def test_j_is_the_mean_of_the_judge_runs_with_their_spread():
    """Question i is judged CORRECT by its first 3 + 2i runs of 10: J = the mean over items of each item's
    share of CORRECT runs (= the mean of the 10 runs' own J), run_sd the s.d. of those 10 run scores."""
    seen: dict[str, int] = {}

    def verdict(messages, schema):
        question = messages[1]["content"].splitlines()[0]
        seen[question] = seen.get(question, 0) + 1
        i = int(question.split()[-1].rstrip("?"))
        return {"reason": "r", "label": "CORRECT" if seen[question] <= 3 + 2 * i else "WRONG"}

    rows, _ = _judged(["mem0_style"], verdict)
    judged = [r for r in rows if r["skipped"] is None]
    by_run = [sum(r["score"] for r in judged if r["run"] == k) / 4 for k in range(10)]
    summary = answer_summary(pl.DataFrame(rows))
    overall = summary.filter((pl.col("dataset") == "locomo") & pl.col("category").is_null()).row(0, named=True)
    assert overall["score"] == pytest.approx(sum((3 + 2 * i) / 10 for i in range(4)) / 4)
    assert overall["score"] == pytest.approx(sum(by_run) / 10)
    mean = sum(by_run) / 10
    assert overall["run_sd"] == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in by_run) / 9))
    assert (overall["items"], overall["judged"], overall["correct"]) == (5, 4, None)  # items, not rows
    assert overall["iid_low"] < overall["score"] < overall["iid_high"]
    temporal = summary.filter(pl.col("category") == "temporal").row(0, named=True)
    i = next(i for i, c in enumerate(COUNTS) if c == "temporal")
    assert temporal["score"] == pytest.approx((3 + 2 * i) / 10) and temporal["run_sd"] > 0


def test_an_item_is_averaged_over_its_runs_with_a_verdict_and_failed_only_when_every_run_failed():
    down = LLMError("judge down")
    rows, _ = _judged(["mem0_style"], lambda messages, schema: down if "Question 0?" in messages[1]["content"]
                      else {"reason": "r", "label": "CORRECT"})
    q0 = [r for r in rows if r["probe_id"] == "qa:q0"]
    assert len(q0) == 10 and all(r["error"] and r["score"] is None for r in q0)  # every run of q0 failed
    for r in rows:  # q1: runs 0-3 WRONG, run 4 failed, runs 5-9 CORRECT: its value is 5 / 9
        if r["probe_id"] == "qa:q1" and r["run"] < 4:
            r["score"] = 0.0
        if r["probe_id"] == "qa:q1" and r["run"] == 4:
            r.update(score=None, error="judge down")
    summary = answer_summary(pl.DataFrame(rows))
    overall = summary.filter((pl.col("dataset") == "locomo") & pl.col("category").is_null()).row(0, named=True)
    assert (overall["items"], overall["skipped"], overall["failed"], overall["judged"]) == (5, 1, 1, 3)
    assert overall["score"] == pytest.approx((5 / 9 + 1 + 1) / 3)
    q1 = summary.filter(pl.col("category") == CATEGORIES[1]).row(0, named=True)
    assert q1["score"] == pytest.approx(5 / 9) and q1["judged"] == 1


# --- the sheet -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [CONFIG, "longmemeval"])
def test_every_published_number_names_a_report_table_row_and_column_once(name):
    cfg = sheet_config(name)
    seen = set()
    for r in cfg.paper.results:
        assert r.table in SUMMARY_TABLES, f"{r.name}: no report table {r.table!r}"
        columns = set(SUMMARY_TABLES[r.table].names)
        assert r.column in columns and set(r.where) <= columns, r.name
        assert r.scale > 0 and r.source.strip()
        key = (r.table, tuple(sorted(r.where.items(), key=lambda kv: kv[0])), r.column)
        assert key not in seen, f"{name}: two paper numbers for {key}"
        seen.add(key)
        method = r.where.get("method")
        assert method in cfg.methods or method in NOT_RUN or method == "full_history_con", f"{r.name}: {method}"


def test_the_locomo_rows_are_j_per_category_and_overall_with_their_table():
    for r in results():
        if r.table == "method_summary":
            assert r.source.startswith("Table 2") and r.column == "mean_context_tokens"
            continue
        if r.table == "metric_summary":  # Table 1's F1 / B1: per category only, by mem0's scorer
            assert r.column == {"F1": "mem0_f1", "BLEU-1": "mem0_bleu1"}[r.name.rsplit(", ", 1)[1]] and r.scale == 100
            assert r.where == {"dataset": "locomo", "kind": "qa", "category": r.where["category"],
                               "session_idx": None, "method": r.where["method"]}
            assert r.where["category"] in COUNTS and r.source.startswith("Table 1")
            column = next(c for c in MEM0_COLUMNS if f", {c} (" in r.name)
            assert MEM0_COLUMNS[column] == r.where["category"] and f"our `{r.where['category']}`" in r.source
            continue
        assert r.table == "answer_summary" and r.column == "score" and r.scale == 100
        assert r.where["judge"] == "locomo_j" and r.where["dataset"] == "locomo"
        assert r.where["category"] in (None, *COUNTS)  # never the adversarial category
        assert r.source.startswith("Table 1" if r.where["category"] else "Table 2")
        if r.where["category"]:  # the row names the column as mem0 prints it and the category as LoCoMo numbers it
            column = next(c for c in MEM0_COLUMNS if f", {c} (" in r.name)
            assert MEM0_COLUMNS[column] == r.where["category"] and f"our `{r.where['category']}`" in r.source


def test_the_sheet_quotes_the_papers_headline_numbers():
    def number(row):
        return next(r.paper for r in results() if r.name == row)

    assert number("Mem0, Single Hop (LoCoMo category 1), F1") == 38.72
    assert number("Mem0, Single Hop (LoCoMo category 1), BLEU-1") == 27.13
    assert number("Mem0g, Temporal (LoCoMo category 2), F1") == 51.55  # Sec. 4.1's highest temporal F1
    assert number("Zep, Open Domain (LoCoMo category 4), F1") == 49.56
    assert number("A-Mem*, Multi-Hop (LoCoMo category 3), BLEU-1") == 8.81

    assert number("Mem0, overall J") == 66.88 and number("Mem0g, overall J") == 68.44
    assert number("Full-context, overall J") == 72.90 and number("Zep, overall J") == 65.99
    assert number("Mem0, Single Hop (LoCoMo category 1), J") == 67.13
    assert number("OpenAI, Temporal (LoCoMo category 2), J") == 21.71
    assert number("RAG k=2, 256-token chunks (stand-in: turn, dense, 512-token budget), overall J") == 60.97
    assert number("Mem0, memory tokens") == 1764


def test_table_1s_categories_weighted_by_locomos_counts_give_table_2s_overall_j():
    """Why mem0's Single Hop is LoCoMo category 1 (and so on): with this mapping Table 1's per-category J,
    weighted by the questions per category, is Table 2's overall J for every system that has both."""
    rows = [r for r in results() if r.table == "answer_summary"]
    systems = {r.name.split(",")[0] for r in rows if r.where.get("category")}
    assert systems == {"Mem0", "Mem0g", "Zep", "LangMem", "OpenAI", "A-Mem*"}
    for system in systems:
        per = {r.where["category"]: r.paper for r in rows if r.name.startswith(system + ",") and r.where.get("category")}
        overall = next(r.paper for r in rows if r.name == f"{system.rstrip('*')}, overall J")
        weighted = sum(COUNTS[c] * j for c, j in per.items()) / sum(COUNTS.values())
        assert weighted == pytest.approx(overall, abs=0.006), system


def test_the_report_shows_the_published_rows_beside_ours_and_the_systems_we_do_not_run_as_not_produced():
    rows, _ = _judged(["mem0", "full_history"], lambda messages, schema: {
        "reason": "r", "label": "CORRECT" if "mem0 answer" in messages[1]["content"] else "WRONG"})
    cfg = sheet_config(CONFIG)
    summary = reproduction_summary(cfg, [("configs/locomo_memory_systems.yaml", cfg.paper)],
                                   {"answer_summary": answer_summary(pl.DataFrame(rows), reference="mem0")})
    got = {r["name"]: r for r in summary.filter(pl.col("kind") == "result").iter_rows(named=True)}
    assert len(got) == len(cfg.paper.results)
    mem0 = got["Mem0, overall J"]
    assert mem0["produced"] and mem0["run"] == pytest.approx(100.0) and mem0["n"] == 4 and mem0["episodes"] == 1
    assert got["Mem0, Single Hop (LoCoMo category 1), J"]["run"] == pytest.approx(100.0)
    assert got["Full-context, overall J"]["run"] == pytest.approx(0.0)
    assert not got["Zep, overall J"]["produced"] and not got["Mem0g, Temporal (LoCoMo category 2), J"]["produced"]
    assert not got["Mem0, memory tokens"]["produced"]  # no method_summary in this toy report
    assert summary.filter(pl.col("kind") == "deviation").is_empty()
    section = reproduction_section(summary, [])
    (caption, shown), _ = section.tables
    assert caption.startswith("Mem0: Building Production-Ready AI Agents")
    runs = dict(zip(shown["result"], shown["run"]))
    assert runs["Zep, overall J"] == "not produced" and runs["Mem0, overall J"].startswith("100")


# --- mem0's F1 and BLEU-1 (Table 1) ---------------------------------------------------------------

def test_mem0s_f1_is_over_token_sets_with_only_four_punctuation_marks_split_off():
    # {the, cat, sat} vs {cat, sat, on, the, mat}: 3 shared, P = 3/3, R = 3/5, F1 = 2 * 0.6 / 1.6
    assert mem0_qa.f1("the cat sat.", "cat sat on the mat") == pytest.approx(0.75)
    assert mem0_qa.simple_tokens("Paris, France! Really?") == ["paris", "france", "really"]
    # sets: a repeated word counts once (SQuAD's multiset F1 would give 2 * 2/3 * 1 / (5/3) = 0.8)
    assert mem0_qa.f1("the the cat", "the cat") == 1.0
    # no article or other punctuation removed: ';' stays on its word, "a" is a token
    assert mem0_qa.f1("Paris;", "paris") == 0.0 and mem0_qa.f1("a dog", "dog") == pytest.approx(2 / 3)
    assert mem0_qa.f1("", "paris") == mem0_qa.f1("...", "paris") == mem0_qa.f1("rome", "paris") == 0.0


def test_mem0s_bleu1_is_nltks_smoothed_sentence_bleu_of_word_tokenize_tokens():
    # hypothesis the cat sat . (4, word_tokenize splits the final period), reference cat sat on the mat
    # (5): clipped unigram precision 3/4, brevity penalty exp(1 - 5/4)
    assert mem0_qa.bleu1("The cat sat.", "cat sat on the mat") == pytest.approx(0.75 * math.exp(-0.25))
    # the cat sat on the cat . (7) vs the cat sat on a mat (6): "the" and "cat" clipped to 1 each, so
    # 4/7; longer than the reference, no penalty
    assert mem0_qa.bleu1("The cat sat on the cat.", "the cat sat on a mat") == pytest.approx(4 / 7)
    # lowercased first; method1 smoothing does not lift a BLEU-1 without a shared token, nor an empty answer
    assert mem0_qa.bleu1("PARIS", "paris") == 1.0
    assert mem0_qa.bleu1("rome", "paris") == mem0_qa.bleu1("", "paris") == 0.0


def _scored_locomo(answers: dict[str, str | None], episode: str = "e1") -> list[dict]:
    return [{"episode_id": episode, "dataset": "locomo", "probe_id": f"qa:{c}", "kind": "qa", "category": c,
             "method": "mem0", "session_idx": 20, "response": answers[c],
             "gold": None if c == "adversarial" else "7 May 2023"} for c in CATEGORIES]


def test_mem0s_scores_are_computed_per_locomo_question_of_categories_1_to_4_only():
    answers = {"multi-hop": "On 7 May 2023.", "temporal": "May 2023", "open-domain": None,
               "single-hop": "7 may, 2023", "adversarial": "Not mentioned."}
    rows = {r["category"]: r for r in score_rows(_scored_locomo(answers))}
    for c in ("multi-hop", "temporal", "single-hop"):
        assert rows[c]["mem0_f1"] == mem0_qa.f1(answers[c], "7 May 2023")
        assert rows[c]["mem0_bleu1"] == mem0_qa.bleu1(answers[c], "7 May 2023")
    assert rows["single-hop"]["mem0_f1"] == 1.0 and rows["temporal"]["mem0_f1"] == pytest.approx(0.8)
    failed = rows["open-domain"]
    assert failed["failed"] and failed["mem0_f1"] == failed["mem0_bleu1"] == 0.0  # as an empty answer
    # category 5 is not scored (evals.py skips it): no value, so no weight in any mean
    assert rows["adversarial"]["mem0_f1"] is None and rows["adversarial"]["mem0_bleu1"] is None
    # not a LoCoMo question: not scored
    other = score_rows([{**_scored_locomo(answers)[0], "dataset": "msc", "kind": "next_response", "category": None}])
    assert other[0]["mem0_f1"] is None and other[0]["mem0_bleu1"] is None


def test_metric_summary_carries_mem0s_means_per_category_and_overall_and_the_sheet_reads_them():
    exact = {c: "7 May 2023" for c in CATEGORIES}
    half = {**exact, "multi-hop": "June 2023", "single-hop": "Rome"}  # multi-hop F1 2 * 1/2 * 1/3 / (5/6) = 0.4
    rows = score_rows(_scored_locomo(exact, "e1") + _scored_locomo(half, "e2"))
    summary = metric_summary(pl.from_arrow(pa.Table.from_pylist(rows, schema=RESPONSE_METRICS)))
    got = {r["category"]: r for r in summary.iter_rows(named=True)}
    assert got["multi-hop"]["mem0_f1"] == pytest.approx((1.0 + 0.4) / 2)
    assert got["single-hop"]["mem0_f1"] == pytest.approx(0.5) and got["adversarial"]["mem0_f1"] is None
    # overall: the plain mean over every question of categories 1-4 (generate_scores.py), 8 here
    assert got[None]["mem0_f1"] == pytest.approx((4 * 1.0 + 0.4 + 0.0 + 1.0 + 1.0) / 8)
    for c in (None, "multi-hop"):  # two episodes: a cluster interval and an independent-bootstrap one
        for m in ("mem0_f1", "mem0_bleu1"):
            assert got[c][f"{m}_low"] <= got[c][m] <= got[c][f"{m}_high"]
            assert got[c][f"{m}_iid_low"] <= got[c][m] <= got[c][f"{m}_iid_high"]
    cfg = sheet_config(CONFIG)
    shown = reproduction_summary(cfg, [("configs/locomo_memory_systems.yaml", cfg.paper)],
                                 {"metric_summary": summary})
    by_name = {r["name"]: r for r in shown.filter(pl.col("kind") == "result").iter_rows(named=True)}
    f1 = by_name["Mem0, Single Hop (LoCoMo category 1), F1"]
    assert f1["produced"] and f1["run"] == pytest.approx(70.0) and (f1["n"], f1["episodes"]) == (2, 2)
    assert f1["scorer"] == COLUMN_SCORERS["mem0_f1"]
    assert by_name["Mem0, Temporal (LoCoMo category 2), BLEU-1"]["run"] == pytest.approx(100.0)
    assert not by_name["Zep, Temporal (LoCoMo category 2), F1"]["produced"]


# --- LongMemEval_S against its paper ---------------------------------------------------------------

def test_longmemeval_checks_against_its_paper_with_only_the_release_differing_and_quotes_figure_3b(capsys):
    path = CONFIGS / "longmemeval.yaml"
    assert main(["check", "-c", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    head = next(line for line in out if line.startswith("LongMemEval: Benchmarking Chat Assistants"))
    cfg = sheet_config("longmemeval")
    assert f"1 of {len(cfg.paper.protocol)} settings differ" in head
    # Figure 3b was measured on the 2024 file; the config reads the 2025 cleaned release (F4)
    assert cfg.paper.seed == "arXiv:2410.10813"
    assert [(d.path, d.paper, d.run) for d in deviations(cfg)] == [
        ("corpus.path", "data/longmemeval_s.json", "data/longmemeval_s_cleaned.json")]
    assert "2024" in deviations(cfg)[0].source and "cleaned" in deviations(cfg)[0].source
    assert deviations(sheet_config("longmemeval", ["corpus.path=data/longmemeval_s.json"])) == []
    papers = {r.where["method"]: (r.paper, r.source) for r in cfg.paper.results}
    assert papers["full_history"][0] == 0.606 and papers["full_history_con"][0] == 0.640
    assert all(src.startswith("Figure 3b") for _, src in papers.values())
    assert all(r.where["judge"] == "longmemeval" and r.where["category"] is None and r.scale == 1.0
               for r in cfg.paper.results)
    # a Chain-of-Note run of full history is a deviation from the sheet's (no-CoN) protocol
    devs = deviations(sheet_config("longmemeval", ["method.full_history.qa_prompt=longmemeval_con",
                                                   "corpus.path=data/longmemeval_s.json"]))
    assert [(d.path, d.run) for d in devs] == [("method.full_history.qa_prompt", "longmemeval_con")]
