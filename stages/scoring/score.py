"""score: per-item metrics. Segmentation against gold boundaries (Pk, WindowDiff, F1, segment
score) and retrieval against gold evidence (recall@k, DCG) for every granularity, with and
without compression as the retrieval key; and LongMemEval's retrieval measures of what each
method's answers read (`answer_retrieval_scores`, stages/scoring/answer_retrieval.py)."""

from __future__ import annotations

from typing import Any, Literal

import pyarrow as pa
from pydantic import Field

from pipeline.config import Section
from pipeline.retrieval import Similarity, top_k
from pipeline.engine.stage import EpisodeStage, Rows, StageContext
from stages.dialogue import sessions_of
from stages.metrics import retrieval as rmetrics
from stages.metrics import segmentation as smetrics
from stages.method_stages import respond_stage_name
from stages.methods.secom.units import unit_retriever
from stages.scoring.answer_retrieval import ANSWER_RETRIEVAL_SCORES, answer_retrieval_rows

SEGMENTATION_SCORES = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("session_idx", pa.int32(), nullable=False),
        pa.field("n_turns", pa.int32(), nullable=False),
        pa.field("pk", pa.float64()),
        pa.field("window_diff", pa.float64()),
        pa.field("f1", pa.float64()),
        pa.field("segment_score", pa.float64()),
        pa.field("fallback", pa.bool_()),
    ]
)

RETRIEVAL_SCORES = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("qa_id", pa.string(), nullable=False),
        pa.field("granularity", pa.string(), nullable=False),
        pa.field("compressed", pa.bool_(), nullable=False),  # retrieval key: compressed vs original text
        pa.field("retriever", pa.string(), nullable=False),
        pa.field("k", pa.int32(), nullable=False),
        pa.field("recall", pa.float64()),
        pa.field("dcg", pa.float64()),
        # LongMemEval's measures (its print_retrieval_metrics): turn level, and session level
        # against `answer_session_ids`; NaN where a question has no gold.
        *(pa.field(name, pa.float64()) for name in rmetrics.LONGMEMEVAL_MEASURES),
    ]
)


class ScoreConfig(Section):
    # null: in the run when its methods bring the segmentation and banks it scores (SeCom's); true:
    # always (a run that only segments: configs/secom_dialseg.yaml); false: never.
    enabled: bool | None = None
    # Pk / WindowDiff / F1 sequence: SuperDialseg's per-utterance labels (what SeCom reports) or
    # the between-turn slots of Pevzner & Hearst (see stages/metrics/segmentation.py).
    segmentation_convention: Literal["superdialseg", "slots"] = "superdialseg"
    retrieval_k: list[int] = Field(default_factory=lambda: [1, 3, 5])
    retrievers: list[Literal["bm25", "dense", "hybrid"]] = ["bm25", "dense"]  # (pydantic copies a list default)
    # Dense scoring of the retrieval rows: set it as the methods' `similarity` (SeCom configs: l2).
    similarity: Similarity = "cosine"
    # Also LongMemEval's measures of what each method's answers read (`answer_retrieval_scores`): then
    # `score` reads the probes and every respond stage, so it waits for the answers.
    answer_retrieval: bool = False


def segmentation_rows(episode_id: str, dataset: str, sessions: dict[int, Rows], segments: Rows,
                      convention: str = "superdialseg") -> Rows:
    rows: Rows = []
    for s, turns in sessions.items():
        gold = [t["gold_topic_boundary"] for t in turns]
        if any(g is None for g in gold) or len(turns) < 2:
            continue  # no annotation for this session
        segs = sorted((g for g in segments if g["session_idx"] == s), key=lambda g: g["segment_idx"])
        if not segs:
            continue
        position = {t["turn_idx"]: i for i, t in enumerate(turns)}
        spans = [(position[g["turn_start"]], position[g["turn_end"]]) for g in segs]
        m = smetrics.evaluate(smetrics.gold_boundaries(gold), smetrics.spans_to_boundaries(spans, len(turns)),
                              convention=convention)
        rows.append({
            "episode_id": episode_id, "dataset": dataset, "session_idx": s, "n_turns": len(turns),
            "pk": m["pk"], "window_diff": m["wd"], "f1": m["f1"], "segment_score": m["score"],
            "fallback": any(g["fallback"] for g in segs),
        })
    return rows


def scored_questions(qa: Rows) -> Rows:
    return [q for q in qa if q.get("evidence")]


