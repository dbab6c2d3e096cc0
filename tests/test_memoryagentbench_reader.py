"""MemoryAgentBench's reader (stages/methods/shared/memoryagentbench_reader.py): the official agents'
requests per task (utils/templates.py, agent.py at 455306d), in our words."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import cast

import pytest
from conftest import llm_config

from pipeline.llm.cache import DiskCallCache
from pipeline.llm.client import LLMClient
from stages.methods.shared import memoryagentbench_reader as mab

CATEGORIES: dict[mab.Task, str] = {
    "ruler_qa": "Accurate_Retrieval/ruler_qa1_197k",
    "longmemeval": "Accurate_Retrieval/longmemeval_s*",
    "eventqa": "Accurate_Retrieval/eventqa_full",
    "in_context_learning": "Test_Time_Learning/icl_banking77_5900shot_balance",
    "recsys_redial": "Test_Time_Learning/recsys_redial_full",
    "infbench_sum": "Long_Range_Understanding/infbench_sum_eng_shots2",
    "detective_qa": "Long_Range_Understanding/detective_qa",
    "factconsolidation": "Conflict_Resolution/factconsolidation_sh_6k",
}
# Distinctive words of each task's query (our wording of the official instruction)
QUERY_WORDS = {
    "ruler_qa": ["documents you have memorised", "answer alone", "no other words"],
    "longmemeval": ["between you and a user", "as briefly as you can", "single phrase"],
    "eventqa": ["context you have memorised", "The next event to happen is:"],
    "in_context_learning": ["numerical label", 'Output "label: {label}" only'],
    "recsys_redial": ["movie recommender system", "20 recommendations", "no other sentences",
                      "1.movie1\n2.movie2"],
    "infbench_sum": ["A book was given to you above", "summarise it", "Now write the summary of the book."],
    "detective_qa": ["context you have memorised", "strictly to the output format"],
    "factconsolidation": ["knowledge management system", "serial number", "newer fact carries a larger serial number",
                          "**only** from the knowledge pool", "not from what is true in the real world",
                          "who is the current president of Russia?\nAnswer: Donald Trump"],
}
# What the user calls a chunk in its memorise frame
MATERIAL = {
    "ruler_qa": "the documents I have read", "longmemeval": "the conversation between the user and the assistant",
    "eventqa": "an excerpt from a book", "in_context_learning": "the examples I have learned from",
    "recsys_redial": "dialogues between a user and a recommender system", "infbench_sum": "the book I have read",
    "detective_qa": "the book I have read", "factconsolidation": "the facts I have learned",
}
MAX_TOKENS: dict[mab.Task, int] = {"ruler_qa": 50, "longmemeval": 50, "eventqa": 40, "in_context_learning": 20,
                                   "recsys_redial": 300, "infbench_sum": 1200, "detective_qa": 2000,
                                   "factconsolidation": 10}


def unit(i: int, text: str | None = None, when: datetime | None = None) -> dict:
    return {"unit_id": f"u{i}", "session_idx": i, "turn_start": 0, "turn_end": 0,
            "text": text or f"chunk number {i} says lorem{i}.", "session_time": when}


BAD_FRAME = cast(mab.Frame, "agentic")  # not a frame of ours (the official agentic-memory agent is not mirrored)
UNITS = [unit(0, when=datetime(2025, 3, 1, 9, 30)), unit(1), unit(2)]


def test_every_official_source_maps_to_its_task_as_the_official_normalisation_does():
    for task, category in CATEGORIES.items():
        assert mab.task_of(category) == task
        assert mab.task_of(category.split("/", 1)[1]) == task  # a bare source as well
    assert mab.task_of("Accurate_Retrieval/ruler_qa2_421K") == "ruler_qa"
    assert mab.task_of("Conflict_Resolution/factconsolidation_mh_262k") == "factconsolidation"
    assert mab.task_of("Test_Time_Learning/icl_trec_fine_6400shot_balance") == "in_context_learning"
    assert mab.task_of("longmemeval_s_-1_500") == "longmemeval"
    assert set(mab.PROMPTS) == set(mab.TASKS) == set(CATEGORIES)


def test_an_unknown_source_is_refused_naming_it():
    with pytest.raises(ValueError, match="novel_qa_x"):
        mab.task_of("Long_Range_Understanding/novel_qa_x")
    with pytest.raises(ValueError, match="ruler_niah"):  # "ruler_" without "qa" is no task
        mab.task_of("ruler_niah")


@pytest.mark.parametrize("task", list(CATEGORIES))
def test_the_long_context_agent_sees_every_chunk_memorised_in_order_then_the_query(task):
    messages = mab.build_messages(UNITS, "QUESTION-TEXT", task, "long_context")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == mab.SYSTEM
    assert "keep it in memory" in mab.SYSTEM
    user = messages[1]["content"]
    # every chunk as a User/Assistant memorise dialogue, in the order given, the query after them
    places = [user.index(u["text"]) for u in UNITS]
    assert places == sorted(places)
    assert user.count("Dialogue between User and Assistant") == 3
    assert user.count(f"<User> The context below is {MATERIAL[task]}:") == 3
    assert user.count("<Assistant> ") == 3 and "I will answer whatever you ask" in user
    ask = mab.query("QUESTION-TEXT", task, "long_context")
    assert user.endswith("\n" + ask)
    assert user.index(ask) > places[-1]
    assert "QUESTION-TEXT" in ask and "Memory 1:" not in user
    for words in QUERY_WORDS[task]:
        assert words in ask
    # the time stamp: the chunk's session time, none when it has none; longmemeval's frame has none
    stamped = "Dialogue between User and Assistant 2025-03-01 09:30:00\n" in user
    assert stamped == (task != "longmemeval")


@pytest.mark.parametrize("task", list(CATEGORIES))
def test_the_rag_agent_sees_only_the_retrieved_chunks_in_rank_order_then_the_query(task):
    ranked = [UNITS[2], UNITS[0]]
    messages = mab.build_messages(ranked, "QUESTION-TEXT", task, "rag")
    assert [m["role"] for m in messages] == ["system", "user"] and messages[0]["content"] == mab.SYSTEM
    user = messages[1]["content"]
    assert UNITS[1]["text"] not in user
    assert user.index("Memory 1:\n") < user.index(UNITS[2]["text"]) < user.index("Memory 2:\n") \
        < user.index(UNITS[0]["text"])
    assert "Memory 3:" not in user
    assert user.count(f"<User> The context below is {MATERIAL[task]}:") == 2
    ask = mab.query("QUESTION-TEXT", task, "rag")
    assert user.endswith("\n" + ask)
    for words in QUERY_WORDS[task]:
        assert words in ask


def test_the_two_frames_ask_alike_but_for_ruler_and_icl():
    for task in mab.TASKS:
        same = mab.query("Q?", task, "long_context") == mab.query("Q?", task, "rag")
        assert same == (task not in ("ruler_qa", "in_context_learning"))
    assert mab.query("Q?", "ruler_qa", "long_context").endswith("Question: Q?\n\nAnswer:")
    assert mab.query("Q?", "ruler_qa", "rag").endswith("Now answer the question: Q?")
    assert mab.query("Q?", "in_context_learning", "long_context").endswith("\n\nQ?\n\nlabel:")
    assert mab.query("Q?", "in_context_learning", "rag").endswith("\n\nQuestion: Q?\n\nlabel:")


def test_a_question_with_braces_is_put_in_as_it_is():
    ask = mab.query("{movie} and {question}?", "recsys_redial", "rag")
    assert "The conversation: {movie} and {question}?" in ask


def test_the_bm25_query_is_the_question_part_where_the_official_agent_cuts_it():
    assert mab.retrieval_query("who wrote it?", "ruler_qa") == "who wrote it?"
    assert mab.retrieval_query("who leads X?", "factconsolidation") == \
        "According to the Knowledge Pool given, who leads X?\nAnswer:"
    assert mab.retrieval_query("User: hi", "recsys_redial") == "User: hi\n\nRecommendations:\n"
    assert mab.retrieval_query("Q?", "eventqa") == mab.query("Q?", "eventqa", "rag")


def test_the_long_context_agent_keeps_the_newest_tokens_of_its_window():
    units = [unit(i, f"chunk {i} " + "word " * 200) for i in range(5)]
    full = mab.build_messages(units, "Q?", "eventqa", "long_context")[1]["content"]
    cut = mab.build_messages(units, "Q?", "eventqa", "long_context", limit=300)[1]["content"]
    assert len(cut) < len(full)
    assert "chunk 4 " in cut and "chunk 0 " not in cut  # the oldest go first
    assert cut.endswith(mab.query("Q?", "eventqa", "long_context"))
    memory, dropped = mab.dialogue(units, "eventqa", 300)
    assert dropped > 0 and full.startswith("Dialogue") and memory and not cut.startswith("Dialogue")
    assert mab.input_limit("eventqa") == 128000 - 4000 - 40
    assert mab.dialogue(units, "eventqa")[1] == 0  # the default window holds them all


def test_sampling_per_task_is_its_generation_max_length_at_the_main_rows_temperature():
    for task, n in MAX_TOKENS.items():
        assert mab.sampling(task) == {"temperature": 0.7, "max_tokens": n}
    assert mab.MAX_TOKENS == MAX_TOKENS


def test_an_unknown_frame_is_refused():
    with pytest.raises(ValueError, match="frame"):
        mab.build_messages(UNITS, "Q?", "eventqa", BAD_FRAME)


@pytest.mark.parametrize("frame", ["long_context", "rag"])
def test_answer_sends_the_frame_with_the_tasks_sampling_to_the_endpoint(fake_llm, tmp_path, frame):
    fake_llm.responder = lambda body: "  label: 7\n"
    cfg = llm_config(fake_llm, cache_dir=str(tmp_path / "cache"))

    async def ask() -> tuple:
        client = LLMClient(cfg, cache=DiskCallCache(tmp_path / "cache"))
        try:
            return await mab.answer(client, UNITS[:2], "What is the label of: card lost",
                                    CATEGORIES["in_context_learning"], frame=frame)
        finally:
            await client.aclose()

    result, details = asyncio.run(ask())
    assert result.text == "  label: 7\n"  # the reply as written: the caller keeps it raw
    assert details == {"qa_prompt": "memoryagentbench", "task": "in_context_learning", "frame": frame,
                       "sampling": {"temperature": 0.7, "max_tokens": 20},
                       **({"dropped_tokens": 0} if frame == "long_context" else {})}
    chats = [r for r in fake_llm.requests if r["path"] == "/v1/chat/completions"]
    assert len(chats) == 1
    body = chats[0]["body"]
    assert body["max_tokens"] == 20 and body["temperature"] == 0.7
    assert body["messages"] == mab.build_messages(UNITS[:2], "What is the label of: card lost",
                                                  "in_context_learning", frame)
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    user = body["messages"][1]["content"]
    assert user.index(UNITS[0]["text"]) < user.index(UNITS[1]["text"]) < user.index("card lost")
    assert ("Memory 1:" in user) == (frame == "rag")


# --- the reader inside the methods (`qa_prompt: memoryagentbench`) -------------------------------------

def _probe(category: str = CATEGORIES["factconsolidation"], question: str = "Who leads Acme?") -> "ProbeInput":
    from stages.methods.base import ProbeInput

    return ProbeInput(probe={"probe_id": "qa:q1", "kind": "qa", "category": category, "session_idx": 9,
                             "request": question, "respondent": "user"},
                      episode={"dataset": "memoryagentbench", "speakers": ["user"]}, history={}, current=[])


def _bank_unit(i: int) -> dict:
    return {**unit(i), "text": f"user: chunk number {i} says lorem{i}."}  # a bank unit: its turn as a line


@pytest.mark.parametrize("retrieved", [False, True])
def test_generate_asks_with_the_long_context_frame_for_a_history_and_the_rag_frame_for_retrieved_units(retrieved):
    from pipeline.testing.fake_chat import FakeChat
    from stages.methods.shared.response import generate

    chat = FakeChat(["Bob\nuser: and more"])
    ranked = [_bank_unit(2), _bank_unit(0)]  # a retrieval's rank order; a history's would be sorted
    answer = asyncio.run(generate(chat, _probe(), ranked, qa_prompt="memoryagentbench", retrieved=retrieved))
    [call] = chat.calls
    system, user = call["messages"]
    assert system["content"] == mab.SYSTEM and call["params"] == {"temperature": 0.7, "max_tokens": 10}
    shown = user["content"]
    assert "user: chunk" not in shown  # the chunk as the context held it, not the bank's "user:" line
    first, second = shown.index("lorem2"), shown.index("lorem0")
    assert (first < second) == retrieved  # rank order for the RAG agent, time order for the long-context one
    assert ("Memory 1:" in shown) == retrieved
    assert answer.details["frame"] == ("rag" if retrieved else "long_context")
    assert answer.text == "Bob\nuser: and more"  # kept whole: the official scorers parse the raw reply


def test_a_retrieval_method_searches_with_what_the_official_bm25_agent_searches_with():
    from stages.methods.secom.retrieval import search_query

    probe = _probe()
    assert search_query(probe, "memoryagentbench") == mab.retrieval_query("Who leads Acme?", "factconsolidation")
    searched = search_query(probe, "memoryagentbench")
    assert "Who leads Acme?" in searched and "knowledge management system" not in searched  # the question part only
    assert search_query(probe, "ours") == "Who leads Acme?"
