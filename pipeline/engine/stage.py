"""What a stage is: inputs, settings, outputs, LLM roles, and the work it does.

Two shapes cover every stage SPEC lists:
- `EpisodeStage`: an async function over one episode's upstream rows (segmenting sessions,
  building memories, answering probes, judging pairs). The runner shards episodes over Ray
  tasks, and a finished shard is never redone.
- `GlobalStage`: one function over whole upstream tables (ingest, aggregate scores, reports).

Upstream tables reach a stage as `"<stage>.<table>"` (e.g. `"ingest.turns"`), so two stages
that write a table of the same name never collide. Stages never touch Ray, paths of other stages
or the LLM cache directly; they get a `StageContext` that hands out the injected services.

A stage's settings are typed as a method's are: `class BanksStage(EpisodeStage[BanksConfig])` with
`section = "banks"` reads `ctx.settings.granularities`, and `BanksConfig` is the section's model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, ClassVar, Generic, Iterator, TypeVar, get_args, get_origin

import pyarrow as pa
from pydantic import BaseModel

from pipeline.config import Section

if TYPE_CHECKING:
    from pipeline.config import EmbeddingConfig, RunConfig
    from pipeline.embeddings import Embedder
    from pipeline.llm.types import ChatLLM
    from pipeline.manifest import Manifest
    from pipeline.models_needed import ModelNeed
    from pipeline.storage import Location

Rows = list[dict[str, Any]]
# The executor's shared local embedder for these embedding settings, or None where it has none (the
# Ray executor: the node's embedding service, pipeline.engine.execution.embedding_service.node_embedder).
EmbedderFactory = Callable[["EmbeddingConfig"], "Embedder | None"]

# The LLM role of embedding requests when `embedding.provider` is openai: shared cache, limiter
# and ledger like any role, its endpoint overridable under `roles.embedder`.
EMBEDDER_ROLE = "embedder"


# A stage's settings model. A stage without settings subclasses `EpisodeStage` / `GlobalStage` bare (no
# `section`); a helper that reads no settings takes a bare `StageContext`, any stage's.
S = TypeVar("S", bound=BaseModel)


@dataclass
class StageContext(Generic[S]):
    cfg: "RunConfig"
    stage: "Stage[S]"
    # Where side artifacts (Lance banks, JSON) of this stage go: a local folder, renamed (or, on an
    # object store, uploaded) atomically with the stage.
    out_dir: Path
    upstream_dirs: dict[str, "Location"] = field(default_factory=dict)  # a folder, or a URI on an object store
    # Finished input stage -> its manifest (counts, LLM usage), so a stage never reads another's files;
    # with `Stage.whole_upstream`, every stage upstream of its inputs too, in pipeline order.
    upstream_manifests: dict[str, "Manifest"] = field(default_factory=dict)
    clients: dict[str, Any] = field(default_factory=dict)  # role -> ChatLLM, one per stage.roles
    # Set by the executor that shares one local embedding model among its workers (Ray: one per
    # node); None: the stage loads its own (`make_embedder`).
    embedder_factory: EmbedderFactory | None = None
    # Loaded models; the per-episode copies of a shard's context share this dict, so one load serves all.
    _models: dict[str, Any] = field(default_factory=dict)

    @property
    def settings(self) -> S:
        """This stage's settings (its config section, or its method's settings)."""
        return self.stage.settings_of(self.cfg)

    @property
    def llm(self) -> "ChatLLM":
        """The client of the stage's first role."""
        if not self.stage.roles:
            raise KeyError(f"stage {self.stage.name} declares no LLM role")
        return self.role(self.stage.roles[0])

    def role(self, name: str) -> "ChatLLM":
        try:
            return self.clients[name]
        except KeyError:
            raise KeyError(f"stage {self.stage.name} did not declare LLM role {name!r}") from None

    @property
    def embedder(self) -> "Embedder":
        if "embedder" not in self._models:
            from pipeline.embeddings import make_embedder
            from pipeline.simulation import simulating_models

            # A local model: the executor's shared one where it has one (never in plan's dry run,
            # which simulates vectors even where a real run's service is up).
            local = self.cfg.embedding.provider == "local" and not simulating_models()
            shared = self.embedder_factory(self.cfg.embedding) if local and self.embedder_factory else None
            client = self.clients.get(EMBEDDER_ROLE) or (self.llm if self.stage.roles else None)
            embed_fn = getattr(client, "embed", None)
            self._models["embedder"] = shared or make_embedder(self.cfg.embedding, llm_embed=embed_fn)
        return self._models["embedder"]

    def lazy_embed(self) -> Callable[[list[str]], Awaitable[Any]]:
        """An awaitable `embedder.encode` (`pipeline.embeddings.aencode`: off the event loop, in
        rounds with the worker's other episodes' requests), loading the model at the first call: work whose
        settings never embed (BM25 retrieval) never pays for loading it in every worker."""
        from pipeline.embeddings import aencode

        async def embed(texts: list[str]) -> Any:
            return await aencode(self.embedder, texts)

        return embed


