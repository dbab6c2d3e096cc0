"""`mempipe plan`: before any paid call, which stages a run would run and why, and per stage and LLM
role the calls, prompt and completion tokens and cost it expects, each with how it was estimated.

Which stages, and why: `Runner.select`, the very selection `mempipe run` executes (same `--only`,
`--from`, `--force`, `--until`): `new` (no output yet), `stale` (an output of another fingerprint:
the stage's own settings / prompts / code / role changed, or an upstream stage's), `partial` (an
interrupted run of this fingerprint; its finished shards are not redone), `forced`, or `done`.

How much (per stage that would run and has LLM roles):

1. Calls and prompt tokens are counted by a dry run: the stages to run, and those they need, run in
   a scratch directory with every role pointed at `pipeline.llm.simulated` (an OpenAI-compatible
   endpoint on 127.0.0.1 that answers schema-valid JSON to structured requests and plain text of the
   assumed length otherwise, and counts tokens as OpenAI bills them, in cl100k), the cache off, the
   `inline` executor, no embedded model started. Roles keep their model names, so prices apply.
   No model runs and nothing is downloaded (`_no_models`): compression is estimated from sizes (a
   `rate` share of each utterance's words kept, speaker tags and lines intact:
   `pipeline.compression.simulate_line`), local embeddings are hashed-word vectors of the model's
   dimension (`pipeline.embeddings.SimulatedEmbedder`), and stages no LLM stage reads (the report,
   `score`, `response_metrics` with its BERTScore) are not run; `method["models"]` says which.
   Stages already done for this config are not simulated: their outputs are linked into the scratch
   directory, so the stages after them read the real data (only when the dry run covers every
   episode). Calls whose number is known from the inputs (segmentation: one per session; the
   judges: per probe, method pair and sample) are thereby exact; calls that depend on what the model
   answers (Theanine's links per memory, CREEM's steps, re-asks of invalid answers, TeaBag's rejects)
   are what the simulated answers make them.
2. Big corpora: the dry run reads the first `sample` episodes (per corpus source, in proportion),
   fewer while they hold more than `DRY_RUN_TURNS` turns (never under 2: turn-by-turn methods make
   calls per turn, and a LoCoMo conversation has ~400), and at most `DRY_RUN_PROBES` probes per
   episode and kind (the probes stage's own seeded random subset; the run's probes are made first and
   counted). A per-episode stage's counts are scaled to the run (`_scales`): per episode made over
   to all of the run's probes where it reads them (x its probes / the sampled ones), then by the
   size they grow with, the one of episodes, turns, sessions and questions (counted in the corpus
   for every episode) over which the sampled episodes' counts are most even. Global stages are not
   scaled. Each role's `method` says how (e.g. "counted on 2 of 10 episode(s), x 5.09 by turns").
3. Completion tokens cannot be counted before the calls. Per (stage, role) they come from a
   calibration source, in this order: `--like RUN_DIR` (another run's manifests), `--calibrate K` (a
   real run of the first K episodes into `<run>-calibrate-K`, sharing the run's LLM cache so the real
   run does not pay for them again; plan states what it cost), or the manifests already in this run
   directory (any fingerprint: a previous run of this config, or of its earlier version). A source
   also corrects calls and prompt tokens: both are multiplied by real / simulated over the episodes
   the source and the dry run share (real tokenizers are not cl100k, real models write other
   answers than the simulated ones). Without a source, completions are assumed:
   `completion_fraction` (0.5) of each request's max_tokens, and calls and prompt tokens stay counted.
4. Cost: tokens x the role's price (`pipeline.llm.prices`: the default table, the config's
   `llm.prices` / `roles.<r>.prices` over it; `batch: true` roles at the batch discount). The cache is
   not consulted: a call the cache already holds is free in the run but counted here. Prompt tokens
   the endpoint would serve from its prompt cache are priced at `cached_input`: their share of each
   (stage, role)'s prompt tokens is the dry run's (`Usage.cached_prompt_tokens`: the simulated
   endpoint applies OpenAI's rule to the prompts it is sent), so it is estimated from the prompt
   structure, not measured.
5. Where the money goes: per method of the run, the cost of its memory and respond stages and its
   share of each judge stage. A (stage, role)'s cost is split by the dry run's `Usage.cost_by_method`
   (the judges bill each judged row to its method); where the dry run has none, a stage built for one
   method (`memory_<m>`, `respond_<m>`) is wholly that method's and any other stage is `(shared)`.

The estimate is also written to `<run_dir>/_plan.json`, which the live progress line of `mempipe run`
reads (calls done / expected, `pipeline.progress.planned_calls`) when a stage's fingerprint matches:

    {"created_at": ISO time, "run_dir": str, "method": {...},
     "stages": {name: {"fingerprint": str, "calls": int, "prompt_tokens": int, "cached_prompt_tokens": int,
                       "completion_tokens": int, "cost_usd": float}},   # the stages that would run
     "total": {"calls", "prompt_tokens", "cached_prompt_tokens", "completion_tokens", "cost_usd"}}

`calls` counts every call the stage's clients make, answered or failed, embeddings one per text (as
the manifests' `calls + failed_calls` and the run's ledger count them). With `embedding.provider:
openai` the stages that embed (`banks`, `score`, methods that retrieve densely) have a row for the
`embedder` role: texts counted by the dry run, the requests they go in (up to 128 texts each), their
cl100k tokens, and the embedding model's input price ("no price" where the table has none).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from pipeline import storage
from pipeline.artifacts import MANIFEST, StageDir, atomic_write_json, make_dirs, read_text
from pipeline.config import RunConfig
from pipeline.errors import PipelineError
from pipeline.llm.prices import BATCH_DISCOUNT, cost_usd, prices_for, role_prices
from pipeline.llm.usage import SHARED, Usage, method_shares, stage_kind
from pipeline.manifest import Manifest
from pipeline.progress import PLAN_FILE
from pipeline.stage import EMBEDDER_ROLE, GlobalStage, Stage
from pipeline.storage import Location, is_remote, join

log = logging.getLogger("mempipe")

SIM_KEY_ENV = "MEMPIPE_SIMULATED_KEY"  # the dry run's roles read their (dummy) API key here
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


# ---------------------------------------------------------------------------------------------
# result types

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


# ---------------------------------------------------------------------------------------------
# episodes and sampling

@dataclass(frozen=True)
class EpisodeSize:
    """What a per-episode stage's work may grow with, counted from the corpus (no stage run)."""

    episode_id: str
    sessions: int
    turns: int
    questions: int

    def measure(self, name: str) -> float:
        return 1.0 if name == "episodes" else float(getattr(self, name))


