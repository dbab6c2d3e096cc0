"""`a_mem`: A-MEM (agentic memory: notes with keywords, tags and a context written by the LLM, linked to
their nearest notes, which a new note can "evolve") run as a library, unchanged.

Which A-MEM: the official code (agiresearch/A-mem, WujiangXu/A-mem) is not on PyPI; this runs the PyPI
`a-mem` 0.2.6 (module `agentic_memory`), a packaged fork of it: the same `AgenticMemorySystem`,
`add_note` (the LLM's analysis of a note, then the evolution step: the note's nearest notes in
ChromaDB shown to the LLM, which may link the new note to them, retag it, and rewrite their context
and tags) and search, with ChromaDB as its only store. It runs offline here by configuration alone:

- LLM: the fork's `openai` backend (an `openai.OpenAI` client that takes no base URL); its client is
  replaced by one on the run's gateway (pipeline/llm/gateway.py) with the dummy key naming this
  method, so every call is cached, capped, budgeted and billed as `a_mem`. The model name sent is
  "gateway" (the gateway answers with the run's model). Its litellm import reads the packaged cost map
  (`LITELLM_LOCAL_MODEL_COST_MAP`); litellm itself is never called (it serves the other backends).
- Embeddings: NOT through the gateway. The fork embeds inside ChromaDB with a local
  SentenceTransformer (`all-MiniLM-L6-v2` by default); `embedding_model` is resolved as the
  project's embedder resolves it (the packaged MiniLM, extracted under `model_cache_dir`), loaded
  offline (`local_files_only`) and handed to ChromaDB's model cache, so neither ChromaDB's default
  ONNX model nor the hub is fetched. ChromaDB's telemetry is off (`ANONYMIZED_TELEMETRY`).
- Store: a ChromaDB folder per episode (and per answer), in a scratch directory, closed after use.

Protocol:
- Build (as A-MEM's LoCoMo evaluation adds a conversation): every turn, in order, one note "Name: text"
  timestamped with its session's time (A-MEM's YYYYMMDDHHMM), by `add_note`: the library's own
  analysis and evolution calls. Note ids are ours and deterministic (episode, session, turn), so the
  evolution prompts (which list neighbours by id) repeat exactly and a rerun is answered from the
  call cache. After each session every note as it stands then (content, keywords, tags, context,
  links, timestamp) is kept as `notes`, a `snapshots` memory: a probe sees the notes before it.
- Answer (the mem0 paper's protocol: only the memory differs between rows): the probe's snapshot is
  loaded into a fresh memory system without LLM calls (the fork's `add_note` always runs the evolution
  step, so each note goes in through its retriever's `add_document`, the very write `add_note` ends
  with), searched with the library's own search for the request (`search: agentic`, its
  `search_agentic`: the nearest notes and the notes they link to; `vector`: `search`, nearest only;
  `top_k` in all), and read by the shared reader (`mem0_style.read_memories`), the retrieved notes
  grouped under the speaker whose turn each records, dated by session. The reader sees a note's
  content, not its keywords, tags or context (those shaped the retrieval).

A library exception on one episode fails that episode's memory, an answer's fails that row; an error
the gateway answered that the library swallowed (its analysis and evolution steps catch everything)
fails it too, as does a search the library logged as failed; a budget stop stops the run. Settings of
`Mem0Settings` that belong to mem0's extraction (`top_s`, `extract_every`, `recent_turns`,
`per_speaker`) are unused here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator, Literal

import pyarrow as pa
from pydantic import Field

from pipeline.errors import ConfigError
from pipeline.llm.gateway import Gateway
from stages.methods.base import (SNAPSHOT_FIELDS, Answer, EpisodeInput, Method, MethodContext, ProbeInput,
                                 after_session)
from stages.methods.baselines.mem0_style import Mem0Settings, read_memories
from stages.methods.mem0_library import session_clock

PACKAGE, MODULE = "a-mem", "agentic_memory"
# Read when litellm / ChromaDB are imported: the packaged cost map (else litellm fetches it at import),
# no anonymized telemetry from ChromaDB.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["ANONYMIZED_TELEMETRY"] = "False"

NOTES = pa.schema([
    *SNAPSHOT_FIELDS,  # the notes after session snapshot_session
    pa.field("note_id", pa.string(), nullable=False),
    pa.field("content", pa.string(), nullable=False),  # "Name: text" of one turn
    pa.field("speaker", pa.string()),  # whose turn it records
    pa.field("session_idx", pa.int32(), nullable=False),  # the session the note was added in
    pa.field("session_date", pa.string()),  # that session's date (null: undated corpus)
    pa.field("timestamp", pa.string()),  # A-MEM's YYYYMMDDHHMM
    pa.field("keywords", pa.list_(pa.string())),
    pa.field("tags", pa.list_(pa.string())),
    pa.field("context", pa.string()),
    pa.field("category", pa.string()),
    pa.field("links", pa.list_(pa.string())),  # ids of the notes evolution linked it to
])


class AMemSettings(Mem0Settings):
    top_k: int = Field(default=10, ge=1)  # notes retrieved for a response (A-MEM's `k`)
    search: Literal["agentic", "vector"] = "agentic"  # search_agentic (with linked notes) or search
    embedding_model: str = "all-MiniLM-L6-v2"  # the fork's SentenceTransformer (packaged MiniLM by default)
    model_cache_dir: str = ".cache/models"  # where the packaged model is extracted (embedding.cache_dir)


# --- the library, configured to stay on this machine ----------------------------------------------

def _library() -> Any:
    """The fork's `AgenticMemorySystem`, imported with litellm's cost map local and telemetry off."""
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    os.environ["ANONYMIZED_TELEMETRY"] = "False"
    try:
        from agentic_memory.memory_system import AgenticMemorySystem
    except ImportError as e:
        raise ConfigError(f"method a_mem needs the {PACKAGE} package: pip install -e '.[a_mem]'") from e
    return AgenticMemorySystem


_model_lock = threading.Lock()


def local_embedder(model: str, cache_dir: str) -> str:
    """The name ChromaDB's SentenceTransformer function is given: a local folder, its model loaded
    offline into ChromaDB's model cache (so ChromaDB never loads it from the hub itself)."""
    from chromadb.utils.embedding_functions.sentence_transformer_embedding_function import (
        SentenceTransformerEmbeddingFunction)

    from pipeline.embeddings import _load_sentence_transformer, resolve_local_model

    path, local = resolve_local_model(model, cache_dir)
    if not local:
        raise ConfigError(f"method a_mem: embedding_model {model!r} is neither the packaged MiniLM nor a folder; "
                          "the fork would download it")
    with _model_lock:
        if path not in SentenceTransformerEmbeddingFunction.models:
            SentenceTransformerEmbeddingFunction.models[path] = _load_sentence_transformer(path, "cpu", True)
    return path


