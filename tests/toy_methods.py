"""Method plug-ins for framework tests: memories that record exactly what they were built from.

`TurnLog` keeps one full snapshot after every turn (memory evolving inside a session, as CREEM's
does); `SessionNotes` appends one note per session (an append-only log, as Theanine's graph grows).
Their answers list the memory they were shown, so a test can check that no probe ever sees the
future. They call the LLM once per answer, like a real method.
"""

from __future__ import annotations

import pyarrow as pa

from pipeline.stage import Rows
from stages.methods.base import SNAPSHOT_FIELDS, Answer, EpisodeInput, Method, MethodContext, MethodSettings, ProbeInput

TURN_LOG = pa.schema([*SNAPSHOT_FIELDS, pa.field("turn_ref", pa.string())])
NOTES = pa.schema([*SNAPSHOT_FIELDS, pa.field("note", pa.string())])


def ref(session: int, turn: int) -> str:
    return f"{session}:{turn}"


class TurnLogSettings(MethodSettings):
    prefix: str = "seen"


class TurnLog(Method[TurnLogSettings]):
    name = "turn_log"
    Settings = TurnLogSettings
    memory = {"log": TURN_LOG}

    async def build(self, ctx: MethodContext[TurnLogSettings], episode: EpisodeInput) -> dict[str, Rows]:
        rows: Rows = []
        seen: list[str] = []
        eid = episode.episode["episode_id"]
        for s, turns in episode.sessions.items():
            for t in turns:
                seen.append(ref(s, t["turn_idx"]))
                rows += [{"episode_id": eid, "snapshot_session": s, "snapshot_turn": t["turn_idx"], "turn_ref": r}
                         for r in seen]
        return {"log": rows}

    async def answer(self, ctx: MethodContext[TurnLogSettings], probe: ProbeInput, memory: dict[str, Rows]) -> Answer:
        refs = [r["turn_ref"] for r in memory["log"]]
        result = await ctx.llm.chat([{"role": "user", "content": f"{ctx.settings.prefix} {len(refs)}"}])
        return Answer(text=result.text, used_ids=refs, context_tokens=len(refs))


class SessionNotes(Method[MethodSettings]):
    name = "session_notes"
    memory = {"notes": NOTES}
    memory_kind = "log"

    async def build(self, ctx: MethodContext[MethodSettings], episode: EpisodeInput) -> dict[str, Rows]:
        result = await ctx.llm.chat([{"role": "user", "content": "note"}])
        eid = episode.episode["episode_id"]
        return {"notes": [{"episode_id": eid, "snapshot_session": s, "snapshot_turn": None,
                           "note": f"session {s}: {result.text}"} for s in episode.sessions]}

    async def answer(self, ctx: MethodContext[MethodSettings], probe: ProbeInput, memory: dict[str, Rows]) -> Answer:
        result = await ctx.llm.chat([{"role": "user", "content": "answer"}])
        return Answer(text=result.text, used_ids=[n["note"].split(":")[0] for n in memory["notes"]])


TOY_METHODS = {m.name: m for m in [TurnLog(), SessionNotes()]}
