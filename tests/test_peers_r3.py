"""Round-3 peer fixes (audits/round3/teafarm_peers.md): mem0's rag.py answer frame (`qa_prompt: mem0_rag`) for
the full-context and RAG rows, mem0_style's `show_work`, a failed response scored wrong by the correct / wrong
judges, category 5 skipped by category, the reworded J opening, LongMemEval's judge clauses and raw reader
answers, LoCoMo's official context newest first, and the sheets that state each."""

from __future__ import annotations

import asyncio
from datetime import datetime
from types import SimpleNamespace

import polars as pl
import pytest

from pipeline.retrieval import count_tokens
from pipeline.engine.stage import StageContext
from pipeline.testing.fake_chat import FakeChat
from sheets import sheet_config
from stages.judging import answers
from stages.judging import longmemeval as lme
from stages.judging.judge_answers import SKIP_UNANSWERABLE, JudgeAnswersStage, reference_or_skip
from stages.methods.base import MethodContext, ProbeInput
from stages.methods.baselines.history import FullHistory, FullHistorySettings
from stages.methods.baselines.mem0_style import (MEM0_ANSWER_SYSTEM, MEM0_SHOW_WORK_SYSTEM, Mem0Settings,
                                                 Mem0Style)
from stages.methods.secom.retrieval import RetrievalSettings
from stages.methods.shared import mem0_rag, response
from stages.report.tables import answer_summary, teafarm_summary
from test_peers_r2 import embed, lme_history, lme_probe, mem0_episode, mem0_responder


def run(coro):
    return asyncio.run(coro)


MAY8, JUN1, JUL3 = datetime(2023, 5, 8, 13, 56), datetime(2023, 6, 1, 9, 5), datetime(2023, 7, 3, 20, 0)


def turn(s: int, i: int, speaker: str, text: str, when: datetime) -> dict:
    return {"session_idx": s, "turn_idx": i, "speaker": speaker, "text": text, "session_time": when,
            "source_turn_id": f"D{s}:{i + 1}"}


HISTORY = {1: [turn(1, 0, "Priya", "I bought a red bicycle.", MAY8), turn(1, 1, "Dev", "Nice!", MAY8)],
           2: [turn(2, 0, "Priya", "I ride it to work.", JUN1), turn(2, 1, "Dev", "Good for you.", JUN1)],
           3: [turn(3, 0, "Dev", "I adopted a cat.", JUL3), turn(3, 1, "Priya", "What is its name?", JUL3),
               turn(3, 2, "Dev", "Miso.", JUL3)]}


def unit(s: int, lo: int, hi: int) -> dict:
    turns = [t for t in HISTORY[s] if lo <= t["turn_idx"] <= hi]
    return {"session_idx": s, "turn_start": lo, "turn_end": hi, "session_time": turns[0]["session_time"],
            "text": "\n".join(f"{t['speaker']}: {t['text']}" for t in turns), "unit_id": f"turn:{s}:{lo}"}


def qa_probe(history: dict | None = None, category: str = "single-hop") -> ProbeInput:
    return ProbeInput(probe={"probe_id": "qa:q1", "kind": "qa", "category": category, "session_idx": 4,
                             "request": "What is Dev's cat called?", "respondent": "Priya"},
                      episode={"dataset": "locomo", "speakers": ["Priya", "Dev"]},
                      history=HISTORY if history is None else history, current=[])


# --- mem0's rag.py frame (F1) ---------------------------------------------------------------------------

def test_the_mem0_rag_frame_has_rag_pys_elements_in_our_words():
    system, user = mem0_rag.build_messages([unit(1, 0, 1)], "What did Priya buy?", HISTORY)
    assert system["role"] == "system" and user["role"] == "user"
    s = system["content"].lower()
    assert all(w in s for w in ("context", "dates", "short", "own wording", "leave out who"))
    assert "not mentioned" not in s  # rag.py never invites it, unlike our frame
    assert user["content"] == ("# Question:\nWhat did Priya buy?\n\n# Context:\n"
                               "1:56 pm on 8 May, 2023 | Priya: I bought a red bicycle.\n"
                               "1:56 pm on 8 May, 2023 | Dev: Nice!\n\n# Short answer:")