# The sizes a sampled stage may be scaled by, in order of preference on a tie.
MEASURES = ("episodes", "turns", "sessions", "questions")


def _episode_sizes(cfg: RunConfig) -> list[list[EpisodeSize]]:
    """Per corpus source (its limit and episode_ids applied), the size of each episode, in order."""
    from pipeline.corpus import iter_episodes

    # read episode by episode: the driver never holds a big corpus, only four numbers per episode
    return [[EpisodeSize(str(r.episode["episode_id"]), len({t.get("session_idx") for t in r.turns}), len(r.turns),
                         len(r.qa)) for r in iter_episodes(s.format, s.path, s.limit, s.episode_ids)]
            for s in cfg.corpus.sources()]


def _count_episodes(cfg: RunConfig) -> list[int]:
    """Episodes each corpus source gives the run (its limit and episode_ids applied)."""
    return [len(sizes) for sizes in _episode_sizes(cfg)]


def _take(counts: list[int], k: int) -> list[int]:
    """The first episodes of each source, `k` in all, in proportion to the sources' sizes (at least
    one of each non-empty source)."""
    total = sum(counts)
    if k >= total:
        return list(counts)
    out = [min(n, max(1 if n else 0, math.floor(k * n / total))) for n in counts]
    i = 0
    while sum(out) < k:  # hand out what rounding down left, source by source
        if out[i] < counts[i]:
            out[i] += 1
        i = (i + 1) % len(counts)
    return out


def _take_within(sizes: list[list[EpisodeSize]], k: int, max_turns: int | None, at_least: int) -> int:
    """How many episodes the dry run samples: `k`, fewer while their turns exceed `max_turns`
    (turn-by-turn methods make calls per turn), never under `at_least` (nor under 2 where the run
    has 2: the sizes a stage scales by are chosen over at least 2 episodes)."""
    counts = [len(x) for x in sizes]
    k = min(k, sum(counts))
    floor = min(max(at_least, 2), k)
    while max_turns is not None and k > floor and sum(
            e.turns for src, n in zip(sizes, _take(counts, k)) for e in src[:n]) > max_turns:
        k -= 1
    return k


def _with_limits(data: dict[str, Any], limits: list[int] | None) -> None:
    if limits is None:
        return
    corpus = data.setdefault("corpus", {})
    corpus["limit"] = limits[0]
    for extra, n in zip(corpus.get("extra", []), limits[1:]):
        extra["limit"] = n


def _config_data(cfg: RunConfig) -> dict[str, Any]:
    # exclude_unset: a role keeps overriding only what it set (an explicit None would override `llm`)
    data = cfg.model_dump(mode="json", exclude_unset=True)
    data.pop("paper", None)  # the reproduction sheet changes no LLM call
    return data


def _derive(cfg: RunConfig, data: dict[str, Any]) -> RunConfig:
    try:
        return type(cfg).model_validate(data)
    except Exception as e:  # noqa: BLE001 - a config that loaded must derive; say which when not
        raise PipelineError(f"plan: cannot derive the dry-run config: {e}") from e


PROBE_CAPS = ("max_qa_per_episode", "max_per_episode")  # probes.*: questions, next-response turns


def _probe_caps(cfg: RunConfig, cap: int | None) -> dict[str, int]:
    """The `probes` settings a dry run lowers to `cap` (None or a larger value in the run's config)."""
    probes = getattr(cfg, "probes", None)
    if cap is None or probes is None:
        return {}
    set_to = {k: getattr(probes, k) for k in PROBE_CAPS if hasattr(probes, k)}
    return {k: cap for k, v in set_to.items() if v is None or v > cap}


def dry_run_config(cfg: RunConfig, base_url: str, scratch: Path, stages: list[str] | None,
                   limits: list[int] | None, probe_cap: int | None = None) -> RunConfig:
    """The config of a dry run: every role on the simulated endpoint (model names kept), no cache,
    no budget, no batch API, no rate limits, inline executor, the sampled episodes, at most
    `probe_cap` probes per episode and kind (`_probe_caps`), in `scratch`. (No model either:
    `dry_run` embeds and compresses inside `_no_models`.)"""
    data = _config_data(cfg)
    data.update(run_name="dry-run", artifacts_dir=str(scratch), stages=stages)
    _with_limits(data, limits)
    caps = _probe_caps(cfg, probe_cap)
    if caps:
        data.setdefault("probes", {}).update(caps)
    sim = {"provider": "openai", "base_url": base_url, "api_key_env": SIM_KEY_ENV, "cache_enabled": False,
           "max_cost_usd": None, "batch": False, "rpm": None, "tpm": None, "max_retries": 2, "timeout_s": 600.0}
    data.setdefault("llm", {}).update(sim)
    for role in (data.get("roles") or {}).values():
        role.update(sim)
    data.setdefault("ray", {})["executor"] = "inline"
    return _derive(cfg, data)


def calibration_config(cfg: RunConfig, stages: list[str] | None, limits: list[int], k: int) -> RunConfig:
    """The config of `--calibrate K`: the run's own, on its first K episodes, in `<run>-calibrate-K`
    beside it; the LLM cache stays the run's, so the real run replays these calls for free."""
    data = _config_data(cfg)
    data.update(run_name=f"{cfg.run_name}-calibrate-{k}", stages=stages)
    _with_limits(data, limits)
    return _derive(cfg, data)


# ---------------------------------------------------------------------------------------------
# calibration

@dataclass
class Calibration:
    """Real over simulated, for one (stage, role), from a source's manifest."""

    source: str
    calls: float | None  # multiply the counted calls by this (None: no ratio, keep counted)
    prompt: float | None
    completion_per_call: float | None
    rate: dict[str, float] | None = None  # real calls / prompt tokens per episode, when nothing was counted


