"""MemoryAgentBench's per-task answer scores as the official utils/eval_other_utils.py computes them.

- normalisation: lowercase, punctuation (string.punctuation) removed, then the words a / an / the
  replaced by a space, whitespace collapsed (punctuation goes first, unlike SQuAD's order);
- exact match: normalised prediction equals a normalised gold; substring exact match: a normalised
  gold is inside the normalised prediction; F1: multiset token overlap, 0 when either side is yes /
  no / noanswer and they differ; each the best over the gold strings;
- the reply is parsed as parse_output does (the text after "Answer:" on its line, else the first line)
  and, for most tasks, each metric is the better of the raw reply and the parsed answer; in-context
  learning scores the parsed answer only;
- EventQA's recall: 1 when every gold string is inside the lowercased reply, else 0;
- RULER NIAH's recall: the share of gold strings inside the lowercased reply;
- movie recommendation (recsys): the reply's list (after the first "1.", one item a line, or comma
  separated without it) cleaned of parentheses and numbering, each item mapped to the nearest known
  title by edit distance (editdistance.eval, as the official), and recall@1 / @5 / @10 of the gold
  titles among the first 1 / 5 / 10; the titles and the gold ids' titles come from the release's
  entity2id.json (`entity_titles`, `recsys_metrics`).

The judged tasks (LongMemEval's and InfBench summarisation's GPT-4o judges) and ROUGE are not here.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import editdistance

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SPECIAL = frozenset({"yes", "no", "noanswer"})
Metric = Callable[[str, str], float]


def normalize_answer(text: str) -> str:
    """Lowercase, punctuation removed, articles replaced by a space, whitespace collapsed."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def substring_exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(gold) in normalize_answer(prediction))


