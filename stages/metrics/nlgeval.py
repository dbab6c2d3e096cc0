"""LD-Agent's scorer: nlg-eval's BLEU-1..4 and ROUGE-L of one (response, gold) pair at a time,
averaged per episode and session.

LD-Agent's DataLoader/MSC.py scores every generated reply on its own through its nlgeval wrapper:
each text lowercased, tokenised by nltk `word_tokenize` (`stages/metrics/tokens.py`) and re-joined
with spaces, an empty reply replaced by "&"; then nlg-eval's coco-caption scorers, which
pycocoevalcap packages: `Bleu(4)` (BLEU-1..4 of the one pair, closest reference length, coco's
tiny-count smoothing) and `Rouge()` (ROUGE-L F with beta 1.2). Its tables average those scores per
(episode, session) over the session's replies, then over episodes (one row per session); an
episode's all-sessions score is the mean of its session means (`nested_mean`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from functools import lru_cache
from typing import Any

from stages.metrics.tokens import word_tokenize

ORDERS = (1, 2, 3, 4)
SCORES = (*(f"bleu{n}" for n in ORDERS), "rougeL")


def prepare(text: str) -> str:
    """A text as LD-Agent hands it to nlg-eval: its lowercased word_tokenize tokens joined by spaces."""
    return " ".join(word_tokenize(text.lower()))


@lru_cache(maxsize=1)
def _scorers() -> tuple[Any, Any]:
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.rouge.rouge import Rouge

    return Bleu(4), Rouge()


@lru_cache(maxsize=1 << 16)  # the stage scores a reply per row and again per corpus group
def _pair(response: str, gold: str) -> tuple[float, ...]:
    bleu, rouge = _scorers()
    hyp, ref = {0: [prepare(response) or "&"]}, {0: [prepare(gold)]}  # LD-Agent's "&" for an empty reply
    blues, _ = bleu.compute_score(ref, hyp, verbose=0)  # verbose=0: coco's Bleu prints its counts otherwise
    rouge_l, _ = rouge.compute_score(ref, hyp)
    return (*(float(b) for b in blues), float(rouge_l))


def pair_scores(response: str, gold: str) -> dict[str, float]:
    """nlg-eval's scores of one reply against its gold turn: {"bleu1".."bleu4", "rougeL"}, in [0, 1]."""
    return dict(zip(SCORES, _pair(response, gold)))


def episode_means(values: Sequence[tuple[Hashable, Hashable, float]]) -> dict[Hashable, float]:
    """Per episode, LD-Agent's average of its (episode, session, score) triples: the mean of its
    session means, each the mean of the session's scores."""
    cells: dict[Hashable, dict[Hashable, list[float]]] = defaultdict(lambda: defaultdict(list))
    for episode, session, value in values:
        cells[episode][session].append(value)
    return {e: sum(sum(v) / len(v) for v in sessions.values()) / len(sessions) for e, sessions in cells.items()}


def nested_mean(values: Sequence[tuple[Hashable, Hashable, float]]) -> float | None:
    """LD-Agent's average of (episode, session, score) triples: the mean per (episode, session),
    the mean of an episode's session means, then the mean over episodes; None for no value."""
    per_episode = episode_means(values)
    return sum(per_episode.values()) / len(per_episode) if per_episode else None