class CalibrationSource:
    """Manifests of real runs to calibrate against: another run directory, the calibration run, or
    this run's own directory (any fingerprint)."""

    def __init__(self, run_dir: Location, label: str) -> None:
        self.run_dir = storage.location(run_dir)
        self.label = label

    def manifest(self, stage: str) -> Manifest | None:
        return StageDir(self.run_dir, stage).manifest()

    def episodes(self) -> int | None:
        m = self.manifest("ingest")
        return None if m is None else int(m.tables.get("episodes", 0)) or None


def _per_episode(m: Manifest) -> dict[str, dict[str, float]]:
    data = m.stats.get("llm_per_episode")
    return data if isinstance(data, dict) else {}


def _sent(u: Usage) -> float:
    return float(u.calls + u.failed_calls)


def calibrate(stage: Stage, role: str, dry: Manifest, dry_chat: tuple[float, float], dry_episodes: int,
              src: CalibrationSource, embeds: tuple[float, float],
              probe_factor: Mapping[str, float] | None = None) -> Calibration | None:
    """Ratios real / simulated for `role` of `stage` from the source's manifest of that stage.

    dry_chat: the dry run's (calls, prompt tokens) of the role's chat requests; embeds: the source's
    embedding (calls, tokens) to leave out of its role totals (estimated from the dry run). Over the
    episodes both ran, from the per-episode counts (chat calls only), when the stage has one role;
    else per episode from the role's totals. probe_factor: per episode, the run's probes over the
    dry run's (it sampled them): its per-episode counts are multiplied by it (dry_chat already is)."""
    real = src.manifest(stage.name)
    if real is None or not real.llm_usage or role not in real.llm_usage:
        return None
    ru = real.llm_usage[role]
    real_sent = max(ru.calls - embeds[0], 0.0) + ru.failed_calls  # chat calls, answered or failed
    if real_sent <= 0:
        return None
    real_prompt_total = max(ru.prompt_tokens - embeds[1], 0.0)
    # Per call, failed calls included (a failed structured call was answered, invalidly, and billed).
    cpc = ru.completion_tokens / real_sent
    dry_calls, dry_prompt = dry_chat
    mine, theirs = _per_episode(dry), _per_episode(real)
    if probe_factor:
        mine = {e: {k: v * probe_factor.get(e, 1.0) for k, v in c.items()} for e, c in mine.items()}
    common = sorted(set(mine) & set(theirs)) if len(stage.roles) == 1 else []
    if common and sum(theirs[e].get("calls", 0) for e in common):
        # Per-episode counts hold answered calls only: each side's totals over its per-episode sums
        # put the failed calls (and their prompts) back, so like is compared with like.
        def share(total: float, per: dict[str, dict[str, float]], key: str) -> float:
            summed = sum(v.get(key, 0) for v in per.values())
            return total / summed if summed else 1.0

        r_calls = sum(theirs[e].get("calls", 0) for e in common) * share(real_sent, theirs, "calls")
        r_prompt = sum(theirs[e].get("prompt_tokens", 0) for e in common) * share(real_prompt_total, theirs,
                                                                                  "prompt_tokens")
        d_calls = sum(mine[e].get("calls", 0) for e in common) * share(dry_calls, mine, "calls")
        d_prompt = sum(mine[e].get("prompt_tokens", 0) for e in common) * share(dry_prompt, mine, "prompt_tokens")
        where = f"{src.label} ({len(common)} episode{'s' * (len(common) != 1)})"
        if d_calls <= 0:
            return Calibration(where, None, None, cpc, rate={"calls": r_calls / len(common),
                                                              "prompt_tokens": r_prompt / len(common)})
        return Calibration(where, r_calls / d_calls, r_prompt / d_prompt if d_prompt else None, cpc)
    # Per episode from the totals (several roles, or no per-episode counts).
    n_real = 1 if isinstance(stage, GlobalStage) else (len(theirs) or src.episodes() or 1)
    n_dry = 1 if isinstance(stage, GlobalStage) else max(dry_episodes, 1)
    real_calls = real_sent / n_real
    real_prompt = real_prompt_total / n_real
    if dry_calls <= 0:
        return Calibration(src.label, None, None, cpc, rate={"calls": real_calls, "prompt_tokens": real_prompt})
    return Calibration(src.label, real_calls / (dry_calls / n_dry),
                       real_prompt / (dry_prompt / n_dry) if dry_prompt else None, cpc)


# ---------------------------------------------------------------------------------------------
# the dry run

@contextlib.contextmanager
def _quiet() -> Iterator[io.StringIO]:
    """The dry run's progress lines stay out of the user's terminal (kept for an error message)."""
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        yield buf


def _link_stage(real_dir: Location, scratch_dir: Path, name: str, fingerprint: str, upstream: dict[str, str]) -> None:
    """A finished stage of the real run, seen in the scratch run as done for its fingerprint there:
    its files linked (copied down from an object store), its manifest re-stamped."""
    src, dst = join(real_dir, name), scratch_dir / name
    dst.mkdir(parents=True)
    if is_remote(src):
        storage.download_dir(src, dst)
    else:
        for entry in Path(src).iterdir():
            if entry.name != MANIFEST:
                (dst / entry.name).symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
    data = json.loads(read_text(join(src, MANIFEST)))
    data.update(fingerprint=fingerprint, upstream=upstream)
    atomic_write_json(dst / MANIFEST, data)


@contextlib.contextmanager
def _no_models() -> Iterator[None]:
    """No model in a dry run: local embeddings and compression are simulated (pipeline.embeddings,
    pipeline.compression), in this process, where the inline executor runs every stage."""
    from pipeline.simulation import models_simulated

    with models_simulated():
        yield