def test_retrieved_chunks_keep_rank_order_split_by_the_separator_and_adjacent_units_join_one_chunk():
    # Ranked: the cat exchange first, then the bicycle one (not adjacent): two chunks, in that order.
    ranked = [unit(3, 0, 2), unit(1, 0, 1)]
    text = mem0_rag.context(ranked, HISTORY)
    first, second = text.split("\n<->\n")
    assert first.startswith("8:00 pm on 3 July, 2023 | Dev: I adopted a cat.") and "Miso." in first
    assert second.startswith("1:56 pm on 8 May, 2023 | Priya: I bought")
    # Units that continue one another (the end of session 1, then the start of session 2) are one chunk.
    assert "<->" not in mem0_rag.context([unit(1, 0, 1), unit(2, 0, 1)], HISTORY)
    # Without the turns, a unit's own lines are dated with its session's date.
    assert mem0_rag.context([unit(2, 0, 1)], {}) == ("9:05 am on 1 June, 2023 | Priya: I ride it to work.\n"
                                                     "9:05 am on 1 June, 2023 | Dev: Good for you.")


def test_generate_asks_in_the_mem0_rag_frame_greedy_and_keeps_the_reply_as_written():
    llm = FakeChat(["  Miso\nDev: yes, Miso  "])
    ranked = [unit(3, 0, 2), unit(1, 0, 1)]
    ans = run(response.generate(llm, qa_probe(), ranked, "mem0_rag"))
    call = llm.calls[0]
    assert call["params"] == {"temperature": 0.0}  # rag.py's temperature 0, no length cap
    assert call["messages"][0]["content"] == mem0_rag.MEM0_RAG_SYSTEM
    shown = call["messages"][1]["content"]
    assert shown.index("Dev: I adopted") < shown.index("Priya: I bought")  # rank order
    assert ans.text == "Miso\nDev: yes, Miso"  # rag.py stores content.strip(): never cut to one turn
    assert ans.details["qa_prompt"] == "mem0_rag" and ans.details["sampling"] == {"temperature": 0.0}
    # The context tokens are those of the context as shown ("timestamp | speaker: text" lines, F7).
    assert ans.context_tokens == count_tokens(mem0_rag.context(ranked, HISTORY))
    assert ans.context_tokens > response.context_tokens(ranked)


def test_full_history_under_mem0_rag_is_one_chunk_of_the_whole_conversation():
    llm = FakeChat(["Miso"])
    ctx = MethodContext(settings=FullHistorySettings(qa_prompt="mem0_rag"), llm=llm)
    run(FullHistory().answer(ctx, qa_probe(), {}))
    shown = llm.calls[0]["messages"][1]["content"].split("# Context:\n")[1].split("\n\n# Short answer:")[0]
    assert "<->" not in shown and len(shown.splitlines()) == 7
    assert shown.splitlines()[0] == "1:56 pm on 8 May, 2023 | Priya: I bought a red bicycle."
    assert shown.splitlines()[-1] == "8:00 pm on 3 July, 2023 | Dev: Miso."


def test_mem0_rag_is_a_setting_of_the_retrieval_and_history_methods():
    assert RetrievalSettings(qa_prompt="mem0_rag").qa_prompt == "mem0_rag"
    assert FullHistorySettings(qa_prompt="mem0_rag").qa_prompt == "mem0_rag"


