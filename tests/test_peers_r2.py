"""Round-2 peer fixes: LongMemEval's reader (`qa_prompt: longmemeval`, with Chain-of-Note), its
date-sorted loader with user-side evidence, its retrieval metrics and its long-context truncation;
mem0_style's dated facts, per-speaker retrieval, mem0's answer rules and pair extraction; COMEDY's
length cap and profile items; MemoChat's original preset."""

from __future__ import annotations

import asyncio
import copy
import json
import math
import re
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from pipeline.testing.fake_chat import FakeChat
from pipeline.corpus import load_corpus
from pipeline.llm.types import LLMError
from stages import load_config
from stages.methods.shared import response
from stages.methods.base import EpisodeInput, MethodContext, ProbeInput
from stages.methods.baselines.comedy import ComedySettings, compress_messages, summary_messages
from stages.methods.baselines.history import FullHistory, FullHistorySettings, budget_sessions, o200k_tokens
from stages.methods.baselines.mem0_style import MEM0_ANSWER_SYSTEM, Mem0Settings, Mem0Style
from stages.methods.baselines.memochat import NOTO_TOPIC, MemoChat, MemoChatSettings
from stages.metrics import retrieval as rm

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "corpora" / "longmemeval" / "longmemeval_mini.json"
RECORDS = json.loads(FIXTURE.read_text())
MAY1, MAY9, JUN2 = datetime(2023, 5, 1, 9, 0), datetime(2023, 5, 9, 18, 30), datetime(2023, 6, 2, 8, 5)


def lme_turn(s: int, i: int, speaker: str, text: str, when: datetime) -> dict:
    return {"episode_id": "e", "session_idx": s, "turn_idx": i, "speaker": speaker, "text": text,
            "session_time": when, "source_turn_id": f"s{s}:{i + 1}"}


def lme_probe(history: dict[int, list[dict]]) -> ProbeInput:
    return ProbeInput(probe={"probe_id": "qa:q1", "kind": "qa", "session_idx": 4, "respondent": "assistant",
                             "request": "[Current date: 2023/06/10 (Sat) 12:00] Which city did I move to?"},
                      episode={"episode_id": "e", "dataset": "longmemeval", "speakers": ["user", "assistant"]},
                      history=history, current=[])


def lme_history() -> dict[int, list[dict]]:
    # Session 2 is dated before session 1, as a haystack that was not sorted.
    return {1: [lme_turn(1, 0, "user", "I moved to Leeds.", MAY9), lme_turn(1, 1, "assistant", "Nice!", MAY9)],
            2: [lme_turn(2, 0, "user", "I live in York.", MAY1), lme_turn(2, 1, "assistant", "Lovely.", MAY1)],
            3: [lme_turn(3, 0, "user", "Any tea tips?", JUN2), lme_turn(3, 1, "assistant", "Try oolong.", JUN2)]}


# --- LongMemEval's reader ----------------------------------------------------------------------------

def test_the_longmemeval_reader_shows_dated_json_sessions_by_date_then_the_current_date_and_asks_openly():
    llm = FakeChat(["You moved to Leeds in May 2023."])
    ctx = MethodContext(settings=FullHistorySettings(qa_prompt="longmemeval"), llm=llm)
    answer = asyncio.run(FullHistory().answer(ctx, lme_probe(lme_history()), {}))
    [call] = llm.calls
    [message] = call["messages"]
    assert message["role"] == "user"
    prompt = message["content"]
    york, leeds, tea = (prompt.index(w) for w in ("I live in York.", "I moved to Leeds.", "Any tea tips?"))
    assert york < leeds < tea  # by date, not by session number
    assert "Session 1 (date: 2023/05/01 (Mon) 09:00)\nTurns:\n" in prompt
    assert json.dumps([{"role": "user", "content": "I live in York."}, {"role": "assistant", "content": "Lovely."}]) in prompt
    assert prompt.endswith("Today's date: 2023/06/10 (Sat) 12:00\nQuestion: Which city did I move to?\nAnswer:")
    assert "[Current date" not in prompt
    lowered = prompt.lower()
    assert not any(w in lowered for w in ("not mentioned", "short phrase", "concise", "cannot be answered"))
    assert (call["params"].get("temperature"), call["params"].get("max_tokens")) == (0.0, 500)
    assert answer.text == "You moved to Leeds in May 2023."
    assert answer.details["qa_prompt"] == "longmemeval" and answer.details["sampling"]["max_tokens"] == 500