def retrieval_rows(episode_id: str, dataset: str, qa: Rows, units: Rows, cfg: Any, qvecs: Any) -> Rows:
    """`qvecs`: the vectors of `scored_questions(qa)` (None when only BM25 is scored)."""
    rows: Rows = []
    questions = scored_questions(qa)
    if not questions or not units:
        return rows
    granularities = sorted({u["granularity"] for u in units})
    has_compression = any(u.get("compression") not in (None, "none") for u in units)
    k_max = max(cfg.retrieval_k)
    settings = [True, False] if has_compression else [False]
    # One index per (granularity, key): BM25 is built once and serves every question.
    indexes = {}
    for gran in granularities:
        pool = [u for u in units if u["granularity"] == gran]
        for compressed in settings:
            indexes[(gran, compressed)] = (pool, unit_retriever(pool, use_compression=compressed,
                                                                similarity=cfg.similarity))
    for qi, q in enumerate(questions):
        for gran in granularities:
            for compressed in settings:
                pool, index = indexes[(gran, compressed)]
                for retriever in cfg.retrievers:
                    qvec = None if qvecs is None else qvecs[qi]
                    order = top_k(index.scores(q["question"], retriever, qvec), k_max)
                    ranked = [pool[i]["source_turn_ids"] for i in order]
                    for k in cfg.retrieval_k:
                        rows.append({
                            "episode_id": episode_id, "dataset": dataset, "qa_id": q["qa_id"], "granularity": gran,
                            "compressed": compressed, "retriever": retriever, "k": k,
                            "recall": rmetrics.recall_at_k(ranked, q["evidence"], k),
                            "dcg": rmetrics.dcg_at_k(ranked, q["evidence"], k, by_turn=True),  # App. A.8
                            **rmetrics.longmemeval_retrieval(ranked, q["evidence"], q.get("evidence_sessions"), k),
                        })
    return rows


class ScoreStage(EpisodeStage[ScoreConfig]):
    name = "score"
    outputs = {"segmentation_scores": SEGMENTATION_SCORES, "retrieval_scores": RETRIEVAL_SCORES,
               "answer_retrieval_scores": ANSWER_RETRIEVAL_SCORES}
    section = "score"
    uses_embedder = True

    def __init__(self, methods: tuple[str, ...] = ()) -> None:
        self.methods = methods  # whose answers' context is scored
        self.inputs = ("ingest", "segment", "banks", *(["probes"] if methods else []),
                       *(respond_stage_name(m) for m in methods))

    def selected_by(self, cfg: Any, present: set[str]) -> str | None:
        enabled = self.settings_of(cfg).enabled
        if enabled:
            return "scores segmentation and retrieval (score.enabled)"
        if enabled is None and {"segment", "banks"} <= present:
            return "scores the segmentation and retrieval the run's methods build"
        return None

    async def process_episode(self, ctx: StageContext[ScoreConfig], episode_id: str,
                              inputs: dict[str, Rows]) -> dict[str, Rows]:
        settings = ctx.settings
        dataset = inputs["ingest.episodes"][0]["dataset"]
        questions = scored_questions(inputs["ingest.qa"]) if inputs["banks.memory_units"] else []
        dense = bool(set(settings.retrievers) - {"bm25"}) and questions
        qvecs = await ctx.lazy_embed()([q["question"] for q in questions]) if dense else None
        return {
            "segmentation_scores": segmentation_rows(episode_id, dataset, sessions_of(inputs["ingest.turns"]),
                                                     inputs["segment.segments"], settings.segmentation_convention),
            "retrieval_scores": retrieval_rows(episode_id, dataset, inputs["ingest.qa"], inputs["banks.memory_units"],
                                               settings, qvecs),
            "answer_retrieval_scores": self.answer_rows(episode_id, dataset, inputs, settings.retrieval_k),
        }

    def answer_rows(self, episode_id: str, dataset: str, inputs: dict[str, Rows], ks: list[int]) -> Rows:
        """Each method's answers' context against the evidence of the questions `score` scores."""
        if not self.methods:
            return []
        gold = {q["qa_id"]: q for q in scored_questions(inputs["ingest.qa"])}
        questions = {p["probe_id"]: gold[p["qa_id"]] for p in inputs["probes.probes"] if p.get("qa_id") in gold}
        if not questions:
            return []
        sources = {u["unit_id"]: u["source_turn_ids"] for u in inputs["banks.memory_units"] if u.get("source_turn_ids")}
        turn_ids = {(t["session_idx"], t["turn_idx"]): t["source_turn_id"] for t in inputs["ingest.turns"]
                    if t.get("source_turn_id") is not None}
        return [row for m in self.methods
                for row in answer_retrieval_rows(episode_id, dataset, m, inputs[f"{respond_stage_name(m)}.responses"],
                                                 questions, sources, turn_ids, ks)]
