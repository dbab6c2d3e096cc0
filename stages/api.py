"""What a method author imports: the method API, the row types, the retrieval and conversation
helpers, the shared response frame, `LLMError` and the test kit, all from this one module.

    from stages.api import Answer, Method, MethodContext, MethodSettings, answer_from_memory

A method (ours or one in a package of its own, registered under the `mempipe.methods` entry point)
imports nothing else of this project: everything behind these names may move, these names stay.
docs/adding-a-method.md says what each is for.

The test kit (`run_method`, `FakeChat`, `FakeOpenAI`, `SAMPLE_CORPUS`) is loaded on first use: it
runs a whole pipeline, which a method module must not import (the project's methods load at
import time, and a method's fingerprint holds the source of what it imports). Its pytest fixtures
`fake_llm` and `sample_corpus` need no import: the installed package registers them (`pytest11`).
"""

from __future__ import annotations

import importlib
from datetime import datetime
from typing import TYPE_CHECKING, Literal, TypedDict

from pipeline.config import Section
from pipeline.failures import attempt
from pipeline.llm.types import ChatLLM, LLMError, LLMResult, Messages
from pipeline.retrieval import (bm25_scores, count_tokens, dense_scores, hybrid_scores, minmax, tokenize, top_k,
                                within_budget, within_tokens)
from pipeline.engine.stage import EpisodeStage, GlobalStage, Rows, StageContext
from stages.dialogue import build_exchanges, format_unit, in_time_order, last_turns, sessions_of
from stages.methods.base import (SNAPSHOT_FIELDS, Answer, Embed, EpisodeInput, MemoryItem, Method, MethodContext,
                                 MethodSettings, ProbeInput, ReportPanel, after_session, visible_memory)
from stages.methods.shared.memory_response import answer_from_memory, memory_messages

if TYPE_CHECKING:  # the test kit, for type checkers; at run time `__getattr__` loads it on first use
    from pipeline.testing.fake_chat import FakeChat
    from pipeline.testing.fake_openai import FakeOpenAI
    from pipeline.testing.plugin import SAMPLE_CORPUS
    from stages.testing import run_method

__all__ = [
    # the method API (stages/methods/base.py)
    "Method", "MethodSettings", "MethodContext", "EpisodeInput", "ProbeInput", "Answer", "Embed",
    "SNAPSHOT_FIELDS", "after_session", "visible_memory", "MemoryItem", "ReportPanel",
    # rows
    "Rows", "Turn", "Probe", "Episode",
    # the LLM client and its failure
    "ChatLLM", "LLMResult", "Messages", "LLMError", "attempt",
    # stages a method brings itself
    "EpisodeStage", "GlobalStage", "StageContext", "Section",
    # retrieval (pipeline/retrieval.py)
    "tokenize", "bm25_scores", "dense_scores", "hybrid_scores", "minmax", "top_k", "within_budget",
    "within_tokens", "count_tokens",
    # the conversation (stages/dialogue.py)
    "sessions_of", "format_unit", "last_turns", "build_exchanges", "in_time_order",
    # the shared response frame (stages/methods/shared/memory_response.py)
    "answer_from_memory", "memory_messages",
    # the test kit (stages/testing.py, pipeline/testing/)
    "run_method", "FakeChat", "FakeOpenAI", "SAMPLE_CORPUS",
]


class Turn(TypedDict):
    """One turn of the conversation (an `ingest.turns` row): `EpisodeInput.sessions`, `ProbeInput.history`
    and `ProbeInput.current` hold these, each session in turn order."""

    episode_id: str
    session_idx: int  # 1-based
    turn_idx: int  # 0-based within the session
    speaker: str
    text: str
    session_time: datetime | None  # when the session took place, where the corpus says
    session_gap_label: str | None  # the corpus's gap before the session ("2 days later"), where it has one
    source_turn_id: str | None  # the corpus's own id of the turn (a QA's evidence names these)
    gold_topic_boundary: bool | None  # True: the turn starts a new topic (segmentation corpora)


class _ContextTurn(TypedDict):
    speaker: str
    text: str


class Probe(TypedDict):
    """One probe (a `probes.probes` row): `ProbeInput.probe`. A probe asks the method for the next
    utterance of a session (`next_response`), or a question about the conversation (`qa`, `teafarm`)."""

    episode_id: str
    probe_id: str
    kind: Literal["next_response", "qa", "teafarm"]
    session_idx: int  # the session the probe sits in (a question after the last session: one past it)
    turn_idx: int | None  # the turn to produce (next_response); None for a question
    respondent: str  # the speaker who answers
    request: str  # the partner's last utterance, or the question (`ProbeInput.request`)
    gold: str | None  # the real next turn, or the reference answer (not for the method's eyes)
    qa_id: str | None
    evidence: list[str] | None  # the turns (`source_turn_id`) that hold the answer
    category: str | None
    context: list[_ContextTurn] | None  # the probe's session, when the corpus does not hold it (TeaFarm)
    false_premise: str | None  # TeaFarm: what the question wrongly assumes
    adversarial_answer: str | None  # LoCoMo category 5: the tempting wrong option
    abstention: bool | None  # the history cannot answer it (LongMemEval "_abs")
    gold_original: str | None  # the dataset's own reference where an audited answer key changed it


class _Note(TypedDict):
    session_idx: int
    kind: str
    speaker: str
    text: str


class Episode(TypedDict):
    """One conversation (an `ingest.episodes` row): `EpisodeInput.episode`, `ProbeInput.episode`."""

    episode_id: str
    dataset: str
    speakers: list[str]
    personas: list[list[str]] | None  # one list per speaker, in `speakers` order
    relationship: str | None
    notes: list[_Note] | None  # the corpus's session annotations (LoCoMo's summaries and observations)
    n_sessions: int
    source_file: str


_TEST_KIT = {"run_method": "stages.testing", "FakeChat": "pipeline.testing.fake_chat",
             "FakeOpenAI": "pipeline.testing.fake_openai", "SAMPLE_CORPUS": "pipeline.testing.plugin"}


def __getattr__(name: str) -> object:
    """The test kit's names, imported when first asked for (see the module's docstring)."""
    module = _TEST_KIT.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
