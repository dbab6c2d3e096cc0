"""Every memory method, by name: the values `methods` selects and `method.<name>.*` configures.

Add a method by writing its module (see `base.py` and docs/adding-a-method.md) and listing it here.
"""

from __future__ import annotations

from stages.methods.base import Method
from stages.methods.comedy import Comedy
from stages.methods.creem import Creem, CreemNoPreblend, CreemNoRefine
from stages.methods.gold_memory import GoldMemory
from stages.methods.golden import Golden
from stages.methods.history import AllContext, FullHistory, PartContext, ZeroHistory
from stages.methods.ld_agent import LDAgent
from stages.methods.ld_agent_base import LDAgentBase
from stages.methods.memochat import MemoChat
from stages.methods.mem0_style import Mem0Style
from stages.methods.memory_baselines import AllMemories, AllMemoriesUpdate, MemoryRetrieval, MemoryRetrievalUpdate
from stages.methods.rsum import RSum
from stages.methods.secom.retrieval import SeCom, SessionLevel, TurnLevel
from stages.methods.theanine import Theanine, TheanineAll, TheanineNoRefine, TheanineNoRelation

METHODS: dict[str, Method] = {m.name: m for m in [
    SeCom(), TurnLevel(), SessionLevel(), FullHistory(), ZeroHistory(),
    Theanine(), TheanineAll(), TheanineNoRelation(), TheanineNoRefine(),
    RSum(), AllMemories(), MemoryRetrieval(), AllMemoriesUpdate(), MemoryRetrievalUpdate(), GoldMemory(),
    AllContext(), PartContext(), LDAgent(), LDAgentBase(), Creem(), CreemNoRefine(), CreemNoPreblend(), Golden(),
    MemoChat(), Comedy(),
    Mem0Style(),
]}