class Stage(Generic[S]):
    """A stage; `S` is its settings model (`EpisodeStage[MySettings]`), read as `ctx.settings`."""

    # Class attributes for fixed stages; stages made per method set them on the instance.
    name: str
    inputs: tuple[str, ...] = ()
    outputs: dict[str, pa.Schema] = {}
    section: ClassVar[str | None] = None  # config section; its values enter the fingerprint
    # The section's model, owned by the stage: `S`, unless a subclass sets it (None: no section of its own).
    Settings: ClassVar[type[Section] | None] = None
    episodes_from: str = "ingest"  # the stage whose `episodes` table shards this one
    roles: tuple[str, ...] = ()  # LLM roles it calls; their identity enters the fingerprint
    config_keys: ClassVar[tuple[str, ...]] = ()  # other top-level config keys it depends on
    version: ClassVar[str] = "1"  # bump when behaviour changes in a way the source hash misses
    prompts: dict[str, str] = {}  # prompt texts; a change re-runs the stage
    uses_embedder: bool = False
    billed_method: str = ""  # the method its LLM calls are costed to (Usage.cost_by_method), if it serves one
    why: str = ""  # why the run's graph holds it (set by the project's registry; plan, status and check show it)
    # False: its calls are a third-party library's own, which plan's dry run does not model; plan
    # estimates them only from a calibration (--calibrate K, --like RUN_DIR)
    dry_run_estimates: bool = True
    # True: its context holds the manifests of every stage upstream of its inputs, transitively (the
    # report prices stages whose rows it never reads: the segmenter, TeaBag), without their tables.
    whole_upstream: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "settings" in cls.__dict__:  # the old spelling: ignored, it would leave the section unknown
            raise TypeError(f"{cls.__name__}: name its settings model as the parameter "
                            f"(`EpisodeStage[{getattr(cls.__dict__['settings'], '__name__', '...')}]`), not `settings =`")
        if "Settings" not in cls.__dict__:
            model = settings_parameter(cls, Stage, Section)
            if model is not None:
                cls.Settings = model

    def selected_by(self, cfg: "RunConfig", present: set[str]) -> str | None:
        """Why a run holds this stage for its own sake (a judge its settings enable), given the
        stages its methods bring (`present`); None: only when a stage of the run reads it."""
        return None

    def llm_roles(self, cfg: "RunConfig") -> tuple[str, ...]:
        """The roles whose clients its shards get: its own, and `embedder` when it embeds through
        an OpenAI-compatible endpoint (`embedding.provider: openai`; `roles.embedder.*` sets it)."""
        if self.uses_embedder and cfg.embedding.provider == "openai" and EMBEDDER_ROLE not in self.roles:
            return (*self.roles, EMBEDDER_ROLE)
        return self.roles

    def settings_of(self, cfg: "RunConfig") -> S:
        """Its settings in `cfg` (its section's values); KeyError for a stage that has none."""
        if self.section is None:
            raise KeyError(f"stage {self.name} has no settings section")
        return getattr(cfg, self.section)

    def models(self, cfg: "RunConfig") -> list["ModelNeed"]:
        """The models it loads with these settings (`mempipe models`, and the preflight that finds
        them before a command runs): by default the local embedding model when it embeds."""
        from pipeline.embeddings import PACKAGED_MINILM
        from pipeline.models_needed import embedding_need

        return embedding_need(cfg, PACKAGED_MINILM) if self.uses_embedder else []

    def extra_fingerprint(self, cfg: "RunConfig") -> dict[str, Any]:
        """Anything else the output depends on (e.g. input file hashes for ingest)."""
        return {}

    def check_inputs(self, cfg: "RunConfig") -> None:
        """Raise InputError / ConfigError for an input it reads that the driver already sees is
        missing; called before a run starts its backend (Ray, model servers), so a mistyped path
        costs a second, not a cluster start. By default nothing to check."""

    def code_roots(self) -> tuple[str, ...]:
        """Modules whose source, with every project module they import, enters the fingerprint
        (`pipeline.engine.code_closure`): the stage's own module; a stage made per method adds the method's."""
        return (type(self).__module__,)


M = TypeVar("M", bound=BaseModel)


def settings_parameter(cls: type, generic: type, model: type[M]) -> type[M] | None:
    """The settings model `cls` names in its bases (`X` of `class C(EpisodeStage[X])`, of a subclass
    of `generic`), a subclass of `model`; None where its bases name none, or only a type variable
    (`JudgeStage[JS]`)."""
    for base in cls.__dict__.get("__orig_bases__", ()):  # its own bases, not those it inherits
        origin = get_origin(base)
        if isinstance(origin, type) and issubclass(origin, generic):
            for arg in get_args(base):
                if isinstance(arg, type) and issubclass(arg, model):
                    return arg
    return None


# A streamed part may also hold, under this key, the stage's own counts for its manifest (summed over
# parts, as shard stats are): e.g. what ingest's audited answer key changed.
PART_STATS = "_stats"


class GlobalStage(Stage[S]):
    # True: the stage gives its output through `run_parts`, part by part, and never holds it whole
    # (ingest: a 10k-episode corpus parsed at once took 700 MB in one worker).
    streams: ClassVar[bool] = False

    async def run(self, ctx: StageContext[S], inputs: dict[str, pa.Table]) -> dict[str, pa.Table]:
        raise NotImplementedError

    def run_parts(self, ctx: StageContext[S], inputs: dict[str, pa.Table],
                  episodes_per_part: int) -> Iterator[dict[str, Any]]:
        """For a stage that `streams`: its output tables, `episodes_per_part` whole episodes at a time
        (the last part may hold fewer), in episode order, and optionally its counts under `PART_STATS`.
        Each part is written as it comes, as the part a non-streaming stage's whole output would have
        been cut into; an exception publishes nothing."""
        raise NotImplementedError


class EpisodeStage(Stage[S]):
    async def process_episode(self, ctx: StageContext[S], episode_id: str, inputs: dict[str, Rows]) -> dict[str, Rows]:
        """Rows of every output table for one episode. LLM failures become rows with `error` set."""
        raise NotImplementedError

    def shard_stats(self, produced: dict[str, Rows]) -> dict[str, Any]:
        """Counts for the manifest from one shard's rows (summed over shards); e.g. fallbacks."""
        return {}
