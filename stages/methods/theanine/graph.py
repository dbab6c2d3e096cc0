"""Theanine's memory graph as pure functions: Algorithm 1 (linking a session's new memories into
the graph as it stood before the session) and Algorithm 2's timelines (directed linear paths
from the oldest memory of a component through a retrieved memory to an end with out-degree 0).

A memory is identified by its id; its age is (session index, memory index within the session):
"most recent" is the largest such pair, "oldest" the smallest, so within one session the memory
summarised later counts as more recent. Edges go from the older memory to the newer one.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Literal, Mapping, Sequence

import numpy as np

from pipeline.retrieval import dense_scores, top_k

NO_RELATION = "None"
RELATIONS = ("Changed", "Cause", "Reason", "HinderedBy", "React", "Want", "SameTopic")
# The edge label of the no-relation ablation (Section 2.1: edges that carry only text similarity and
# chronological order): deliberately outside RELATIONS, so no relation reaches its prompts.
SIMILAR = "similar"

Age = tuple[int, int]


@dataclass(frozen=True)
class Edge:
    source: str  # the older memory
    target: str  # the newer memory
    relation: str


@dataclass
class Graph:
    ages: dict[str, Age] = field(default_factory=dict)  # memory id -> (session, index)
    edges: list[Edge] = field(default_factory=list)

    def add_memories(self, ages: Mapping[str, Age]) -> None:
        self.ages.update(ages)

    def successors(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = defaultdict(list)
        for e in self.edges:
            out[e.source].append(e.target)
        return {k: sorted(v, key=self.ages.__getitem__) for k, v in out.items()}

    def predecessors(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = defaultdict(list)
        for e in self.edges:
            out[e.target].append(e.source)
        return out

    def components(self) -> dict[str, int]:
        """Weakly connected components: memory id -> component number."""
        parent = {m: m for m in self.ages}

        def find(x: str) -> str:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for e in self.edges:
            parent[find(e.source)] = find(e.target)
        roots: dict[str, int] = {}
        return {m: roots.setdefault(find(m), len(roots)) for m in sorted(self.ages, key=self.ages.__getitem__)}

    def relation(self, source: str, target: str) -> str | None:
        return next((e.relation for e in self.edges if e.source == source and e.target == target), None)


# -------------------------------------------------------------------- Phase I (Algorithm 1)

def top_similar(query: np.ndarray, pool_ids: Sequence[str], pool_vectors: np.ndarray, j: int) -> list[str]:
    """The j pool memories most similar to `query` (cosine), most similar first; ties keep pool order."""
    if not len(pool_ids):
        return []
    return [pool_ids[i] for i in top_k(dense_scores(query, pool_vectors), j)]


LinkMode = Literal["recent_per_component", "all_labelled", "all_candidates"]


def links_for(new_id: str, labels: Mapping[str, str], graph_before: Graph, components: Mapping[str, int],
              mode: LinkMode = "recent_per_component") -> list[Edge]:
    """Edges into one new memory from its labelled candidates (Algorithm 1, lines 6-9).

    labels: candidate id -> relation, or "None" (no relation). `recent_per_component` (Theanine):
    of the candidates with a relation, only the most recent one of each connected component of the
    graph before this session; `all_labelled` (Theanine-All): every candidate with a relation;
    `all_candidates`: every candidate, a "None" label kept as the edge's relation.
    """
    if mode == "all_candidates":
        chosen = list(labels)
    else:
        labelled = [c for c, r in labels.items() if r != NO_RELATION]
        if mode == "all_labelled":
            chosen = labelled
        else:
            newest: dict[int, str] = {}
            for c in labelled:
                comp = components[c]
                if comp not in newest or graph_before.ages[c] > graph_before.ages[newest[comp]]:
                    newest[comp] = c
            chosen = list(newest.values())
    return [Edge(c, new_id, labels[c]) for c in sorted(chosen, key=graph_before.ages.__getitem__)]


# -------------------------------------------------------------------- Phase II-1 (Algorithm 2)

@dataclass
class Timelines:
    paths: list[list[str]]  # every directed linear path found (up to the bound)
    start: str
    bound_hit: bool  # enumeration stopped at max_paths


def _paths(frm: str, to_sinks: bool, target: str | None, succ: Mapping[str, list[str]], limit: int
           ) -> tuple[list[list[str]], bool]:
    """Directed paths from `frm`: to `target` (to_sinks False) or to every out-degree-0 memory."""
    found: list[list[str]] = []
    stack: list[list[str]] = [[frm]]
    while stack:
        path = stack.pop()
        node = path[-1]
        nxt = succ.get(node, [])
        if (not to_sinks and node == target) or (to_sinks and not nxt):
            found.append(path)
            if len(found) >= limit:
                return found, bool(stack)
            continue
        for n in reversed(nxt):  # edges go forward in time: no cycles
            stack.append(path + [n])
    return found, False


def ancestors(memory: str, graph: Graph) -> set[str]:
    pred = graph.predecessors()
    seen: set[str] = set()
    todo = [memory]
    while todo:
        for p in pred.get(todo.pop(), []):
            if p not in seen:
                seen.add(p)
                todo.append(p)
    return seen


def timelines_through(retrieved: str, graph: Graph, max_paths: int = 1000) -> Timelines:
    """Every directed linear path from the oldest memory of `retrieved`'s component through
    `retrieved` to an end with out-degree 0. When the oldest memory has no directed path to
    `retrieved` (weak components allow it), the path starts at `retrieved`'s oldest ancestor
    (itself when it has none); an isolated memory is a one-memory timeline."""
    comps = graph.components()
    members = [m for m, c in comps.items() if c == comps[retrieved]]
    start = min(members, key=graph.ages.__getitem__)
    if start != retrieved and start not in ancestors(retrieved, graph):
        start = min(ancestors(retrieved, graph) | {retrieved}, key=graph.ages.__getitem__)
    succ = graph.successors()
    heads, hit_head = _paths(start, False, retrieved, succ, max_paths)
    tails, hit_tail = _paths(retrieved, True, None, succ, max_paths)
    paths: list[list[str]] = []
    hit = hit_head or hit_tail
    for h in heads:
        for t in tails:
            if len(paths) >= max_paths:
                return Timelines(paths, start, True)
            paths.append(h + t[1:])
    return Timelines(paths, start, hit)


def sample_timelines(found: Timelines, n: int, rng: random.Random,
                     used: set[tuple[str, ...]] | None = None) -> list[list[str]]:
    """n of the paths, sampled without replacement with a seeded generator (all when fewer). With
    `used` (the paths already chosen for this response) only the paths not in it are drawn, and the
    drawn ones are added to it: a repeat is replaced by another unused path, and a memory whose
    paths are all taken gives none."""
    paths = found.paths if used is None else [p for p in found.paths if tuple(p) not in used]
    chosen = list(paths) if len(paths) <= n else [paths[i] for i in sorted(rng.sample(range(len(paths)), n))]
    if used is not None:
        used.update(tuple(p) for p in chosen)
    return chosen


def group_by_component(retrieved: Iterable[str], graph: Graph) -> list[str]:
    """One retrieved memory per component (the best ranked), for Algorithm 2's loop over the set of
    components rather than over the k retrieved memories."""
    comps = graph.components()
    seen: set[int] = set()
    out = []
    for m in retrieved:
        if comps[m] not in seen:
            seen.add(comps[m])
            out.append(m)
    return out
