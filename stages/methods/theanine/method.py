"""Theanine (seed 000): a relation-aware memory graph built session by session (Phase I,
Algorithm 1), timelines retrieved through it (Phase II-1, Algorithm 2), refined for the current
conversation (Phase II-2), and a chain-of-thought response over them (Phase III).

Variants (Section 4's ablations and Section 6), each a method with its own settings:
`theanine`, `theanine_all` (link every labelled candidate, or every candidate),
`theanine_no_relation` (no LLM labelling: edges by similarity and chronology), `theanine_no_refine`
(raw timelines go to the response).

Where each phase lives:
- Phase I memories m = (event, time) per session: `session_memories.summarize_session` (shared with
  the memory baselines and TeaBag), called by `Theanine.build`; time = session index, date when the
  corpus has one, and the corpus's gap label before the session (`session_memories.memory_when`);
- Phase I relation-aware linking (Algorithm 1): the labelling prompt `prompts.relation_messages`,
  candidates `graph.top_similar`, links `graph.links_for`, run by `Theanine.build` / `Theanine.link`;
- Phase II-1 timeline retrieval (Algorithm 2): `graph.timelines_through`, `graph.sample_timelines`,
  `graph.group_by_component`, run by `Theanine.timelines`;
- Phase II-2 timeline refinement: `prompts.timeline_text` (each edge read earlier -> later, App. A.1),
  `prompts.refine_messages` (with `prompts.relation_guide`), in `Theanine.answer`; a timeline already
  chosen is replaced by another unused path of the next memory (`dedupe_timelines`);
- Phase III chain-of-thought response: `prompts.response_messages`, in `Theanine.answer`;
- the report's memory graph: `figure.memory_graph`, via `Theanine.report_panel`;
- TeaBag / TeaFarm (Section 5): `stages/teabag/`; Theanine's judges (App. D):
  `stages/judging/pairwise.py` and `stages/judging/answers.py` (TeaFarm correctness).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from pipeline.errors import ConfigError
from pipeline.failures import FAILURE_FIELDS, NO_FAILURE, attempt
from pipeline.llm.types import ChatLLM
from pipeline.retrieval import count_tokens, within_tokens
from stages.methods.shared import response
from stages.methods.base import (SNAPSHOT_FIELDS, Answer, EpisodeInput, Method, MethodContext, MethodSettings,
                                 ProbeInput, ReportPanel, after_session, asked_ahead)
from stages.dialogue import format_unit
from stages.methods.shared.session_memories import (
    MEMORY_FIELDS,
    memory_lines,
    memory_rows,
    summarize_session,
)
from stages.methods.theanine import figure, prompts
from stages.methods.theanine import graph as g
from stages.methods.theanine.prompts import RelationLabel  # (the class's `prompts` hides the module in its body)

MEMORIES = pa.schema([*MEMORY_FIELDS, pa.field("vector", pa.list_(pa.float32()))])
EDGES = pa.schema([
    *SNAPSHOT_FIELDS,  # keyed by the session whose new memory the edge links in
    pa.field("source", pa.string(), nullable=False),  # the older memory
    pa.field("target", pa.string(), nullable=False),  # the new memory
    pa.field("relation", pa.string(), nullable=False),
])
LINK_LABELS = pa.schema([
    *SNAPSHOT_FIELDS,
    pa.field("new_id", pa.string(), nullable=False),
    pa.field("candidate_id", pa.string(), nullable=False),
    pa.field("rank", pa.int32(), nullable=False),  # similarity rank among the top-j candidates
    # the LLM's label; "None" = no relation; null when the call failed; `graph.SIMILAR` without labelling
    pa.field("relation", pa.string()),
    pa.field("explanation", pa.string()),  # the labeller's reasoning, written before the label; null without one
    pa.field("linked", pa.bool_(), nullable=False),
    *FAILURE_FIELDS,
])
BUILD_LOG = pa.schema([
    *SNAPSHOT_FIELDS,
    pa.field("memories", pa.int32(), nullable=False),
    pa.field("link_calls", pa.int32(), nullable=False),  # at most j per new memory
    *FAILURE_FIELDS,  # the session's summary failed: no memories from it
])


class TheanineSettings(MethodSettings):
    j: int = Field(default=3, ge=1)  # associative memories per new memory (Phase I-1)
    k: int = Field(default=3, ge=1)  # memories retrieved per response (Phase II)
    n: int = Field(default=1, ge=1)  # timelines sampled per retrieved memory
    max_memories: int = Field(default=10, ge=1)  # memories summarised per session
    link_mode: g.LinkMode = "recent_per_component"
    relation_aware: bool = True  # False: no labelling, every candidate is linked as `graph.SIMILAR`
    # Without relation labels: whether the most-recent-per-component rule still applies to the
    # (unlabelled) candidates (theanine_no_relation's ablation).
    per_component: bool = True
    refine: bool = True  # Phase II-2
    # Algorithm 2 loops over the components of the retrieved memories, while Section 2.2 collects
    # k*n timelines: `memory` (default) = n per retrieved memory; `component` = n per component.
    timelines_per: Literal["memory", "component"] = "memory"
    max_paths: int = Field(default=1000, ge=1)  # bound on enumerated paths per retrieved memory
    # Section 2.2 writes the timelines as a union (a set): a path already chosen for an earlier
    # retrieved memory is not drawn again; the memory draws another of its paths (the official
    # retrieve_timeline), or none when all are taken (counted as `dropped` in the response's details).
    dedupe_timelines: bool = True
    # The order the retrieved memories draw their timelines in, which decides who gets a replacement
    # path when two share one: `similarity` (as retrieved; the paper defines M_re by similarity and is
    # silent on order; the default, today's) or `recency` (newest session first, as the official
    # retrieve_timeline sorts them, kimnamssya/Theanine src/theanine.py:134).
    draw_order: Literal["similarity", "recency"] = "similarity"
    origin_tokens: int | None = Field(default=600, ge=1)  # origin dialogue shown when labelling (ours)
    seed: int = 0  # timeline sampling


class TheanineAllSettings(TheanineSettings):
    link_mode: Literal["all_labelled", "all_candidates"] = "all_labelled"


class TheanineNoRelationSettings(TheanineSettings):
    relation_aware: Literal[False] = False


class TheanineNoRefineSettings(TheanineSettings):
    refine: Literal[False] = False


def origin_dialogue(turns: list[dict], budget: int | None) -> str:
    """The memory's session as "Speaker: text" lines, its first `budget` cl100k tokens."""
    lines = format_unit(turns).splitlines()
    kept = within_tokens(lines, budget, newest=False)
    return "\n".join(kept) + ("\n..." if len(kept) < len(lines) else "")