def test_chain_of_note_reads_each_session_into_notes_and_answers_from_the_notes():
    def responder(messages, schema):
        text = messages[-1]["content"]
        if text.rstrip().endswith("Notes:"):
            return "moved to Leeds" if "Leeds" in text else "empty"
        return "Leeds"
    llm = FakeChat(responder=responder)
    ctx = MethodContext(settings=FullHistorySettings(qa_prompt="longmemeval_con"), llm=llm)
    answer = asyncio.run(FullHistory().answer(ctx, lme_probe(lme_history()), {}))
    notes, final = llm.calls[:3], llm.calls[3]
    assert len(llm.calls) == 4 and all("Which city did I move to?" in c["messages"][0]["content"] for c in notes)
    assert answer.details["notes"] == ["empty", "moved to Leeds", "empty"]  # sessions by date
    shown = final["messages"][0]["content"]
    assert "Session 2 (date: 2023/05/09 (Tue) 18:30)\nNotes:\nmoved to Leeds" in shown and "I moved to Leeds." not in shown
    assert answer.text == "Leeds"


def test_the_longmemeval_config_reads_the_cleaned_release_with_the_longmemeval_reader_and_its_truncation():
    cfg = load_config(ROOT / "configs" / "longmemeval.yaml")
    assert Path(cfg.corpus.path).name == "longmemeval_s_cleaned.json"
    for name in ("full_history", "turn", "session", "zero_history"):
        assert getattr(cfg.method, name).qa_prompt == "longmemeval", name
    full = cfg.method.full_history
    assert (full.token_budget, full.keep, full.budget_tokenizer) == (126500, "oldest", "o200k")


# --- the loader -------------------------------------------------------------------------------------

def _load(tmp_path: Path, records: list) -> object:
    path = tmp_path / "lme.json"
    path.write_text(json.dumps(records))
    return load_corpus("longmemeval", path)


def test_haystack_sessions_are_sorted_by_date_keeping_their_ids(tmp_path):
    record = copy.deepcopy(RECORDS[2])  # tr_0003: three sessions
    for key in ("haystack_dates", "haystack_session_ids", "haystack_sessions"):
        record[key] = record[key][::-1]  # newest first, as an unsorted release could give them
    corpus = _load(tmp_path, [record])
    turns = sorted(corpus.turns, key=lambda t: (t["session_idx"], t["turn_idx"]))
    times = [t["session_time"] for t in turns if t["turn_idx"] == 0]
    assert times == sorted(times)
    assert [t["source_turn_id"] for t in turns if t["turn_idx"] == 0] == \
        ["answer_tr_0003_1:1", "sharegpt_b2_1:1", "answer_tr_0003_2:1"]


def test_evidence_is_the_user_side_has_answer_turns_and_abstention_questions_have_none(tmp_path):
    qa = {q["qa_id"]: q for q in load_corpus("longmemeval", FIXTURE).qa}
    assert qa["tr_0003"]["evidence"] == ["answer_tr_0003_1:1", "answer_tr_0003_2:1"]
    assert qa["ssa_0002"]["evidence"] is None  # its answer is in an assistant turn: no user-side evidence
    assert qa["ssa_0002"]["evidence_sessions"] == ["answer_ssa_0002"]
    record = copy.deepcopy(RECORDS[0])
    record["question_id"] = "ssu_0001_abs"
    assert _load(tmp_path, [record]).qa[0]["evidence"] is None  # left out of retrieval, as LongMemEval does


# --- retrieval metrics ------------------------------------------------------------------------------

def test_recall_any_all_and_ndcg_any_as_longmemeval_computes_them():
    gold = ["a:1", "b:3"]
    ranked = [["c:1", "c:2"], ["a:1", "a:2"], ["d:1"], ["b:3", "b:4"]]
    assert rm.any_all_ndcg(ranked, gold, 1) == {"recall_any": 0.0, "recall_all": 0.0, "ndcg_any": 0.0}
    two = rm.any_all_ndcg(ranked, gold, 2)
    assert (two["recall_any"], two["recall_all"]) == (1.0, 0.0)
    assert two["ndcg_any"] == pytest.approx(1.0 / (1.0 + 1.0))  # rank 2 counts 1/log2(2); ideal 1 + 1
    four = rm.any_all_ndcg(ranked, gold, 4)
    assert (four["recall_any"], four["recall_all"]) == (1.0, 1.0)
    assert four["ndcg_any"] == pytest.approx((1.0 + 1.0 / math.log2(4)) / 2.0)
    assert all(math.isnan(v) for v in rm.any_all_ndcg(ranked, [], 5).values())


