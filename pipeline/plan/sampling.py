"""Big corpora: which episodes the dry run reads (`_take_within`), and how a per-episode stage's counts
on them scale back to the run (`_scales`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from pipeline.config import RunConfig
from pipeline.manifest import Manifest
from pipeline.plan.estimates import DRY_RUN_PROBES
from pipeline.engine.stage import Stage

if TYPE_CHECKING:
    from pipeline.plan.dryrun import DryRun


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


def _per_episode(m: Manifest) -> dict[str, dict[str, float]]:
    data = m.stats.get("llm_per_episode")
    return data if isinstance(data, dict) else {}


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