@dataclass
class DryRun:
    manifests: dict[str, Manifest]  # simulated stage -> its dry-run manifest
    embeddings: dict[str, dict[str, float]]  # stage -> {"model", "calls" (texts), "requests", "prompt_tokens"}
    max_tokens: dict[str, float]  # stage -> mean max_tokens of its chat requests
    episodes: int  # episodes the dry run covered
    linked: list[str]  # stages linked from the real run
    seconds: dict[str, float] = field(default_factory=dict)  # stage -> wall seconds of its dry run
    # Per episode: the run's probes / the dry run's, where the dry run sampled probes (else empty)
    probe_factor: dict[str, float] = field(default_factory=dict)
    # stage -> {"texts": embedded, "units": compressed} by the simulated models (stages that used them)
    simulated: dict[str, dict[str, int]] = field(default_factory=dict)


def _probes_per_episode(run_dir: Path) -> dict[str, int]:
    table = StageDir(run_dir, "probes").read_table("probes")
    out: dict[str, int] = {}
    for eid in table.column("episode_id").to_pylist():
        out[eid] = out.get(eid, 0) + 1
    return out


def dry_run(cfg: RunConfig, registry_of: Registry, needed: list[str], reuse: set[str], limits: list[int] | None,
            episodes: int, completion_fraction: float, scratch: Path,
            probe_cap: int | None = DRY_RUN_PROBES) -> DryRun:
    from pipeline.compression import simulated_units
    from pipeline.embeddings import simulated_texts
    from pipeline.llm.simulated import SimulatedEndpoint
    from pipeline.runner import Runner

    os.environ.setdefault(SIM_KEY_ENV, "simulated-no-key")
    with _no_models(), SimulatedEndpoint(completion_fraction=completion_fraction) as sim:
        dcfg = dry_run_config(cfg, sim.base_url, scratch, needed, limits, probe_cap)
        runner = Runner(dcfg, dict(registry_of(dcfg)))
        fps = runner.fingerprints()
        for name in reuse:
            stage = runner.registry[name]
            _link_stage(cfg.run_dir, dcfg.run_dir, name, fps[name], {i: fps[i] for i in stage.inputs})
        # Probes sampled: the run's own probes are made first (cheap, no LLM) and counted, then the
        # capped ones the stages after read; those stages are scaled back by their ratio per episode.
        sample_probes = "probes" in needed and "probes" not in reuse and bool(_probe_caps(cfg, probe_cap))
        full_probes: dict[str, int] = {}
        manifests: dict[str, Manifest] = {}
        embeddings: dict[str, dict[str, float]] = {}
        max_tokens: dict[str, float] = {}
        seconds: dict[str, float] = {}
        simulated: dict[str, dict[str, int]] = {}
        for stage in runner.plan:
            if stage.name in reuse:
                continue
            sim.stage = stage.name
            started = time.perf_counter()
            before = (simulated_texts(), simulated_units())
            with _quiet() as out:
                try:
                    if stage.name == "probes" and sample_probes:
                        full = dry_run_config(cfg, sim.base_url, scratch, needed, limits, None)
                        Runner(full, dict(registry_of(full))).run(only=["probes"])
                        full_probes = _probes_per_episode(dcfg.run_dir)
                    runner.run(only=[stage.name])
                except Exception as e:
                    raise PipelineError(f"plan: the dry run of stage {stage.name!r} failed: {e}\n{out.getvalue()[-2000:]}") from e
            seconds[stage.name] = round(time.perf_counter() - started, 2)
            used = {"texts": simulated_texts() - before[0], "units": simulated_units() - before[1]}
            if any(used.values()):
                simulated[stage.name] = used
            m = StageDir(dcfg.run_dir, stage.name).manifest()
            if m is not None:
                manifests[stage.name] = m
            for (kind, model), c in sim.stage_counts(stage.name).items():
                if kind == "embeddings":
                    e = embeddings.setdefault(stage.name, {"model": model, "calls": 0.0, "requests": 0.0,
                                                           "prompt_tokens": 0.0})
                    e["calls"] += c["texts"]
                    e["requests"] += c["requests"]
                    e["prompt_tokens"] += c["prompt_tokens"]
            chat = [c for (kind, _), c in sim.stage_counts(stage.name).items() if kind == "chat"]
            if chat:
                max_tokens[stage.name] = sum(c["max_tokens"] for c in chat) / max(sum(c["requests"] for c in chat), 1)
        factor: dict[str, float] = {}
        if full_probes:
            sampled = _probes_per_episode(dcfg.run_dir)
            factor = {e: n / sampled[e] for e, n in full_probes.items() if sampled.get(e)}
        covered = StageDir(dcfg.run_dir, "ingest").manifest()
        n = int(covered.tables.get("episodes", episodes)) if covered is not None else episodes
        return DryRun(manifests, embeddings, max_tokens, n, sorted(reuse), seconds, factor, simulated)


# ---------------------------------------------------------------------------------------------
# the plan

def _why(state: str, stage: Stage, status_manifest: Manifest | None, fps: Mapping[str, str],
         partial: tuple[int, int] | None) -> str:
    if state == "new":
        return "no output yet"
    if state == "forced":
        return "forced rebuild"
    if state == "partial" and partial:
        return f"interrupted: {partial[0]} of {partial[1]} episodes done, the rest to run"
    if state == "stale" and status_manifest is not None:
        changed = [i for i in stage.inputs if status_manifest.upstream.get(i) != fps.get(i)]
        if changed:
            return "upstream changed: " + ", ".join(changed)
        return "its settings, prompts, code or LLM roles changed"
    if state == "done":
        return "up to date (skipped)"
    return ""


def _done_episodes(run_dir: Path, stage: str) -> int:
    return sum(int(m.get("episodes", 0)) for m in StageDir(run_dir, stage).finished_shards().values())