def test_the_mem0_board_answers_full_context_and_rag_in_the_rag_frame_and_mem0_with_its_work_shown():
    cfg = sheet_config("locomo_memory_systems")
    assert cfg.method.full_history.qa_prompt == "mem0_rag" and cfg.method.turn.qa_prompt == "mem0_rag"
    assert cfg.method.secom.qa_prompt == "ours"
    assert cfg.method.mem0_style.show_work is True
    protocol = cfg.paper.protocol
    for path in ("method.full_history.qa_prompt", "method.turn.qa_prompt"):
        assert protocol[path].value == "mem0_rag" and "rag.py" in protocol[path].source
    assert protocol["method.mem0_style.show_work"].value is True
    assert "evals.py" in protocol["method.mem0_style.show_work"].source
    assert "no running conversation summary" in protocol["method.mem0_style.extract_every"].source  # P10
    sources = {r.name: r.source for r in cfg.paper.results}
    assert "timestamp | speaker: text" in sources["Full-context, context tokens"]  # F7
    assert "ours: counted as our prompt shows them" in sources["Mem0, memory tokens"]


# --- mem0_style's show_work (F2) ------------------------------------------------------------------------

def _mem0_answer(settings: Mem0Settings, reply: str):
    built = run(Mem0Style().build(MethodContext(settings=Mem0Settings(), llm=FakeChat(responder=mem0_responder),
                                                embed=embed), mem0_episode()))
    last = [f for f in built["facts"] if f["snapshot_session"] == 2]
    probe = ProbeInput(probe={"probe_id": "qa:1", "kind": "qa", "session_idx": 3, "respondent": "Bob",
                              "request": "Where does Ann live?"},
                       episode={"episode_id": "e1", "speakers": ["Ann", "Bob"]}, history={}, current=[])
    llm = FakeChat([reply])
    answer = run(Mem0Style().answer(MethodContext(settings=settings, llm=llm, embed=embed), probe, {"facts": last}))
    return answer, llm.calls[0]["messages"][0]["content"]


def test_show_work_asks_for_the_steps_and_the_whole_completion_is_the_answer_scored():
    reply = "Step 1: a memory dated 2023-05-02 says Ann moved.\nBob: so\nAnswer: Leeds"
    answer, system = _mem0_answer(Mem0Settings(top_k=1, show_work=True), f"  {reply}\n")
    assert system == MEM0_SHOW_WORK_SYSTEM and "step by step" in system and "answer only" not in system
    assert answer.text == reply  # as mem0's evals.py scores the stored completion: not cut at "Bob:"
    assert answer.details["show_work"] is True
    # Off (the default), the answer alone is asked for and the reply is one turn.
    answer, system = _mem0_answer(Mem0Settings(top_k=1), reply)
    assert system == MEM0_ANSWER_SYSTEM and system.endswith("Reply with the answer only.")
    assert answer.text == "Step 1: a memory dated 2023-05-02 says Ann moved." and answer.details["show_work"] is False


# --- a failed response scored wrong (F3) ------------------------------------------------------------------

def _row(method: str, judge: str, q: int, score: float | None, error: str | None = None, dataset: str = "d"):
    return {"dataset": dataset, "episode_id": f"e{q}", "probe_id": f"q{q}", "kind": "qa", "category": "c",
            "method": method, "judge": judge, "score": score, "error": error, "skipped": None,
            "history_source": None, "judge_model": "j", "prompt_fingerprint": "p"}


def test_a_failed_response_counts_wrong_for_a_correct_or_wrong_judge_and_stays_in_failed():
    rows = [_row("m", "strict", 0, 1.0), _row("m", "strict", 1, 1.0),
            _row("m", "strict", 2, None, "no response from m"),  # the method failed: wrong
            _row("m", "strict", 3, None, "judge down")]  # the judge failed: no verdict, out of the score
    got = answer_summary(pl.DataFrame(rows)).filter(pl.col("dataset") == "d").row(0, named=True)
    assert (got["items"], got["failed"], got["judged"], got["correct"]) == (4, 2, 3, 2)
    assert got["score"] == pytest.approx(2 / 3)  # as the official scorer scores the exported empty answer
    # A 0-100 judge has no "wrong": its failed response stays out of the mean, counted in failed.
    g = [_row("m", "gpt4score", 0, 80.0), _row("m", "gpt4score", 1, None, "no response from m")]
    got = answer_summary(pl.DataFrame(g)).filter(pl.col("dataset") == "d").row(0, named=True)
    assert (got["failed"], got["judged"], got["score"]) == (1, 1, 80.0)


