"""`graphiti`: Graphiti (Zep's open temporal knowledge-graph library, the `graphiti-core` package,
pinned at 0.31.2 on the memory-systems sheet) run as its makers ship it, with every LLM, embedding
and reranking call through the run's gateway (pipeline/llm/gateway.py), so they are cached, capped,
budgeted and billed under this method like ours.

Store: Graphiti's Kuzu driver (`KuzuDriver`), an embedded graph database in a scratch folder, no
server. Kuzu is pinned at 0.11.3; the Kuzu project was archived in October 2025 and Graphiti marks
its Kuzu backend deprecated, so this pin will not move. Two gaps of graphiti-core 0.31.2 on Kuzu are
bridged without touching the library: `Graphiti.build_indices_and_constraints` never reaches the
driver's full-text indexes (we call the driver's own `graph_ops.build_indices_and_constraints`;
Kuzu 0.11 bundles its FTS extension, nothing is downloaded), and `add_episode(group_id=...)` reads a
`_database` the Kuzu driver lacks (we name the driver's database after the group, the one graph it
holds). Telemetry off: `GRAPHITI_TELEMETRY_ENABLED=false` before the import.

Clients: the library's defaults, pointed at the gateway with a dummy key naming this method:
`OpenAIClient` (structured output through `responses.parse`, i.e. /v1/responses with a json_schema
text format), `OpenAIEmbedder` (/v1/embeddings, sized to the run's embedder) and
`OpenAIRerankerClient` (chat completions with logprobs and logit_bias, the cross-encoder of the edge
search). Their OpenAI SDK clients are built with `max_retries=0`: the gateway's client retries
already, and the SDK's retries would only multiply them (and a budget stop's 503 would be retried).

Protocol (mirroring the mem0 paper's Zep evaluation, mem0ai/mem0 `evaluation/src/zep/`, in our code):
- Build: each LoCoMo conversation is one graph, `group_id` the episode id. Each message is added as
  one Graphiti `message` episode ("Speaker: text") with its session's date as `reference_time`
  (`episode_unit: message`, the evaluation's choice, which added messages one by one with the
  session's timestamp); `episode_unit: session` adds a session as one message episode instead.
  After each session the graph's entity nodes and entity edges (facts), as the library's models
  with their embeddings, are kept as `graph` rows keyed `after_session(eid, s)`: a snapshot.
- Answer: the probe's snapshot saved into a fresh Kuzu graph with the library's own `save` methods
  (no LLM calls), then the library's `search_`: facts (edges) by hybrid search reranked by the
  cross-encoder, and entities (nodes) by hybrid search with RRF, `top_k` each (20, as the
  evaluation); `include_nodes: false` leaves entities out. They are read by the shared reader
  (`read_memories`, mem0's evaluation answer rules for questions): facts with their valid date range
  ("from - to", "date unknown" / "present" where open, as the evaluation wrote them), entities with
  their summaries.

A library exception on one episode fails that episode's memory, an answer's fails that row; an error
the gateway answered that the library swallowed fails it too, and a budget stop stops the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from datetime import datetime, timezone
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

PACKAGE, EXTRA = "graphiti-core", "graphiti"
# Read by Graphiti at each event it would send to PostHog: off before the library is imported.
os.environ["GRAPHITI_TELEMETRY_ENABLED"] = "false"

GRAPH = pa.schema([
    *SNAPSHOT_FIELDS,  # the graph after session snapshot_session
    pa.field("kind", pa.string(), nullable=False),  # "entity" (a node) or "fact" (an entity edge)
    pa.field("uuid", pa.string(), nullable=False),  # the library's id
    pa.field("text", pa.string(), nullable=False),  # a fact's sentence, an entity's "name: summary"
    pa.field("valid_at", pa.string()),  # facts: when it became true (ISO), null when unknown
    pa.field("invalid_at", pa.string()),  # facts: when it stopped being true, null while it holds
    pa.field("record", pa.string(), nullable=False),  # the library model as JSON, embedding included
])
# A session without a date still needs a reference time; a fixed one keeps reruns' prompts equal.
UNDATED = datetime(2000, 1, 1, tzinfo=timezone.utc)
FACTS_OF = "{speakers}"  # the reader's heading for the facts: "Memories about Mina and Joon"
ENTITIES = "the people, places and things in their conversation"


class GraphitiSettings(Mem0Settings):
    top_k: int = Field(default=20, ge=1)  # facts and entities retrieved each (the evaluation's limit)
    # message: one Graphiti episode per message (the evaluation's); session: one per session
    episode_unit: Literal["message", "session"] = "message"
    include_nodes: bool = True  # entities beside the facts, as the evaluation searched both


# --- the library, configured to stay on this machine ----------------------------------------------

def _library() -> dict[str, Any]:
    """Graphiti's classes, imported with telemetry off."""
    os.environ["GRAPHITI_TELEMETRY_ENABLED"] = "false"
    try:
        from graphiti_core import Graphiti
        from graphiti_core.cross_encoder.openai_reranker_client import OpenAIRerankerClient
        from graphiti_core.driver.kuzu_driver import KuzuDriver
        from graphiti_core.edges import EntityEdge
        from graphiti_core.embedder.openai import OpenAIEmbedder, OpenAIEmbedderConfig
        from graphiti_core.llm_client import LLMConfig, OpenAIClient
        from graphiti_core.nodes import EntityNode, EpisodeType
        from graphiti_core.search import search_config_recipes as recipes
    except ImportError as e:
        raise ConfigError(f"method graphiti needs the {PACKAGE} and kuzu packages: pip install -e '.[{EXTRA}]'") from e
    return {"Graphiti": Graphiti, "Reranker": OpenAIRerankerClient, "KuzuDriver": KuzuDriver, "EntityEdge": EntityEdge,
            "Embedder": OpenAIEmbedder, "EmbedderConfig": OpenAIEmbedderConfig, "LLMConfig": LLMConfig,
            "LLMClient": OpenAIClient, "EntityNode": EntityNode, "EpisodeType": EpisodeType, "recipes": recipes}


