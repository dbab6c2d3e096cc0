"""SeCom's retrieval scoring: DCG per distinct retrieved turn (App. A.8) and the score stage's dense
rows ranked with the configured similarity."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stages.metrics.retrieval import dcg_at_k
from stages.scoring.score import ScoreConfig, retrieval_rows


def test_an_exchange_id_shared_by_user_and_assistant_is_one_position_in_dcg() -> None:
    """Long-MT-Bench+ gives both turns of an exchange one id, so a unit lists it twice; the second
    exchange is position 2, not 3."""
    units = [["S1:1", "S1:1"], ["S1:2", "S1:2"]]
    assert dcg_at_k(units, ["S1:2"], 2, by_turn=True) == pytest.approx(1 / math.log2(3))
    # With one distinct id per unit, the per-turn and per-unit forms agree.
    assert dcg_at_k(units, ["S1:2"], 2, by_turn=True) == pytest.approx(dcg_at_k(units, ["S1:2"], 2))
    # Evidence over two units: 1/2 at position 1, 1/2 at position 2.
    both = dcg_at_k(units, ["S1:1", "S1:2"], 2, by_turn=True)
    assert both == pytest.approx(0.5 + 0.5 / math.log2(3))
    # A segment: positions count distinct turns in order.
    seg = [["D1:1", "D1:2", "D1:1", "D1:3"]]
    assert dcg_at_k(seg, ["D1:3"], 1, by_turn=True) == pytest.approx(1 / math.log2(4))


def unit(uid: str, turn: str, vec: list[float]) -> dict:
    return {"unit_id": uid, "granularity": "segment", "compression": "none", "text": f"text of {uid}",
            "compressed_text": None, "source_turn_ids": [turn], "vector": vec, "text_vector": vec}


@pytest.mark.parametrize(("similarity", "recall"), [("l2", 1.0), ("cosine", 0.0), ("dot", 0.0)])
def test_score_ranks_dense_units_with_the_configured_similarity(similarity: str, recall: float) -> None:
    """q = (1, 0): the long vector (3, 0) is nearest by angle and by dot product, the short (1, 0.2)
    by Euclidean distance (4 vs 0.04), which is what FAISS IndexFlatL2 returns first."""
    units = [unit("far", "D1:1", [3.0, 0.0]), unit("near", "D1:2", [1.0, 0.2])]
    qa = [{"qa_id": "q1", "question": "where?", "evidence": ["D1:2"]}]
    cfg = ScoreConfig(retrieval_k=[1], retrievers=["dense"], similarity=similarity)
    rows = retrieval_rows("e", "locomo", qa, units, cfg, np.array([[1.0, 0.0]]))
    assert [(r["retriever"], r["k"], r["recall"]) for r in rows] == [("dense", 1, recall)]


def test_score_rows_carry_longmemevals_turn_and_session_measures() -> None:
    """LongMemEval's recall_any / recall_all / ndcg_any per turn and per session (the session gold
    is `evidence_sessions`): the gold turn's unit ranks second, so nothing at k=1, all at k=2."""
    units = [unit("first", "s1:1", [1.0, 0.0]), unit("second", "s2:1", [0.0, 1.0])]
    qa = [{"qa_id": "q1", "question": "when?", "evidence": ["s2:1"], "evidence_sessions": ["s2"]}]
    cfg = ScoreConfig(retrieval_k=[1, 2], retrievers=["dense"], similarity="cosine")
    rows = {r["k"]: r for r in retrieval_rows("e", "longmemeval", qa, units, cfg, np.array([[1.0, 0.1]]))}
    assert [rows[1][m] for m in ("recall_any", "recall_all", "ndcg_any")] == [0.0, 0.0, 0.0]
    assert [rows[1][f"session_{m}"] for m in ("recall_any", "recall_all", "ndcg_any")] == [0.0, 0.0, 0.0]
    assert rows[2]["recall_any"] == rows[2]["recall_all"] == rows[2]["session_recall_any"] == 1.0
    # LongMemEval's dcg discounts rank r >= 2 by log2(r): rank 2 counts in full (1 / log2 2).
    assert rows[2]["ndcg_any"] == rows[2]["session_ndcg_any"] == 1.0