def make_plan(cfg: RunConfig, registry_of: Registry, *, only: list[str] | None = None, from_: str | None = None,
              force: list[str] | None = None, until: str | None = None, sample: int = DEFAULT_SAMPLE,
              calibrate_k: int | None = None, like: str | Path | None = None,
              completion_fraction: float = DEFAULT_COMPLETION_FRACTION, write: bool = True,
              say: Callable[[str], None] | None = None, max_turns: int | None = DRY_RUN_TURNS,
              probe_cap: int | None = DRY_RUN_PROBES) -> Plan:
    """The estimate of what `mempipe run` with these selectors would call (see the module docstring).
    `registry_of(cfg)` builds the stages of a config (the App's `registry`). Writes `_plan.json`
    into the run directory unless `write` is False. `say` gets progress lines (default: nothing).
    `max_turns` / `probe_cap`: the dry run's work bounds (DRY_RUN_TURNS, DRY_RUN_PROBES; None: none)."""
    from pipeline.runner import Runner

    say = say or (lambda _: None)
    if sample < 1:
        raise PipelineError("plan: --sample must be at least 1")
    if calibrate_k is not None and calibrate_k < 1:
        raise PipelineError("plan: --calibrate must be at least 1")
    runner = Runner(cfg, dict(registry_of(cfg)))
    selection = {s.name: reason for s, reason in runner.select(only=only, from_=from_, force=force, until=until)}
    fps = runner.fingerprints()
    manifests = {st.name: st.manifest for st in runner.status()}
    to_run = [s for s in runner.plan if selection.get(s.name, "done") != "done"]
    # With `embedding.provider: openai`, stages that only embed (banks) call the `embedder` role too.
    llm_run = [s for s in to_run if s.llm_roles(cfg)]

    sizes = _episode_sizes(cfg) if llm_run else [[]]
    counts = [len(x) for x in sizes]
    n_episodes = sum(counts)
    method: dict[str, Any] = {
        "selection": "Runner.select: the stages `mempipe run` with the same selectors runs",
        "episodes": n_episodes, "completion_fraction": completion_fraction,
        "prices": "pipeline.llm.prices.DEFAULT_PRICES with llm.prices / roles.<role>.prices over it"
                  f"; batch roles x{BATCH_DISCOUNT}",
        "cache": "not consulted: calls the LLM cache already holds are free in the run, counted here",
        "cached_prompt_tokens": CACHED_PROMPT_RULE + " (the dry run's share of each stage and role's prompt tokens)",
        "by_method": "each method's memory and respond stages, and its share of each judge stage: a stage and role's "
                     "cost split by the dry run's cost per method (a judge bills each judged row to its method; "
                     "head-to-head, to the non-reference one); without one, a method's own stage is wholly its, "
                     f"any other {SHARED}",
    }
    calibration_run: dict[str, Any] | None = None
    estimates: dict[str, list[RoleEstimate]] = {}

    if llm_run:
        needed_set: set[str] = set()
        for s in llm_run:
            needed_set |= runner.upstream(s.name)
        needed = [s.name for s in runner.plan if s.name in needed_set]
        k_dry = _take_within(sizes, max(sample, calibrate_k or 0), max_turns, calibrate_k or 1)
        sampled = k_dry < n_episodes
        limits = _take(counts, k_dry) if sampled else None
        in_dry = [e for src, n in zip(sizes, limits or counts) for e in src[:n]]
        # Done stages are linked into the dry run (real inputs for the stages after them), unless
        # the dry run samples episodes: their outputs hold every episode.
        reuse = set() if sampled else {n for n in needed if selection.get(n, "done") == "done"
                                       and manifests.get(n) is not None and manifests[n].fingerprint == fps[n]}
        method["dry_run"] = (f"simulated endpoint (pipeline.llm.simulated), {k_dry if sampled else n_episodes} of "
                             f"{n_episodes} episodes" + (f" (the first {max(sample, calibrate_k or 0)}, at most "
                                                         f"{max_turns} turns in all)" if sampled and max_turns else "")
                             + (", per-episode stages scaled by the size each grows with (episodes, turns, sessions "
                                "or questions)" if sampled else "")
                             + (f"; at most {probe_cap} probes per episode and kind, scaled back by the run's probes"
                                if _probe_caps(cfg, probe_cap) else "")
                             + (f"; done stages linked in: {', '.join(sorted(reuse))}" if reuse else ""))

        source: CalibrationSource | None = None
        if like is not None:
            like_dir = Path(like)
            if not like_dir.is_dir():
                raise PipelineError(f"plan: --like {like}: no such run directory")
            source = CalibrationSource(like_dir, f"--like {like_dir}")
        elif calibrate_k is not None:
            if calibrate_k >= n_episodes:
                raise PipelineError(f"plan: --calibrate {calibrate_k} covers all {n_episodes} episodes of the run: "
                                    "that is the run itself; calibrate on fewer")
            limits_cal = _take(counts, calibrate_k)
            if limits is not None:
                limits_cal = [min(a, b) for a, b in zip(limits_cal, limits)]
            ccfg = calibration_config(cfg, needed, limits_cal, calibrate_k)
            say(f"plan: calibration run of {calibrate_k} episode(s) into {ccfg.run_dir} (real calls, cached for the run)")
            crunner = Runner(ccfg, dict(registry_of(ccfg)))
            crunner.run()
            source = CalibrationSource(ccfg.run_dir, f"calibration run {ccfg.run_name}")
            calibration_run = _calibration_cost(ccfg, crunner)
        else:
            source = CalibrationSource(cfg.run_dir, "this run's manifests")

        say(f"plan: dry run of {len(needed) - len(reuse)} stage(s) on the simulated endpoint")
        scratch = Path(tempfile.mkdtemp(prefix="mempipe-plan-"))
        try:
            dry = dry_run(cfg, registry_of, needed, reuse, limits, n_episodes, completion_fraction, scratch, probe_cap)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        method["dry_run_episodes"] = dry.episodes
        method["dry_run_s"] = round(sum(dry.seconds.values()), 1)
        method["dry_run_slowest_s"] = dict(sorted(dry.seconds.items(), key=lambda kv: -kv[1])[:3])
        log.debug("plan: dry run seconds per stage: %s", dry.seconds)
        method["models"] = _model_notes(cfg, dry, [s.name for s in to_run if s.name not in needed_set])

        for stage in llm_run:
            reason = selection[stage.name]
            remaining = n_episodes
            if reason == "partial" and not isinstance(stage, GlobalStage):
                remaining = max(n_episodes - _done_episodes(cfg.run_dir, stage.name), 0)
            if isinstance(stage, GlobalStage):
                scale = 0.0 if reason == "partial" and StageDir(cfg.run_dir, stage.name).finished_shards() else 1.0
                scaling = Scaling.flat(scale, "counted" if scale == 1.0 else f"counted x {scale:.3g}")
            else:
                scaling = _scales(stage, dry, [e for src in sizes for e in src], in_dry, remaining)
            estimates[stage.name] = _estimate_stage(cfg, stage, dry, scaling, source, completion_fraction,
                                                    n_episodes, remaining)
        used = any("calibrated" in v for ests in estimates.values() for e in ests for v in e.method.values())
        method["calibration"] = source.label if used else (
            f"none ({source.label}: nothing for these stages)" if like or calibrate_k else
            "none (no manifest of these stages in this run directory; --calibrate K or --like RUN_DIR give one)")
    else:
        method["dry_run"] = "none: no stage with an LLM role would run"
        method["calibration"] = None

    stages: list[StageEstimate] = []
    for s in runner.plan:
        reason = selection.get(s.name)
        state = reason if reason is not None else "not selected"
        partial = None
        if reason == "partial":
            partial = (_done_episodes(cfg.run_dir, s.name), n_episodes)
        why = _why(state, s, manifests.get(s.name), fps, partial) if reason else "not picked by the selectors"
        runs = reason is not None and reason != "done"
        roles = estimates.get(s.name, []) if runs else []
        if runs and not s.llm_roles(cfg):
            why += "; no LLM role"
        stages.append(StageEstimate(s.name, state, why, fps[s.name], runs, roles, s.billed_method))
    plan = Plan(cfg.run_name, str(cfg.run_dir), stages, method, calibration_run)
    if write:
        make_dirs(cfg.run_dir)
        atomic_write_json(join(cfg.run_dir, PLAN_FILE), plan.plan_file())
    return plan


