"""Every memory method, by name: the values `methods` selects and `method.<name>.*` configures.

Built-in methods are listed here. A method from another package registers itself under the
`mempipe.methods` entry point group (docs/adding-a-method.md), e.g. in its pyproject.toml:

    [project.entry-points."mempipe.methods"]
    my_method = "my_package.my_method:MyMethod"

The entry point names a `Method` subclass (or instance); its `name` is what `methods:` selects.
"""

from __future__ import annotations

import logging
from importlib.metadata import EntryPoint, entry_points

from stages.methods.base import Method
from stages.methods.baselines.chatgpt import LDAgentBase
from stages.methods.baselines.comedy import Comedy
from stages.methods.baselines.gold_memory import GoldMemory
from stages.methods.baselines.golden import Golden
from stages.methods.baselines.history import AllContext, FullHistory, PartContext, ZeroHistory
from stages.methods.baselines.mem0_style import Mem0Style
from stages.methods.baselines.memochat import MemoChat
from stages.methods.baselines.memory_baselines import (AllMemories, AllMemoriesUpdate, MemoryRetrieval,
                                                       MemoryRetrievalUpdate)
from stages.methods.creem import Creem, CreemNoPreblend, CreemNoRefine
from stages.methods.ld_agent import LDAgent
from stages.methods.langmem_library import LangMemLibrary
from stages.methods.a_mem_library import AMemLibrary
from stages.methods.graphiti_library import GraphitiLibrary
from stages.methods.mem0_library import Mem0Library
from stages.methods.rsum import RSum
from stages.methods.secom.retrieval import SeCom, SessionLevel, TurnLevel
from stages.methods.theanine import Theanine, TheanineAll, TheanineNoRefine, TheanineNoRelation

ENTRY_POINT_GROUP = "mempipe.methods"
log = logging.getLogger(__name__)

_BUILT_IN: list[Method] = [
    SeCom(), TurnLevel(), SessionLevel(), FullHistory(), ZeroHistory(),
    Theanine(), TheanineAll(), TheanineNoRelation(), TheanineNoRefine(),
    RSum(), AllMemories(), MemoryRetrieval(), AllMemoriesUpdate(), MemoryRetrievalUpdate(), GoldMemory(),
    AllContext(), PartContext(), LDAgent(), LDAgentBase(), Creem(), CreemNoRefine(), CreemNoPreblend(), Golden(),
    MemoChat(), Comedy(),
    Mem0Style(), Mem0Library(),
    GraphitiLibrary(),
    AMemLibrary(),
    LangMemLibrary(),
]
BUILT_IN: dict[str, Method] = {m.name: m for m in _BUILT_IN}


def _loaded(ep: EntryPoint) -> Method:
    obj = ep.load()
    method = obj() if isinstance(obj, type) else obj
    if not isinstance(method, Method):
        raise TypeError(f"{ep.value} is not a mempipe Method (a subclass of stages.methods.base.Method)")
    return method


def installed_methods(known: dict[str, Method]) -> tuple[dict[str, Method], dict[str, str]]:
    """Methods other packages register under `mempipe.methods`, and, per entry point that could not
    be used, why (it failed to import, is not a Method, or takes a name already taken): a broken
    plug-in is reported when a config selects it, and never stops runs that do not."""
    found: dict[str, Method] = {}
    broken: dict[str, str] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        where = f"entry point {ep.name!r} = {ep.value!r} ({ENTRY_POINT_GROUP}, {ep.dist.name if ep.dist else '?'})"
        try:
            method = _loaded(ep)
        except Exception as e:  # any import-time error of someone else's package
            broken[ep.name] = f"{where}: {type(e).__name__}: {e}"
            log.warning("method plug-in not loaded: %s", broken[ep.name])
            continue
        if method.name in known or method.name in found:
            broken[method.name] = f"{where}: the name {method.name!r} is taken by another method"
            continue
        found[method.name] = method
    return found, broken


PLUGINS, BROKEN_PLUGINS = installed_methods(BUILT_IN)
METHODS: dict[str, Method] = {**BUILT_IN, **PLUGINS}
