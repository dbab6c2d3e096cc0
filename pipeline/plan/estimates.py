"""What `make_plan` answers (`Plan`: per stage and LLM role the expected calls, tokens and cost, each
with how it was estimated), and the plan's defaults."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from pipeline.config import RunConfig
from pipeline.errors import PipelineError
from pipeline.llm.usage import SHARED, stage_kind
from pipeline.engine.stage import Stage

DEFAULT_SAMPLE = 20
# The dry run's work bounds (a plan answers in seconds): episodes sampled up to this many turns in
# all, and up to this many probes per episode and kind (question / next-response), a random subset
# as the run's own `probes` sampling picks them; what they leave out is scaled back (see `_scales`).
DRY_RUN_TURNS = 1000
DRY_RUN_PROBES = 50
DEFAULT_COMPLETION_FRACTION = 0.5
TOTAL_KEYS = ("calls", "prompt_tokens", "cached_prompt_tokens", "completion_tokens", "cost_usd")
CACHED_PROMPT_RULE = ("estimated from the prompt structure: OpenAI caches prompts of >= 1024 tokens, the prefix "
                      "another request already sent, in 128-token steps; priced at the model's cached_input")

Registry = Callable[[RunConfig], Mapping[str, Stage]]


@dataclass(frozen=True)
class PlanOptions:
    """How `make_plan` estimates (`mempipe plan`'s options beside the selectors); checked when made."""

    sample: int = DEFAULT_SAMPLE  # episodes the dry run reads at most
    calibrate_k: int | None = None  # --calibrate K: a real run of the first K episodes
    like: str | Path | None = None  # --like RUN_DIR: another run's manifests
    completion_fraction: float = DEFAULT_COMPLETION_FRACTION  # of max_tokens, without calibration
    max_turns: int | None = DRY_RUN_TURNS  # the dry run's work bounds (None: none)
    probe_cap: int | None = DRY_RUN_PROBES

    def __post_init__(self) -> None:
        if self.sample < 1:
            raise PipelineError("plan: --sample must be at least 1")
        if self.calibrate_k is not None and self.calibrate_k < 1:
            raise PipelineError("plan: --calibrate must be at least 1")


@dataclass
class RoleEstimate:
    role: str  # the LLM role (`embedder`: the embedding requests of `embedding.provider: openai`)
    model: str
    calls: float = 0.0
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0
    cost_usd: float | None = 0.0  # None: no price for the model
    price: dict[str, float] | None = None  # USD per 1M tokens, batch discount applied
    method: dict[str, str] = field(default_factory=dict)  # per quantity: how it was estimated
    counted: dict[str, float] = field(default_factory=dict)  # the dry run's raw counts
    cached_prompt_tokens: float = 0.0  # of prompt_tokens, those the prompt cache would serve
    by_method: dict[str, float] = field(default_factory=dict)  # cost_usd per method label (SHARED: no one's)


@dataclass
class StageEstimate:
    name: str
    state: str  # new | stale | partial | forced | done | not selected
    why: str
    fingerprint: str
    runs: bool
    roles: list[RoleEstimate] = field(default_factory=list)
    owner: str = ""  # the method the stage is built for ("": none)
    in_graph: str = ""  # why the run's graph holds the stage (a selected method, a judge, read by another)

    def total(self) -> dict[str, float]:
        out = {k: 0.0 for k in TOTAL_KEYS}
        for r in self.roles:
            for k in TOTAL_KEYS:
                out[k] += getattr(r, k) or 0.0
        return out


@dataclass
class Plan:
    run_name: str
    run_dir: str
    stages: list[StageEstimate]
    method: dict[str, Any]
    calibration_run: dict[str, Any] | None = None  # what --calibrate ran and cost

    def total(self) -> dict[str, float]:
        out = {k: 0.0 for k in TOTAL_KEYS}
        for s in self.stages:
            if s.runs:
                for k, v in s.total().items():
                    out[k] += v
        return out

    def by_role(self) -> dict[str, dict[str, float]]:
        """TOTAL_KEYS per LLM role over the stages that run."""
        out: dict[str, dict[str, float]] = {}
        for s in self.stages:
            for r in s.roles if s.runs else []:
                row = out.setdefault(r.role, {k: 0.0 for k in TOTAL_KEYS})
                for k in TOTAL_KEYS:
                    row[k] += getattr(r, k) or 0.0
        return out

    def by_method(self) -> dict[str, dict[str, Any]]:
        """Where the money goes, per method label (SHARED last): USD of its `memory` and `respond`
        stages, its share of each judge stage (`judges`: stage -> USD), of the `other` stages, and
        `total`, over the stages that run."""
        out: dict[str, dict[str, Any]] = {}
        for s in self.stages:
            kind = stage_kind(s.name, s.owner)
            for r in s.roles if s.runs else []:
                for m, usd in r.by_method.items():
                    row = out.setdefault(m, {"memory": 0.0, "respond": 0.0, "judges": {}, "other": 0.0, "total": 0.0})
                    if kind == "judge":
                        row["judges"][s.name] = row["judges"].get(s.name, 0.0) + usd
                    else:
                        row[kind] += usd
                    row["total"] += usd
        return dict(sorted(out.items(), key=lambda kv: (kv[0] == SHARED, kv[0])))

    def to_json(self) -> dict[str, Any]:
        """`mempipe plan --json`: every stage of the run (`runs`: whether it would run), each with its
        roles; `total` over the stages that run; `by_role` and `by_method` (see `by_method`) over them
        too. Numbers are rounded per role (tokens and calls to integers, USD to 6 places) and stage and
        run totals summed from there, so a total is exactly the sum of its parts."""
        stages = []
        total = {k: 0.0 for k in TOTAL_KEYS}
        for s in self.stages:
            d = asdict(s)
            st = {k: 0.0 for k in TOTAL_KEYS}
            for r in d["roles"]:
                for k in TOTAL_KEYS:
                    r[k] = None if r[k] is None else _num(k, r[k])
                    st[k] += r[k] or 0
                r["by_method"] = {m: _num("cost_usd", v) for m, v in r["by_method"].items()}
            d.update({k: _num(k, v) for k, v in st.items()})
            if s.runs:
                for k in TOTAL_KEYS:
                    total[k] += d[k]
            stages.append(d)
        by_method = {m: {k: ({j: _num("cost_usd", u) for j, u in v.items()} if isinstance(v, dict)
                             else _num("cost_usd", v)) for k, v in row.items()} for m, row in self.by_method().items()}
        return {"run_name": self.run_name, "run_dir": self.run_dir, "stages": stages,
                "total": {k: _num(k, v) for k, v in total.items()},
                "by_role": {role: {k: _num(k, v) for k, v in row.items()} for role, row in self.by_role().items()},
                "by_method": by_method,
                "method": self.method, "calibration_run": self.calibration_run}

    def plan_file(self) -> dict[str, Any]:
        """What `_plan.json` holds (see the module docstring)."""
        data = self.to_json()
        return {"created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "run_dir": self.run_dir,
                "method": self.method,
                "stages": {s["name"]: {"fingerprint": s["fingerprint"], **{k: s[k] for k in TOTAL_KEYS}}
                           for s in data["stages"] if s["runs"]},
                "total": data["total"]}


def _num(key: str, value: float) -> float | int:
    return round(value, 6) if key == "cost_usd" else int(round(value))
