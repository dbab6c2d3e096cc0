"""What a memory method is, and what the framework hands it.

A method is one module (or small package), under `stages/methods/` or in a package of its own
registered under the `mempipe.methods` entry point (docs/adding-a-method.md), with:
- `Settings`: its pydantic settings model, configured as `method.<name>.*`: the `S` of
  `Method[S]`, unless the class sets `Settings` itself;
- `needs`: upstream stages it reads besides `ingest` and `probes` (SeCom's retrieval needs `banks`);
- `stages()`: the stages it brings itself, before its memory (SeCom's segmentation, compression and
  banks), each with its own settings section and tables; a run holds them when a selected stage
  reads them (`needs`), so a method that no run selects costs nothing;
- `memory`: the tables its `build` writes, with their Arrow schemas (start them with
  `SNAPSHOT_FIELDS`); empty for methods without memory (full history, SeCom's banks);
- `build(ctx, episode)`: walks the episode session by session (turn by turn where memory evolves
  inside a session) and returns memory rows keyed by the point they were built up to;
- `answer(ctx, probe, memory)`: the response plus what it used.
  Both get one `MethodContext`: the method's typed settings, the LLM client of the role the call
  plays (`build_role` for build, `answer_role` for answer) and the embedder when `uses_embedder`;
- `memory_view(episode, memory, settings)`: its memory of the whole episode as text, which the
  memory-quality judge rates (None for methods that keep none); `shows_memory` gives a method
  without memory tables a memory stage that writes only this view (SeCom's bank units);
- `memory_evidence`, `whole_memory_in_context`, `memory_items(memory, settings)`: how `diagnose` tells
  whether a probe's evidence was written to its memory and retrieved into an answer (by the turns
  its memory holds, or by a judge reading the rows it wrote);
- `report_panel(memory, responses)`: its own part of the run report (Theanine's memory graph,
  CREEM's label shares), with `report_table` naming and typing the table it adds to the report.

The framework turns each selected method into the stages `memory_<name>` (when it has memory or
`shows_memory`) and
`respond_<name>`, each with its own fingerprint, and shows every probe exactly the memory built
from what came before it (`visible_memory`). Methods are pure: no Ray, no I/O, the LLM injected.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, ClassVar, Generic, Iterable, Iterator, Literal, TypeVar

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict

from pipeline.errors import ConfigError
from pipeline.llm.types import ChatLLM
from pipeline.engine.stage import Rows, settings_parameter

if TYPE_CHECKING:
    from pipeline.models_needed import ModelNeed
    from pipeline.engine.stage import Stage

# Awaited: the pipeline's runs off the event loop (on Ray, in the node's embedding service).
Embed = Callable[[list[str]], Awaitable[np.ndarray]]

# Every memory row says up to which point of the conversation it was built: the end of session
# `snapshot_session` (snapshot_turn null), or its turn `snapshot_turn` included.
SNAPSHOT_FIELDS = [
    pa.field("episode_id", pa.string(), nullable=False),
    pa.field("snapshot_session", pa.int32(), nullable=False),
    pa.field("snapshot_turn", pa.int32()),
]


@contextlib.contextmanager
def asked_ahead(calls: Iterable[asyncio.Future | None]) -> Iterator[None]:
    """Around a build that starts calls before the step that reads them (calls that depend on the
    input alone, so a chain of dependent steps waits on fewer of its own): on the way out, none is
    left running and no error of one is left unread, however the build ended."""
    try:
        yield
    finally:
        for call in calls:
            if call is None:
                continue
            if not call.done():
                call.cancel()
            elif not call.cancelled():
                call.exception()


def after_session(episode_id: str, session: int) -> dict[str, Any]:
    """The snapshot key of memory built from everything up to the end of `session`."""
    return {"episode_id": episode_id, "snapshot_session": session, "snapshot_turn": None}


class MethodSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


S = TypeVar("S", bound=MethodSettings)


@dataclass
class EpisodeInput:
    """One episode as `build` sees it."""

    episode: dict[str, Any]  # the `ingest.episodes` row
    sessions: dict[int, Rows]  # turns by session index, each in turn order
    upstream: dict[str, Rows] = field(default_factory=dict)  # "<stage>.<table>" rows of `needs`


@dataclass
class MethodContext(Generic[S]):
    """What the framework hands `build` and `answer`."""

    settings: S  # the method's `Settings`, as configured under `method.<name>`
    llm: ChatLLM  # the client of the role this call plays (`build_role` / `answer_role`)
    embed: Embed | None = None  # None unless the method `uses_embedder`

    async def embedding_dims(self) -> int:
        """The width of the run's embedder's vectors (a library sizes its vector store by it)."""
        if self.embed is None:
            raise ConfigError("this method embeds through the run's embedder, which its context lacks "
                              "(its `uses_embedder` is false?)")
        return len((await self.embed(["dimensions"]))[0])


@dataclass
class ProbeInput:
    """One probe as `answer` sees it: the conversation before it, nothing after."""

    probe: dict[str, Any]  # the `probes.probes` row
    episode: dict[str, Any]
    history: dict[int, Rows]  # sessions before the probe's session
    current: Rows  # the probe's session up to (not including) the turn to produce
    upstream: dict[str, Rows] = field(default_factory=dict)  # "<stage>.<table>" rows of `needs`

    @property
    def request(self) -> str:
        return self.probe["request"]


@dataclass
class Answer:
    text: str
    used_ids: list[str] = field(default_factory=list)  # memory / unit ids that entered the context
    context_tokens: int = 0  # tokens of memory that entered the context
    context_turns: int = 0  # dataset turns of memory that entered the context
    rationale: str | None = None
    details: dict[str, Any] | None = None  # method-specific record (JSON), e.g. timelines
    model: str = ""


@dataclass(frozen=True)
class MemoryItem:
    """One entry of a method's memory as `diagnose`'s judge reads it: the id its answers' `used_ids`
    name, and its text."""

    id: str
    text: str
    always_shown: bool = False  # it enters every answer's context (LD-Agent's persona traits)


# What `diagnose` (stages/judging/diagnose.py) takes as a method's memory of a probe's evidence:
# turns_in_context: the conversation's own turns that entered the answer (a history keeps what it
#   shows: written = retrieved); every_turn: every turn before the probe, kept verbatim in units it
#   retrieves from (SeCom's banks), retrieved = the turns of the units in the answer; judge: memory it
#   writes itself (summaries, facts, events), where a judge names the rows that state each item.
MemoryEvidence = Literal["turns_in_context", "every_turn", "judge"]
# Columns `memory_items` reads by default: a row's id, and its text.
ITEM_ID_COLUMNS = ("memory_id", "memo_id", "fact_id", "event_id", "unit_id")
ITEM_TEXT_COLUMNS = ("text", "event", "summary", "memory", "trait")


@dataclass
class ReportPanel:
    """A method's own section of the run report, from its memory tables and responses."""

    title: str
    text: str
    rows: Rows = field(default_factory=list)  # rows of the method's `report_table`, shown and written
    figure: Callable[[Path], bool] | None = None  # draws the panel's PNG at a path; False: nothing to draw
    caption: str = ""  # the figure's caption (alt text)


