"""Method plug-ins for framework tests: memories that record exactly what they were built from.

`TurnLog` keeps one full snapshot after every turn (memory evolving inside a session, as CREEM's
does); `SessionNotes` appends one note per session (an append-only log, as Theanine's graph grows).
Their answers list the memory they were shown, so a test can check that no probe ever sees the
future. They call the LLM once per answer, like a real method.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from pipeline.stage import Rows
from stages.methods.base import SNAPSHOT_FIELDS, Answer, BuildContext, EpisodeInput, Method, MethodSettings, ProbeInput

TURN_LOG = pa.schema([*SNAPSHOT_FIELDS, pa.field("turn_ref", pa.string())])
NOTES = pa.schema([*SNAPSHOT_FIELDS, pa.field("note", pa.string())])


def ref(session: int, turn: int) -> str:
    return f"{session}:{turn}"


class TurnLogSettings(MethodSettings):
    prefix: str = "seen"


class TurnLog(Method):
    name = "turn_log"
    Settings = TurnLogSettings
    memory = {"log": TURN_LOG}

    async def build(self, ctx: BuildContext, episode: EpisodeInput) -> dict[str, Rows]:
        rows: Rows = []
        seen: list[str] = []
        eid = episode.episode["episode_id"]
        for s, turns in episode.sessions.items():
            for t in turns:
                seen.append(ref(s, t["turn_idx"]))
                rows += [{"episode_id": eid, "snapshot_session": s, "snapshot_turn": t["turn_idx"], "turn_ref": r}
                         for r in seen]
        return {"log": rows}

    async def answer(self, llm: Any, probe: ProbeInput, memory: dict[str, Rows], settings: Any) -> Answer:
        refs = [r["turn_ref"] for r in memory["log"]]
        result = await llm.chat([{"role": "user", "content": f"{settings.prefix} {len(refs)}"}])
        return Answer(text=result.text, used_ids=refs, context_tokens=len(refs))


class SessionNotes(Method):
    name = "session_notes"
    memory = {"notes": NOTES}
    memory_kind = "log"

    async def build(self, ctx: BuildContext, episode: EpisodeInput) -> dict[str, Rows]:
        result = await ctx.llm.chat([{"role": "user", "content": "note"}])
        eid = episode.episode["episode_id"]
        return {"notes": [{"episode_id": eid, "snapshot_session": s, "snapshot_turn": None,
                           "note": f"session {s}: {result.text}"} for s in episode.sessions]}

    async def answer(self, llm: Any, probe: ProbeInput, memory: dict[str, Rows], settings: Any) -> Answer:
        result = await llm.chat([{"role": "user", "content": "answer"}])
        return Answer(text=result.text, used_ids=[n["note"].split(":")[0] for n in memory["notes"]])


TOY_METHODS = {m.name: m for m in [TurnLog(), SessionNotes()]}