def _model_notes(cfg: RunConfig, dry: DryRun, skipped: list[str]) -> dict[str, str]:
    """What the dry run estimated instead of running a model (`_no_models`), and what it left out."""
    notes: dict[str, str] = {}
    compressed = {k: v["units"] for k, v in dry.simulated.items() if v["units"]}
    embedded = {k: v["texts"] for k, v in dry.simulated.items() if v["texts"]}
    compress = getattr(cfg, "compress", None)
    if compressed:
        how = f"{compress.method} at rate {compress.rate}" if compress is not None else "the compressor"
        notes["compress"] = (f"estimated from sizes: {how} not run; rate x the words of each utterance kept (evenly "
                             f"spread, speaker tags and lines intact), no model loaded ({_listed(compressed)} units)")
    if embedded:
        notes["embeddings"] = (f"simulated vectors: hashed words, {cfg.embedding.model}'s dimension where known, no "
                               f"model loaded ({_listed(embedded)} texts)")
    if skipped:
        notes["not run"] = (f"{', '.join(skipped)}: no LLM role, and no LLM stage reads them "
                            "(no BERTScore or other model)")
    return notes


def _listed(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in counts.items())


def _calibration_cost(ccfg: RunConfig, crunner: Any) -> dict[str, Any]:
    """What the calibration run's calls were, and what its fresh ones cost at plan's prices."""
    calls = fresh = 0.0
    cost = 0.0
    for st in crunner.status():
        m = st.manifest
        for role, u in ((m.llm_usage or {}) if m is not None else {}).items():
            sent = u.calls + u.failed_calls
            calls += sent
            share = (u.calls - u.cached_calls) / u.calls if u.calls else 0.0
            fresh += u.calls - u.cached_calls
            cost += cost_usd(role_prices(ccfg.role(role)), u.prompt_tokens * share, u.completion_tokens * share,
                             u.cached_prompt_tokens * share)
    return {"run_dir": str(ccfg.run_dir), "calls": int(calls), "fresh_calls": int(fresh), "cost_usd": round(cost, 6),
            "note": "its answers are in the run's LLM cache: the real run replays them without paying again"}


@dataclass
class Scaling:
    """From the dry run's counts of a stage to the run's: per quantity a factor and how it was found."""

    calls: float
    prompt: float
    how_calls: str
    how_prompt: str
    episodes: float  # the plain episode factor (embedding requests, which have no per-episode counts)
    probe_factor: dict[str, float] = field(default_factory=dict)  # per episode, before scaling

    @classmethod
    def flat(cls, scale: float, how: str) -> "Scaling":
        return cls(scale, scale, how, how, scale)


def _best_measure(counts: Mapping[str, float], sampled: list[EpisodeSize]) -> str:
    """The size (MEASURES) the sampled episodes' counts are most nearly proportional to: least
    spread of count / size over them (coefficient of variation); episodes with fewer than 2 of them."""
    best, best_cv = "episodes", math.inf
    for name in MEASURES:
        pairs = [(counts.get(e.episode_id, 0.0), e.measure(name)) for e in sampled]
        if any(size <= 0 < n for n, size in pairs):
            continue  # counts where this size is nothing: it cannot be what they grow with
        ratios = [n / size for n, size in pairs if size > 0]
        mean = sum(ratios) / len(ratios) if len(ratios) >= 2 else 0.0
        if mean <= 0:
            continue
        cv = math.sqrt(sum((r - mean) ** 2 for r in ratios) / len(ratios)) / mean
        if cv < best_cv - 1e-9:
            best, best_cv = name, cv
    return best