async def open_graph(base_url: str, method: str, dims: int, folder: Path, group_id: str) -> Any:
    """A fresh Graphiti on a Kuzu graph in `folder`, its full-text indexes built, every client on the
    gateway. Called inside the event loop that will use it (the SDK's connections belong to one)."""
    from openai import AsyncOpenAI

    lib = _library()
    key = Gateway.api_key(method)
    sdk = AsyncOpenAI(api_key=key, base_url=base_url, max_retries=0)  # the gateway's client retries
    config = lib["LLMConfig"](api_key=key, base_url=base_url, model="gateway", small_model="gateway")
    driver = lib["KuzuDriver"](db=str(folder / "graph.kuzu"))
    driver._database = group_id  # the one graph this driver holds; add_episode(group_id) reads it
    await driver.graph_ops.build_indices_and_constraints(driver)  # Graphiti's own call skips Kuzu's
    embedder = lib["Embedder"](lib["EmbedderConfig"](api_key=key, base_url=base_url, embedding_model="gateway",
                                                     embedding_dim=dims), client=sdk)
    return lib["Graphiti"](graph_driver=driver, llm_client=lib["LLMClient"](config=config, client=sdk),
                           embedder=embedder, cross_encoder=lib["Reranker"](config=config, client=sdk))


def episodes_of(session: int, turns: list[dict], unit: str) -> list[tuple[str, str]]:
    """(name, body) of the Graphiti episodes one session is added as, in order."""
    if unit == "session":
        return [(f"session {session}", "\n".join(f"{t['speaker']}: {t['text']}" for t in turns))]
    return [(f"session {session} turn {t.get('turn_idx', i)}", f"{t['speaker']}: {t['text']}")
            for i, t in enumerate(turns)]


async def _add_episode(graph: Any, group_id: str, name: str, body: str, when: datetime) -> None:
    """One Graphiti episode, with the library's own extraction, dedupe and invalidation."""
    await graph.add_episode(name=name, episode_body=body, source_description="conversation",
                            reference_time=when, source=_library()["EpisodeType"].message, group_id=group_id)


def _iso(when: datetime | None) -> str | None:
    return when.isoformat() if when is not None else None


async def _snapshot(graph: Any, group_id: str) -> list[dict[str, Any]]:
    """The graph's entities and facts as rows (without the snapshot key), embeddings included."""
    lib = _library()
    nodes = await lib["EntityNode"].get_by_group_ids(graph.driver, [group_id], with_embeddings=True)
    edges = await lib["EntityEdge"].get_by_group_ids(graph.driver, [group_id], with_embeddings=True)
    rows = [{"kind": "entity", "uuid": n.uuid, "text": f"{n.name}: {n.summary}" if n.summary else n.name,
             "valid_at": None, "invalid_at": None, "record": n.model_dump_json()} for n in nodes]
    rows += [{"kind": "fact", "uuid": e.uuid, "text": e.fact, "valid_at": _iso(e.valid_at),
              "invalid_at": _iso(e.invalid_at), "record": e.model_dump_json()} for e in edges]
    return rows


def build_graph(base_url: str, method: str, dims: int, episode_id: str, sessions: dict[int, list[dict]],
                unit: str) -> list[dict[str, Any]]:
    """The whole episode's graph, session by session, in one event loop of this (gateway) thread;
    the snapshot rows after each session."""
    async def run() -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        with _scratch() as folder:
            graph = await open_graph(base_url, method, dims, folder, episode_id)
            for s, turns in sorted(sessions.items()):
                when = session_clock(turns) or UNDATED
                for name, body in episodes_of(s, turns, unit):
                    await _add_episode(graph, episode_id, name, body, when)
                rows += [{**after_session(episode_id, s), **r} for r in await _snapshot(graph, episode_id)]
        return rows

    return asyncio.run(run())


