"""Reference metrics against independent implementations, LoCoMo's QA F1 on hand-worked cases per
category, the sign test on a worked case, and the judges' verdict bookkeeping."""

from __future__ import annotations

import asyncio
import re
from collections import Counter

import pytest
import sacrebleu

from stages.judging import answers, memory_quality, pairwise
from stages.metrics import locomo_qa, significance, text
from pipeline.testing.fake_chat import FakeChat

PAIRS = [
    ("the cat sat on the mat today", "the cat sat on the mat"),
    ("i went hiking in the mountains with my sister last weekend", "last weekend i went hiking in the mountains"),
    ("we moved and the kids love the new house by the lake", "the kids love the new house by the lake, honestly"),
]


@pytest.mark.parametrize("hyp,ref", PAIRS)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_bleu_agrees_with_sacrebleu(hyp, ref, n):
    # Every n-gram order matches at least once in these pairs, so no smoothing applies and nltk's
    # sentence BLEU must equal sacrebleu's with the same tokens and no smoothing.
    theirs = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", max_ngram_order=n, effective_order=False)
    expected = theirs.sentence_score(" ".join(text.bleu_tokens(hyp)), [" ".join(text.bleu_tokens(ref))]).score / 100
    assert text.bleu(hyp, ref, n) == pytest.approx(expected, abs=1e-9)


def test_bleu_smooths_an_order_without_matches_instead_of_returning_zero():
    hyp, ref = "i really like green tea", "she likes green apples a lot"  # one unigram match, no bigram
    assert 0 < text.bleu(hyp, ref, 2) < text.bleu(hyp, ref, 1)
    assert text.bleu("", ref, 1) == 0.0


def _lcs(a: list[str], b: list[str]) -> int:
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            table[i + 1][j + 1] = table[i][j] + 1 if x == y else max(table[i][j + 1], table[i + 1][j])
    return table[-1][-1]


def _f(overlap: int, n_pred: int, n_ref: int) -> float:
    if not overlap:
        return 0.0
    p, r = overlap / n_pred, overlap / n_ref
    return 2 * p * r / (p + r)


@pytest.mark.parametrize("hyp,ref", PAIRS)
def test_rouge_agrees_with_an_independent_count_of_ngrams_and_lcs(hyp, ref):
    h, r = re.findall(r"[a-z0-9]+", hyp.lower()), re.findall(r"[a-z0-9]+", ref.lower())
    grams = {n: (Counter(zip(*[h[i:] for i in range(n)])), Counter(zip(*[r[i:] for i in range(n)]))) for n in (1, 2)}
    expected = {f"rouge{n}": _f(sum((a & b).values()), sum(a.values()), sum(b.values())) for n, (a, b) in grams.items()}
    expected["rougeL"] = _f(_lcs(h, r), len(h), len(r))
    assert text.rouge(hyp, ref) == pytest.approx(expected, abs=1e-9)


def test_token_f1_and_distinct_on_worked_cases():
    # normalised: "cat sat on mat today" vs "cat sat on mat": 4 shared, P 4/5, R 1 -> F1 8/9
    assert text.token_f1("The cat sat on the mat today.", "the cat sat on the mat") == pytest.approx(8 / 9)
    assert text.token_f1("nothing alike", "cat") == 0.0
    # "a a b": unigrams a, a, b -> 2 distinct of 3; bigrams (a a), (a b) -> 2 of 2
    assert text.distinct(["a a b"], 1) == pytest.approx(2 / 3) and text.distinct(["a a b"], 2) == 1.0
    assert text.distinct(["a b", "a b"], 2) == 0.5  # corpus level over several responses
    assert text.distinct(["a"], 2) is None


def test_bertscore_without_its_model_says_what_to_do():
    with pytest.raises(text.BertScoreUnavailable, match="BERTScore|bert-score"):
        text.bertscore(["a reply"], ["a reference"], "no-such-org/no-such-model")


@pytest.mark.parametrize("prediction,gold,category,expected", [
    # single-hop: stems [she, went, to, pari, museum] vs [pari, museum]: P 2/5, R 1 -> 4/7
    ("She went to the Paris museums", "Paris museum", 4, 4 / 7),
    # temporal: commas dropped before comparing
    ("7 May 2023", "7 May, 2023", 2, 1.0),
    # open-domain: the gold is cut at ';' -> "likely yes": P 1, R 1/2
    ("yes", "likely yes; she enjoys hiking", 3, 2 / 3),
    # multi-hop: gold split on commas, each part against the best prediction part ("and" is dropped)
    ("hiking and painting", "painting, hiking", 1, 2 / 3),
    ("painting, hiking", "painting, hiking", 1, 1.0),
    # adversarial: scored by the abstention phrases, gold unused
    ("That is not mentioned in the conversation", None, 5, 1.0),
    ("No information available.", None, "adversarial", 1.0),
    ("She went to Paris", None, 5, 0.0),
])
def test_locomo_f1_matches_the_benchmark_on_hand_worked_cases(prediction, gold, category, expected):
    assert locomo_qa.locomo_f1(prediction, gold, category) == pytest.approx(expected)


