"""The canonical Arrow schemas. Every table the pipeline writes is defined here, once."""

from __future__ import annotations

import pyarrow as pa

EPISODES = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("speakers", pa.list_(pa.string()), nullable=False),
        # One entry per speaker (same order as `speakers`); null when the corpus has none.
        pa.field("personas", pa.list_(pa.list_(pa.string()))),
        pa.field("relationship", pa.string()),
        pa.field("n_sessions", pa.int32(), nullable=False),
        pa.field("source_file", pa.string(), nullable=False),
    ]
)

TURNS = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("session_idx", pa.int32(), nullable=False),  # 1-based
        pa.field("turn_idx", pa.int32(), nullable=False),  # 0-based within the session
        pa.field("speaker", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("session_time", pa.timestamp("s")),
        pa.field("session_gap_label", pa.string()),
        pa.field("source_turn_id", pa.string()),
        pa.field("gold_topic_boundary", pa.bool_()),  # True = this turn starts a new topic
    ]
)

QA = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("qa_id", pa.string(), nullable=False),
        pa.field("question", pa.string(), nullable=False),
        pa.field("answer", pa.string()),
        pa.field("evidence", pa.list_(pa.string())),  # source_turn_ids
        pa.field("category", pa.string()),
        pa.field("source", pa.string(), nullable=False),  # "dataset" | "teabag"
    ]
)



# --- SeCom stages ----------------------------------------------------------------------------

SEGMENTS = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("session_idx", pa.int32(), nullable=False),
        pa.field("segment_idx", pa.int32(), nullable=False),
        pa.field("turn_start", pa.int32(), nullable=False),  # inclusive turn_idx
        pa.field("turn_end", pa.int32(), nullable=False),  # inclusive turn_idx
        pa.field("fallback", pa.bool_(), nullable=False),  # fixed-size chunks replaced the LLM answer
        pa.field("fallback_reason", pa.string()),
        pa.field("raw", pa.string()),  # last model output when the answer was rejected
        pa.field("model", pa.string()),
    ]
)

GUIDANCE = pa.schema(
    [
        pa.field("rubric", pa.string()),
        pa.field("examples_json", pa.string()),
        pa.field("history_json", pa.string()),  # per reflection round: mean WindowDiff, ...
        pa.field("sessions_used", pa.int64()),
        pa.field("model", pa.string()),
    ]
)

# A memory unit at one granularity; the same table feeds compression, banks and retrieval.
_UNIT_FIELDS = [
    pa.field("episode_id", pa.string(), nullable=False),
    pa.field("unit_id", pa.string(), nullable=False),  # "<granularity>:<session>:<turn_start>"
    pa.field("granularity", pa.string(), nullable=False),  # turn | session | segment
    pa.field("session_idx", pa.int32(), nullable=False),
    pa.field("turn_start", pa.int32(), nullable=False),
    pa.field("turn_end", pa.int32(), nullable=False),
    pa.field("session_time", pa.timestamp("s")),
    pa.field("source_turn_ids", pa.list_(pa.string())),
    pa.field("text", pa.string(), nullable=False),  # what retrieval returns
    pa.field("compressed_text", pa.string()),  # the retrieval key after denoising
    pa.field("compression", pa.string()),  # method@rate, or "none"
]

UNITS = pa.schema([*_UNIT_FIELDS, pa.field("error", pa.string())])

MEMORY_UNITS = pa.schema(
    [
        *_UNIT_FIELDS,
        pa.field("vector", pa.list_(pa.float32())),  # embedding of the retrieval key (compressed text)
        pa.field("text_vector", pa.list_(pa.float32())),  # embedding of the original text (ablation)
        pa.field("lance_table", pa.string()),
    ]
)

PROBES = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("probe_id", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),  # next_response | qa
        pa.field("session_idx", pa.int32(), nullable=False),  # session the probe sits in
        pa.field("turn_idx", pa.int32()),  # the turn to produce (next_response); null for qa
        pa.field("respondent", pa.string(), nullable=False),
        pa.field("request", pa.string(), nullable=False),  # last partner utterance, or the question
        pa.field("gold", pa.string()),  # the real next turn, or the reference answer
        pa.field("qa_id", pa.string()),
        pa.field("evidence", pa.list_(pa.string())),
        pa.field("category", pa.string()),
    ]
)

RESPONSES = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("probe_id", pa.string(), nullable=False),
        pa.field("method", pa.string(), nullable=False),
        pa.field("response", pa.string()),
        pa.field("retrieved_unit_ids", pa.list_(pa.string())),
        pa.field("context_tokens", pa.int32()),
        pa.field("model", pa.string()),
        pa.field("error", pa.string()),
    ]
)

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
    ]
)

SEGMENTATION_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("sessions", pa.int64()),
        pa.field("pk", pa.float64()),
        pa.field("window_diff", pa.float64()),
        pa.field("f1", pa.float64()),
        pa.field("segment_score", pa.float64()),  # SeCom Eq. 3 on the mean Pk, WD and F1
        pa.field("fallback_sessions", pa.int64()),
    ]
)

RETRIEVAL_SUMMARY = pa.schema(
    [
        pa.field("dataset", pa.string()),
        pa.field("granularity", pa.string()),
        pa.field("compressed", pa.bool_()),
        pa.field("retriever", pa.string()),
        pa.field("k", pa.int32()),
        pa.field("questions", pa.int64()),
        pa.field("recall", pa.float64()),
        pa.field("dcg", pa.float64()),
    ]
)

RESPONSE_SUMMARY = pa.schema(
    [
        pa.field("method", pa.string()),
        pa.field("probes", pa.int64()),
        pa.field("failed", pa.int64()),
        pa.field("mean_context_tokens", pa.float64()),
        pa.field("mean_response_words", pa.float64()),
    ]
)