def test_session_measures_count_distinct_sessions_within_the_answer_sessions():
    ranked = [["c:1"], ["c:3"], ["a:1"], ["b:3"]]
    out = rm.longmemeval_retrieval(ranked, ["a:1", "b:3"], ["a", "b"], 2)
    # The first two rounds are one session (c), so two sessions reach round 3 (a): any, not all.
    assert (out["session_recall_any"], out["session_recall_all"]) == (1.0, 0.0)
    assert (out["recall_any"], out["recall_all"]) == (0.0, 0.0)
    only_a = rm.longmemeval_retrieval(ranked, ["a:1", "b:3"], ["a"], 2)
    assert only_a["session_recall_all"] == 1.0 and only_a["session_ndcg_any"] == pytest.approx(1.0 / 1.0)


# --- full history over budget -----------------------------------------------------------------------

def test_full_history_can_keep_the_oldest_turns_that_fit_as_longmemeval_truncates():
    sessions = [[{"speaker": "user", "text": f"s{s} t{i} " + "word " * 20, "turn_idx": i} for i in range(3)]
                for s in range(3)]
    count = lambda text: len(text.split())  # noqa: E731
    per_turn = count(response.longmemeval_content(sessions[0][:1]))
    size = count(response.longmemeval_content(sessions[0]))  # every session has the same size
    newest = budget_sessions(sessions, 2 * size + 1, "newest", count, "longmemeval")
    assert newest == [sessions[1], sessions[2]]
    oldest = budget_sessions(sessions, size + per_turn + 5, "oldest", count, "longmemeval")
    assert oldest[0] == sessions[0] and oldest[1] == sessions[1][:1] and len(oldest) == 2
    assert budget_sessions(sessions, None, "oldest", count, "ours") == sessions
    assert 0 < o200k_tokens("Hello world, how are you?") == 7


# --- mem0_style -------------------------------------------------------------------------------------

WORDS = ["cello", "violin", "leeds", "york", "cat", "dog", "tea", "coffee"]


async def embed(texts: list[str]) -> np.ndarray:
    return np.array([[1.0 if w in t.lower() else 0.0 for w in WORDS] + [0.01] for t in texts], dtype=np.float32)


def mem0_episode() -> EpisodeInput:
    sessions = {s: [{"speaker": "Ann", "text": f"news {s}", "turn_idx": 0, "source_turn_id": f"D{s}:1",
                     "session_time": datetime(2023, 5, s)},
                    {"speaker": "Bob", "text": f"reply {s}", "turn_idx": 1, "source_turn_id": f"D{s}:2",
                     "session_time": datetime(2023, 5, s)}] for s in (1, 2)}
    return EpisodeInput(episode={"episode_id": "e1", "speakers": ["Ann", "Bob"]}, sessions=sessions)


FACTS = {(1, "Ann"): ["Ann plays the cello", "Ann has a cat"], (1, "Bob"): ["Bob drinks tea"],
         (2, "Ann"): ["Ann moved to Leeds"], (2, "Bob"): ["Bob lives in York"]}


def mem0_responder(messages, schema):
    text = messages[-1]["content"]
    if "List the facts about" in text:
        session = int(re.search(r"news (\d+)", text).group(1))
        speaker = re.search(r"List the facts about (\w+)", text).group(1)
        return {"facts": FACTS.get((session, speaker), [])}
    if "New fact:" in text:
        return {"op": "ADD", "target": None, "text": None}
    return "Leeds"


