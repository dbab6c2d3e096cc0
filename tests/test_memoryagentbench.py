"""MemoryAgentBench: the loader (one episode per context, its chunks as sessions, its questions as QA rows
with competency and task as category, strict errors) on a fixture in the release's layout (one file
per competency split, rows of context / questions / answers / metadata, as `mempipe data fetch` writes
the hub's Parquet files as JSON Lines)."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.corpus import load_corpus, sources
from pipeline.corpus.fetch import _ParquetToJsonl, fetch
from pipeline.corpus.memoryagentbench import (
    CHUNK_TOKENS,
    JUDGE_NOTES,
    _sentences,
    _token_count,
    chunk_context,
    competency_of,
    encode_answers,
    gold_answers,
    source_of,
)
from pipeline.errors import InputError

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "corpora" / "memoryagentbench"
CR_FILE = FIXTURE / "Conflict_Resolution-00000-of-00001.jsonl"
AR_FILE = FIXTURE / "Accurate_Retrieval-00000-of-00001.jsonl"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write(tmp_path: Path, name: str, rows: list[dict]) -> Path:
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


# --- the loader -------------------------------------------------------------------------------------

def test_each_context_is_an_episode_whose_chunks_are_sessions_of_one_user_turn():
    corpus = load_corpus("memoryagentbench", FIXTURE)
    episodes = {e["episode_id"]: e for e in corpus.episodes}
    assert set(episodes) == {
        "memoryagentbench-eventqa_full-0", "memoryagentbench-ruler_qa1_197K-0",
        "memoryagentbench-factconsolidation_sh_6k-0", "memoryagentbench-infbench_sum_eng_shots2-0",
        "memoryagentbench-recsys_redial_full-0", "memoryagentbench-icl_banking77_5900shot_balance-0"}
    facts = [t for t in corpus.turns if t["episode_id"] == "memoryagentbench-factconsolidation_sh_6k-0"]
    assert episodes["memoryagentbench-factconsolidation_sh_6k-0"]["n_sessions"] == len(facts) == 3
    assert [t["session_idx"] for t in facts] == [1, 2, 3] and {t["speaker"] for t in facts} == {"user"}
    context = _rows(CR_FILE)[0]["context"]
    assert " ".join(t["text"] for t in facts) == context  # the chunks, in order, are the whole context
    # each chunk's sentences fit the budget, counted one by one as the official chunker counts them,
    # and the next chunk's first sentence would not have fitted
    count, split = _token_count(), _sentences()
    sizes = [[count(s) for s in split(t["text"])] for t in facts]
    assert all(sum(chunk) <= CHUNK_TOKENS for chunk in sizes)
    assert all(sum(chunk) + nxt[0] > CHUNK_TOKENS for chunk, nxt in zip(sizes, sizes[1:]))


def test_questions_pair_with_their_answers_and_carry_competency_and_task_as_category():
    corpus = load_corpus("memoryagentbench", FIXTURE)
    qa = {q["qa_id"]: q for q in corpus.qa}
    assert qa["factconsolidation_sh_6k_0_q0"]["category"] == "Conflict_Resolution/factconsolidation_sh_6k"
    assert gold_answers(qa["factconsolidation_sh_6k_0_q1"]["answer"]) == ["Lisbon", "Lisboa"]
    assert qa["eventqa_full_0_q1"]["answer"] == "Mr. Hale"
    assert qa["icl_banking77_0_q1"]["category"] == "Test_Time_Learning/icl_banking77_5900shot_balance"
    assert qa["infbench_sum_0_q0"]["category"] == "Long_Range_Understanding/infbench_sum_eng_shots2"
    # one question takes every answer given: recsys's gold movie ids
    assert gold_answers(qa["recsys_redial_full_0_q0"]["answer"]) == ["7001", "7002", "7003"]
    assert all(q["evidence"] is None for q in corpus.qa)


def test_a_question_without_qa_pair_ids_is_numbered_and_a_file_not_named_for_a_split_uses_the_task(tmp_path):
    rows = _rows(CR_FILE)
    rows[0]["metadata"]["qa_pair_ids"] = None
    corpus = load_corpus("memoryagentbench", _write(tmp_path, "mine.jsonl", rows))
    assert [q["qa_id"] for q in corpus.qa] == ["1", "2"]
    assert corpus.qa[0]["category"] == "Conflict_Resolution/factconsolidation_sh_6k"
    assert competency_of("Test_Time_Learning-00000-of-00001", "anything") == "Test_Time_Learning"
    assert competency_of("mine", "detective_qa") == "Long_Range_Understanding"
    assert competency_of("mine", "new_task") is None


def test_gold_strings_round_trip_through_the_answer_field():
    for golds in (["Paris"], ["Paris", "paris, France"], ['["not a list"]'], ["[1, 2]"], ["[\"a\", \"b\"]"]):
        assert gold_answers(encode_answers(golds)) == golds
    assert encode_answers(["Paris"]) == "Paris" and gold_answers(None) == []


def test_chunks_join_whole_sentences_up_to_the_token_budget():
    text = "One two three. Four five six seven. Eight. " + "A very long sentence " * 20 + "ends here. Last one."
    chunks = chunk_context(text, chunk_tokens=8)
    count = _token_count()
    assert chunks[0] == "One two three. Four five six seven." or count("One two three. Four five six seven. Eight.") > 8
    assert " ".join(chunks) == " ".join(text.split(" ")).strip()
    # the long sentence is a chunk of its own, with no empty chunk before it
    assert all(chunks) and any(count(c) > 8 for c in chunks)
    assert all(count(c) <= 8 for c in chunks if c.count(".") > 1)


@pytest.mark.parametrize("mutate, record, field, words", [
    (lambda r: r[0].pop("context"), "memoryagentbench-factconsolidation_sh_6k-0 (line 1)", "context", "missing"),
    (lambda r: r[0]["answers"].pop(), "memoryagentbench-factconsolidation_sh_6k-0 (line 1)", "answers",
     "1 answers for 2 questions"),
    (lambda r: r[0]["answers"][1].__setitem__(0, 7), "memoryagentbench-factconsolidation_sh_6k-0 (line 1)",
     "answers[1][0]", "expected a string"),
    (lambda r: r[0]["metadata"]["qa_pair_ids"].pop(), "memoryagentbench-factconsolidation_sh_6k-0 (line 1)",
     "metadata.qa_pair_ids", "1 ids for 2 questions"),
    (lambda r: r[0]["metadata"].pop("source"), "line 1", "metadata.source", "missing"),
    (lambda r: r[0]["questions"].__setitem__(0, None), "memoryagentbench-factconsolidation_sh_6k-0 (line 1)",
     "questions[0]", "expected a string"),
])
def test_a_malformed_record_names_file_record_and_field(tmp_path, mutate, record, field, words):
    rows = copy.deepcopy(_rows(CR_FILE))
    mutate(rows)
    path = _write(tmp_path, CR_FILE.name, rows)
    with pytest.raises(InputError) as caught:
        load_corpus("memoryagentbench", path)
    err = caught.value
    assert (err.file, err.record, err.field) == (str(path), record, field), str(err)
    assert words in err.message and "\n" not in str(err)


def test_a_task_of_no_known_competency_in_a_file_not_named_for_one_is_an_error(tmp_path):
    rows = _rows(CR_FILE)
    rows[0]["metadata"]["source"] = "new_task"
    path = _write(tmp_path, "mine.jsonl", rows)
    with pytest.raises(InputError, match="belongs to no known competency") as caught:
        load_corpus("memoryagentbench", path)
    assert caught.value.field == "metadata.source"


def test_the_hub_parquet_as_fetch_writes_it_loads_like_the_fixture(tmp_path):
    # The release's schema (the dataset card's features): answers a list of lists, metadata a struct.
    meta = pa.struct([("demo", pa.string()), ("keypoints", pa.list_(pa.string())),
                      ("previous_events", pa.list_(pa.string())), ("qa_pair_ids", pa.list_(pa.string())),
                      ("question_dates", pa.list_(pa.string())), ("question_ids", pa.list_(pa.string())),
                      ("question_types", pa.list_(pa.string())), ("source", pa.string())])
    schema = pa.schema([("context", pa.string()), ("questions", pa.list_(pa.string())),
                        ("answers", pa.list_(pa.list_(pa.string()))), ("metadata", meta)])
    rows = _rows(AR_FILE)
    for r in rows:
        r["metadata"].pop("haystack_sessions")
    parquet = tmp_path / "Accurate_Retrieval-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), parquet)
    target = tmp_path / "memoryagentbench" / "Accurate_Retrieval.jsonl"
    target.parent.mkdir()
    _ParquetToJsonl(target)(str(parquet), "download", None)
    got, want = load_corpus("memoryagentbench", target), load_corpus("memoryagentbench", AR_FILE)
    assert [q["answer"] for q in got.qa] == [q["answer"] for q in want.qa]
    assert [t["text"] for t in got.turns] == [t["text"] for t in want.turns]
    assert {q["category"] for q in got.qa} == {"Accurate_Retrieval/eventqa_full", "Accurate_Retrieval/ruler_qa1_197K"}


def test_a_tasks_contexts_are_numbered_from_0_in_the_order_read_wherever_the_split_holds_them(tmp_path):
    rows = _rows(FIXTURE / "Conflict_Resolution-00000-of-00001.jsonl")
    other = json.loads(json.dumps(rows[0]))
    other["metadata"]["source"] = "factconsolidation_mh_6k"
    (tmp_path / "Conflict_Resolution-00000-of-00001.jsonl").write_text(
        "\n".join(json.dumps(r) for r in [other, rows[0], rows[0]]) + "\n")
    ids = [e["episode_id"] for e in load_corpus("memoryagentbench", tmp_path).episodes]
    assert ids == ["memoryagentbench-factconsolidation_mh_6k-0", "memoryagentbench-factconsolidation_sh_6k-0",
                   "memoryagentbench-factconsolidation_sh_6k-1"]
    picked = load_corpus("memoryagentbench", tmp_path, episode_ids=["factconsolidation_sh_6k-1"])
    assert [e["episode_id"] for e in picked.episodes] == ["memoryagentbench-factconsolidation_sh_6k-1"]


# --- mempipe data fetch -----------------------------------------------------------------------------

def test_fetch_writes_each_split_as_json_lines_in_the_directory_the_loader_reads(mirror, tmp_path):
    source = sources.REGISTRY["memoryagentbench"]
    splits = [f for f in source.files if f.unpack == "parquet_to_jsonl"]
    assert source.corpus_format == "memoryagentbench" and len(splits) == 4 == len(source.files) - 1
    [entities] = [f for f in source.files if f not in splits]  # the movie titles, beside the corpus
    mirror.serve(entities.url, json.dumps({"http://dbpedia.org/resource/Memento_(film)": 7001}).encode())
    for remote in splits:
        split = Path(remote.fname).name.split("-", 1)[0]
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(_rows(FIXTURE / f"{split}-00000-of-00001.jsonl")), buf)
        mirror.serve(remote.url, buf.getvalue())
    got = fetch("memoryagentbench", tmp_path, progress=False, base_url_override=mirror.url)
    assert sorted(f.path.name for f in got) == sorted(["entity2id.json", *(f"{s}.jsonl" for s in (
        "Accurate_Retrieval", "Test_Time_Learning", "Long_Range_Understanding", "Conflict_Resolution"))])
    fetched = load_corpus("memoryagentbench", tmp_path / source.corpus_path)
    want = load_corpus("memoryagentbench", FIXTURE)
    assert sorted(q["qa_id"] for q in fetched.qa) == sorted(q["qa_id"] for q in want.qa)
    assert {q["category"].split("/")[0] for q in fetched.qa} == {
        "Accurate_Retrieval", "Test_Time_Learning", "Long_Range_Understanding", "Conflict_Resolution"}


# --- what the official judges read beside the gold ----------------------------------------------------

def test_longmemeval_questions_keep_their_type_and_abstention_and_summaries_their_key_points(tmp_path):
    rows = _rows(AR_FILE)[:1]
    rows[0]["metadata"].update(source="longmemeval_s*", qa_pair_ids=None,
                               question_ids=["gpt4_1a2b", "gpt4_3c4d_abs"],
                               question_types=["temporal-reasoning", "multi-session"])
    corpus = load_corpus("memoryagentbench", _write(tmp_path, "Accurate_Retrieval-00000-of-00001.jsonl", rows))
    by_id = {q["qa_id"]: q for q in corpus.qa}
    assert [by_id[i][JUDGE_NOTES] for i in ("1", "2")] == [["temporal-reasoning"], ["multi-session"]]
    assert [by_id[i]["abstention"] for i in ("1", "2")] == [False, True]
    # the category stays the task's, one report row per task
    assert {q["category"] for q in corpus.qa} == {"Accurate_Retrieval/longmemeval_s*"}
    assert source_of("Accurate_Retrieval/longmemeval_s*") == "longmemeval_s*" and source_of("odd") is None
    fixture = {q["qa_id"]: q for q in load_corpus("memoryagentbench", FIXTURE).qa}
    assert fixture["infbench_sum_0_q0"][JUDGE_NOTES] == ["the lamp failed"]
    assert fixture["eventqa_full_0_q0"][JUDGE_NOTES] is None and fixture["eventqa_full_0_q0"]["abstention"] is None


def test_key_points_fall_back_to_the_short_key_points_and_a_type_list_must_match_the_questions(tmp_path):
    rows = _rows(FIXTURE / "Long_Range_Understanding-00000-of-00001.jsonl")
    rows[0]["metadata"]["keypoints"] = None
    rows[0]["metadata"]["summary/short_keypoints"] = ["a", "b"]
    corpus = load_corpus("memoryagentbench", _write(tmp_path, "Long_Range_Understanding-00000-of-00001.jsonl", rows))
    assert corpus.qa[0][JUDGE_NOTES] == ["a", "b"]
    bad = _rows(CR_FILE)
    bad[0]["metadata"]["question_types"] = ["single-session-user"]
    with pytest.raises(InputError, match="1 entries for 2 questions") as caught:
        load_corpus("memoryagentbench", _write(tmp_path, CR_FILE.name, bad))
    assert caught.value.field == "metadata.question_types"
