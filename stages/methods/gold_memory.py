"""Gold memory (RSum Table 1): the memory a corpus annotates, in the response frame of the memory
baselines. Session notes (LoCoMo's `session_summary` and `observation`) count from the sessions
before the probe's; episode personas (MSC's, the sample's) are the corpus's own summary of the
speakers as of its last session, so a probe in an earlier session may see persona facts stated
later: the details record which sources were used. A corpus without either gives an empty memory.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from pipeline.llm.types import ChatLLM
from stages.methods import memory_response
from stages.methods.base import Answer, EpisodeInput, Method, MethodSettings, ProbeInput


class GoldMemorySettings(MethodSettings):
    kinds: list[str] = Field(default_factory=lambda: ["persona", "summary", "observation"])  # sources used


def gold_memory(episode: dict[str, Any], before_session: int, kinds: list[str]) -> tuple[str, list[str], list[str]]:
    """(memory text, ids of the notes used, sources used) from the corpus's annotations."""
    lines, ids, sources = [], [], []
    if "persona" in kinds:
        for speaker, persona in zip(episode.get("speakers") or [], episode.get("personas") or []):
            for i, fact in enumerate(persona or []):
                lines.append(f"{speaker}: {fact}")
                ids.append(f"persona:{speaker}:{i}")
        if ids:
            sources.append("persona")
    for i, note in enumerate(episode.get("notes") or []):
        if note["kind"] in kinds and note["session_idx"] < before_session:
            who = f"{note['speaker']}: " if note.get("speaker") else ""
            lines.append(f"[session {note['session_idx']} {note['kind']}] {who}{note['text']}")
            ids.append(f"{note['kind']}:{note['session_idx']}:{i}")
            if note["kind"] not in sources:
                sources.append(note["kind"])
    return "\n".join(lines), ids, sources


class GoldMemory(Method):
    name = "gold_memory"
    Settings = GoldMemorySettings
    shows_memory = True  # the gold summaries, rated like a built memory

    async def answer(self, llm: ChatLLM, probe: ProbeInput, memory: dict[str, Any], settings: Any) -> Answer:
        text, ids, sources = gold_memory(probe.episode, probe.probe["session_idx"], settings.kinds)
        return await memory_response.answer_from_memory(llm, probe, text, ids, details={"gold_sources": sources})

    def memory_view(self, episode: EpisodeInput, memory: dict[str, Any], settings: Any) -> str | None:
        return gold_memory(episode.episode, max(episode.sessions, default=0) + 1,
                           settings.kinds)[0] or None
