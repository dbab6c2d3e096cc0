"""MemoryAgentBench's per-task scores on constructed cases. Every expected value below was computed once
by the official utils/eval_other_utils.py (HUST-AI-HYZ/MemoryAgentBench at commit
455306dcabc3842526eb83cd4e225e5d486c5c5d), its functions called directly on these cases (its rouge
scorer stubbed out, as none of these values reads it); the last tests score constructed rows through
the response_metrics stage's `mab_*` columns."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import polars as pl
import pyarrow as pa
import pytest

from stages.metrics import memoryagentbench as mab
from stages.report.tables import metric_summary
from stages.scoring.response_metrics import (
    COLUMN_SCORERS,
    MAB_SCORES,
    RESPONSE_METRICS,
    RESPONSE_SCORES,
    ResponseMetricsSettings,
    ResponseMetricsStage,
    entity_titles_reader,
    score_rows,
)


@pytest.mark.parametrize("reply, golds, raw, default", [
    ("The Eiffel Tower.", ["eiffel tower"], (1, 1.0, 1), (1, 1.0, 1)),
    ("Answer: Paris\nBecause the facts say so.", ["Paris", "Lyon"], (0, 0.2857142857142857, 1), (1, 1.0, 1)),
    ("I think it is Paris, France", ["paris"], (0, 0.2857142857142857, 1), (0, 0.2857142857142857, 1)),
    ("yes", ["no"], (0, 0, 0), (0, 0, 0)),
    ("no answer", ["noanswer"], (0, 0, 0), (0, 0, 0)),
    ("An apple a day", ["the apple day"], (1, 1.0, 1), (1, 1.0, 1)),
    ("label: 12\nmore", ["12"], (0, 0.5, 1), (0, 0.6666666666666666, 1)),
    ("answer: answer: Mr. Hale came", ["Mr Hale"], (0, 0.5714285714285715, 1), (0, 0.8, 1)),
    ("U.S.A. won", ["usa"], (0, 0.6666666666666666, 1), (0, 0.6666666666666666, 1)),
])
def test_exact_f1_and_substring_match_take_the_best_gold_and_the_better_of_reply_and_parsed_answer(
        reply, golds, raw, default):
    keys = ("exact_match", "f1", "substring_exact_match")
    assert mab.qa_metrics(reply, golds) == pytest.approx(dict(zip(keys, raw)))
    assert mab.reply_metrics(reply, golds) == pytest.approx(dict(zip(keys, default)))
    assert mab.task_metrics("factconsolidation_sh_6k", reply, golds) == pytest.approx(dict(zip(keys, default)))


def test_normalisation_drops_punctuation_before_articles():
    # "the-end" loses its hyphen first, so "theend" keeps its letters; "a." becomes "a", then a space
    assert mab.normalize_answer("The-End of a. Story!") == "theend of story"
    assert mab.f1("the cat sat on the mat", "a cat on a mat") == pytest.approx(0.8571428571428571)


def test_the_parsed_answer_is_the_rest_of_the_answer_line_else_the_first_line():
    assert mab.parse_output("Answer: Paris\nBecause the facts say so.") == "Paris"
    assert mab.parse_output("answer: answer: Mr. Hale came") == "Mr. Hale came"
    assert mab.parse_output("label: 12\nmore") == "label: 12"


def test_in_context_learning_scores_the_parsed_answer_only():
    assert mab.task_metrics("icl_banking77_5900shot_balance", "label: 12\nmore", ["12"]) == pytest.approx(
        {"exact_match": 0, "f1": 0.6666666666666666, "substring_exact_match": 1})
    assert mab.task_metrics("icl_trec_coarse", "The label is 12", ["12"]) == pytest.approx(
        {"exact_match": 0, "f1": 0.5, "substring_exact_match": 1})


def test_eventqa_recall_needs_every_gold_event_in_the_raw_reply():
    reply = "Mara asks the keeper. Then the Lamp failed and Mr. Hale came"
    assert mab.task_metrics("eventqa_full", reply, ["lamp failed", "mr. hale"]) == pytest.approx(
        {"exact_match": 0, "f1": 0.33333333333333337, "substring_exact_match": 1, "eventqa_recall": 1})
    assert mab.task_metrics("eventqa_64k", "Answer: the lamp failed", ["lamp failed", "mr. hale"]) == pytest.approx(
        {"exact_match": 1, "f1": 1.0, "substring_exact_match": 1, "eventqa_recall": 0})


def test_ruler_niah_recall_is_the_share_of_gold_strings_found():
    assert mab.task_metrics("ruler_niah_mk", "The codes are 123 and 456", ["123", "456", "789"]) == {
        "ruler_recall": pytest.approx(0.6666666666666666)}


def test_recommendations_are_read_after_the_first_numbered_item_or_split_on_commas():
    assert mab.recommended_items("Here you go: 1. Inception (2010)\n2. The Matrix\n3.Memento") == [
        "Inception", "The Matrix", "Memento"]
    assert mab.recommended_items("Inception, Matrix Reloaded, Memento") == ["Inception", "Matrix Reloaded", "Memento"]
    assert mab.movie_title("http://dbpedia.org/resource/The_Matrix_(1999)") == "The Matrix"
    assert mab.movie_title("Spider-Man>2") == "Spider Man 2"


def test_recsys_recall_at_k_counts_gold_titles_among_the_nearest_titles_of_the_first_k():
    titles = ["Inception", "The Matrix", "Memento", "Interstellar", "The Prestige", "Tenet"]
    reply = "Sure! 1. Inceptoin (2010)\n2. Matrix\n3. Tenet\n4. Prestige\n5. Dunkirk\n6. Memento"
    assert [mab.nearest_title(i, titles) for i in mab.recommended_items(reply)] == [
        "Inception", "The Matrix", "Tenet", "The Prestige", "Tenet", "Memento"]
    assert mab.recsys_recall(reply, ["Memento", "Tenet", "Inception"], titles) == pytest.approx(
        {"recsys_recall@1": 1 / 3, "recsys_recall@5": 2 / 3, "recsys_recall@10": 1.0})
    with pytest.raises(ValueError, match="entity2id"):
        mab.task_metrics("recsys_redial_full", reply, ["1"])


def test_no_gold_is_an_error_not_a_zero():
    with pytest.raises(ValueError, match="no gold"):
        mab.qa_metrics("Paris", [])


# --- the movie titles of entity2id.json, and the rows of the response_metrics stage -----------------

ENTITIES = {"http://dbpedia.org/resource/Inception": 7001, "http://dbpedia.org/resource/The_Matrix_(1999)": 7002,
            "Memento_(film)": 7003, "http://dbpedia.org/resource/Tenet": 7004, "The_Prestige": 7005}


def test_entity2id_becomes_the_id_to_title_map_and_gold_ids_are_scored_by_their_titles():
    titles = mab.entity_titles(ENTITIES)
    assert titles == {7001: "Inception", 7002: "The Matrix", 7003: "Memento", 7004: "Tenet", 7005: "The Prestige"}
    assert mab.recsys_gold_ids([" 7003", "7004 "]) == [7003, 7004]
    reply = "Sure! 1. Inceptoin (2010)\n2. Matrix\n3. Tenet"
    assert mab.recsys_metrics(reply, [7004, 7003], titles) == pytest.approx(
        {"recsys_recall@1": 0.0, "recsys_recall@5": 0.5, "recsys_recall@10": 0.5})
    with pytest.raises(ValueError, match="9999"):
        mab.recsys_metrics(reply, [9999], titles)


def test_the_edit_distance_is_the_editdistance_package_levenshtein():
    assert mab.nearest_title("Memnto", ["Inception", "Memento", "Tenet"]) == "Memento"
    assert not hasattr(mab, "edit_distance")  # no hand-written distance beside the library's


def _mab_row(category, response, gold, *, dataset="memoryagentbench", probe_id="q"):
    return {"episode_id": "e1", "dataset": dataset, "probe_id": probe_id, "kind": "qa", "category": category,
            "method": "m", "session_idx": 2, "response": response, "gold": gold}


def _entities_file(tmp_path):
    path = tmp_path / "entity2id.json"
    path.write_text(json.dumps(ENTITIES))
    return str(path)


def test_every_memoryagentbench_question_gets_its_tasks_official_scores_and_no_other_mab_column(tmp_path):
    rows = score_rows([
        _mab_row("Accurate_Retrieval/eventqa_full", "Mara asks the keeper. Then the Lamp failed and Mr. Hale came",
                 json.dumps(["lamp failed", "mr. hale"])),
        _mab_row("Accurate_Retrieval/ruler_niah_mk", "The codes are 123 and 456", json.dumps(["123", "456", "789"])),
        _mab_row("Test_Time_Learning/icl_banking77_5900shot_balance", "label: 12\nmore", "12"),
        _mab_row("Conflict_Resolution/factconsolidation_sh_6k", "Answer: Paris\nBecause.", json.dumps(["Paris", "Lyon"])),
        _mab_row("Accurate_Retrieval/longmemeval_s*/temporal-reasoning", "It was 3 days", "3 days"),
        _mab_row("Test_Time_Learning/recsys_redial_full", "1. Memento\n2. Tenet\n3. Inception",
                 json.dumps(["7004", "7003"])),
        _mab_row("Conflict_Resolution/factconsolidation_sh_6k", None, "Vienna"),  # failed: an empty output
        _mab_row("single-hop", "Paris", "Paris", dataset="locomo"),
    ], entities=_entities_file(tmp_path))
    got = [{k[4:]: v for k, v in r.items() if k.startswith("mab_") and v is not None} for r in rows]
    assert [r["error"] for r in rows] == [None] * 8
    assert got[0] == pytest.approx({"exact_match": 0, "f1": 0.33333333333333337, "substring_exact_match": 1,
                                    "eventqa_recall": 1})
    assert got[1] == {"ruler_recall": pytest.approx(2 / 3)}
    assert got[2] == pytest.approx({"exact_match": 0, "f1": 0.6666666666666666, "substring_exact_match": 1})
    assert got[3] == pytest.approx({"exact_match": 1, "f1": 1.0, "substring_exact_match": 1})
    assert got[4] == pytest.approx(mab.reply_metrics("It was 3 days", ["3 days"]))  # the judged task's defaults
    assert got[5] == pytest.approx({"recsys_recall_at_1": 0.5, "recsys_recall_at_5": 1.0, "recsys_recall_at_10": 1.0})
    assert got[6] == {"exact_match": 0.0, "f1": 0.0, "substring_exact_match": 0.0} and rows[6]["failed"]
    assert got[7] == {}  # LoCoMo's question: no MemoryAgentBench column
    pa.Table.from_pylist(rows, schema=RESPONSE_METRICS)
    assert set(MAB_SCORES) <= set(COLUMN_SCORERS) and set(MAB_SCORES) <= set(RESPONSE_SCORES)
    assert all("MemoryAgentBench's scorer: utils/eval_other_utils.py" in COLUMN_SCORERS[c] for c in MAB_SCORES)


def test_the_summary_means_each_mab_score_per_task(tmp_path):
    rows = score_rows([
        _mab_row("Accurate_Retrieval/ruler_niah_mk", "123", json.dumps(["123", "456"]), probe_id="a"),
        _mab_row("Accurate_Retrieval/ruler_niah_mk", "123 456", json.dumps(["123", "456"]), probe_id="b"),
        _mab_row("Conflict_Resolution/factconsolidation_sh_6k", "Vienna", "Vienna", probe_id="c"),
    ], entities=_entities_file(tmp_path))
    summary = metric_summary(pl.from_arrow(pa.Table.from_pylist(rows, schema=RESPONSE_METRICS)))
    by_task = {r["category"]: r for r in summary.to_dicts()}
    assert by_task["Accurate_Retrieval/ruler_niah_mk"]["mab_ruler_recall"] == pytest.approx(0.75)
    assert by_task["Accurate_Retrieval/ruler_niah_mk"]["mab_exact_match"] is None
    assert by_task["Conflict_Resolution/factconsolidation_sh_6k"]["mab_substring_exact_match"] == 1.0
    assert by_task["Conflict_Resolution/factconsolidation_sh_6k"]["mab_ruler_recall"] is None


def test_without_entity2id_the_recsys_rows_say_how_to_fetch_it_and_the_others_are_scored(tmp_path):
    missing = tmp_path / "nowhere" / "entity2id.json"
    episodes = pa.Table.from_pylist([{"episode_id": "e1", "dataset": "memoryagentbench"}])
    probes = pa.Table.from_pylist([
        {"episode_id": "e1", "probe_id": "p1", "kind": "qa", "session_idx": 2, "gold": json.dumps(["7001", "7002"]),
         "category": "Test_Time_Learning/recsys_redial_full", "qa_id": "1"},
        {"episode_id": "e1", "probe_id": "p2", "kind": "qa", "session_idx": 2, "gold": "12",
         "category": "Test_Time_Learning/icl_trec_coarse", "qa_id": "2"}])
    responses = pa.Table.from_pylist([
        {"episode_id": "e1", "probe_id": p, "response": "1. Inception\n2. The Matrix", "error": None,
         "details_json": None} for p in ("p1", "p2")])
    stage = ResponseMetricsStage(("m",))
    ctx = SimpleNamespace(settings=ResponseMetricsSettings(memoryagentbench_entities=str(missing)))
    out = asyncio.run(stage.run(ctx, {"ingest.episodes": episodes, "probes.probes": probes,
                                      "respond_m.responses": responses}))
    recsys, icl = out["response_metrics"].to_pylist()
    assert recsys["error"].startswith(f"FileNotFoundError: {missing}: no such file")
    assert "`mempipe data fetch memoryagentbench`" in recsys["error"]
    assert all(recsys[c] is None for c in MAB_SCORES)
    assert icl["error"] is None and icl["mab_exact_match"] == 0.0 and icl["mab_substring_exact_match"] == 0.0
    assert ResponseMetricsSettings().memoryagentbench_entities == "data/memoryagentbench_entities/entity2id.json"
    # the path under a data directory of its own names that directory
    fetch_hint = entity_titles_reader("/srv/data/memoryagentbench_entities/entity2id.json")
    with pytest.raises(FileNotFoundError, match=r"fetch memoryagentbench --dir /srv/data`"):
        fetch_hint()