def graph_of(memories: list[dict], edges: list[dict]) -> g.Graph:
    graph = g.Graph()
    graph.add_memories({m["memory_id"]: (m["session_idx"], m["memory_idx"]) for m in memories})
    graph.edges = [g.Edge(e["source"], e["target"], e["relation"]) for e in edges]
    return graph


class Theanine(Method[TheanineSettings]):
    name = "theanine"
    Settings: ClassVar[type[MethodSettings]] = TheanineSettings
    memory = {"memories": MEMORIES, "edges": EDGES, "link_labels": LINK_LABELS, "build_log": BUILD_LOG}
    memory_kind = "log"
    uses_embedder = True
    prompts = {"relations": str(prompts.RELATION_DEFINITIONS), "guide": prompts.relation_guide(True),
               "guide_no_relation": prompts.relation_guide(False)}

    # ---------------------------------------------------------------- Phase I

    async def label(self, llm: ChatLLM, older: dict, newer: dict, sessions: dict[int, list[dict]],
                    settings: TheanineSettings) -> RelationLabel:
        msgs = prompts.relation_messages(
            older, newer, origin_dialogue(sessions[older["session_idx"]], settings.origin_tokens),
            origin_dialogue(sessions[newer["session_idx"]], settings.origin_tokens))
        return (await llm.chat(msgs, schema=prompts.RelationLabel)).parsed

    def link_mode(self, settings: TheanineSettings) -> g.LinkMode:
        if not settings.relation_aware and not settings.per_component:
            return "all_candidates"
        return settings.link_mode

    async def build(self, ctx: MethodContext[TheanineSettings], episode: EpisodeInput) -> dict[str, list[dict]]:
        settings = ctx.settings
        embed = ctx.embed
        if embed is None:
            raise ConfigError(f"{self.name} links memories by embedding similarity: configure `embedding:`")
        graph = g.Graph()
        by_id: dict[str, dict] = {}
        vectors: dict[str, np.ndarray] = {}
        out: dict[str, list[dict]] = {t: [] for t in self.memory}
        # A session's memories are summarised (and embedded) from its own turns alone, so every
        # session's are asked at once; only the linking waits for the graph the sessions before it built.
        async def summarized(s: int, turns: list[dict]) -> tuple[list[str] | None, dict[str, Any], np.ndarray]:
            events, failed = await attempt(summarize_session(ctx.llm, turns, s, settings.max_memories))
            vectors = np.asarray(await embed(events), dtype=np.float32) if events else np.zeros((0, 1))
            return events, failed, vectors

        summaries = {s: asyncio.ensure_future(summarized(s, turns)) for s, turns in episode.sessions.items()}
        with asked_ahead(summaries.values()):
            await self._build_sessions(ctx, episode, summaries, graph, by_id, vectors, out)
        return out

    async def _build_sessions(self, ctx: MethodContext[TheanineSettings], episode: EpisodeInput,
                              summaries: dict[int, Any], graph: g.Graph, by_id: dict[str, dict],
                              vectors: dict[str, np.ndarray], out: dict[str, list[dict]]) -> None:
        """Algorithm 1 session by session: each session's summarised memories linked to the graph."""
        settings, eid = ctx.settings, episode.episode["episode_id"]
        for s, turns in episode.sessions.items():
            events, failed, new_vectors = await summaries[s]
            if events is None:  # no memories from this session; the build goes on
                out["build_log"].append({**after_session(eid, s), "memories": 0, "link_calls": 0, **failed})
                continue
            new = memory_rows(eid, s, turns, events)
            edges, labels = await self.link(ctx.llm, graph, by_id, vectors, new, new_vectors, episode.sessions,
                                            settings)
            for m, v in zip(new, new_vectors):
                by_id[m["memory_id"]] = m
                vectors[m["memory_id"]] = v
                out["memories"].append({**m, "vector": v.tolist()})
            graph.add_memories({m["memory_id"]: (s, m["memory_idx"]) for m in new})
            graph.edges.extend(edges)
            out["edges"] += [{**after_session(eid, s), "source": e.source, "target": e.target, "relation": e.relation}
                             for e in edges]
            out["link_labels"] += labels
            calls = len(labels) if settings.relation_aware else 0
            out["build_log"].append({**after_session(eid, s), "memories": len(new), "link_calls": calls, **failed})

    async def link(self, llm: ChatLLM, graph: g.Graph, by_id: dict[str, dict], vectors: dict[str, np.ndarray],
                   new: list[dict], new_vectors: np.ndarray, sessions: dict[int, list[dict]], settings: TheanineSettings
                   ) -> tuple[list[g.Edge], list[dict]]:
        """Algorithm 1 for one session: every new memory against the graph as it stood before it."""
        if not graph.ages or not new:
            return [], []
        pool = sorted(graph.ages, key=graph.ages.__getitem__)
        pool_vectors = np.stack([vectors[m] for m in pool])
        components = graph.components()
        mode = self.link_mode(settings)

        async def one(m: dict, vec: np.ndarray) -> tuple[list[g.Edge], list[dict]]:
            candidates = g.top_similar(vec, pool, pool_vectors, settings.j)
            errors: dict[str, dict[str, Any]] = {}
            explained: dict[str, str] = {}
            if settings.relation_aware:
                async def ask(c: str) -> str:
                    label, failed = await attempt(self.label(llm, by_id[c], m, sessions, settings))
                    if label is None:  # a failed label is no relation, and recorded
                        errors[c] = failed
                        return g.NO_RELATION
                    explained[c] = label.explanation
                    return label.relation
                labels = dict(zip(candidates, await asyncio.gather(*(ask(c) for c in candidates))))
            else:
                labels = {c: g.SIMILAR for c in candidates}  # similarity and order only, no relation
            edges = g.links_for(m["memory_id"], labels, graph, components, mode)
            linked = {e.source for e in edges}
            rows = [{**after_session(m["episode_id"], m["session_idx"]), "new_id": m["memory_id"], "candidate_id": c,
                     "rank": r, "relation": None if c in errors else labels[c],
                     "explanation": explained.get(c) or None, "linked": c in linked,
                     **errors.get(c, NO_FAILURE)} for r, c in enumerate(candidates)]
            return edges, rows

        results = await asyncio.gather(*(one(m, v) for m, v in zip(new, new_vectors)))
        return [e for es, _ in results for e in es], [r for _, rows in results for r in rows]

    # ---------------------------------------------------------------- Phase II and III

    def timelines(self, graph: g.Graph, retrieved: list[str], settings: TheanineSettings, probe_id: str
                  ) -> tuple[list[list[str]], bool, int]:
        """Algorithm 2's timelines for the retrieved memories, in their order: (paths, whether an
        enumeration hit `max_paths`, timelines short). With `dedupe_timelines` a path already chosen
        for an earlier memory is never drawn again: the memory draws from its unused paths instead
        (the official retrieve_timeline, theanine.py:140-152), and when it has none left it adds
        nothing, counted as short."""
        targets = retrieved if settings.timelines_per == "memory" else g.group_by_component(retrieved, graph)
        chosen: list[list[str]] = []
        used: set[tuple[str, ...]] | None = set() if settings.dedupe_timelines else None
        bound_hit, short = False, 0
        for m in targets:
            found = g.timelines_through(m, graph, settings.max_paths)
            bound_hit |= found.bound_hit
            drawn = g.sample_timelines(found, settings.n, random.Random(f"{settings.seed}:{probe_id}:{m}"), used)
            short += min(settings.n, len(found.paths)) - len(drawn)
            chosen += drawn
        return chosen, bound_hit, short

    async def answer(self, ctx: MethodContext[TheanineSettings], probe: ProbeInput, memory: dict[str, list[dict]]) -> Answer:
        llm, settings = ctx.llm, ctx.settings
        if ctx.embed is None:  # without it there is no retrieval, so no timelines: refuse, do not guess
            raise ConfigError(f"{self.name} retrieves memories by embedding similarity: configure `embedding:`")
        memories = memory.get("memories", [])
        by_id = {m["memory_id"]: m for m in memories}
        graph = graph_of(memories, memory.get("edges", []))
        question = probe.probe["kind"] == "qa"  # a dataset question after the history: a short answer
        # The query: the current dialogue so far (it ends with the request), or the question alone.
        dialogue = format_unit(probe.current) if probe.current else probe.request
        retrieved: list[str] = []
        if memories:
            ids = [m["memory_id"] for m in memories]
            qvec = np.asarray((await ctx.embed([dialogue]))[0], dtype=np.float32)
            retrieved = g.top_similar(qvec, ids, np.asarray([m["vector"] for m in memories], dtype=np.float32),
                                      settings.k)
        if settings.draw_order == "recency":  # newest first; ties keep the similarity order (a stable sort)
            retrieved = sorted(retrieved, key=lambda i: -by_id[i]["session_idx"])
        paths, bound_hit, dropped = self.timelines(graph, retrieved, settings, probe.probe["probe_id"])
        raw = [prompts.timeline_text([by_id[i] for i in p], [graph.relation(a, b) for a, b in zip(p, p[1:])])
               for p in paths]
        if settings.refine:
            refined_results = await asyncio.gather(*(
                llm.chat(prompts.refine_messages(dialogue, t, settings.relation_aware), schema=prompts.Refined)
                for t in raw))
            refined = [r.parsed.information for r in refined_results]
        else:
            refined = raw
        result = await llm.chat(prompts.response_messages(dialogue, refined, probe.probe["respondent"], question,
                                                          raw=not settings.refine,
                                                          relation_aware=settings.relation_aware),
                                schema=prompts.ReasonedResponse)
        used = list(dict.fromkeys(i for p in paths for i in p))
        turns = {t for i in used for t in (by_id[i].get("source_turn_ids") or [])}
        return Answer(
            text=response.one_turn(result.parsed.response, probe.episode.get("speakers") or []),
            rationale=result.parsed.rationale, used_ids=used, context_tokens=sum(count_tokens(r) for r in refined),
            context_turns=len(turns), model=result.model,
            details={"retrieved": retrieved, "timelines": paths, "raw_timelines": raw, "refined_timelines": refined,
                     "timelines_per": settings.timelines_per, "bound_hit": bound_hit, "dropped": dropped})

    def memory_view(self, episode: EpisodeInput, memory: dict[str, list[dict]], settings: TheanineSettings) -> str | None:
        return memory_lines(memory.get("memories", [])) or None

    def report_panel(self, memory: dict[str, list[dict]], responses: list[dict]) -> ReportPanel | None:
        """The memory graph of the episode with the most edges, with the longest timeline one of its
        responses retrieved highlighted."""
        edges = memory.get("edges", [])
        if not edges:
            return None
        episode = Counter(e["episode_id"] for e in edges).most_common(1)[0][0]
        nodes = [n for n in memory.get("memories", []) if n["episode_id"] == episode]
        shown = [e for e in edges if e["episode_id"] == episode]
        highlight: list[str] = []
        for r in responses:
            if r["episode_id"] == episode and r["details_json"]:
                for timeline in json.loads(r["details_json"]).get("timelines") or []:
                    highlight = timeline if len(timeline) > len(highlight) else highlight
        title = f"{self.name}: memory graph of episode {episode} (red: a timeline a response retrieved)"
        return ReportPanel("Memory graph", "Memories as nodes by session; edges point from the older memory to the "
                           "newer and carry their relation.", caption=title,
                           figure=lambda path: figure.memory_graph(nodes, shown, highlight, path, title))

    def build_stats(self, produced: dict[str, list[dict]]) -> dict[str, Any]:
        log = produced.get("build_log", [])
        if not log:
            return {}
        eid = log[0]["episode_id"]
        calls = sum(r["link_calls"] for r in log)
        new = sum(r["memories"] for r in log)
        return {"memories": new, "link_calls": calls, "failed_sessions": sum(r["error"] is not None for r in log),
                "link_calls_per_episode": {eid: calls}, "memories_per_episode": {eid: new}}


class TheanineAll(Theanine):
    name = "theanine_all"
    Settings = TheanineAllSettings


class TheanineNoRelation(Theanine):
    name = "theanine_no_relation"
    Settings = TheanineNoRelationSettings


class TheanineNoRefine(Theanine):
    name = "theanine_no_refine"
    Settings = TheanineNoRefineSettings