def test_teafarm_counts_a_failed_response_in_total_as_wrong():
    rows = [_row("m", "teafarm", 0, 1.0), _row("m", "teafarm", 1, None, "no response from m"),
            _row("m", "teafarm", 2, None, "judge down")]
    got = teafarm_summary(pl.DataFrame(rows)).filter(pl.col("dataset") == "d").row(0, named=True)
    assert (got["correct"], got["total"], got["failed"], got["correctness"]) == (1, 2, 2, 0.5)


# --- category 5 out under `unanswerable: skip` (F6) --------------------------------------------------------

def test_category_5_is_skipped_by_category_under_skip_even_with_a_gold_answer():
    with_gold = {"gold": "No", "category": "adversarial"}
    assert reference_or_skip(with_gold, False, "skip") == (None, SKIP_UNANSWERABLE)
    assert reference_or_skip(with_gold, True, "skip") == (None, SKIP_UNANSWERABLE)  # MemoChat's judge too
    assert reference_or_skip(with_gold, False, "not_mentioned") == ("gold", None)
    assert reference_or_skip({"gold": None, "category": "5"}, False, "skip") == (None, SKIP_UNANSWERABLE)
    assert reference_or_skip({"gold": "x", "category": "single-hop"}, False, "skip") == ("gold", None)


def test_the_mem0_board_judges_no_category_5_item_with_a_gold_answer():
    cfg = sheet_config("locomo_memory_systems")
    probes = [{"probe_id": f"qa:q{i}", "kind": "qa", "category": c, "session_idx": 2, "turn_idx": None,
               "qa_id": f"q{i}", "request": f"Question {i}?", "gold": g, "evidence": []}
              for i, (c, g) in enumerate([("single-hop", "Rome"), ("adversarial", "No"), ("adversarial", None)])]
    inputs = {"ingest.episodes": [{"episode_id": "e", "dataset": "locomo"}], "ingest.turns": [],
              "ingest.qa": [{"qa_id": p["qa_id"], "question": p["request"]} for p in probes], "probes.probes": probes,
              "respond_m.responses": [{"probe_id": p["probe_id"], "response": "No", "error": None,
                                       "details_json": "{}"} for p in probes]}
    stage = JudgeAnswersStage(("m",))
    llm = FakeChat(responder=lambda messages, schema: {"reason": "r", "label": "CORRECT"})
    llm.cfg = SimpleNamespace(model="gpt-4o-mini")  # type: ignore[attr-defined]
    ctx = StageContext(cfg=SimpleNamespace(judge_answers=cfg.judge_answers, corpus=cfg.corpus),  # type: ignore[arg-type]
                       stage=stage, out_dir=None, clients={"judge": llm})
    rows = run(stage.process_episode(ctx, "e", inputs))["answer_judgments"]
    by = {}
    for r in rows:
        by.setdefault(r["probe_id"], set()).add(r["skipped"])
    assert by == {"qa:q0": {None}, "qa:q1": {SKIP_UNANSWERABLE}, "qa:q2": {SKIP_UNANSWERABLE}}
    assert all("Question 1?" not in c["messages"][-1]["content"] for c in llm.calls)


# --- the J opening (F8) and LongMemEval's judge (F9) -------------------------------------------------------

def test_the_locomo_j_opening_is_ours():
    text = answers.LOCOMO_J_SYSTEM.lower()
    assert "label an answer to a question as" not in text
    assert text.startswith("you grade a generated reply") and "correct or wrong" in text


def test_longmemeval_temporal_forgives_off_by_one_in_any_count_and_abstention_adds_no_clause():
    temporal = lme.SYSTEMS["temporal"]
    assert "whenever the question asks for a number of days, weeks, months or the like" in temporal
    assert "how long ago" not in temporal and "between two events" not in temporal
    abstention = lme.SYSTEMS["abstention"]
    assert "It is no when" not in abstention and "as if the conversations held one" not in abstention
    assert "cannot be answered" in abstention


# --- LongMemEval's reader keeps the raw completion (F10) ---------------------------------------------------