def open_system(gateway: Gateway, method: str, folder: Path, settings: AMemSettings) -> Any:
    """A fresh memory system with its ChromaDB in `folder`, its LLM client on the gateway."""
    from openai import OpenAI

    system = _library()(model_name=local_embedder(settings.embedding_model, settings.model_cache_dir),
                        llm_backend="openai", llm_model="gateway", api_key=Gateway.api_key(method),
                        storage_path=str(folder / "chroma"))
    # The gateway retries (and stops) on the run's terms; the client asks once.
    system.llm_controller.llm.client = OpenAI(api_key=Gateway.api_key(method), base_url=gateway.base_url,
                                              max_retries=0)
    return system


def close_system(system: Any) -> None:
    with contextlib.suppress(Exception):
        system.retriever.client.close()  # ChromaDB keeps a system per folder until closed


def amem_time(when: datetime | None) -> str | None:
    return when.strftime("%Y%m%d%H%M") if when is not None else None


def note_id(episode_id: str, session: int, turn: int) -> str:
    return f"{episode_id}:s{session:03d}:t{turn:04d}"


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []


# --- library calls (each runs in one of the gateway's threads) --------------------------------------

def _add_session(system: Any, notes: list[tuple[str, str, str | None]]) -> None:
    """(id, content, timestamp) of each turn, added in order with the library's own analysis and evolution."""
    for nid, content, when in notes:
        system.add_note(content, time=when, id=nid)


def _notes(system: Any) -> list[Any]:
    """Every note as it stands now (after the evolution of later notes)."""
    ids = system.retriever.get_all_ids()
    return [n for n in system.read_multiple(ids).values() if n is not None]


def _load(system: Any, rows: list[dict]) -> None:
    """A snapshot into a fresh system, no LLM call: the write `add_note` ends with, with the note's fields."""
    for r in rows:
        metadata = {"id": r["note_id"], "content": r["content"], "keywords": list(r["keywords"] or []),
                    "links": list(r["links"] or []), "retrieval_count": 0, "timestamp": r["timestamp"] or "",
                    "last_accessed": r["timestamp"] or "", "context": r["context"] or "General",
                    "evolution_history": [], "category": r["category"] or "Uncategorized",
                    "tags": list(r["tags"] or [])}
        system.retriever.add_document(r["content"], metadata, r["note_id"])


