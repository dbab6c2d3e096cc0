"""What a stage is: inputs, config section, outputs, and the work it does.

Two shapes cover every stage SPEC lists:
- `EpisodeStage`: an async function over one episode's upstream rows (segmenting sessions,
  building graphs, answering probes, judging pairs). The runner shards episodes over Ray
  tasks, and a finished shard is never redone.
- `GlobalStage`: one function over whole upstream tables (ingest, aggregate scores, reports).

Stages never touch Ray, paths of other stages or the LLM cache directly; they get a
`StageContext` that hands out the injected services lazily.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa

if TYPE_CHECKING:
    from pipeline.config import RunConfig

Rows = list[dict[str, Any]]


@dataclass
class StageContext:
    cfg: "RunConfig"
    stage: "Stage"
    out_dir: Path  # where side artifacts (Lance banks, JSON) of this stage go; renamed atomically
    upstream_dirs: dict[str, Path] = field(default_factory=dict)
    llm: Any = None  # ChatLLM, set by the runner when stage.uses_llm
    judge: Any = None  # ChatLLM for the judge model, when stage.uses_judge
    _embedder: Any = None

    @property
    def section(self) -> Any:
        return getattr(self.cfg, self.stage.section) if self.stage.section else None

    @property
    def embedder(self) -> Any:
        if self._embedder is None:
            from pipeline.embeddings import make_embedder

            embed_fn = getattr(self.llm, "embed", None)
            self._embedder = make_embedder(self.cfg.embedding, llm_embed=embed_fn)
        return self._embedder


class Stage:
    name: ClassVar[str]
    inputs: ClassVar[tuple[str, ...]] = ()
    outputs: ClassVar[dict[str, pa.Schema]] = {}
    section: ClassVar[str | None] = None  # config section; its values enter the fingerprint
    config_keys: ClassVar[tuple[str, ...]] = ()  # other top-level config keys it depends on
    version: ClassVar[str] = "1"  # bump when behaviour changes in a way the source hash misses
    prompts: ClassVar[dict[str, str]] = {}  # prompt texts; a change re-runs the stage
    code: ClassVar[tuple[Any, ...]] = ()  # extra modules whose source enters the fingerprint
    uses_llm: ClassVar[bool] = False
    uses_judge: ClassVar[bool] = False
    uses_embedder: ClassVar[bool] = False

    def extra_fingerprint(self, cfg: "RunConfig") -> dict[str, Any]:
        """Anything else the output depends on (e.g. input file hashes for ingest)."""
        return {}

    def manifest_extra(self, out_dir: Path) -> dict[str, Any]:
        """Stage-specific counts for the manifest (e.g. segmentation fallbacks), read from out_dir."""
        return {}

    def source_texts(self) -> list[str]:
        modules = [sys.modules[type(self).__module__], *self.code]
        return [inspect.getsource(m) for m in modules]


class GlobalStage(Stage):
    async def run(self, ctx: StageContext, inputs: dict[str, pa.Table]) -> dict[str, pa.Table]:
        raise NotImplementedError


class EpisodeStage(Stage):
    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict[str, Rows]) -> dict[str, Rows]:
        """Rows of every output table for one episode. LLM failures become rows with `error` set."""
        raise NotImplementedError

    def finalize(self, ctx: StageContext) -> None:
        """Optional work after every shard is done (e.g. a stage-level side artifact)."""
