"""SeCom re-audit, round 3 (shared/audits/round3/secom.md N1-N12): dates the same in the answer
prompt and the judge, the temporal category on its own, SeCom's official pre-scoring strips, LoCoMo
without photo captions, retrieved units in time order (rank order as an option), Table 6's # Turns
count, context means over the questions the scores average, MemoChat's first [[rating]], and the
sheets stating each choice."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pyarrow as pa
import pytest
from pipeline.testing.fake_chat import FakeChat

import stages
from pipeline.corpus import load_corpus
from pipeline.reproduction import deviations
from stages.judging import answers
from stages.judging.judge_answers import judge_call
from stages.methods.base import MethodContext, ProbeInput
from stages.methods.baselines.history import FullHistory, FullHistorySettings
from stages.methods.secom.retrieval import RetrievalSettings
from stages.methods.shared import response
from stages.report.answers import answer_summary
from stages.report.tables import method_summary
from stages.scoring import response_metrics as rm

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
LOCOMO_MINI = Path(__file__).resolve().parent / "fixtures" / "corpora" / "locomo" / "locomo_mini.json"
QA_CONFIGS = ["secom_locomo", "secom_longmtbench"]


def config(name: str, overrides: list[str] | None = None):
    return stages.load_config(CONFIGS / f"{name}.yaml", overrides)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


WHEN = datetime(2023, 5, 8, 13, 56)
TURNS = [{"episode_id": "e", "session_idx": 1, "turn_idx": i, "speaker": who, "text": f"{who} line {i}",
          "session_time": WHEN, "source_turn_id": f"D1:{i + 1}"} for i, who in enumerate(["A", "B", "A", "B", "A"])]


def qa_probe(history: dict | None = None, dataset: str = "locomo") -> ProbeInput:
    return ProbeInput(probe={"probe_id": "qa:q0", "kind": "qa", "category": "temporal", "request": "When did A go?",
                             "session_idx": 9, "respondent": "B"},
                      episode={"dataset": dataset, "speakers": ["A", "B"]}, history=history or {}, current=[])


# ------------------------------------------------------------------------------ N1: dates, temporal

def test_the_locomo_judge_sees_no_date_the_secom_chat_answer_prompt_did_not_show():
    cfg = config("secom_locomo")
    assert cfg.judge_answers.memochat_dates is False and cfg.method.secom.qa_prompt == "secom_chat"
    unit = {"unit_id": "segment:1:0", "session_idx": 1, "session_time": WHEN, "turn_start": 0, "turn_end": 1,
            "text": "A: line 0\nB: line 1"}
    llm = FakeChat(["May."])
    run(response.generate(llm, qa_probe(), [unit], "secom_chat"))
    asked = llm.calls[0]["messages"][-1]["content"]
    probe = {"probe_id": "qa:q0", "session_idx": 2, "turn_idx": None, "evidence": ["D1:1", "D1:2"],
             "request": "When did A go?", "gold": "7 May 2023", "category": "temporal"}
    dateless, _, source = judge_call("gpt4score", probe, "May.", {}, TURNS, True, True, cfg.judge_answers.memochat_dates)
    dated, _, _ = judge_call("gpt4score", probe, "May.", {}, TURNS, True, True, True)
    shown = dateless.messages[-1]["content"]
    assert source == "evidence" and "[Session 1]" in shown and "A: A line 0" in shown
    for text in (asked, shown):
        assert str(WHEN) not in text and "2023" not in text
    assert str(WHEN) in dated.messages[-1]["content"]  # the default keeps the dated headers


def test_the_temporal_category_gets_its_own_gpt4score_row():
    rows = [{"dataset": "locomo", "episode_id": "e1", "probe_id": f"q{i}", "kind": "qa", "run": 0,
             "category": "temporal" if i < 2 else "single-hop", "method": "secom", "judge": "gpt4score",
             "score": [40.0, 60.0, 90.0, 90.0][i], "error": None, "skipped": None, "history_source": "evidence",
             "judge_model": "j", "prompt_fingerprint": "p"} for i in range(4)]
    got = {(r["category"], r["judge"]): r for r in answer_summary(pl.DataFrame(rows)).iter_rows(named=True)
           if r["dataset"] == "locomo"}
    assert got[("temporal", "gpt4score")]["score"] == pytest.approx(50.0)
    assert got[(None, "gpt4score")]["score"] == pytest.approx(70.0)


# ------------------------------------------------------------------------- N8: MemoChat's rating

def test_memochat_judge_takes_the_first_rating_as_memochat_does():
    call = answers.memochat_call("h", "q", "r")
    reply = SimpleNamespace(text="Faithful. [[30]] Though a second look says [[90]].", model="j")
    score, explanation, _ = call.read(reply)
    assert score == 30.0 and explanation == "Faithful."


# ----------------------------------------------------------------- N2: the official strips

def test_secoms_character_set_strips_clip_golds_and_predictions_as_chat_py_does():
    # .strip("Answer:") removes any of A n s w e r : from both ends, not the word
    assert [rm.secom_gold(g) for g in ("Sweden", "Adoption agencies", "sunset", "\nAnswer: Paris")] == [
        "Swed", "doption agenci", "unset", " Pari"]
    # get_answer: the strips in turn, then the cut at a following question or human turn
    assert rm.secom_prediction("Dialogs: Paris\nQuestion: and then?") == " Paris"
    assert rm.secom_prediction("[bot]: Lisbon.\n[human]: ok") == " Lisbon."
    assert rm.scored_texts("sunset", "sunset", "clean") == ("sunset", "sunset")
    assert rm.scored_texts(None, "sunset", "secom_official") == (None, "unset")


def _stage_inputs(gold: str, reply: str) -> dict[str, pa.Table]:
    probe = {"episode_id": "e", "probe_id": "qa:q0", "kind": "qa", "category": "single-hop", "session_idx": 3,
             "gold": gold, "request": "q"}
    return {"ingest.episodes": pa.Table.from_pylist([{"episode_id": "e", "dataset": "locomo"}]),
            "probes.probes": pa.Table.from_pylist([probe]),
            "respond_secom.responses": pa.Table.from_pylist([{"episode_id": "e", "probe_id": "qa:q0", "error": None,
                                                              "response": reply, "details_json": None}])}


@pytest.mark.parametrize("postprocess, rouge1", [("clean", 1.0), ("secom_official", 0.0)])
def test_response_metrics_score_the_texts_the_postprocess_setting_names(postprocess, rouge1):
    stage = rm.ResponseMetricsStage(methods=("secom",))
    ctx = SimpleNamespace(settings=rm.ResponseMetricsSettings(postprocess=postprocess))
    # "sunset" -> "unset" (gold) but "sunset" survives get_answer's strips: official scoring misses it
    out = run(stage.run(ctx, _stage_inputs("sunset", "sunset")))
    assert out["response_metrics"].to_pylist()[0]["rouge1"] == pytest.approx(rouge1)
    impl = out["metric_implementations"].to_pylist()
    assert all(("pre-scoring" in r["implementation"]) == (postprocess == "secom_official") for r in impl)


@pytest.mark.parametrize("name", QA_CONFIGS)
def test_both_sheets_score_the_officially_stripped_texts_and_say_so(name):
    cfg = config(name)
    assert cfg.response_metrics.postprocess == "secom_official"
    assert cfg.paper.protocol["response_metrics.postprocess"].value == "secom_official"
    text_rows = [r for r in cfg.paper.results if r.column in ("evaluate_bleu4", "rouge1", "rouge2", "rougeL", "bertscore")]
    assert text_rows and all("official strips" in r.source for r in text_rows)
    devs = deviations(config(name, ["response_metrics.postprocess=clean"]))
    assert [(d.path, d.paper, d.run) for d in devs] == [("response_metrics.postprocess", "secom_official", "clean")]


# ------------------------------------------------------------------------------ N3: captions

def test_locomo_captions_are_a_corpus_switch_off_in_secom_locomo():
    def shared(captions: bool) -> str:
        c = load_corpus("locomo", LOCOMO_MINI, captions=captions)
        return next(t["text"] for t in c.turns if t["episode_id"] == "locomo-conv-90" and t["source_turn_id"] == "D10:2")
    with_caption, without = shared(True), shared(False)
    assert with_caption.endswith(" [shares a photo of a loaf of sourdough bread on a table]")
    assert without == with_caption.removesuffix(" [shares a photo of a loaf of sourdough bread on a table]")
    assert config("secom_locomo").corpus.captions is False
    assert config("locomo_memory_systems").corpus.captions is True  # other configs keep today's text
    assert config("secom_locomo").paper.protocol["corpus.captions"].value is False


# ------------------------------------------------------------------------------ N4: order

UNITS = [{"unit_id": "segment:3:0", "session_idx": 3, "turn_start": 0, "turn_end": 1, "text": "A: late\nB: yes"},
         {"unit_id": "segment:1:0", "session_idx": 1, "turn_start": 0, "turn_end": 1, "text": "A: early\nB: ok"}]


@pytest.mark.parametrize("order, first", [("time", "A: early"), ("rank", "A: late")])
def test_secom_chat_shows_units_in_time_order_or_as_ranked(order, first):
    llm = FakeChat(["x"])
    ans = run(response.generate(llm, qa_probe(), UNITS, "secom_chat", order))
    context = llm.calls[0]["messages"][-1]["content"].split("\n\n", 1)[1]
    assert context.startswith(first) and ans.details["secom_chat_order"] == order


@pytest.mark.parametrize("name", QA_CONFIGS)
def test_secom_configs_order_units_in_time_as_sec_2_1_says(name):
    cfg = config(name)
    assert RetrievalSettings().secom_chat_order == "time"
    for m in ("secom", "turn", "session"):
        assert getattr(cfg.method, m).secom_chat_order == "time"
        assert "Sec. 2.1" in cfg.paper.protocol[f"method.{m}.secom_chat_order"].source


# ------------------------------------------------------------------- N5 / N6: # Turns, context means

def test_table_6_turns_count_halves_each_sessions_utterances():
    history = {1: TURNS, 2: [{**t, "session_idx": 2} for t in TURNS[:4]]}  # 5 and 4 utterances
    answer = run(FullHistory().answer(MethodContext(settings=FullHistorySettings(), llm=FakeChat(["x"])),
                                      qa_probe(history), {}))
    assert answer.details["context_turn_pairs"] == 5 // 2 + 4 // 2 == 4
    assert answer.context_turns == 5  # first-speaker exchanges: 3 + 2
    # one retrieved exchange of two utterances is one pair
    one = [{"session_idx": 1, "turn_start": 2, "turn_end": 3, "text": "x"}]
    assert response.context_turn_pairs(one, history) == 1


def test_method_summary_means_pairs_over_the_questions_the_judges_did_not_skip():
    def resp(i: int, pairs: int, tokens: int) -> dict:
        return {"episode_id": "locomo-1", "probe_id": f"qa:{i}", "method": "s", "context_tokens": tokens,
                "context_turns": pairs + 1, "response": "a", "error": None,
                "details_json": json.dumps({"context_turn_pairs": pairs})}
    responses = pl.DataFrame([resp(0, 2, 10), resp(1, 4, 30), resp(2, 100, 1000)])
    judged = pl.DataFrame([{"episode_id": "locomo-1", "probe_id": f"qa:{i}", "dataset": "locomo", "kind": "qa",
                            "method": "s", "judge": "gpt4score", "score": None if i == 2 else 50.0,
                            "skipped": "unanswerable question (judge_answers.unanswerable: skip)" if i == 2 else None}
                           for i in range(3)])
    row = method_summary(responses, {"s": {"calls": 3}}, judged, pl.DataFrame(), pl.DataFrame()).row(0, named=True)
    assert row["probes"] == 3  # every response is counted ...
    assert (row["mean_context_turn_pairs"], row["mean_context_turns"], row["mean_context_tokens"]) == (3.0, 4.0, 20.0)


def test_the_locomo_sheet_reads_turns_as_table_6_counts_them():
    cfg = config("secom_locomo")
    turns = [r for r in cfg.paper.results if r.name.endswith("# Turns")]
    assert len(turns) == 4 and all(r.column == "mean_context_turn_pairs" for r in turns)


# ----------------------------------------------------------------------------------- N11 budget

def test_secoms_locomo_budget_leaves_room_for_table_6s_mean():
    cfg = config("secom_locomo")
    tokens = next(r.paper for r in cfg.paper.results if r.name == "SeCom, # Tokens")
    assert cfg.method.secom.token_budget > tokens and cfg.method.session.token_budget == 3500


# ----------------------------------------------------------------------------------- N9 BM25 ties

def test_equal_bm25_scores_go_to_the_earlier_unit_where_rank_bm25s_get_top_n_gives_the_later_one():
    from rank_bm25 import BM25Okapi

    from pipeline.retrieval import bm25_scores, top_k

    docs = ["the fence is green", "we walked home", "a quiet morning", "lunch at noon", "green fence paint"]
    query = "green fence"
    scores = bm25_scores(query, docs, tokens="whitespace", idf="okapi")
    assert [i for i, s in enumerate(scores) if s > 0] == [0, 4]  # two matches, three zero-score fills
    ours = top_k(scores, 4)
    official = BM25Okapi([d.split() for d in docs]).get_top_n(query.split(), list(range(len(docs))), n=4)
    # The matches rank alike; among the zero-score fills ours takes the earliest units, the official the
    # latest (reversed argsort): the sheets' bm25_idf rows say so.
    assert sorted(ours[:2]) == sorted(official[:2]) == [0, 4]
    assert ours[2:] == [1, 2] and official[2:] == [3, 2]
    cfg = config("secom_locomo")
    assert "reversed argsort" in cfg.paper.protocol["method.secom.bm25_idf"].source


# ----------------------------------------------------------------------------------- N12 docs

def test_the_methods_page_names_the_counted_answer_format_the_secom_configs_use():
    assert {config(name).segment.answer_format for name in QA_CONFIGS} == {"counted"}
    secom_row = next(ln for ln in (ROOT / "docs" / "methods.md").read_text().splitlines() if ln.startswith("| SeCom:"))
    assert "counted" in secom_row and "spans" in secom_row and "starts" in secom_row