def test_mem0_facts_carry_their_date_and_the_answer_reads_each_speakers_top_k_with_mem0s_rules():
    ctx = MethodContext(settings=Mem0Settings(), llm=FakeChat(responder=mem0_responder), embed=embed)
    built = asyncio.run(Mem0Style().build(ctx, mem0_episode()))
    last = [f for f in built["facts"] if f["snapshot_session"] == 2]
    assert {f["text"]: f["fact_date"] for f in last}["Ann moved to Leeds"] == "2023-05-02"
    assert {f["text"]: f["fact_date"] for f in last}["Ann plays the cello"] == "2023-05-01"
    llm = FakeChat(responder=mem0_responder)
    probe = ProbeInput(probe={"probe_id": "qa:1", "kind": "qa", "session_idx": 3, "respondent": "Bob",
                              "request": "Is Ann in Leeds now?"},
                       episode={"episode_id": "e1", "speakers": ["Ann", "Bob"]}, history={}, current=[])
    answer = asyncio.run(Mem0Style().answer(MethodContext(settings=Mem0Settings(top_k=1), llm=llm, embed=embed), probe,
                                            {"facts": last}))
    system, user = (m["content"] for m in llm.calls[0]["messages"])
    assert system == MEM0_ANSWER_SYSTEM
    assert all(w in system for w in ("most recent", "under six words", "relative", "date"))
    # top_k per speaker: one fact of Ann's and one of Bob's, each dated.
    assert "Memories about Ann:\n2023-05-02: Ann moved to Leeds" in user
    assert re.search(r"Memories about Bob:\n2023-05-0\d: Bob", user)
    assert user.endswith("Question: Is Ann in Leeds now?\nAnswer:") and len(answer.used_ids) == 2


def test_mem0_pair_mode_reads_each_exchange_with_the_ten_turns_before_it():
    turns = [{"speaker": "Ann" if i % 2 == 0 else "Bob", "text": f"line {i}", "turn_idx": i} for i in range(14)]
    units = Mem0Style().units(turns, Mem0Settings(extract_every="pair"))
    assert [u[0] for u in units] == list(range(1, 14, 2))  # keyed by each exchange's last turn
    last_turn, calls = units[-1]
    assert [sp for sp, _ in calls] == ["Ann", "Bob"]
    prompt = calls[0][1][-1]["content"]
    assert "Ann: line 12\nBob: line 13" in prompt.split("Read the facts from these lines:\n")[1]
    context = prompt.split("Earlier lines, for context only:\n")[1].split("\n\n")[0]
    assert context.splitlines() == [f"{'Ann' if i % 2 == 0 else 'Bob'}: line {i}" for i in range(2, 12)]


# --- COMEDY -----------------------------------------------------------------------------------------

def test_comedy_writes_a_list_of_memories_and_compresses_under_a_length_cap_with_every_profile_item():
    session = summary_messages([{"speaker": "Ann", "text": "hi", "turn_idx": 0}], 1, None)
    assert "one memory per line" in session[-1]["content"] and "name of the person" in session[-1]["content"]
    system = compress_messages([{"session_idx": 1, "summary": "Ann: hi"}], ("Ann", "Bob"), None, 150)[0]["content"]
    for item in ("basic information", "personality", "behaviour", "preferences", "emotional", "work", "health",
                 "example", "150 words"):
        assert item in system, item
    assert ComedySettings().memory_words == 150
    assert "under" not in compress_messages([], ("Ann",), None, None)[0]["content"]


# --- MemoChat's original preset ---------------------------------------------------------------------

def test_the_original_preset_fills_every_unset_setting_with_memochats_own():
    s = MemoChatSettings(preset="original")
    assert (s.write_every, s.write_words, s.close_topics, s.noto_fallback, s.max_retrieved, s.query_turns,
            s.temperature) == (8, 1024, True, True, None, 0, 0.2)
    assert MemoChatSettings(preset="original", query_turns=2).query_turns == 2  # what is set wins
    d = MemoChatSettings()
    assert (d.write_every, d.close_topics, d.noto_fallback, d.max_retrieved) == (None, False, False, 3)


def _memochat_turns(n: int) -> dict[int, list[dict]]:
    return {1: [{"speaker": "Ann" if i % 2 == 0 else "Bob", "text": f"line {i} about camping", "turn_idx": i,
                 "session_idx": 1, "source_turn_id": f"D1:{i}"} for i in range(n)]}


def test_the_original_preset_closes_every_topic_at_each_write_and_files_a_failed_write_under_noto():
    calls = []

    def responder(messages, schema):
        calls.append(messages[-1]["content"])
        if len(calls) == 1:
            return {"topics": [{"topic": "camping", "summary": "a trip", "start": 1},
                               {"topic": "weather", "summary": "rain", "start": 5}]}
        return LLMError("refused", "no json")

    episode = EpisodeInput(episode={"episode_id": "e1", "speakers": ["Ann", "Bob"]}, sessions=_memochat_turns(12))
    built = asyncio.run(MemoChat().build(MethodContext(settings=MemoChatSettings(preset="original"),
                                                       llm=FakeChat(responder=responder)), episode))
    memos = built["memos"]
    # The first write, after 8 lines, closes both topics (nothing pending); the second (session end) fails.
    assert [(m["topic"], m["turn_start"], m["turn_end"]) for m in memos[:2]] == [("camping", 0, 3), ("weather", 4, 7)]
    assert memos[0]["snapshot_turn"] == 7 and built["writes"][0]["pending_from"] is None
    noto = memos[2]
    assert noto["topic"] == NOTO_TOPIC and (noto["turn_start"], noto["turn_end"]) == (8, 11)
    assert noto["summary"].startswith("Partial dialogue about: ")