async def _restore(graph: Any, stored: list[dict[str, Any]]) -> None:
    """A snapshot saved into an empty graph with the library's own models and saves: entities
    first, as a fact's save links its two entities."""
    lib = _library()
    for row in stored:
        if row["kind"] == "entity":
            await lib["EntityNode"].model_validate_json(row["record"]).save(graph.driver)
    for row in stored:
        if row["kind"] == "fact":
            await lib["EntityEdge"].model_validate_json(row["record"]).save(graph.driver)


def search_graph(base_url: str, method: str, dims: int, episode_id: str, stored: list[dict[str, Any]],
                 query: str, top_k: int, include_nodes: bool) -> tuple[list[str], list[str]]:
    """(fact uuids, entity uuids) Graphiti's search finds for `query` in the snapshot, best first."""
    async def run() -> tuple[list[str], list[str]]:
        recipes = _library()["recipes"]
        with _scratch() as folder:
            graph = await open_graph(base_url, method, dims, folder, episode_id)
            await _restore(graph, stored)
            edges = recipes.EDGE_HYBRID_SEARCH_CROSS_ENCODER.model_copy(deep=True, update={"limit": top_k})
            facts = (await graph.search_(query, config=edges, group_ids=[episode_id])).edges
            entities = []
            if include_nodes:
                nodes = recipes.NODE_HYBRID_SEARCH_RRF.model_copy(deep=True, update={"limit": top_k})
                entities = (await graph.search_(query, config=nodes, group_ids=[episode_id])).nodes
        return [e.uuid for e in facts], [n.uuid for n in entities]

    return asyncio.run(run())


def date_range(row: dict[str, Any]) -> str:
    """A fact's validity as the evaluation showed it: "from - to", open ends named."""
    return f"{row['valid_at'] or 'date unknown'} - {row['invalid_at'] or 'present'}"


class GraphitiLibrary(Method[GraphitiSettings]):
    name = "graphiti"
    library = PACKAGE
    library_modules = ("graphiti_core", "kuzu")
    library_extra = EXTRA
    memory = {"graph": GRAPH}
    memory_kind = "snapshots"
    uses_embedder = True

    async def build(self, ctx: MethodContext[GraphitiSettings], episode: EpisodeInput) -> dict[str, list[dict]]:
        eid = episode.episode["episode_id"]
        async with Gateway(ctx.llm, ctx.embed) as gw:
            rows = await gw.call(build_graph, gw.base_url, self.name, await ctx.embedding_dims(), eid,
                                 dict(episode.sessions), ctx.settings.episode_unit)
        return {"graph": rows}

    async def answer(self, ctx: MethodContext[GraphitiSettings], probe: ProbeInput,
                     memory: dict[str, list[dict]]) -> Answer:
        settings, eid = ctx.settings, probe.episode["episode_id"]
        stored = memory.get("graph", [])
        facts: list[str] = []
        entities: list[str] = []
        if stored:  # an empty graph has nothing to search: no gateway, no calls
            async with Gateway(ctx.llm, ctx.embed) as gw:
                facts, entities = await gw.call(search_graph, gw.base_url, self.name, await ctx.embedding_dims(), eid,
                                                stored, probe.request, settings.top_k, settings.include_nodes)
        by_uuid = {r["uuid"]: r for r in stored}
        speakers = " and ".join(probe.episode.get("speakers") or []) or "the speakers"
        groups = [(FACTS_OF.format(speakers=speakers),
                   [{**by_uuid[u], "fact_date": date_range(by_uuid[u])} for u in facts if u in by_uuid])]
        if settings.include_nodes:
            groups.append((ENTITIES, [{**by_uuid[u], "fact_date": "entity"} for u in entities if u in by_uuid]))
        used = [m["uuid"] for _, ms in groups for m in ms]
        details = {"facts_stored": sum(r["kind"] == "fact" for r in stored),
                   "entities_stored": sum(r["kind"] == "entity" for r in stored)}
        return await read_memories(ctx.llm, probe, groups, used, settings, details)

    def memory_view(self, episode: EpisodeInput, memory: dict[str, list[dict]],
                    settings: GraphitiSettings) -> str | None:
        if not memory.get("graph"):
            return None
        last = max(r["snapshot_session"] for r in memory["graph"])  # the graph as the episode left it
        return "\n".join(f"[{r['kind']}] {r['text']}" + (f" ({date_range(r)})" if r["kind"] == "fact" else "")
                         for r in memory["graph"] if r["snapshot_session"] == last) or None


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="mempipe-graphiti-") as folder:
        yield Path(folder)
