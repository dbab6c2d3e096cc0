"""MemoryAgentBench's per-task scores on constructed cases. Every expected value below was computed once
by the official utils/eval_other_utils.py (HUST-AI-HYZ/MemoryAgentBench at commit
455306dcabc3842526eb83cd4e225e5d486c5c5d), its functions called directly on these cases (its rouge
scorer stubbed out, as none of these values reads it, and editdistance.eval supplied as plain
Levenshtein distance)."""

from __future__ import annotations

import pytest

from stages.metrics import memoryagentbench as mab


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