def test_a_noto_memo_is_never_used_and_the_original_retrieval_reads_the_input_alone_without_a_cap():
    memos = [{"memo_id": f"1:{i}", "topic": t, "summary": t, "session_idx": 1, "turn_start": i, "turn_end": i,
              "dialogue": f"Ann: {t}", "source_turn_ids": [], "episode_id": "e1", "snapshot_session": 1,
              "snapshot_turn": None} for i, t in enumerate(["camping", NOTO_TOPIC, "job", "cat"])]

    def responder(messages, schema):
        return {"chosen": [1, 2, 3, 4]} if schema is not None else "Bob: sure"
    llm = FakeChat(responder=responder)
    current = [{"speaker": "Ann", "text": "earlier words", "turn_idx": 0}, {"speaker": "Ann", "text": "Any news?",
                                                                              "turn_idx": 1}]
    probe = ProbeInput(probe={"probe_id": "p", "kind": "next_response", "session_idx": 2, "turn_idx": 2,
                              "respondent": "Bob", "request": "Any news?"},
                       episode={"episode_id": "e1", "speakers": ["Ann", "Bob"]}, history={}, current=current)
    answer = asyncio.run(MemoChat().answer(MethodContext(settings=MemoChatSettings(preset="original"), llm=llm), probe,
                                           {"memos": memos}))
    assert answer.used_ids == ["1:0", "1:2", "1:3"]  # all chosen but NOTO: no cap
    retrieval = llm.calls[0]["messages"][-1]["content"]
    assert "earlier words" not in retrieval and "(just started)" in retrieval
    assert llm.calls[0]["params"]["temperature"] == 0.2


def test_mem0_pooled_retrieval_and_our_answer_frame_are_settings():
    ctx = MethodContext(settings=Mem0Settings(), llm=FakeChat(responder=mem0_responder), embed=embed)
    built = asyncio.run(Mem0Style().build(ctx, mem0_episode()))
    last = [f for f in built["facts"] if f["snapshot_session"] == 2]
    probe = ProbeInput(probe={"probe_id": "qa:1", "kind": "qa", "session_idx": 3, "respondent": "Bob",
                              "request": "Is Ann in Leeds now?"},
                       episode={"episode_id": "e1", "speakers": ["Ann", "Bob"]}, history={}, current=[])
    llm = FakeChat(responder=mem0_responder)
    settings = Mem0Settings(top_k=1, per_speaker=False, answer_prompt="ours")
    answer = asyncio.run(Mem0Style().answer(MethodContext(settings=settings, llm=llm, embed=embed), probe,
                                            {"facts": last}))
    prompt = llm.calls[0]["messages"][-1]["content"]
    assert llm.calls[0]["messages"][0]["content"] != MEM0_ANSWER_SYSTEM  # the memory baselines' frame
    assert "Memories about Ann:\n2023-05-02: Ann moved to Leeds" in prompt and "Memories about Bob:\n(none)" in prompt
    assert len(answer.used_ids) == 1  # top_k pooled over both speakers


def test_memochat_also_writes_once_the_pending_lines_pass_write_words():
    seen = []

    def responder(messages, schema):
        seen.append(len(lines(messages[-1]["content"])))
        return {"topics": [{"topic": "camping", "summary": "a trip", "start": 1}]}

    episode = EpisodeInput(episode={"episode_id": "e1", "speakers": ["Ann", "Bob"]}, sessions=_memochat_turns(6))
    # Each line is "Ann: line i about camping" (5 words): past 12 words after the third line.
    asyncio.run(MemoChat().build(MethodContext(settings=MemoChatSettings(write_words=12, close_topics=True),
                                               llm=FakeChat(responder=responder)), episode))
    assert seen == [3, 3]


def lines(prompt: str) -> dict[int, str]:
    return {int(n): text for n, text in re.findall(r"^\((\d+)\) (.*)$", prompt, re.MULTILINE)}
