"""`mem0`: mem0 run as its makers ship it, the `mem0ai` package (pinned in pyproject's `[mem0]` extra and
on the memory-systems sheet; mem0ai 2.x is the open library, not the hosted Mem0 the paper ran), not
our reading of it (`mem0_style`).

Every call the library makes goes through the run's gateway (pipeline/llm/gateway.py): its LLM and
embedder are OpenAI clients pointed at 127.0.0.1 with a dummy key naming this method, so they are
cached, capped, budgeted and billed like ours, and answered by the run's model and embedder. Its
vector store is its own default (Qdrant in local mode, in a scratch folder per episode), its history
database a file beside it; telemetry off.

- Build (as mem0's LoCoMo evaluation adds a conversation): each session from each speaker's side,
  that speaker's turns as the user's and the partner's as the assistant's ("Name: text"), added
  `batch_turns` messages at a time under the speaker's user id, with the library's own extraction.
  mem0 dates its extraction prompt with today's date; the adapter pins that clock to the session's
  date (else a rerun on another day would ask anew). After each session the store of each speaker
  (`get_all`) is kept as `memories`, a `snapshots` memory: a probe sees the store as it was before it.
- Answer (the mem0 paper's protocol: only the memory differs between rows): the store at the probe,
  loaded into a fresh library instance as it is (`infer=False`, no extraction), searched per speaker
  with the library's own `search` (`top_k`), and read by the shared reader: mem0's evaluation answer
  rules for questions (`answer_prompt: mem0`, as `mem0_style`), the memory baselines' frame otherwise.

A library exception on one episode fails that episode's memory (the memory stage's build failures), an
answer's fails that row; an error the gateway answered that the library swallowed fails it too, and a
budget stop stops the run.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
from pydantic import Field

from pipeline.errors import ConfigError
from pipeline.llm.gateway import Gateway
from stages.methods.base import (SNAPSHOT_FIELDS, Answer, EpisodeInput, Method, MethodContext, ProbeInput,
                                 after_session)
from stages.methods.baselines.mem0_style import Mem0Settings, read_memories
from stages.methods.shared.spacy_model import spacy_model

PACKAGE, EXTRA = "mem0ai", "mem0"
# Read by mem0 when it is imported: no telemetry (it would post to PostHog and keep a second Qdrant
# store for it), and its home folder (config.json with a user id) in the temp dir, not in ~/.mem0.
os.environ["MEM0_TELEMETRY"] = "False"
os.environ.setdefault("MEM0_DIR", str(Path(tempfile.gettempdir()) / "mempipe-mem0-home"))

MEMORIES = pa.schema([
    *SNAPSHOT_FIELDS,  # the store after session snapshot_session
    pa.field("memory_id", pa.string(), nullable=False),  # the library's id
    pa.field("speaker", pa.string(), nullable=False),  # whose user id holds it
    pa.field("text", pa.string(), nullable=False),
    pa.field("session_date", pa.string()),  # the date its session was added on (the pinned clock)
])


class Mem0LibrarySettings(Mem0Settings):
    batch_turns: int = Field(default=2, ge=1)  # messages per `add` (mem0's LoCoMo evaluation: 2)
    # The library's own fact extraction (true); false stores each message as it is.
    infer: bool = True


# --- the library, configured to stay on this machine ----------------------------------------------

_clock = threading.local()


class _SessionClock(datetime):
    """mem0's prompt clock: the session being added (per thread), else the real one."""

    @classmethod
    def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
        pinned = getattr(_clock, "date", None)
        return pinned.replace(tzinfo=tz) if pinned is not None else datetime.now(tz)


@contextlib.contextmanager
def pinned_clock(when: datetime | None) -> Iterator[None]:
    _clock.date = when
    try:
        yield
    finally:
        _clock.date = None


def _library() -> Any:
    """mem0's `Memory`, imported with telemetry off, its prompt clock pinnable and its spaCy model the
    one installed here (it would download en_core_web_sm otherwise)."""
    os.environ["MEM0_TELEMETRY"] = "False"
    if os.environ.get("OPENROUTER_API_KEY"):
        raise ConfigError("method mem0: OPENROUTER_API_KEY is set, and mem0 then sends its calls to OpenRouter "
                          "instead of the run's gateway; unset it for this run")
    try:
        import mem0.configs.prompts as prompts
        import mem0.memory.main as main
        import mem0.memory.telemetry as telemetry
        from mem0 import Memory
        from mem0.utils import spacy_models
    except ImportError as e:
        raise ConfigError(f"method mem0 needs the {PACKAGE} package: pip install -e '.[{EXTRA}]'") from e
    main.MEM0_TELEMETRY = telemetry.MEM0_TELEMETRY = False  # also where mem0 was imported before us
    prompts.datetime = _SessionClock
    if spacy_models._nlp_full is None:
        spacy_models._nlp_full = spacy_model(full=True)
        spacy_models._nlp_lemma = spacy_model(full=False)
    return Memory


