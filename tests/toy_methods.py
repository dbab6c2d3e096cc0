"""Method plug-ins for framework tests: memories that record exactly what they were built from.

`TurnLog` keeps one full snapshot after every turn (memory evolving inside a session, as CREEM's
does); `SessionNotes` appends one note per session (an append-only log, as Theanine's graph grows).
Their answers list the memory they were shown, so a test can check that no probe ever sees the
future. They call the LLM once per answer, like a real method.
"""

from __future__ import annotations

import pyarrow as pa
from pydantic import Field

from pipeline.config import Section
from pipeline.engine.stage import EpisodeStage, Rows, Stage, StageContext
from stages.methods.base import SNAPSHOT_FIELDS, Answer, EpisodeInput, Method, MethodContext, MethodSettings, ProbeInput

TURN_LOG = pa.schema([*SNAPSHOT_FIELDS, pa.field("turn_ref", pa.string())])
NOTES = pa.schema([*SNAPSHOT_FIELDS, pa.field("note", pa.string())])


def ref(session: int, turn: int) -> str:
    return f"{session}:{turn}"


class TurnLogSettings(MethodSettings):
    prefix: str = "seen"


class TurnLog(Method[TurnLogSettings]):
    name = "turn_log"
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


# A method that brings a stage of its own (as an outside package would): `keyword_index` indexes each
# episode's words once; the method reads it (`needs`) and answers with the words of the request it finds.
KEYWORDS = pa.schema([pa.field("episode_id", pa.string(), nullable=False), pa.field("word", pa.string()),
                      pa.field("session_idx", pa.int32())])


class KeywordIndexSettings(Section):
    min_length: int = Field(default=4, ge=1)  # shorter words are not indexed


class KeywordIndexStage(EpisodeStage[KeywordIndexSettings]):
    name = section = "keyword_index"
    inputs = ("ingest",)
    outputs = {"keywords": KEYWORDS}

    async def process_episode(self, ctx: StageContext[KeywordIndexSettings], episode_id: str,
                              inputs: dict[str, Rows]) -> dict[str, Rows]:
        words = {(w.lower().strip(".,!?"), t["session_idx"]) for t in inputs["ingest.turns"] for w in t["text"].split()}
        return {"keywords": [{"episode_id": episode_id, "word": w, "session_idx": s} for w, s in sorted(words)
                             if len(w) >= ctx.settings.min_length]}


class KeywordRecall(Method[MethodSettings]):
    name = "keyword_recall"
    needs = ("keyword_index",)

    def stages(self) -> tuple[Stage, ...]:
        return (KeywordIndexStage(),)

    async def answer(self, ctx: MethodContext[MethodSettings], probe: ProbeInput, memory: dict[str, Rows]) -> Answer:
        known = {r["word"] for r in probe.upstream["keyword_index.keywords"] if r["session_idx"] < probe.probe["session_idx"]}
        found = sorted(w for w in (x.lower().strip(".,!?") for x in probe.request.split()) if w in known)
        return Answer(text=" ".join(found) or "(none)", used_ids=found)