def test_locomo_category_names_map_to_official_ids():
    assert locomo_qa.CATEGORY_IDS == {"multi-hop": 1, "temporal": 2, "open-domain": 3, "single-hop": 4,
                                      "adversarial": 5}


def test_sign_test_p_value_on_a_worked_case():
    # 9 wins, 1 loss: P(X >= 9 | n=10, p=1/2) = 11/1024, two-sided doubles it.
    assert significance.sign_test(9, 1) == pytest.approx(22 / 1024)
    assert significance.sign_test(5, 5) == pytest.approx(1.0)
    assert significance.sign_test(0, 0) is None
    rates = significance.win_rates(["reference"] * 9 + ["other"] + ["tie"] * 2)
    assert (rates["wins"], rates["losses"], rates["ties"], rates["pairs"]) == (9, 1, 2, 12)
    assert rates["win_rate"] == pytest.approx(9 / 12) and rates["p_value"] == pytest.approx(22 / 1024)


def test_a_preference_that_flips_with_the_order_is_a_tie():
    assert significance.pair_outcome(["reference", "other"]) == "tie"
    assert significance.pair_outcome(["reference", "tie"]) == "reference"
    assert significance.pair_outcome(["other", "other"]) == "other"
    assert significance.majority(["reference", "other", "reference"]) == "reference"
    assert significance.majority(["reference", "other"]) == "tie"


def test_the_judge_sees_both_orders_and_its_letter_maps_back_to_the_method():
    llm = FakeChat([{"better": "A", "reason": "r"}, {"better": "A", "reason": "r"}])
    past = "[Session 1]\nAnn: I adopted a dog"

    async def both() -> list[str]:
        [first] = await pairwise.judge_pair(llm, "consistency", pairwise.PairShown("Ann: hi", "Bob", "REF", "OTHER",
                                                                                   True, past))
        [second] = await pairwise.judge_pair(llm, "consistency", pairwise.PairShown("Ann: hi", "Bob", "REF", "OTHER",
                                                                                    False, past))
        return [first[0], second[0]]

    # "A" both times: the first position wins whatever is in it, a pure position bias -> a tie.
    assert asyncio.run(both()) == ["reference", "other"]
    shown = [c["messages"][1]["content"] for c in llm.calls]
    assert "[A] REF" in shown[0] and "[B] OTHER" in shown[0]
    assert "[A] OTHER" in shown[1] and "[B] REF" in shown[1]
    # Both orders (SeCom App. A.4) see the earlier sessions too: memorability and consistency with
    # the past cannot be judged without them.
    assert all(f"Earlier sessions:\n{past}\n\nCurrent session:\nAnn: hi" in s for s in shown)
    assert '"reason"' in shown[0] and '"tie"' in shown[0]


def test_creem_protocol_shows_the_raw_past_sessions():
    llm = FakeChat([{"better": "B"}])
    shown = pairwise.PairShown("Ann: hi", "Bob", "x", "y", past="[Session 1]\nAnn: I adopted a dog")
    asyncio.run(pairwise.judge_pair(llm, "memorability", shown, pairwise.PairProtocol("creem")))
    assert "Earlier sessions:\n[Session 1]\nAnn: I adopted a dog" in llm.calls[0]["messages"][1]["content"]


def test_answer_judges_read_their_scales_and_teafarm_questions_get_teafarm_correctness():
    llm = FakeChat([{"score": 85, "reason": "close"}, {"correct": False, "reason": "vague"}])
    score = asyncio.run(answers.judge_answer(llm, "gpt4score", "Where?", "Paris", "In Paris"))
    strict = asyncio.run(answers.judge_answer(llm, "strict", "Where?", "Paris", "Somewhere in Europe"))
    assert score[0] == 85.0 and strict[0] == 0.0
    from stages.judging.judge_answers import JudgeAnswersSettings

    assert [j.name for j in JudgeAnswersSettings(correctness=["strict", "lenient"]).judges()] == [
        "gpt4score", "strict", "lenient"]
    # An out-of-scale score is invalid and re-asked, never recorded.
    llm = FakeChat([{"score": 140}, {"score": 60}])
    assert asyncio.run(answers.judge_answer(llm, "gpt4score", "q", "a", "b"))[0] == 60.0


def test_memory_rating_is_about_one_speaker_and_one_criterion_given_the_dialogue():
    llm = FakeChat([{"score": 4}])
    [(score, _)] = asyncio.run(memory_quality.rate_memory(llm, "concreteness", "Ann", "[Ann] adopted a dog named Rex.",
                                                      "[Session 1]\nAnn: I adopted Rex today"))
    prompt = llm.calls[0]["messages"][1]["content"]
    assert score == 4 and "Person: Ann" in prompt and "Concreteness" in prompt and "Integration" not in prompt
    assert prompt.index("Dialogue:\n[Session 1]\nAnn: I adopted Rex today") < prompt.index("Memory about Ann:")
    assert "specific information about Ann" in prompt and "{speaker}" not in prompt
    assert "Evaluation steps:\n1. " in prompt and "\n3. " in prompt
    assert {g for g, _ in memory_quality.CRITERIA.values()} == {"evolutionary", "fundamental"}
