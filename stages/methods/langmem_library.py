"""`langmem`: LangChain's LangMem run as its makers ship it, the `langmem` package (0.0.30), as a
memory method: its memory store manager, whose extraction is tool calling (trustcall), writing into
a langgraph `InMemoryStore` indexed with embeddings.

Every call the library makes goes through the run's gateway (pipeline/llm/gateway.py): its chat model
(`ChatOpenAI`) and its store's embedder (`OpenAIEmbeddings`) point at 127.0.0.1 with a dummy key naming
this method, so they are cached, capped, budgeted and billed like ours, and answered by the run's
model and embedder. LangSmith tracing is off; nothing else leaves the machine.

- Build (as the mem0 paper's LangMem evaluation adds a conversation: one memory per speaker, fed only
  that speaker's messages, each written "date | Name: text"): each session, per speaker, handed to the
  memory store manager `batch_turns` messages at a time (0: the speaker's whole session at once; the
  evaluation handed an agent one message at a time) under the namespace ("memories", speaker). The
  manager searches the speaker's memories, then extracts, updates and deletes by tool calls. After
  each session the store's items are kept as `memories`, a `snapshots` memory: a probe sees the store
  as it was before it.
- Answer (the paper's protocol: only the memory differs between rows): the store at the probe, put
  into a fresh `InMemoryStore` as it is (no extraction), searched per speaker with the store's own
  search (`top_k`, the store's default limit of 10, which the evaluation's prompt search used), and
  read by the shared reader (mem0_style.read_memories), as `mem0` is.

Differs from the evaluation: there an agent (`create_react_agent` with the manage/search memory tools)
decided per message whether to store anything and answered from memory in its own words; here the
library's memory manager extracts, and the shared reader answers from the memories themselves.

A library exception on one episode fails that episode's memory (the memory stage's build failures), an
answer's fails that row; an error the gateway answered fails it too, and a budget stop stops the run.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
from pydantic import Field

from pipeline.errors import ConfigError
from pipeline.llm.gateway import Gateway
from stages.methods.base import (SNAPSHOT_FIELDS, Answer, EpisodeInput, Method, MethodContext, ProbeInput,
                                 after_session)
from stages.methods.baselines.mem0_style import Mem0Settings, read_memories
from stages.methods.mem0_library import session_clock

PACKAGE, EXTRA, NAME = "langmem", "langmem", "langmem"
# LangChain posts traces to LangSmith when these are on (an environment may set them): never here.
for _var in ("LANGCHAIN_TRACING_V2", "LANGSMITH_TRACING", "LANGCHAIN_TRACING"):
    os.environ[_var] = "false"

MEMORIES = pa.schema([
    *SNAPSHOT_FIELDS,  # the store after session snapshot_session
    pa.field("memory_id", pa.string(), nullable=False),  # the store's key
    pa.field("speaker", pa.string(), nullable=False),  # whose namespace holds it
    pa.field("namespace", pa.string(), nullable=False),  # the store's namespace, joined by "/"
    pa.field("kind", pa.string(), nullable=False),  # the schema the manager stored it as ("Memory")
    pa.field("text", pa.string(), nullable=False),
    pa.field("session_date", pa.string()),  # the date of the session that last wrote it
])


class LangMemSettings(Mem0Settings):
    # a speaker's messages per manager call; 0: the speaker's whole session at once (one extraction)
    batch_turns: int = Field(default=0, ge=0)
    query_limit: int = Field(default=5, ge=1)  # memories the manager recalls before extracting (its default)
    enable_deletes: bool = True  # the manager may delete memories (its default)


# --- deterministic ids ------------------------------------------------------------------------------
# LangMem names each new memory with uuid4, and the next extraction's prompt shows the memories with ids
# derived from those names: random names would make a rerun ask anew instead of hitting the call cache.
# Names drawn while a seed is pinned (per thread) come from it; elsewhere uuid4 stays random.

_seed = threading.local()


def _seeded_uuid4() -> uuid.UUID:
    seed = getattr(_seed, "value", None)
    if seed is None:
        return uuid.uuid4()
    _seed.count += 1
    return uuid.uuid5(uuid.NAMESPACE_URL, f"mempipe-langmem:{seed}:{_seed.count}")


_UUID = SimpleNamespace(**{k: getattr(uuid, k) for k in dir(uuid) if not k.startswith("__")})
_UUID.uuid4 = _seeded_uuid4


# --- the library, configured to stay on this machine ------------------------------------------------

def _library() -> Any:
    try:
        import langmem.knowledge.extraction as extraction
    except ImportError as e:
        raise ConfigError(f"method langmem needs the {PACKAGE} package: pip install -e '.[{EXTRA}]'") from e
    extraction.uuid = _UUID
    return extraction


def _clients(gateway: Gateway) -> tuple[Any, Any]:
    """The chat model and embedder, both on the gateway. The model name is a placeholder (the gateway
    answers with the role's model); no retries here (the gateway's own client retries, and a budget stop
    it answered must not be asked again); no token-length check (it would download tiktoken's files)."""
    from langchain_openai import ChatOpenAI, OpenAIEmbeddings

    key = Gateway.api_key(NAME)
    chat = ChatOpenAI(model="gateway", base_url=gateway.base_url, api_key=key, max_retries=0)
    # The fields' own names (their aliases base_url / api_key are what its type hints do not show).
    embed = OpenAIEmbeddings(model="gateway", openai_api_base=gateway.base_url, openai_api_key=key, max_retries=0,
                             check_embedding_ctx_length=False)
    return chat, embed


def open_store(gateway: Gateway, dims: int) -> Any:
    """A fresh langgraph InMemoryStore, its index embedding through the gateway."""
    from langgraph.store.memory import InMemoryStore

    return InMemoryStore(index={"dims": dims, "embed": _clients(gateway)[1]})


def open_manager(gateway: Gateway, store: Any, settings: LangMemSettings) -> Any:
    """LangMem's memory store manager on `store`, one namespace per speaker."""
    extraction = _library()
    return extraction.create_memory_store_manager(
        _clients(gateway)[0], namespace=namespace("{langgraph_user_id}"), store=store,
        query_limit=settings.query_limit, enable_deletes=settings.enable_deletes)


def namespace(speaker: str) -> tuple[str, str]:
    return ("memories", speaker)


def own_messages(turns: list[dict], speaker: str) -> list[dict[str, str]]:
    """`speaker`'s turns as the evaluation fed them to that speaker's memory: user messages, each
    "date | Name: text"."""
    return [{"role": "user", "content": f"{t.get('session_time') or ''} | {t['speaker']}: {t['text']}"}
            for t in turns if t["speaker"] == speaker]


def batches(messages: list[dict[str, str]], size: int) -> list[list[dict[str, str]]]:
    if not messages:
        return []
    step = size or len(messages)
    return [messages[i:i + step] for i in range(0, len(messages), step)]


def memory_text(value: dict[str, Any]) -> tuple[str, str]:
    """(kind, text) of a stored value: a `Memory`'s content, any other schema as its JSON."""
    content = value.get("content")
    kind = str(value.get("kind") or "__any__")
    if kind == "Memory" and isinstance(content, dict) and set(content) == {"content"}:
        return kind, str(content["content"])
    return kind, json.dumps(content, sort_keys=True)


class LangMemLibrary(Method[LangMemSettings]):
    name = NAME
    library = PACKAGE
    library_modules = ("langmem",)
    library_extra = EXTRA
    memory = {"memories": MEMORIES}
    memory_kind = "snapshots"
    uses_embedder = True

    async def build(self, ctx: MethodContext[LangMemSettings], episode: EpisodeInput) -> dict[str, list[dict]]:
        settings, eid = ctx.settings, episode.episode["episode_id"]
        speakers = list(episode.episode.get("speakers") or [])
        rows: list[dict] = []
        dated: dict[str, tuple[str, str | None]] = {}  # key -> (text, date of the session that wrote it)
        async with Gateway(ctx.llm, ctx.embed) as gw:
            store = await gw.call(open_store, gw, await ctx.embedding_dims())
            manager = await gw.call(open_manager, gw, store, settings)
            for s, turns in sorted(episode.sessions.items()):
                clock = session_clock(turns)
                date = clock.date().isoformat() if clock else None
                for speaker in speakers:
                    for i, batch in enumerate(batches(own_messages(turns, speaker), settings.batch_turns)):
                        await gw.call(_extract, manager, batch, speaker, f"{eid}:{speaker}:{s}:{i}")
                for speaker in speakers:
                    for item in await gw.call(_items, store, speaker):
                        kind, text = memory_text(item.value)
                        if dated.get(item.key, ("", None))[0] != text:
                            dated[item.key] = (text, date)
                        rows.append({**after_session(eid, s), "memory_id": item.key, "speaker": speaker,
                                     "namespace": "/".join(item.namespace), "kind": kind, "text": text,
                                     "session_date": dated[item.key][1]})
        return {"memories": rows}

    async def answer(self, ctx: MethodContext[LangMemSettings], probe: ProbeInput,
                     memory: dict[str, list[dict]]) -> Answer:
        settings = ctx.settings
        stored = memory.get("memories", [])
        speakers = list(dict.fromkeys([*(probe.episode.get("speakers") or []), *(m["speaker"] for m in stored)]))
        by_key = {(m["speaker"], m["memory_id"]): m for m in stored}
        groups: list[tuple[str, list[dict]]] = []
        async with Gateway(ctx.llm, ctx.embed) as gw:
            store = await gw.call(open_store, gw, await ctx.embedding_dims())
            await gw.call(_load, store, stored)
            for speaker in speakers:
                hits = await gw.call(_search, store, speaker, probe.request, settings.top_k) \
                    if any(m["speaker"] == speaker for m in stored) else []
                found = [by_key[(speaker, h.key)] for h in hits if (speaker, h.key) in by_key]
                groups.append((speaker, [{**m, "fact_date": m["session_date"]} for m in found]))
        used = [m["memory_id"] for _, ms in groups for m in ms]
        return await read_memories(ctx.llm, probe, groups, used, settings, {"memories_stored": len(stored)})

    def memory_view(self, episode: EpisodeInput, memory: dict[str, list[dict]],
                    settings: LangMemSettings) -> str | None:
        return "\n".join(f"[{m['speaker']}] {m['text']}" for m in memory.get("memories", [])) or None


# --- library calls, each run in one of the gateway's threads -----------------------------------------

def _extract(manager: Any, messages: list[dict[str, str]], speaker: str, seed: str) -> None:
    """One manager call: recall, extract by tool calls, write to the store; new names from `seed`."""
    _seed.value, _seed.count = seed, 0
    try:
        manager.invoke({"messages": messages}, config={"configurable": {"langgraph_user_id": speaker}})
    finally:
        _seed.value = None


def _items(store: Any, speaker: str) -> list[Any]:
    """Every item in the speaker's namespace, by key (a listing, no query: nothing embedded)."""
    return sorted(store.search(namespace(speaker), limit=1_000_000), key=lambda item: item.key)


def _load(store: Any, stored: list[dict]) -> None:
    """A snapshot back into a store, as the manager wrote it (so its embedded text is the same)."""
    from langgraph.store.base import PutOp

    store.batch([PutOp(namespace(m["speaker"]), m["memory_id"], _value(m)) for m in stored])


def _value(m: dict) -> dict[str, Any]:
    if m["kind"] == "Memory":
        return {"kind": "Memory", "content": {"content": m["text"]}}
    return {"kind": m["kind"], "content": json.loads(m["text"])}


def _search(store: Any, speaker: str, query: str, top_k: int) -> list[Any]:
    return list(store.search(namespace(speaker), query=query, limit=top_k))