class Method(Generic[S]):
    """A memory method; `S` is its settings model (`Method[MySettings]`), also its `Settings` unless
    a subclass sets `Settings` itself."""

    name: ClassVar[str]
    Settings: ClassVar[type[MethodSettings]] = MethodSettings
    needs: ClassVar[tuple[str, ...]] = ()
    memory: ClassVar[dict[str, pa.Schema]] = {}
    # snapshots: each key holds the whole memory at that point; log: rows accumulate over keys.
    memory_kind: ClassVar[Literal["snapshots", "log"]] = "snapshots"
    build_role: ClassVar[str] = "memory"
    answer_role: ClassVar[str] = "generator"
    uses_embedder: ClassVar[bool] = False
    shows_memory: ClassVar[bool] = False  # a memory stage without memory tables, for `memory_view`
    report_table: ClassVar[tuple[str, pa.Schema] | None] = None  # (name, schema) of its panel's rows
    prompts: ClassVar[dict[str, str]] = {}
    # The third-party package it runs unchanged, through the gateway (pipeline/llm/gateway.py), e.g.
    # "mem0ai"; None for ours. Its calls are the library's: plan estimates them from a calibration only.
    library: ClassVar[str | None] = None
    # The modules that library installs (checked before a run) and the pyproject extra that installs it.
    library_modules: ClassVar[tuple[str, ...]] = ()
    library_extra: ClassVar[str | None] = None
    # How `diagnose` checks a probe's evidence (MemoryEvidence); None: `judge` for a method with memory
    # tables, else `turns_in_context`.
    memory_evidence: ClassVar[MemoryEvidence | None] = None
    # Every answer's context holds its whole memory (a running summary): retrieved = written.
    whole_memory_in_context: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "Settings" not in cls.__dict__:
            model = settings_parameter(cls, Method, MethodSettings)
            if model is not None:
                cls.Settings = model

    def stages(self) -> tuple["Stage", ...]:
        """The stages this method brings (pipeline.engine.stage's `EpisodeStage` / `GlobalStage`), in
        pipeline order; `needs` names those it reads. A stage two methods bring, by the same name,
        runs once. None by default."""
        return ()

    async def build(self, ctx: MethodContext[S], episode: EpisodeInput) -> dict[str, Rows]:
        raise NotImplementedError(f"method {self.name} has no memory to build")

    async def answer(self, ctx: MethodContext[S], probe: ProbeInput, memory: dict[str, Rows]) -> Answer:
        raise NotImplementedError

    def build_stats(self, produced: dict[str, Rows]) -> dict[str, Any]:
        """Counts for the memory stage's manifest from one episode's built rows (summed over
        episodes; nested dicts, e.g. per episode, merge)."""
        return {}

    def models(self, settings: S) -> list["ModelNeed"]:
        """Models it loads itself with these settings, besides the embedder (`uses_embedder`), which
        its stages declare; none by default."""
        return []

    @property
    def has_memory_stage(self) -> bool:
        return bool(self.memory) or self.shows_memory

    def check_installed(self) -> None:
        """Raise ConfigError naming the extra to install when the library it runs is missing."""
        missing = [m for m in self.library_modules if importlib.util.find_spec(m) is None]
        if missing:
            raise ConfigError(f"method {self.name} needs the {self.library} package ({', '.join(missing)} not "
                              f"installed): pip install -e '.[{self.library_extra}]'")

    @property
    def evidence_check(self) -> MemoryEvidence:
        """How `diagnose` checks this method's memory (`memory_evidence`, else by its tables)."""
        return self.memory_evidence or ("judge" if self.memory else "turns_in_context")

    def memory_items(self, memory: dict[str, Rows], settings: S) -> list[MemoryItem]:
        """Its memory visible at a probe (each table's `visible_memory`) as the entries `diagnose`'s
        judge reads, in memory order. By default the rows of its first table with a text column
        (`ITEM_TEXT_COLUMNS`), each under its id column (`ITEM_ID_COLUMNS`, else table:row); rows of a
        log with an `op` column are added and removed in order. Methods whose memory is spread over
        tables, or whose answers always see part of it, say so themselves."""
        for table, schema in self.memory.items():
            text = next((c for c in ITEM_TEXT_COLUMNS if c in schema.names), None)
            if text is None:
                continue
            key = next((c for c in ITEM_ID_COLUMNS if c in schema.names), None)
            kept: dict[str, MemoryItem] = {}
            for i, row in enumerate(memory.get(table) or []):
                item_id = str(row[key]) if key else f"{table}:{i}"
                if row.get("op") == "remove":
                    kept.pop(item_id, None)
                elif row.get(text):
                    kept[item_id] = MemoryItem(item_id, str(row[text]))
            return list(kept.values())
        return []

    def memory_view(self, episode: EpisodeInput, memory: dict[str, Rows], settings: S) -> str | None:
        """The method's memory of the whole episode as text (for the memory-quality judge), given its
        memory rows visible after the last session; None for a method that keeps no memory."""
        return None

    def report_panel(self, memory: dict[str, Rows], responses: Rows) -> ReportPanel | None:
        """Its section of the report from the memory tables of every episode and its responses;
        None: the report has nothing of this method's own."""
        return None


def point(session: int, turn: int | None) -> tuple[int, float]:
    """A place in the conversation, ordered: turn `turn` of `session`, or its end when `turn` is None."""
    return (session, float("inf") if turn is None else turn)


def visible_memory(rows: Rows, probe_session: int, probe_turn: int | None, kind: str) -> Rows:
    """The memory rows a probe may see: built from turns strictly before the probe's turn.

    A row keyed (S, T) was built from everything up to turn T of session S (the whole session when T
    is null). A probe at turn t of session s sees turns before t of session s, so keys with S < s, or
    S == s and T < t, are visible. `snapshots`: the rows of the latest visible key; `log`: the rows
    of every visible key.
    """
    limit = point(probe_session, None if probe_turn is None else probe_turn - 1)
    visible = [r for r in rows if point(r["snapshot_session"], r["snapshot_turn"]) <= limit]
    if kind == "log" or not visible:
        return visible
    latest = max(point(r["snapshot_session"], r["snapshot_turn"]) for r in visible)
    return [r for r in visible if point(r["snapshot_session"], r["snapshot_turn"]) == latest]