class _Errors(logging.Handler):
    """ERROR records the library logs in one thread (its search catches and logs, returning nothing)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.thread, self.seen = threading.get_ident(), []  # type: tuple[int, list[str]]

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread:
            self.seen.append(record.getMessage())


@contextlib.contextmanager
def raising_logged_errors() -> Iterator[None]:
    logger = logging.getLogger("agentic_memory.memory_system")
    handler = _Errors()
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    if handler.seen:
        raise RuntimeError(f"a-mem: {handler.seen[0]}")


def _search(system: Any, query: str, top_k: int, how: str) -> list[str]:
    with raising_logged_errors():
        hits = system.search_agentic(query, k=top_k) if how == "agentic" else system.search(query, k=top_k)
    return [str(h["id"]) for h in hits]


# --- the method ---------------------------------------------------------------------------------------

class AMemLibrary(Method[AMemSettings]):
    name = "a_mem"
    library = PACKAGE
    library_modules = (MODULE,)
    library_extra = "a_mem"
    memory = {"notes": NOTES}
    memory_kind = "snapshots"

    async def build(self, ctx: MethodContext[AMemSettings], episode: EpisodeInput) -> dict[str, list[dict]]:
        eid = episode.episode["episode_id"]
        rows: list[dict] = []
        meta: dict[str, dict] = {}  # note id -> speaker, session of the turn it records
        async with Gateway(ctx.llm) as gw, _scratch() as folder:
            system = await gw.call(open_system, gw, self.name, folder, ctx.settings)
            try:
                for s, turns in sorted(episode.sessions.items()):
                    when = session_clock(turns)
                    added = [(note_id(eid, s, i), f"{t['speaker']}: {t['text']}", amem_time(when))
                             for i, t in enumerate(turns)]
                    meta.update({nid: {"speaker": t["speaker"], "session_idx": s,
                                       "session_date": when.date().isoformat() if when else None}
                                 for (nid, _, _), t in zip(added, turns)})
                    await gw.call(_add_session, system, added)
                    notes = await gw.call(_notes, system)
                    rows += sorted((note_row(eid, s, n, meta) for n in notes), key=lambda r: r["note_id"])
            finally:
                close_system(system)
        return {"notes": rows}

    async def answer(self, ctx: MethodContext[AMemSettings], probe: ProbeInput,
                     memory: dict[str, list[dict]]) -> Answer:
        settings = ctx.settings
        stored = memory.get("notes", [])
        found: list[str] = []
        if stored:
            async with Gateway(ctx.llm) as gw, _scratch() as folder:
                system = await gw.call(open_system, gw, self.name, folder, settings)
                try:
                    await gw.call(_load, system, stored)
                    found = await gw.call(_search, system, probe.request, settings.top_k, settings.search)
                finally:
                    close_system(system)
        by_id = {r["note_id"]: r for r in stored}
        hits = [by_id[i] for i in dict.fromkeys(found) if i in by_id]
        return await read_memories(ctx.llm, probe, speaker_groups(probe, hits), [h["note_id"] for h in hits],
                                   settings, {"notes_stored": len(stored), "search": settings.search})

    def memory_view(self, episode: EpisodeInput, memory: dict[str, list[dict]],
                    settings: AMemSettings) -> str | None:
        return "\n".join(f"{n['content']} [{n['context']}; {', '.join(n['tags'] or [])}]"
                         for n in memory.get("notes", [])) or None


def note_row(episode_id: str, session: int, note: Any, meta: dict[str, dict]) -> dict[str, Any]:
    """One note as kept after `session`."""
    known = meta.get(note.id, {"speaker": None, "session_idx": session, "session_date": None})
    return {**after_session(episode_id, session), "note_id": str(note.id), "content": str(note.content), **known,
            "timestamp": str(note.timestamp) if note.timestamp is not None else None,
            "keywords": _strings(note.keywords), "tags": _strings(note.tags), "context": str(note.context),
            "category": str(note.category), "links": _strings(note.links)}


def speaker_groups(probe: ProbeInput, hits: list[dict]) -> list[tuple[str, list[dict]]]:
    """The retrieved notes under the speaker whose turn each records (search order kept), as the
    shared reader takes them: text and date."""
    speakers = list(dict.fromkeys([*(probe.episode.get("speakers") or []), *(h["speaker"] or "" for h in hits)]))
    return [(sp, [{**h, "text": h["content"], "fact_date": h["session_date"]} for h in hits if (h["speaker"] or "") == sp])
            for sp in speakers if sp]


@contextlib.asynccontextmanager
async def _scratch() -> Any:
    with tempfile.TemporaryDirectory(prefix="mempipe-a-mem-") as folder:
        yield Path(folder)
