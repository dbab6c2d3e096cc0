"""The canonical corpus tables the framework itself reads and writes: episodes, turns, qa, memory_points.

Every other table (segments, units, responses, scores, ...) is defined beside the stage or method
that writes it.
"""

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
        # Session annotations the corpus carries (LoCoMo's summaries and observations, HaluMem's "filler"
        # mark of a generated session outside memory scoring); null when none.
        pa.field("notes", pa.list_(pa.struct([pa.field("session_idx", pa.int32()), pa.field("kind", pa.string()),
                                               pa.field("speaker", pa.string()), pa.field("text", pa.string())]))),
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
        pa.field("adversarial_answer", pa.string()),  # LoCoMo category 5's tempting wrong answer
        pa.field("asked_at", pa.timestamp("s")),  # when the question is asked (LongMemEval); null: after the history
        # the session (1-based) the question is asked right after, before the next one (HaluMem asks each
        # session's questions once it is added); null: after the whole history
        pa.field("asked_after_session", pa.int32()),
        pa.field("abstention", pa.bool_()),  # the history cannot answer it (LongMemEval "_abs"); null: not said
        pa.field("evidence_sessions", pa.list_(pa.string())),  # the dataset's ids of the answer's sessions
        # what a judge reads beside the gold and no method is shown (MemoryAgentBench: a LongMemEval
        # question's type, a summary's key points); null: nothing
        pa.field("judge_notes", pa.list_(pa.string())),
        pa.field("source", pa.string(), nullable=False),  # "dataset" | "teabag"
        # The answer key `answer` and `evidence` follow (corpus.answer_key: original | audited, LoCoMo),
        # the dataset's own gold beside them whatever the key, and the audit's error class of an item the
        # audited key changed (null otherwise): pipeline/corpus/locomo_audit.py `gold` reads either key.
        pa.field("answer_key", pa.string()),
        pa.field("gold_original", pa.string()),
        pa.field("evidence_original", pa.list_(pa.string())),
        pa.field("answer_key_class", pa.string()),
    ]
)

# The gold memory points a corpus gives per session (HaluMem): what a memory system should have extracted
# from the session. Empty for a corpus without them.
MEMORY_POINTS = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("session_idx", pa.int32(), nullable=False),  # 1-based: the session the point comes from
        pa.field("point_id", pa.string(), nullable=False),  # "<episode_id>-s<session_idx>-m<the corpus's index>"
        pa.field("content", pa.string(), nullable=False),
        pa.field("memory_type", pa.string()),  # e.g. Persona Memory, Event Memory, Relationship Memory
        # where the point comes from: primary | secondary | interference (a distractor the dialogue
        # states and the memory must not take as fact) | system
        pa.field("memory_source", pa.string()),
        pa.field("is_update", pa.bool_()),  # it revises earlier memories (`original_memories`)
        pa.field("original_memories", pa.list_(pa.string())),  # the memories it replaces; null: none given
        pa.field("importance", pa.float64()),  # 0-1
        pa.field("timestamp", pa.string()),  # when the point was made, as the corpus writes it
    ]
)
