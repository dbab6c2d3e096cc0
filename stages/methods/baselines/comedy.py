"""COMEDY (Chen et al. 2024, "Compress to Impress: Unleashing the Potential of Compressive Memory in
Real-World Long-Term Conversations"; a baseline of Theanine's Table 1, seed 000 Sec. 3.2): one model
does all three tasks, and there is no retrieval.

1. Session-level memory (`summary_messages`): after each session, a list of memories, one per line,
   each with the person it is about as its subject, leaving out nothing worth remembering: the
   events, what each speaker showed of themselves, how they get along.
2. Compressive memory (`compress_messages`): every session summary so far compressed into three
   parts: a profile of each speaker (basic information, personality traits, behaviour patterns,
   likes and preferences, emotional, work and health states, each with a concrete example from the
   memories where they give one), the relationship between the two, and the events, as short
   sentences, under `memory_words` words in all (COMEDY's task 2 asks for under 200 Chinese
   characters; 150 English words is our equivalent). Rebuilt from all the summaries after each
   session, not from the previous compressed memory. COMEDY profiles the user only; Theanine's
   dialogues are between two equal speakers, so ours profiles both (an adaptation).
3. Response (`reply_messages`): the latest compressed memory plus the current session -> the next
   utterance.

"One model": `build_role` is the generator role, so the memory tasks run on the model that
responds (COMEDY trains one model for all three: a 7B / 13B model fine-tuned with SFT and DPO, sampled
at temperature 0.5, top-k 30, top-p 0.85). Ours prompts the run's general LLM instead, as Theanine ran
COMEDY through an API model with its original prompts; ours carry each element in our own words.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import pyarrow as pa
from pydantic import BaseModel, Field

from pipeline.failures import FAILURE_FIELDS, attempt
from pipeline.llm.types import Messages
from pipeline.retrieval import count_tokens
from stages.methods.shared import response
from stages.methods.base import (SNAPSHOT_FIELDS, Answer, EpisodeInput, MemoryItem, Method, MethodContext, MethodSettings,
                                 ProbeInput, after_session)
from stages.dialogue import format_unit
from stages.methods.shared.memory_response import ResponseStyle, closing_block
from stages.methods.shared.session_memories import session_time, when

# Both tables are logs keyed by the end of the session they were written after: a probe sees the
# summaries and compressed memories of the sessions before its own.
SUMMARIES = pa.schema([
    *SNAPSHOT_FIELDS,
    pa.field("session_idx", pa.int32(), nullable=False),
    pa.field("summary", pa.string()),  # null when the call failed (the session is left out)
    pa.field("tokens", pa.int32()),
    *FAILURE_FIELDS,
])
COMPRESSED = pa.schema([
    *SNAPSHOT_FIELDS,
    pa.field("sessions", pa.list_(pa.int32())),  # the sessions whose summaries it compresses
    pa.field("profiles", pa.list_(pa.struct([pa.field("speaker", pa.string()), pa.field("profile", pa.string())]))),
    pa.field("relationship", pa.string()),
    pa.field("events", pa.list_(pa.string())),
    pa.field("memory", pa.string()),  # the three parts as the response sees them; null when the call failed
    pa.field("tokens", pa.int32()),
    *FAILURE_FIELDS,
])


class ComedySettings(MethodSettings):
    summary_words: int | None = Field(default=None, ge=10)  # a length cap on session memories; COMEDY's task 1 states none
    # a length cap on the compressed memory: COMEDY's task 2 asks for under 200 (Chinese) characters
    memory_words: int | None = Field(default=150, ge=20)
    max_events: int | None = Field(default=None, ge=1)  # a cap on the compressed events; None: none asked
    temperature: float | None = Field(default=None, ge=0)  # None = the role's llm.temperature
    response_style: ResponseStyle = "short"  # short: the memory baselines' "a short, natural reply"


# ------------------------------------------------------------------------------- prompts

def summary_messages(turns: list[dict], session_idx: int, words: int | None) -> Messages:
    """Task 1, session-level memory: one session -> what to remember of it (plain text)."""
    limit = f" Use at most {words} words." if words else ""
    system = ("You keep the memory of a long relationship between two people who talk from time to time. Read "
              "one of their conversation sessions and list everything worth remembering from it, leaving none "
              "of it out: what happened or is planned, what each person revealed about themselves (character, "
              "habits, likes, moods, circumstances), and how the two of them get along. Write each memory as "
              "one short sentence whose subject is the person it is about, named. If nothing in the session "
              "is worth remembering, write only: nothing." + limit)
    user = (f"Session ({when(session_idx, session_time(turns))}):\n{format_unit(turns)}\n\n"
            "What to remember, one memory per line, each starting with the name of the person it is about:")
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


@lru_cache(maxsize=64)
def compress_model(speakers: tuple[str, ...]) -> type[BaseModel]:
    """The compressed memory: one profile per speaker, in the order given, the relationship, the events."""
    n = len(speakers)

    class Compressed(BaseModel):
        profiles: list[str] = Field(min_length=n, max_length=n,
                                    description=f"one profile per speaker, in this order: {', '.join(speakers)}")
        relationship: str
        events: list[str]

    return Compressed


def compress_messages(summaries: list[dict], speakers: tuple[str, ...], max_events: int | None,
                      memory_words: int | None = None) -> Messages:
    """Task 2, compression: every session summary so far -> profiles, relationship, events."""
    cap = f" Keep at most {max_events} events, the ones that matter most later." if max_events else ""
    length = f" Keep the whole memory, all three parts together, under {memory_words} words." if memory_words else ""
    system = ("You compress the memories of many conversation sessions between two people into one short "
              "memory with three parts. Profiles: for each person, what they are like: basic information "
              "(such as age, job, family, where they live), personality traits, behaviour patterns and habits, "
              "likes and preferences, and their current states (emotional, work, health), each backed by a "
              "concrete example from the memories where there is one, and how these changed. Relationship: how "
              "the two relate to each other and how that has developed. Events: what happened to them and what "
              "they plan, each as one short sentence, with its session when known. Merge what repeats, keep the "
              "newest where things changed, and drop what does not matter." + cap + length)
    shown = "\n\n".join(f"[{when(s['session_idx'])}] {s['summary']}" for s in summaries)
    user = (f"Session memories, oldest first:\n{shown}\n\nThe people, in order: {', '.join(speakers)}.\n\n"
            'Reply in JSON: {"profiles": ["<profile of ' + '>", "<profile of '.join(speakers) + '>"], '
            '"relationship": "...", "events": ["...", "..."]}.')
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def memory_text(row: dict) -> str:
    """A compressed memory row as the response reads it."""
    profiles = "\n".join(f"- {p['speaker']}: {p['profile']}" for p in row["profiles"])
    events = "\n".join(f"- {e}" for e in row["events"]) or "- (none)"
    return f"Profiles:\n{profiles}\nRelationship: {row['relationship']}\nEvents:\n{events}"


def reply_messages(memory: str, current: list[dict], request: str, respondent: str, question: bool,
                   style: ResponseStyle) -> Messages:
    """Task 3, response: the compressed memory and the current session -> the next utterance."""
    system = (f"You are {respondent}, talking again with someone you know from earlier conversations. What you "
              "remember of them is compressed into profiles of you both, your relationship and past events. "
              "Let it shape your reply: bring up past events where they fit, match what you know of the other "
              "person, and speak in the tone of your relationship; never contradict it.")
    user = (f"Memory:\n{memory or '(empty: this is your first conversation)'}\n\n"
            + closing_block(current, request, respondent, question, style))
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


# ------------------------------------------------------------------------------- the method

def speakers_of(episode: EpisodeInput) -> tuple[str, ...]:
    """The episode's speakers, else the turns' speakers in order of first appearance."""
    named = episode.episode.get("speakers") or []
    if named:
        return tuple(named)
    return tuple(dict.fromkeys(t["speaker"] for turns in episode.sessions.values() for t in turns))


def kept(summary: str) -> bool:
    """A summary that says something (the prompt's "nothing" leaves the session out)."""
    return bool(summary) and summary.strip().strip(".").lower() != "nothing"


def latest_memory(memory: dict[str, list[dict]]) -> dict | None:
    """The newest compressed memory that succeeded (a failed one leaves the previous in force)."""
    ok = [r for r in memory.get("compressed", []) if r["memory"] is not None]
    return max(ok, key=lambda r: r["snapshot_session"], default=None)


class Comedy(Method[ComedySettings]):
    name = "comedy"
    memory = {"summaries": SUMMARIES, "compressed": COMPRESSED}
    memory_kind = "log"
    whole_memory_in_context = True  # every response reads the latest compressed memory whole
    build_role = "generator"  # one model for every task (COMEDY Sec. 3)

    def params(self, settings: ComedySettings) -> dict[str, Any]:
        return {} if settings.temperature is None else {"temperature": settings.temperature}

    async def build(self, ctx: MethodContext[ComedySettings], episode: EpisodeInput) -> dict[str, list[dict]]:
        eid = episode.episode["episode_id"]
        settings: ComedySettings = ctx.settings
        speakers = speakers_of(episode)
        schema = compress_model(speakers)
        summaries: list[dict] = []
        compressed: list[dict] = []
        for s, turns in episode.sessions.items():
            key = after_session(eid, s)
            result, failed = await attempt(ctx.llm.chat(summary_messages(turns, s, settings.summary_words),
                                                        **self.params(settings)))
            text = result.text.strip() if result is not None else None
            summaries.append({**key, "session_idx": s, "summary": text,
                              "tokens": count_tokens(text) if text else None, **failed})
            if text is None or not kept(text):  # nothing new to compress: the previous memory stays
                continue
            usable = [r for r in summaries if r["summary"] is not None and kept(r["summary"])]
            out, failed = await attempt(ctx.llm.chat(compress_messages(usable, speakers, settings.max_events,
                                                                       settings.memory_words),
                                                     schema=schema, **self.params(settings)))
            row: dict[str, Any] = {**key, "sessions": [r["session_idx"] for r in usable], "profiles": None,
                                   "relationship": None, "events": None, "memory": None, "tokens": None, **failed}
            if out is not None:
                parsed = out.parsed
                row.update(profiles=[{"speaker": sp, "profile": p.strip()} for sp, p in zip(speakers, parsed.profiles)],
                           relationship=parsed.relationship.strip(),
                           events=[e.strip() for e in parsed.events if e.strip()][:settings.max_events])
                row["memory"] = memory_text(row)
                row["tokens"] = count_tokens(row["memory"])
            compressed.append(row)
        return {"summaries": summaries, "compressed": compressed}

    async def answer(self, ctx: MethodContext[ComedySettings], probe: ProbeInput, memory: dict[str, list[dict]]) -> Answer:
        llm, settings = ctx.llm, ctx.settings
        latest = latest_memory(memory)
        text = latest["memory"] if latest else ""
        question = probe.probe["kind"] == "qa"
        out = await llm.chat(reply_messages(text, probe.current, probe.request, probe.probe["respondent"], question,
                                            settings.response_style), **self.params(settings))
        return Answer(text=response.one_turn(out.text, probe.episode.get("speakers") or []),
                      used_ids=[f"compressed:{latest['snapshot_session']}"] if latest else [],
                      context_tokens=count_tokens(text) if text else 0, model=out.model,
                      details={"memory_after_session": latest["snapshot_session"] if latest else None,
                               "sessions": list(latest["sessions"]) if latest else []})

    def memory_view(self, episode: EpisodeInput, memory: dict[str, list[dict]], settings: ComedySettings) -> str | None:
        latest = latest_memory(memory)
        return latest["memory"] if latest else None

    def memory_items(self, memory: dict[str, list[dict]], settings: ComedySettings) -> list[MemoryItem]:
        """The compressed memory the answer reads (its session summaries are only its input)."""
        latest = latest_memory(memory)
        return [MemoryItem(f"compressed:{latest['snapshot_session']}", latest["memory"])] if latest else []

    def build_stats(self, produced: dict[str, list[dict]]) -> dict[str, Any]:
        summaries, compressed = produced.get("summaries", []), produced.get("compressed", [])
        if not summaries:
            return {}
        return {"summary_calls": len(summaries), "failed_summaries": sum(r["error"] is not None for r in summaries),
                "compress_calls": len(compressed), "failed_compressions": sum(r["error"] is not None for r in compressed),
                "memory_calls_per_episode": {summaries[0]["episode_id"]: len(summaries) + len(compressed)}}
