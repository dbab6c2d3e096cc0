"""A finished stage's manifest: what it wrote, from which inputs, how long it took, what LLM use.

The runner writes it last into `<stage>/_manifest.json` (pipeline.artifacts); a manifest with the
current fingerprint is what makes a stage done. The JSON layout is a contract with artifacts
already on disk and with bench/, which reads the file as plain JSON: one key per field, `timings`
nested, `llm_usage` per role, and the stage's own summed shard stats (e.g. `fallback_sessions`)
flat beside the fields.

A finished shard's marker (`ShardMarker`, `<stage>.partial/_shards/<idx>.json`) is the same kind of
contract: an interrupted run resumes from the markers an earlier version wrote.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

from pipeline.llm.usage import Usage

# What a report sums over stages and roles (Manifest.usage_total).
USAGE_TOTAL_KEYS = ("calls", "cached_calls", "prompt_tokens", "completion_tokens", "cost_usd", "batch_calls")


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass
class Timings:
    finished_at: str = ""  # UTC, ISO 8601 to the second
    started_at: str = ""  # UTC, ISO 8601 to the millisecond: this invocation's start (its span: + wall_s)
    wall_s: float = 0.0  # this invocation: from the stage's start to its manifest
    shard_s: float = 0.0  # summed over shards, those resumed from an earlier invocation included
    resumed_shards: int = 0  # shards an earlier, interrupted invocation had finished
    shards_per_node: dict[str, int] = field(default_factory=dict)  # Ray node id -> shards run there

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Timings:
        return cls(**_known(cls, data))


@dataclass
class Manifest:
    stage: str
    fingerprint: str
    upstream: dict[str, str] = field(default_factory=dict)  # input stage -> its fingerprint
    code_version: str = ""  # mempipe's version
    config_section: str | None = None
    tables: dict[str, int] = field(default_factory=dict)  # table -> rows
    rows: int = 0  # over every table
    errors: int = 0  # rows with `error` set
    shards: int = 0
    # part file -> its episodes, so a later shard reads only the parts it needs; None: not
    # recorded (shards resumed from an older version), readers take every part
    parts: dict[str, list[str]] | None = None
    llm_usage: dict[str, Usage] | None = None  # per LLM role, summed over shards; None: no LLM
    roles: dict[str, str | None] = field(default_factory=dict)  # LLM role -> model
    retry_round: int = 0  # --retry-failed rounds this fingerprint has had
    timings: Timings = field(default_factory=Timings)
    # The stage's own counts (Stage.shard_stats, e.g. per episode), summed over shards. Flat in
    # the JSON, so a stat must not share a name with a field.
    stats: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clash = sorted(set(self.stats) & _JSON_FIELDS)
        if clash:
            raise ValueError(f"stage {self.stage}: shard stats {clash} clash with manifest fields; rename them")

    def to_json(self) -> dict[str, Any]:
        """The `_manifest.json` object (a fresh dict: callers may change it)."""
        out = asdict(self)  # deep copies
        stats = out.pop("stats")
        # Usage.to_dict rounds the summed cost, as the manifests written before this type did.
        out["llm_usage"] = None if self.llm_usage is None else {r: u.to_dict() for r, u in self.llm_usage.items()}
        return {**out, **stats}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Manifest:
        """A manifest from its JSON. Keys that are no field are the stage's stats, which also keeps
        what other versions wrote; fields they lack take their defaults. ValueError when `data`
        is no manifest (not an object, or no stage / fingerprint)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("fingerprint"), str) or "stage" not in data:
            raise ValueError("not a stage manifest")
        known = _known(cls, data)
        known.pop("stats", None)  # a stat named "stats" stays a stat
        if known.get("llm_usage") is not None:
            known["llm_usage"] = {r: Usage.from_dict(u) for r, u in known["llm_usage"].items()}
        if not isinstance(known.get("parts"), dict):
            known["parts"] = None  # missing or malformed layout: readers take every part
        if "timings" in known:
            known["timings"] = Timings.from_json(known["timings"] or {})
        return cls(**known, stats={k: v for k, v in data.items() if k not in _JSON_FIELDS})

    def usage_total(self) -> dict[str, float]:
        """LLM usage summed over the roles: calls, cached_calls, prompt_tokens, completion_tokens,
        cost_usd, batch_calls (those answered through the Batch API, at its discount; zeros for a stage
        without LLM roles)."""
        total = Usage()
        for u in (self.llm_usage or {}).values():
            total.merge(u)
        return {k: getattr(total, k) for k in USAGE_TOTAL_KEYS}

    def episode_parts(self) -> dict[str, str] | None:
        """Episode id -> the part file holding its rows (None when no layout was recorded)."""
        if self.parts is None:
            return None
        return {eid: part for part, eids in self.parts.items() for eid in eids}


_JSON_FIELDS = frozenset(f.name for f in fields(Manifest)) - {"stats"}


@dataclass
class ShardMarker:
    """What one finished shard wrote (pipeline.engine.shard); the runner sums its shards' markers into the
    stage's manifest. Written after the shard's parts, so a marker makes the shard skippable."""

    rows: dict[str, int] = field(default_factory=dict)  # table -> rows
    errors: int = 0  # rows with `error` set
    episodes: int = 0
    # part file -> its episodes; None: not recorded (a marker of an older version)
    parts: dict[str, list[str]] | None = None
    llm_usage: dict[str, Usage] | None = None  # per LLM role; None: no LLM
    extra: dict[str, Any] = field(default_factory=dict)  # the stage's own counts (Stage.shard_stats)
    wall_s: float = 0.0
    node: str | None = None  # the Ray node it ran on: added for the driver after the file is written

    def to_json(self) -> dict[str, Any]:
        """The marker's JSON object, the file's layout (`parts` and `node` left out when None)."""
        out: dict[str, Any] = {"rows": dict(self.rows), "errors": self.errors, "episodes": self.episodes}
        if self.parts is not None:
            out["parts"] = {k: list(v) for k, v in self.parts.items()}
        out["llm_usage"] = None if self.llm_usage is None else {r: u.to_dict() for r, u in self.llm_usage.items()}
        out["extra"] = dict(self.extra)
        out["wall_s"] = self.wall_s
        if self.node is not None:
            out["node"] = self.node
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShardMarker:
        """A marker from its JSON; keys it lacks (older versions) take their defaults, unknown keys are
        ignored. ValueError when `data` is no marker (not an object, or no `rows`)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("rows"), Mapping):
            raise ValueError("not a shard marker")
        known = _known(cls, data)
        if known.get("llm_usage") is not None:
            known["llm_usage"] = {r: Usage.from_dict(u) for r, u in known["llm_usage"].items()}
        if not isinstance(known.get("parts"), dict):
            known.pop("parts", None)
        known["extra"] = known.get("extra") or {}
        known["wall_s"] = known.get("wall_s") or 0.0
        return cls(**known)