def _scales(stage: Stage, dry: DryRun, sizes: list[EpisodeSize], sampled: list[EpisodeSize],
            remaining: int) -> Scaling:
    """A per-episode stage's counts on the sampled episodes scaled to the run's `remaining`
    episodes: its per-episode counts (times the run's probes over the sampled ones, per episode,
    where the dry run sampled probes and the stage reads them), summed and scaled by the size they
    grow with (`_best_measure`: episodes, turns, sessions or questions, counted in the corpus for
    every episode), calls and prompt tokens each by their own."""
    n_all, part = len(sizes), remaining / max(len(sizes), 1)
    episodes = n_all / max(dry.episodes, 1) * part
    m = dry.manifests.get(stage.name)
    per = _per_episode(m) if m is not None else {}
    pf = dry.probe_factor if "probes" in stage.inputs else {}
    if not per or len(sampled) != dry.episodes:  # no per-episode counts: by episodes, as before
        how = ("counted" if episodes == 1.0 else
               f"counted on {dry.episodes} episode(s) x {episodes:.3g} ({remaining} to run)")
        return Scaling(episodes, episodes, how, how, episodes)
    out: dict[str, tuple[float, str]] = {}
    for key in ("calls", "prompt_tokens"):
        raw = {e.episode_id: float(per.get(e.episode_id, {}).get(key, 0.0)) for e in sampled}
        adj = {e: v * pf.get(e, 1.0) for e, v in raw.items()}
        probes = sum(adj.values()) / sum(raw.values()) if sum(raw.values()) else 1.0
        measure = _best_measure(adj, sampled)
        size = sum(e.measure(measure) for e in sampled)
        f = sum(e.measure(measure) for e in sizes) / size if size else n_all / max(len(sampled), 1)
        factor = probes * f * part
        if factor == 1.0:
            out[key] = (1.0, "counted")
            continue
        how = f"counted on {len(sampled)} of {n_all} episode(s)"
        if probes != 1.0:
            how += f", {DRY_RUN_PROBES} probes per episode and kind x {probes:.3g} (the run's probes)"
        if f != 1.0:
            how += f", x {f:.3g} by {measure}"
        if part != 1.0:
            how += f", x {part:.3g} ({remaining} to run)"
        out[key] = (factor, how)
    return Scaling(out["calls"][0], out["prompt_tokens"][0], out["calls"][1], out["prompt_tokens"][1], episodes, pf)


def _probe_share(m: Manifest, probe_factor: Mapping[str, float], key: str) -> float:
    """The stage's per-episode `key` with every probe made over with the probes the dry run sampled."""
    per = _per_episode(m)
    counted = sum(v.get(key, 0) for v in per.values())
    if not probe_factor or not counted:
        return 1.0
    return sum(v.get(key, 0) * probe_factor.get(e, 1.0) for e, v in per.items()) / counted


def _estimate_stage(cfg: RunConfig, stage: Stage, dry: DryRun, scaling: Scaling | float,
                    source: CalibrationSource | None, completion_fraction: float, n_episodes: int,
                    remaining: int) -> list[RoleEstimate]:
    if not isinstance(scaling, Scaling):  # a plain factor: every count by it, by episodes
        scaling = Scaling.flat(scaling, "counted" if scaling == 1.0 else
                               f"counted on {dry.episodes} episode(s) x {scaling:.3g} ({remaining} to run)")
    m = dry.manifests.get(stage.name)
    emb = dry.embeddings.get(stage.name)
    owner = stage.billed_method
    out: list[RoleEstimate] = []
    for role in stage.roles:
        role_cfg = cfg.role(role)
        price = role_prices(role_cfg)
        u = (m.llm_usage or {}).get(role) if m is not None else None
        u = u or Usage()
        chat_calls, chat_prompt = _sent(u), u.prompt_tokens
        est = RoleEstimate(role, role_cfg.model, price=price,
                           counted={"calls": chat_calls, "prompt_tokens": chat_prompt, "episodes": dry.episodes})
        calls, prompt = chat_calls * scaling.calls, chat_prompt * scaling.prompt
        est.method = {"calls": scaling.how_calls,
                      "prompt_tokens": scaling.how_prompt + " (cl100k, OpenAI's chat framing)"}
        cal = None
        if source is not None and m is not None:
            # Embeddings go through the `embedder` role, never through this one: nothing to leave out.
            # Where the dry run sampled probes, its counts are compared as if it had made them all.
            pf = scaling.probe_factor
            cal = calibrate(stage, role, m, (chat_calls * _probe_share(m, pf, "calls"),
                                             chat_prompt * _probe_share(m, pf, "prompt_tokens")),
                            dry.episodes, source, (0.0, 0.0), pf)
        if cal is not None:
            if cal.rate is not None:  # the dry run made no call where the real one did
                episodes_to_run = 1 if isinstance(stage, GlobalStage) else remaining
                calls, prompt = cal.rate["calls"] * episodes_to_run, cal.rate["prompt_tokens"] * episodes_to_run
                est.method["calls"] = est.method["prompt_tokens"] = f"per episode of {cal.source}"
            else:
                if cal.calls is not None:
                    calls *= cal.calls
                    est.method["calls"] = f"{scaling.how_calls}, x {cal.calls:.3g} calibrated on {cal.source}"
                if cal.prompt is not None:
                    prompt *= cal.prompt
                    est.method["prompt_tokens"] = f"{scaling.how_prompt}, x {cal.prompt:.3g} calibrated on {cal.source}"
        if cal is not None and cal.completion_per_call is not None:
            completion = calls * cal.completion_per_call
            est.method["completion_tokens"] = f"{cal.completion_per_call:.1f} per call, calibrated on {cal.source}"
        else:
            per_call = completion_fraction * dry.max_tokens.get(stage.name, role_cfg.max_tokens)
            completion = calls * per_call
            est.method["completion_tokens"] = (f"assumed: {completion_fraction:g} x max_tokens "
                                               f"= {per_call:.1f} per call (no calibration source)")
        # The cached share of the prompts is the dry run's (see CACHED_PROMPT_RULE): it follows from
        # the prompts' structure, so it carries over to the scaled and calibrated prompt tokens.
        cached_share = min(u.cached_prompt_tokens / chat_prompt, 1.0) if chat_prompt else 0.0
        est.counted["cached_prompt_tokens"] = float(u.cached_prompt_tokens)
        est.method["cached_prompt_tokens"] = f"{cached_share:.1%} of prompt tokens, as in the dry run"
        est.calls, est.prompt_tokens, est.completion_tokens = calls, prompt, completion
        est.cached_prompt_tokens = prompt * cached_share
        est.cost_usd = None if price is None else cost_usd(price, prompt, completion, est.cached_prompt_tokens)
        if est.cost_usd is not None:
            est.by_method = {m: est.cost_usd * f for m, f in method_shares(u.cost_by_method, owner).items()}
        out.append(est)
    if EMBEDDER_ROLE in stage.llm_roles(cfg):
        scaled = ("counted" if scaling.episodes == 1.0 else
                  f"counted on {dry.episodes} episode(s) x {scaling.episodes:.3g} ({remaining} to run)")
        e = _embedding_estimate(cfg.role(EMBEDDER_ROLE), emb, scaling.episodes, scaled, dry.episodes)
        e.by_method = {} if e.cost_usd is None else {owner or SHARED: e.cost_usd}  # the simulator bills no method
        out.append(e)
    return out