def test_the_longmemeval_reader_answer_is_the_raw_completion():
    reply = "You moved to Leeds.\nUser: thanks\n[note]: done"
    llm = FakeChat([f"\n{reply}  "])
    ctx = MethodContext(settings=FullHistorySettings(qa_prompt="longmemeval"), llm=llm)
    answer = run(FullHistory().answer(ctx, lme_probe(lme_history()), {}))
    assert answer.text == reply  # run_generation.py stores the completion: no cut at "User:"
    # Our frame still cuts a reply to one turn.
    ours = run(response.generate(FakeChat([reply]), qa_probe(), [unit(1, 0, 1)]))
    assert ours.text == "You moved to Leeds."


# --- LoCoMo's official context newest first (N4) -----------------------------------------------------------

def test_locomo_official_lists_the_sessions_newest_first_as_get_input_context():
    units = [unit(1, 0, 1), unit(3, 0, 2), unit(2, 0, 1)]
    text = response.build_locomo_qa_messages(units, "q?", "single-hop", ["Priya", "Dev"])[0]["content"]
    dates = [text.index(f"DATE: {d}") for d in (JUL3, JUN1, MAY8)]
    assert dates == sorted(dates)  # session 3, then 2, then 1
    assert "CONVERSATION:\nDev: I adopted a cat.\nPriya: What is its name?\nDev: Miso." in text  # turns in order


# --- LongMemEval's sheet: the release (F4) and the round keys (P12) -----------------------------------

def test_the_longmemeval_sheet_names_the_release_each_number_was_measured_on():
    cfg = sheet_config("longmemeval")
    row = cfg.paper.protocol["corpus.path"]
    assert row.value == "data/longmemeval_s.json"
    assert "2024" in row.source and "longmemeval_s_cleaned.json" in row.source
    assert cfg.paper.protocol["method.turn.key_side"].value == "user" and cfg.method.turn.key_side == "user"  # P12


def test_a_round_keyed_on_its_user_side_is_found_by_the_users_words_and_shown_whole():
    """P12: LongMemEval's round retrieval keys a round on its user turn; the context shows the whole round."""
    from pipeline.retrieval import count_tokens
    from stages.methods.base import ProbeInput
    from stages.methods.secom.retrieval import TurnLevel

    turns = [{"session_idx": 1, "turn_idx": 0, "speaker": "user", "text": "I bought a red kayak."},
             {"session_idx": 1, "turn_idx": 1, "speaker": "assistant", "text": "Paddling is fun; wear a helmet."},
             {"session_idx": 1, "turn_idx": 2, "speaker": "user", "text": "Which helmet should I buy?"},
             {"session_idx": 1, "turn_idx": 3, "speaker": "assistant", "text": "A light one."}]
    bank = [{"unit_id": f"turn:1:{i}", "granularity": "turn", "session_idx": 1, "turn_start": i, "turn_end": i + 1,
             "text": f"user: {turns[i]['text']}\nassistant: {turns[i + 1]['text']}", "compressed_text": None}
            for i in (0, 2)]
    probe = ProbeInput(probe={"probe_id": "q", "session_idx": 2, "turn_idx": None, "request": "helmet"},
                       episode={"episode_id": "e", "speakers": ["user", "assistant"]}, history={1: turns}, current=[],
                       upstream={"banks.memory_units": bank})

    def top(key_side: str) -> list[str]:
        settings = TurnLevel.Settings(top_k=1, use_compression=False, key_side=key_side)
        pool, retriever = TurnLevel()._index(probe, settings)
        return [unit_id for unit_id, _ in retriever.search("helmet", 1, method="bm25")]

    # Both rounds say "helmet"; only the second round's user turn does.
    assert top("user") == ["turn:1:2"]
    pool, retriever = TurnLevel()._index(probe, TurnLevel.Settings(top_k=1, use_compression=False, key_side="user"))
    assert retriever.texts == ["I bought a red kayak.", "Which helmet should I buy?"]
    assert retriever.token_counts == [count_tokens(u["text"]) for u in pool]  # budgets count what is shown