def open_store(gateway: Gateway, method: str, dims: int, folder: Path) -> Any:
    """A fresh mem0 store in `folder`, every client on the gateway."""
    client = {"api_key": Gateway.api_key(method), "openai_base_url": gateway.base_url}
    return _library().from_config({
        "llm": {"provider": "openai", "config": {"model": "gateway", **client}},
        "embedder": {"provider": "openai", "config": {"model": "gateway", "embedding_dims": dims, **client}},
        "vector_store": {"provider": "qdrant", "config": {"collection_name": "mem0", "path": str(folder / "qdrant"),
                                                          "embedding_model_dims": dims, "on_disk": False}},
        "history_db_path": str(folder / "history.db"),
    })


def perspective(turns: list[dict], speaker: str) -> list[dict[str, str]]:
    """A session as `speaker`'s chat with the library: their turns the user's, the others' the assistant's."""
    return [{"role": "user" if t["speaker"] == speaker else "assistant", "content": f"{t['speaker']}: {t['text']}"}
            for t in turns]


def session_clock(turns: list[dict]) -> datetime | None:
    when = turns[0].get("session_time") if turns else None
    if not when:
        return None
    try:
        return datetime.fromisoformat(str(when)).replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def user_id(episode_id: str, speaker: str) -> str:
    """mem0's user id of one speaker of an episode; mem0 refuses whitespace in it ("Lena Ortiz")."""
    return "::".join("_".join(part.split()) for part in (episode_id, speaker))


class Mem0Library(Method[Mem0LibrarySettings]):
    name = "mem0"
    library = PACKAGE
    library_modules = ("mem0",)
    library_extra = EXTRA
    memory = {"memories": MEMORIES}
    memory_kind = "snapshots"
    uses_embedder = True

    async def build(self, ctx: MethodContext[Mem0LibrarySettings], episode: EpisodeInput) -> dict[str, list[dict]]:
        settings, eid = ctx.settings, episode.episode["episode_id"]
        speakers = list(episode.episode.get("speakers") or [])
        rows: list[dict] = []
        async with Gateway(ctx.llm, ctx.embed) as gw, _scratch() as folder:
            dims = await ctx.embedding_dims()
            store = await gw.call(open_store, gw, self.name, dims, folder)
            for s, turns in sorted(episode.sessions.items()):
                clock = session_clock(turns)
                for speaker in speakers:
                    messages = perspective(turns, speaker)
                    for i in range(0, len(messages), settings.batch_turns):
                        await gw.call(_add, store, messages[i:i + settings.batch_turns], user_id(eid, speaker),
                                      clock, settings.infer)
                for speaker in speakers:
                    found = await gw.call(_all, store, user_id(eid, speaker))
                    rows += [{**after_session(eid, s), "memory_id": m["id"], "speaker": speaker, "text": m["memory"],
                              "session_date": clock.date().isoformat() if clock else None} for m in found]
        return {"memories": rows}

    async def answer(self, ctx: MethodContext[Mem0LibrarySettings], probe: ProbeInput,
                     memory: dict[str, list[dict]]) -> Answer:
        settings = ctx.settings
        stored = memory.get("memories", [])
        speakers = list(dict.fromkeys([*(probe.episode.get("speakers") or []), *(m["speaker"] for m in stored)]))
        groups: list[tuple[str, list[dict]]] = []
        async with Gateway(ctx.llm, ctx.embed) as gw, _scratch() as folder:
            store = await gw.call(open_store, gw, self.name, await ctx.embedding_dims(), folder)
            for speaker in speakers:
                mine = [m for m in stored if m["speaker"] == speaker]
                if not mine:
                    groups.append((speaker, []))
                    continue
                uid = user_id(probe.episode["episode_id"], speaker)
                await gw.call(_add, store, [{"role": "user", "content": m["text"]} for m in mine], uid, None, False)
                hits = await gw.call(_search, store, probe.request, uid, settings.top_k)
                by_text = {m["text"]: m for m in mine}
                groups.append((speaker, [{**by_text[h["memory"]], "fact_date": by_text[h["memory"]]["session_date"]}
                                         for h in hits if h["memory"] in by_text]))
        used = [m["memory_id"] for _, ms in groups for m in ms]
        return await read_memories(ctx.llm, probe, groups, used, settings, {"memories_stored": len(stored)})

    def memory_view(self, episode: EpisodeInput, memory: dict[str, list[dict]],
                    settings: Mem0LibrarySettings) -> str | None:
        return "\n".join(f"[{m['speaker']}] {m['text']}" for m in memory.get("memories", [])) or None


@contextlib.asynccontextmanager
async def _scratch() -> Any:
    with tempfile.TemporaryDirectory(prefix="mempipe-mem0-") as folder:
        yield Path(folder)


def _add(store: Any, messages: list[dict], uid: str, clock: datetime | None, infer: bool) -> None:
    with pinned_clock(clock):
        store.add(messages, user_id=uid, infer=infer)


def _all(store: Any, uid: str) -> list[dict]:
    return list(store.get_all(filters={"user_id": uid}, top_k=100_000)["results"])


def _search(store: Any, query: str, uid: str, top_k: int) -> list[dict]:
    return list(store.search(query, filters={"user_id": uid}, top_k=top_k)["results"])
