"""SeCom re-audit, round 2 (shared/audits/round2/secom.md): BM25 as the official retriever builds
it, the official answer frame, Table 6's turn-level top-k, the zero-shot segmentation prompt
without a rule of our own, compressed keys kept as LLMLingua-2 returns them, and the sheets
listing what is ours."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest
from pipeline.testing.fake_chat import FakeChat
from rank_bm25 import BM25Okapi

import stages
from pipeline.reproduction import deviations
from pipeline.retrieval import Retriever, bm25_scores, tokenize
from stages.methods.base import MethodContext, ProbeInput
from stages.methods.baselines.history import FullHistory, ZeroHistory
from stages.methods.shared.response import build_secom_chat_messages, generate
from stages.methods.secom.retrieval import SeCom, TurnLevel
from stages.methods.secom.segmentation import Numbered, build_segmentation_messages
from stages.methods.secom.units import unit_retriever

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
QA_CONFIGS = ["secom_locomo", "secom_longmtbench"]
RETRIEVAL = ("secom", "turn", "session")
ALL_METHODS = (*RETRIEVAL, "full_history", "zero_history")


def config(name: str, overrides: list[str] | None = None):
    return stages.load_config(CONFIGS / f"{name}.yaml", overrides)


def run(coro):
    return asyncio.run(coro)


# ---------------------------------------------------------------- BM25 (row 11)

DOCS = ["Caroline: I went to the LGBTQ support group yesterday.",
        "Melanie: Painting the fence took all weekend!",
        "Caroline: The support group was so welcoming.",
        "Melanie: caroline, the fence is green now."]


def test_whitespace_okapi_bm25_scores_as_langchains_bm25retriever_builds_rank_bm25():
    """langchain's BM25Retriever: str.split terms (case and punctuation kept), rank_bm25's BM25Okapi
    with its defaults (k1 1.5, b 0.75, a negative idf floored at 0.25 x the mean idf)."""
    query = "Caroline support group fence"
    official = BM25Okapi([d.split() for d in DOCS]).get_scores(query.split())
    ours = bm25_scores(query, DOCS, tokens="whitespace", idf="okapi")
    assert np.allclose(ours, official)
    r = Retriever(ids=["a", "b", "c", "d"], texts=DOCS, token_counts=[1] * 4, bm25_tokens="whitespace", bm25_idf="okapi")
    assert np.allclose(r.bm25(query), official)
    # "Caroline:" and "fence," are other terms than "Caroline" and "fence" under whitespace splitting
    assert tokenize("Caroline: the fence, GREEN", "whitespace") == ["Caroline:", "the", "fence,", "GREEN"]


def test_the_default_bm25_stays_lowercased_words_with_lucenes_idf():
    assert tokenize("Caroline: the fence, GREEN") == ["caroline", "the", "fence", "green"]
    query = "caroline fence"
    words = [tokenize(d) for d in DOCS]
    n = len(DOCS)
    assert np.allclose(bm25_scores(query, DOCS), bm25_scores(query, DOCS, tokens="words", idf="lucene"))
    df = sum("fence" in w for w in words)
    lucene = math.log(1 + (n - df + 0.5) / (df + 0.5))
    okapi = BM25Okapi(words)
    assert okapi.idf["fence"] != pytest.approx(lucene)  # the two idfs differ: the option matters


def test_unit_retriever_and_methods_pass_the_bm25_variant_through():
    pool = [{"unit_id": f"turn:1:{i}", "text": d, "compressed_text": d} for i, d in enumerate(DOCS)]
    r = unit_retriever(pool, use_compression=True, bm25_tokens="whitespace", bm25_idf="okapi")
    assert (r.bm25_tokens, r.bm25_idf) == ("whitespace", "okapi")
    assert (unit_retriever(pool, use_compression=True).bm25_tokens, TurnLevel.Settings().bm25_idf) == ("words", "lucene")


@pytest.mark.parametrize("name", QA_CONFIGS)
def test_secom_configs_build_bm25_as_the_official_retriever(name):
    cfg = config(name)
    for m in RETRIEVAL:
        s = getattr(cfg.method, m)
        assert (s.bm25_tokens, s.bm25_idf) == ("whitespace", "okapi"), m
        assert cfg.paper.protocol[f"method.{m}.bm25_tokens"].value == "whitespace"
    devs = deviations(config(name, ["method.turn.bm25_tokens=words"]))
    assert [(d.path, d.paper, d.run) for d in devs] == [("method.turn.bm25_tokens", "whitespace", "words")]


# ---------------------------------------------------------------- answer frame (D2, D6)

UNITS = [{"unit_id": "segment:3:0", "session_idx": 3, "turn_start": 0, "turn_end": 1, "text": "A: late talk\nB: yes"},
         {"unit_id": "segment:1:0", "session_idx": 1, "turn_start": 0, "turn_end": 1, "text": "A: early talk\nB: ok"}]


def _probe(dataset: str, request: str = "Where did A go?") -> ProbeInput:
    return ProbeInput(probe={"kind": "qa", "probe_id": "p", "session_idx": 4, "request": request, "category": "temporal"},
                      episode={"dataset": dataset, "speakers": ["A", "B"]}, history={}, current=[])


def test_secom_chat_is_one_user_message_with_units_in_the_order_given_and_the_question_last():
    """experiment/chat.py: one user message: the frame, the retrieved units in the order given (time
    or rank order: `generate`'s `secom_chat_order`) joined by a blank line, then "Question: ..."; no
    system message, no session headers."""
    msgs = build_secom_chat_messages(UNITS, "Where did A go?")
    assert [m["role"] for m in msgs] == ["user"]
    text = msgs[0]["content"]
    assert "A: late talk\nB: yes\n\nA: early talk\nB: ok" in text  # as given
    assert text.rstrip().endswith("Question: Where did A go?") and "[Session" not in text
    frame = text.split("\n\n")[0].lower()
    # chat.py's elements, in our words: a dialogue agent; evidence for the user's input and recent
    # dialogue with it; read, memorise and understand; one reply, concise, coherent and helpful
    for element in ("conversational agent", "evidence", "user's input", "recent dialogue between the user and you",
                    "go through the material", "keep it in memory", "make sense of it", "a single reply", "brief",
                    "hangs together", "of real help"):
        assert element in frame, element
    assert "concise, coherent and helpful" not in frame  # the official wording is not copied
    assert build_secom_chat_messages([], "q")[0]["content"].rstrip().endswith("Question: q")


@pytest.mark.parametrize("dataset", ["locomo", "longmtbench"])
def test_generate_asks_in_the_secom_chat_frame_on_both_qa_benchmarks(dataset):
    llm = FakeChat(["He went to Paris.\nQuestion: and then?"])
    ans = run(generate(llm, _probe(dataset), UNITS, "secom_chat"))
    # Sec. 2.1's time order by default (round 3, N4): the earlier session's unit first
    assert llm.calls[0]["messages"] == build_secom_chat_messages(UNITS[::-1], "Where did A go?")
    assert ans.text == "He went to Paris."  # cut where the model writes the next question, as chat.py's get_answer
    assert ans.details["qa_prompt"] == "secom_chat" and ans.context_tokens > 0


@pytest.mark.parametrize("name", QA_CONFIGS)
def test_secom_configs_answer_in_the_official_chat_frame(name):
    cfg = config(name)
    for m in ALL_METHODS:
        assert getattr(cfg.method, m).qa_prompt == "secom_chat", m
        assert "chat.py" in cfg.paper.protocol[f"method.{m}.qa_prompt"].source


def test_history_baselines_take_the_frame_too():
    llm = FakeChat(["x", "y"])
    probe = _probe("locomo")
    probe.history[1] = [{"session_idx": 1, "turn_idx": 0, "speaker": "A", "text": "hello there"}]
    run(FullHistory().answer(MethodContext(settings=FullHistory.Settings(qa_prompt="secom_chat"), llm=llm), probe, {}))
    run(ZeroHistory().answer(MethodContext(settings=ZeroHistory.Settings(qa_prompt="secom_chat"), llm=llm), probe, {}))
    assert "A: hello there\n\nQuestion: Where did A go?" in llm.calls[0]["messages"][0]["content"]
    assert len(llm.calls[1]["messages"]) == 1 and "hello" not in llm.calls[1]["messages"][0]["content"]


# ---------------------------------------------------------------- turn-level top-k (D7)

def test_locomo_turn_level_retrieves_a_fixed_55_exchanges_as_table_6_counts_them():
    cfg = config("secom_locomo")
    turn = cfg.method.turn
    assert (turn.top_k, turn.token_budget) == (55, None)
    assert "55.00" in cfg.paper.protocol["method.turn.top_k"].source
    # round 3 (N11): SeCom's budget 3,600, room for Table 6's 3,565 mean; session-level 3,500
    for m, budget in (("secom", 3600), ("session", 3500)):
        assert (getattr(cfg.method, m).top_k, getattr(cfg.method, m).token_budget) == (None, budget)


# ---------------------------------------------------------------- segmentation prompt (D5)

def test_the_zero_shot_segmentation_prompt_adds_no_rule_of_our_own():
    """No official prompt tells the model where greetings, acknowledgements or follow-ups go."""
    turns = [{"speaker": s, "text": t, "turn_idx": i} for i, (s, t) in
             enumerate([("A", "hi"), ("B", "hello"), ("A", "seen the game?"), ("B", "yes")])]
    text = " ".join(m["content"] for m in build_segmentation_messages(Numbered.of(turns))).lower()
    for rule in ("greeting", "acknowledg", "follow-up"):
        assert rule not in text, rule
    assert "topic" in text or "subject" in text


# ---------------------------------------------------------------- sheets: what is ours (D11, row 3)

@pytest.mark.parametrize("name", QA_CONFIGS)
def test_full_history_budget_is_listed_in_the_sheet_as_ours(name):
    cfg = config(name)
    setting = cfg.paper.protocol["method.full_history.token_budget"]
    assert setting.value == 14500 == cfg.method.full_history.token_budget
    assert setting.source.startswith("ours") and "16,385" in setting.source


@pytest.mark.parametrize("name", QA_CONFIGS)
def test_the_sheets_name_the_papers_mpnet(name):
    """Sec. 3.1: MPNet multi-qa-mpnet-base-dot-v1 (the official mpnet.yaml names the same checkpoint)."""
    cfg = config(name)
    assert cfg.embedding.model == cfg.paper.protocol["embedding.model"].value == "sentence-transformers/multi-qa-mpnet-base-dot-v1"


# ---------------------------------------------------------------- compressed keys (D8)

class Lingua:
    """A PromptCompressor stand-in: the exchange list comes back as `out`."""

    def __init__(self, out: list[str]) -> None:
        self.out = out

    def compress_prompt(self, context, **kwargs):
        return {"compressed_prompt_list": list(self.out), "compressed_prompt": "\n\n".join(self.out)}


EXCHANGES = ["A: I adopted a puppy named Max last week\nB: Yes.", "A: He loves the beach so much\nB: Nice!"]
SPEAKERS = ["A", "B", "A", "B"]
PRUNED = ["A: adopted  puppy Max  week\nB: .", "A: loves beach\nB: Nice!"]


def compressor(monkeypatch, out, **kwargs):
    from pipeline.compression import Compressor

    c = Compressor(method="llmlingua2", rate=0.75, **kwargs)
    monkeypatch.setattr(c, "_compressor", lambda: Lingua(out))
    return c


def test_llmlingua2_exchanges_are_kept_as_returned_when_restoring_is_off(monkeypatch):
    """The official key is LLMLingua-2's compressed exchanges joined by newlines, untouched: a line
    pruned to "." stays ".", spaces stay as returned."""
    out = compressor(monkeypatch, PRUNED, restore_pruned_lines=False).compress_unit(EXCHANGES, SPEAKERS)
    assert (out.text, out.path, out.restored) == ("\n".join(PRUNED), "per_exchange", 0)


def test_our_tidying_restores_pruned_lines_and_counts_them(monkeypatch):
    out = compressor(monkeypatch, PRUNED).compress_unit(EXCHANGES, SPEAKERS)
    assert out.path == "per_exchange" and out.restored == 1
    assert out.text == "A: adopted puppy Max week\nB: Yes.\nA: loves beach\nB: Nice!"


def test_a_lost_line_or_tag_still_goes_line_by_line_when_restoring_is_off(monkeypatch):
    lost = ["adopted puppy Max\nB: .", "A: loves beach\nB: Nice!"]  # the first line lost "A:"
    assert compressor(monkeypatch, lost, restore_pruned_lines=False).compress_unit(EXCHANGES, SPEAKERS).path == "per_line"


def test_the_compress_stage_records_restored_lines(monkeypatch):
    from stages.methods.secom.stages.compress import compress_units

    turns = [{"episode_id": "e", "session_idx": 1, "turn_idx": i, "speaker": s, "text": line.split(": ", 1)[1]}
             for i, (s, line) in enumerate(zip(SPEAKERS, "\n".join(EXCHANGES).split("\n")))]
    rows = compress_units(compressor(monkeypatch, PRUNED), {1: turns}, [], ["session"], "llmlingua2@0.75")
    assert [(r["compression_path"], r["restored_lines"]) for r in rows] == [("per_exchange", 1)]


@pytest.mark.parametrize("name", QA_CONFIGS)
def test_secom_configs_index_compressed_exchanges_as_returned(name):
    cfg = config(name)
    assert cfg.compress.restore_pruned_lines is False
    assert "secom.py" in cfg.paper.protocol["compress.restore_pruned_lines"].source


# ---------------------------------------------------------------- the official answer's shape (D9)

def _session(n: int) -> list[dict]:
    return [{"episode_id": "e", "session_idx": 1, "turn_idx": i, "speaker": "A" if i % 2 == 0 else "B",
             "text": f"utterance {i}"} for i in range(n)]


def test_counted_answers_number_from_0_with_ids_counts_and_full_summaries():
    """segment_with_exchange_number.md: exchanges from 0; per segment an id from 0, its first and
    last exchange, how many it holds (summing to the session's) and a summary of at most 100 words
    with every key detail, without narrative openers."""
    from stages.methods.secom.segmentation import CountedAnswer, segment_session

    answer = {"segments": [{"segment_id": 0, "start": 0, "end": 1, "count": 2, "summary": "Max the puppy."},
                           {"segment_id": 1, "start": 2, "end": 2, "count": 1, "summary": "The beach."}]}
    llm = FakeChat([answer])
    res = run(segment_session(llm, _session(6), answer_format="counted"))
    call = llm.calls[0]
    assert call["schema"] is CountedAnswer
    prompt = call["messages"][1]["content"]
    assert "numbered 0 to 2" in prompt and "Exchange 0:\n[A]: utterance 0\n[B]: utterance 1" in prompt
    assert "Exchange 3:" not in prompt
    for element in ("segment_id", "count", "100 words", "every key detail", "add up to 3"):
        assert element in prompt, element
    assert res.segments == [(0, 3), (4, 5)] and res.summaries == ["Max the puppy.", "The beach."] and not res.fallback


@pytest.mark.parametrize("bad,error", [
    ({"segment_id": 1, "start": 2, "end": 2, "count": 2}, "holds 1"),
    ({"segment_id": 5, "start": 2, "end": 2, "count": 1}, "segment_id 5"),
    ({"segment_id": 1, "start": 3, "end": 3, "count": 1}, "out of range"),
])
def test_a_wrong_count_id_or_number_is_re_asked_with_the_error(bad, error):
    from stages.methods.secom.segmentation import segment_session

    first = {"segment_id": 0, "start": 0, "end": 1, "count": 2, "summary": "x"}
    good = {"segments": [first, {"segment_id": 1, "start": 2, "end": 2, "count": 1, "summary": "y"}]}
    llm = FakeChat([{"segments": [first, {**bad, "summary": "y"}]}, good])
    res = run(segment_session(llm, _session(6), answer_format="counted"))
    assert llm.calls[0]["attempts"] == 2 and error in str(llm.calls[0].get("errors"))
    assert res.segments == [(0, 3), (4, 5)]


def test_counted_examples_are_shown_in_the_same_numbering():
    from stages.methods.secom.segmentation import SegmentationGuidance

    g = SegmentationGuidance(examples=[{"conversation": "Exchange 1:\n[A]: hi\n\nExchange 2:\n[A]: bye",
                                        "segments": [[1, 1], [2, 2]], "prediction": [[1, 2]]}])
    text = build_segmentation_messages(Numbered.of(_session(4)), g, "counted")[1]["content"]
    assert "Exchange 0:\n[A]: hi\n\nExchange 1:\n[A]: bye" in text
    assert '{"segment_id": 0, "start": 0, "end": 0, "count": 1' in text
    assert '{"segment_id": 0, "start": 0, "end": 1, "count": 2' in text  # the wrong answer, same numbering


@pytest.mark.parametrize("name", [*QA_CONFIGS, "secom_dialseg"])
def test_secom_configs_ask_for_the_official_answer_shape(name):
    cfg = config(name)
    assert cfg.segment.answer_format == "counted"
    assert "segment_with_" in cfg.paper.protocol["segment.answer_format"].source


# ---------------------------------------------------------------- degenerate answers counted (row 20)

def test_the_segment_manifest_counts_degenerate_model_answers():
    from stages.methods.secom.stages.segment import SegmentStage

    def row(session, start, end, fallback=False):
        return {"episode_id": "e", "session_idx": session, "turn_start": start, "turn_end": end,
                "fallback": fallback, "normalised": False}

    rows = [row(1, 0, 9),  # a 10-turn session left whole
            *[row(2, t, t) for t in range(4)],  # every turn a segment of its own
            row(3, 0, 3), row(3, 4, 5),  # a real answer
            row(4, 0, 2, True), row(4, 3, 5, True)]  # fallback chunks are not the model's
    stats = SegmentStage().shard_stats({"segments": rows})
    assert (stats["sessions"], stats["model_sessions"], stats["fallback_sessions"]) == (4, 3, 1)
    assert (stats["one_segment_sessions"], stats["one_turn_segment_sessions"]) == (1, 1)
