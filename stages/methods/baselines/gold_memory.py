"""Gold memory (RSum Table 1): the memory a corpus annotates, in the response frame of the memory
baselines. A probe in session s sees only the notes of sessions before s: LoCoMo's `session_summary`
and `observation`, and MSC's per-session persona summaries (`previous_dialogs[k].personas`, loaded
as "persona" notes of session k+1). Only an episode without per-session persona notes falls back to
its episode personas (MSC's top-level `personas`, the sample's): those summarise the speakers as of
the corpus's last session, so an earlier probe may see facts stated later. The details record which
sources were used ("persona" = per-session notes, "episode_persona" = the fallback). A corpus without
any of these gives an empty memory.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from stages.methods.shared import memory_response
from stages.methods.base import Answer, EpisodeInput, Method, MethodContext, MethodSettings, ProbeInput


class GoldMemorySettings(MethodSettings):
    kinds: list[str] = Field(default_factory=lambda: ["persona", "summary", "observation"])  # sources used
    # the response frame's length wording; set it as RSum's, so the two differ only in their memory
    response_style: memory_response.ResponseStyle = "short"


def persona_source(episode: dict[str, Any], kinds: list[str]) -> str | None:
    """Where the episode's gold personas come from: "sessions" (per-session persona notes),
    "episode" (the fallback: episode personas), or None (none, or personas not asked for)."""
    if "persona" not in kinds:
        return None
    if any(n["kind"] == "persona" for n in episode.get("notes") or []):
        return "sessions"
    return "episode" if any(episode.get("personas") or []) else None


def gold_memory(episode: dict[str, Any], before_session: int, kinds: list[str]) -> tuple[str, list[str], list[str]]:
    """(memory text, ids of the notes used, sources used) from the corpus's annotations of the
    sessions before `before_session`."""
    notes = episode.get("notes") or []
    lines, ids, sources = [], [], []
    if persona_source(episode, kinds) == "episode":
        for speaker, persona in zip(episode.get("speakers") or [], episode.get("personas") or []):
            for i, fact in enumerate(persona or []):
                lines.append(f"{speaker}: {fact}")
                ids.append(f"persona:{speaker}:{i}")
        if ids:
            sources.append("episode_persona")
    shown: set[tuple[str | None, str]] = set()
    for i, note in enumerate(notes):
        if note["kind"] not in kinds or note["session_idx"] >= before_session:
            continue
        if note["kind"] == "persona":
            # A persona line repeated by a later session's summary (the lists may accumulate) is shown once.
            if (note.get("speaker"), note["text"]) in shown:
                continue
            shown.add((note.get("speaker"), note["text"]))
        who = f"{note['speaker']}: " if note.get("speaker") else ""
        lines.append(f"[session {note['session_idx']} {note['kind']}] {who}{note['text']}")
        ids.append(f"{note['kind']}:{note['session_idx']}:{i}")
        if note["kind"] not in sources:
            sources.append(note["kind"])
    return "\n".join(lines), ids, sources


class GoldMemory(Method[GoldMemorySettings]):
    name = "gold_memory"
    shows_memory = True  # the gold summaries, rated like a built memory

    async def answer(self, ctx: MethodContext[GoldMemorySettings], probe: ProbeInput, memory: dict[str, Any]) -> Answer:
        llm, settings = ctx.llm, ctx.settings
        text, ids, sources = gold_memory(probe.episode, probe.probe["session_idx"], settings.kinds)
        return await memory_response.answer_from_memory(
            llm, probe, text, ids,
            details={"gold_sources": sources, "personas_from": persona_source(probe.episode, settings.kinds)},
            style=settings.response_style)

    def memory_view(self, episode: EpisodeInput, memory: dict[str, Any], settings: GoldMemorySettings) -> str | None:
        return gold_memory(episode.episode, max(episode.sessions, default=0) + 1,
                           settings.kinds)[0] or None