def f1(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if (pred in _SPECIAL or ref in _SPECIAL) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    common = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def best_over_golds(metric: Metric, prediction: str, golds: Sequence[str]) -> float:
    """The metric's best value over the gold strings (ValueError when there is none)."""
    if not golds:
        raise ValueError("no gold answer to score against")
    return max(metric(prediction, gold) for gold in golds)


def parse_output(reply: str, prefix: str = "Answer:") -> str:
    """The answer in a reply: the text after `prefix` (any case) to the end of its line, else the
    reply's first line; stripped, and a repeated prefix at its start removed."""
    match = re.search(f"(?:{prefix})(.*)(?:\n|$)", reply, flags=re.IGNORECASE) or re.search(r"(?:^)(.*)(?:\n|$)", reply)
    assert match is not None  # the second pattern matches any string
    return re.sub(f"^{re.escape(prefix)}", "", match[1].strip(), flags=re.IGNORECASE).strip()


def qa_metrics(prediction: str, golds: Sequence[str]) -> dict[str, float]:
    """exact_match, f1 and substring_exact_match of one prediction, each the best over the golds."""
    return {"exact_match": best_over_golds(exact_match, prediction, golds),
            "f1": best_over_golds(f1, prediction, golds),
            "substring_exact_match": best_over_golds(substring_exact_match, prediction, golds)}


def reply_metrics(reply: str, golds: Sequence[str]) -> dict[str, float]:
    """The default scoring: each metric the better of the raw reply and its parsed answer."""
    raw, parsed = qa_metrics(reply, golds), qa_metrics(parse_output(reply), golds)
    return {name: max(value, parsed[name]) for name, value in raw.items()}


def eventqa_recall(reply: str, golds: Sequence[str]) -> float:
    """1 when every gold string is inside the lowercased reply, else 0."""
    if not golds:
        raise ValueError("no gold answer to score against")
    return float(all(gold.lower() in reply.lower() for gold in golds))


def niah_recall(reply: str, golds: Sequence[str]) -> float:
    """The share of gold strings inside the lowercased reply."""
    if not golds:
        raise ValueError("no gold answer to score against")
    return sum(gold.lower() in reply.lower() for gold in golds) / len(golds)


# --- movie recommendation (recsys) ----------------------------------------------------------------

def _clean_item(text: str) -> str:
    text = re.sub(r"\([^()]*\)", "", text)
    text = re.sub(r"^(?:\d+[\.\)、]?\s*[\-\—\–]?\s*)?", "", text)
    return re.sub(r"\s+", " ", text).strip()


def recommended_items(reply: str) -> list[str]:
    """The reply's recommendations: after its first "1.", one a line (without one, the commas are line
    breaks), each without parenthesised text or leading numbering."""
    head, sep, tail = reply.partition("1.")
    items = tail if sep else reply.replace(",", "\n")
    return [_clean_item(item.strip()) for item in items.split("\n")]


def movie_title(entity: str) -> str:
    """A title as the official entity2id.json keys become titles: the last path part, '_', '-' and
    '>' as spaces, parenthesised text removed, whitespace collapsed."""
    name = entity.split("/")[-1].replace("_", " ").replace("-", " ").replace(">", " ")
    return re.sub(r"\s+", " ", re.sub(r"\([^()]*\)", "", name)).strip()


def nearest_title(item: str, titles: Sequence[str]) -> str:
    """The title at the least edit distance from the item (case ignored); ties go to the first in
    `titles` order (the official code's order is that of a Python set, which varies between runs)."""
    unique = list(dict.fromkeys(titles))
    if not unique:
        raise ValueError("no candidate titles")
    distances = [editdistance.eval(item.lower(), title.lower()) for title in unique]
    return unique[distances.index(min(distances))]


def recsys_recall(reply: str, gold_titles: Sequence[str], titles: Sequence[str],
                  ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """recsys_recall@k: the share of gold titles among the first k recommendations, each mapped to its
    nearest known title."""
    if not gold_titles:
        raise ValueError("no gold answer to score against")
    predicted = [nearest_title(item, titles) for item in recommended_items(reply)]
    return {f"recsys_recall@{k}": sum(gold in predicted[:k] for gold in gold_titles) / len(gold_titles) for k in ks}


def entity_titles(name_to_id: Mapping[str, int]) -> dict[int, str]:
    """The id -> title map the official recsys scorer builds from entity2id.json ({entity: id}): each
    entity's `movie_title`; where two entities share an id, the later one's title."""
    return {int(entity_id): movie_title(name) for name, entity_id in name_to_id.items()}


def recsys_gold_ids(golds: Sequence[str]) -> list[int]:
    """The gold movie ids of a recsys question: each gold string an integer id."""
    return [int(gold.strip()) for gold in golds]


def recsys_metrics(reply: str, gold_ids: Sequence[int], titles: Mapping[int, str]) -> dict[str, float]:
    """recsys_recall@1 / @5 / @10 of a reply, the gold ids named by their titles in `titles`
    (`entity_titles`) and every title a candidate (ValueError for an id it does not hold)."""
    missing = [i for i in gold_ids if i not in titles]
    if missing:
        raise ValueError(f"gold movie id(s) {missing} not in entity2id.json")
    return recsys_recall(reply, [titles[i] for i in gold_ids], list(titles.values()))


def task_metrics(source: str, reply: str, golds: Sequence[str]) -> dict[str, float]:
    """The official post_process's metrics for a task (`metadata.source`), recsys excepted (it needs
    the title list: `recsys_recall`): ICL scores the parsed answer; EventQA adds eventqa_recall on the
    raw reply; RULER NIAH is ruler_recall alone; every other task the default `reply_metrics`."""
    if "icl" in source:
        return qa_metrics(parse_output(reply), golds)
    if "eventqa" in source:
        return {**qa_metrics(parse_output(reply), golds), "eventqa_recall": eventqa_recall(reply, golds)}
    if "ruler_niah" in source:
        return {"ruler_recall": niah_recall(reply, golds)}
    if "recsys" in source:
        raise ValueError("recsys is scored by recsys_metrics, with the titles of entity2id.json")
    return reply_metrics(reply, golds)