def _embedding_estimate(role_cfg: Any, emb: dict[str, float] | None, scale: float, scaled: str,
                        episodes: int) -> RoleEstimate:
    """The `embedder` role of a stage that embeds through an endpoint: calls one per text (as the
    manifests and the run's ledger count them), sent in requests of up to `EMBED_BATCH` texts;
    tokens are the texts' (cl100k, as OpenAI's embedding models count them); cost at the embedding
    model's input price, None where the price table has no such model."""
    from pipeline.llm.client import EMBED_BATCH

    emb = emb or {}
    model = str(emb.get("model") or role_cfg.model)
    texts, tokens = float(emb.get("calls", 0.0)) * scale, float(emb.get("prompt_tokens", 0.0)) * scale
    requests = float(emb.get("requests", 0.0)) * scale
    p = prices_for(role_cfg).get(model)
    price = None if p is None else {"input": p.get("input", 0.0), "output": 0.0}
    return RoleEstimate(
        EMBEDDER_ROLE, model, texts, tokens, 0.0, None if price is None else cost_usd(price, tokens, 0), price,
        {"calls": f"{scaled} (one per text; {requests:,.0f} requests of up to {EMBED_BATCH} texts)",
         "prompt_tokens": scaled + " (cl100k)", "completion_tokens": "none (embeddings)"},
        {"calls": float(emb.get("calls", 0.0)), "requests": float(emb.get("requests", 0.0)),
         "prompt_tokens": float(emb.get("prompt_tokens", 0.0)), "episodes": episodes})


# ---------------------------------------------------------------------------------------------
# the table

def _fmt_int(v: float) -> str:
    return f"{int(round(v)):,}"


def _how(method: dict[str, str]) -> str:
    """calls / prompt / completion methods, said once where they agree."""
    calls, prompt = method.get("calls", ""), method.get("prompt_tokens", "")
    if prompt.startswith(calls) and calls:
        head = f"calls, prompt{prompt[len(calls):]}: {calls}"
    else:
        head = f"calls: {calls}; prompt: {prompt}"
    return f"{head}; completion: {method.get('completion_tokens', '')}"


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def render_views(plan: Plan) -> list[str]:
    """Where the money goes: a table per method (memory, respond, each judge stage's share, other,
    total), one per stage and one per LLM role (with cached prompt tokens), over the stages that run;
    nothing when no stage has an LLM role."""
    methods, roles = plan.by_method(), plan.by_role()
    if not roles:
        return []
    judges = sorted({j for row in methods.values() for j in row["judges"]})
    rows = [["method", "memory $", "respond $", *(f"{j} $" for j in judges), "other $", "total $"]]
    for m, row in methods.items():
        rows.append([m, *(f"{v:.4f}" for v in (row["memory"], row["respond"],
                                                *(row["judges"].get(j, 0.0) for j in judges),
                                                row["other"], row["total"]))])
    lines = ["", "where the money goes, per method (a judge stage split by the method each judged row is for):",
             *_aligned(rows)]

    def totals(name: str, t: dict[str, float]) -> list[str]:
        return [name, _fmt_int(t["calls"]), _fmt_int(t["prompt_tokens"]), _fmt_int(t["cached_prompt_tokens"]),
                _fmt_int(t["completion_tokens"]), f"{t['cost_usd']:.4f}"]

    head = ["calls", "prompt tok", "cached prompt tok", "completion tok", "cost $"]
    stages = [totals(s.name, s.total()) for s in plan.stages if s.runs and s.roles]
    return [*lines, "", "per stage:", *_aligned([["stage", *head], *stages]),
            "", "per role:", *_aligned([["role", *head], *(totals(r, t) for r, t in roles.items())])]


def render(plan: Plan) -> str:
    """The plan as a table per stage and role, with a total line, then the cost per method and per
    role (`render_views`) and the method."""
    header = ["stage", "state", "why", "role", "model", "calls", "prompt tok", "completion tok", "cost $", "how"]
    rows: list[list[str]] = []
    for s in plan.stages:
        if not s.runs:
            rows.append([s.name, s.state, s.why, "", "", "", "", "", "", ""])
            continue
        if not s.roles:
            rows.append([s.name, s.state, s.why, "-", "", "0", "0", "0", "0", ""])
            continue
        for i, r in enumerate(s.roles):
            how = _how(r.method)
            cost = "no price" if r.cost_usd is None else f"{r.cost_usd:.4f}"
            rows.append([s.name if i == 0 else "", s.state if i == 0 else "", s.why if i == 0 else "", r.role,
                         r.model, _fmt_int(r.calls), _fmt_int(r.prompt_tokens), _fmt_int(r.completion_tokens), cost,
                         how])
    t = plan.total()
    rows.append(["total", "", "", "", "", _fmt_int(t["calls"]), _fmt_int(t["prompt_tokens"]),
                 _fmt_int(t["completion_tokens"]), f"{t['cost_usd']:.4f}", ""])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = [f"plan for run {plan.run_name} at {plan.run_dir}"]
    for r in [header, *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + ("  " + r[-1] if r[-1] else ""))
    lines += render_views(plan)
    m = plan.method
    lines.append("")
    lines.append(f"how: dry run: {m.get('dry_run')}; calibration: {m.get('calibration') or 'none'}"
                 f"; episodes in the run: {m.get('episodes')}")
    if m.get("models"):
        lines.append("no model run: " + "; ".join(f"{k}: {v}" for k, v in m["models"].items()))
    lines.append(f"prices: {m['prices']}; {m['cache']}")
    if "by_method" in m:  # (a plan made before these notes has none)
        lines.append(f"cached prompt tokens: {m.get('cached_prompt_tokens')}; per method: {m['by_method']}")
    if plan.calibration_run:
        c = plan.calibration_run
        lines.append(f"calibration run: {c['calls']} calls ({c['fresh_calls']} fresh), ${c['cost_usd']:.4f} at these "
                     f"prices, in {c['run_dir']}; {c['note']}")
    return "\n".join(lines)
