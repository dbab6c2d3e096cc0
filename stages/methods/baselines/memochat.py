"""MemoChat (Lu et al. 2023, "MemoChat: Tuning LLMs to Use Memos for Consistent Long-Range
Open-Domain Conversation"; a baseline of Theanine's Table 1, seed 000 Sec. 3.2): the model keeps
structured memos and runs three steps, memorization -> retrieval -> response.

1. Memorization (`write_messages`): the dialogue not yet memorized, with numbered lines, is split
   into the topics it moved through; each topic gives a short topic name, a summary and the line
   where it begins, so its span runs up to the next topic's start (`topic_spans`). A topic becomes a
   memo once the dialogue has shifted away from it: inside a session (`write_every` turns) the last
   topic may still be going on and stays pending; at the end of a session every topic is closed.
   Each memo keeps its topic, summary and dialogue span (session, turns, and their text).
2. Retrieval (`retrieve_messages`): the model sees the memos by number (topic and summary) and the
   dialogue so far, and chooses the memos the next response needs, or none.
3. Response (`reply_messages`): the chosen memos (topic, summary, and their dialogue when
   `show_dialogue`) plus the current session -> the next utterance.

Theanine ran MemoChat with its original prompts; ours carry the same instructions in our own words,
with JSON answers (the original asks for JSON memos and "#"-joined option numbers).

Ours by default (`preset: project`): memorize at session ends (`write_every` adds in-session writes
that keep the last topic pending, an addition of ours), retrieval reads the request with the 4 turns
before it and chooses at most 3 memos, the role's temperature, and a failed write keeps its turns
pending. `preset: original` sets every setting left unset to MemoChat's own loop
(get_model_infer_memochat.py): a write once 10 lines are buffered (the 2 kept from the last write, so
8 new ones: `write_every: 8`) or they hold more than 1,024 words (`write_words`), every topic closed at
each write (`close_topics`), a write that yields no memo filed as a NOTO memo naming two of its lines
drawn at random, shown among the options but never used (`noto_fallback`), the user input alone as
the retrieval query (`query_turns: 0`), any number of memos chosen (`max_retrieved: null`), and
temperature 0.2. The 2 kept lines are the original's recent dialogue for the response; ours shows the
whole current session.
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, Field, create_model, model_validator

from pipeline.failures import FAILURE_FIELDS, NO_FAILURE, attempt
from pipeline.llm.types import ChatLLM, Messages
from pipeline.retrieval import count_tokens
from stages.methods.shared import response
from stages.methods.base import (SNAPSHOT_FIELDS, Answer, EpisodeInput, Method, MethodContext, MethodSettings,
                                 ProbeInput, after_session)
from stages.dialogue import format_unit, last_turns
from stages.methods.shared.memory_response import ResponseStyle, closing_block
from stages.methods.shared.session_memories import session_time, when

# A log: each memo is keyed by the point whose memorization wrote it (a turn inside a session, or
# the session's end), so a probe sees only memos written from turns before it.
MEMOS = pa.schema([
    *SNAPSHOT_FIELDS,
    pa.field("memo_id", pa.string(), nullable=False),  # "<session>:<first turn>"
    pa.field("topic", pa.string(), nullable=False),
    pa.field("summary", pa.string(), nullable=False),
    pa.field("session_idx", pa.int32(), nullable=False),  # the dialogue span it covers
    pa.field("turn_start", pa.int32(), nullable=False),
    pa.field("turn_end", pa.int32(), nullable=False),
    pa.field("dialogue", pa.string(), nullable=False),  # the span's turns, "Speaker: text" lines
    pa.field("source_turn_ids", pa.list_(pa.string())),
])
# One row per memorization call: the turns it read, what it wrote, what it left pending.
WRITES = pa.schema([
    *SNAPSHOT_FIELDS,
    pa.field("session_idx", pa.int32(), nullable=False),
    pa.field("turn_start", pa.int32(), nullable=False),  # the dialogue read
    pa.field("turn_end", pa.int32(), nullable=False),
    pa.field("topics", pa.int32()),  # topics found; null when the call failed
    pa.field("memos", pa.int32(), nullable=False),  # memos written (closed topics)
    pa.field("pending_from", pa.int32()),  # first turn left for the next memorization; null: none
    *FAILURE_FIELDS,
])


NOTO_TOPIC = "NOTO"  # MemoChat's "none of the others" topic: the fallback memos filed under it are never used
# What `preset: original` sets (every setting the config leaves unset): MemoChat's own loop.
ORIGINAL = {"write_every": 8, "write_words": 1024, "close_topics": True, "noto_fallback": True,
            "max_retrieved": None, "query_turns": 0, "temperature": 0.2}


class MemoChatSettings(MethodSettings):
    # project: our defaults; original: MemoChat's own loop for every setting left unset (`ORIGINAL`)
    preset: Literal["project", "original"] = "project"
    # Memorize every n new turns inside a session too (its finished topics); None: at session ends only.
    write_every: int | None = Field(default=None, ge=2)
    write_words: int | None = Field(default=None, ge=1)  # ... or once the pending lines hold more words than this
    close_topics: bool = False  # an in-session write closes every topic; false: the last one stays pending
    noto_fallback: bool = False  # a write that fails files its lines as a NOTO memo (never used); false: kept pending
    max_retrieved: int | None = Field(default=3, ge=1)  # memos one response may use; None: no cap
    query_turns: int = Field(default=4, ge=0)  # turns before the request that retrieval reads
    show_dialogue: bool = True  # the chosen memos' dialogue spans enter the response (topic-summary-dialogue)
    temperature: float | None = Field(default=None, ge=0)  # None = the role's llm.temperature
    response_style: ResponseStyle = "short"  # short: the memory baselines' "a short, natural reply"

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") == "original":
            return {**ORIGINAL, **data}
        return data


# ------------------------------------------------------------------------------- prompts

class Topic(BaseModel):
    topic: str = Field(description="a few words naming what was talked about")
    summary: str = Field(description="what was said about it, naming the speakers")
    start: int = Field(ge=1, description="the number of the line where this topic begins")


class Topics(BaseModel):
    topics: list[Topic] = Field(min_length=1)


def numbered(turns: list[dict]) -> str:
    return "\n".join(f"({i + 1}) {t['speaker']}: {t['text']}" for i, t in enumerate(turns))


def write_messages(turns: list[dict], session_idx: int, session_over: bool) -> Messages:
    """Memorization: numbered dialogue lines -> the topics they went through (`Topics`)."""
    system = ("You write memos for a long-running conversation between two people, so that either of them can "
              "look back at it later. You get a stretch of their dialogue with numbered lines. Split it into the "
              "topics it went through, in order: whenever the conversation moves on to something else, a new "
              "topic begins. For every topic give a short name, a summary of what was said about it (who said "
              "what, facts, plans and feelings of each speaker; name the speakers), and the number of the line "
              "where it begins.")
    state = ("The session ended with the last line." if session_over
             else "The conversation is still going on, so its last topic may not be finished.")
    user = (f"Dialogue ({when(session_idx, session_time(turns))}):\n{numbered(turns)}\n\n{state}\n\n"
            'Reply in JSON: {"topics": [{"topic": "...", "summary": "...", "start": <line number>}, ...]}.')
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def topic_spans(topics: list[Topic], n: int) -> list[tuple[Topic, int, int]]:
    """Each topic with its span of line indices [lo, hi] (0-based) among `n` lines: from its start
    to the line before the next topic's. Starts are clamped to the lines, sorted and deduplicated
    (the first topic of a start wins), and the first topic takes any lines before it, so the spans
    cover the dialogue without overlap whatever the model answered."""
    by_start: dict[int, Topic] = {}
    for t in sorted(topics, key=lambda t: t.start):
        by_start.setdefault(min(max(t.start, 1), n) - 1, t)
    starts = sorted(by_start)
    if not starts:
        return []
    first = by_start.pop(starts[0])
    by_start[0], starts[0] = first, 0
    return [(by_start[lo], lo, (starts[i + 1] - 1) if i + 1 < len(starts) else n - 1) for i, lo in enumerate(starts)]


@lru_cache(maxsize=256)
def choice_schema(options: int) -> type[BaseModel]:
    """The retrieval answer: memo numbers among 1..`options` (an endpoint that enforces the schema
    cannot name another); an empty list chooses none."""
    index: Any = Literal[tuple(range(1, options + 1))]
    return create_model("MemoChoice", chosen=(list[index], Field(default_factory=list)))


def check_choice(out: Any, options: int) -> None:
    """ValueError when a chosen number is not one of the memos shown (re-asked)."""
    bad = [c for c in out.chosen if not 1 <= c <= options]
    if bad:
        raise ValueError(f"choose among memos 1..{options}; got {bad}")


def memo_options(memos: list[dict]) -> str:
    return "\n".join(f"[{i + 1}] {m['topic']}: {m['summary']}" for i, m in enumerate(memos))


def retrieve_messages(memos: list[dict], dialogue: str, request: str, limit: int | None, question: bool) -> Messages:
    """Retrieval: the numbered memos (topic and summary) and the dialogue -> the chosen numbers."""
    system = ("You help someone in a conversation remember what matters from earlier talks. You get the memos of "
              "those talks, each numbered with its topic and summary, and the conversation now. Choose the memos "
              "that the reply to the latest message needs; if none of them is related, choose none.")
    latest = "Question" if question else "Latest message"
    user = (f"Memos:\n{memo_options(memos)}\n\nConversation now:\n{dialogue or '(just started)'}\n\n"
            f"{latest}: {request}\n\n{f'Choose at most {limit}' if limit else 'Choose any number of'} memo numbers, "
            "most useful first. "
            'Reply in JSON: {"chosen": [<memo numbers>]} (an empty list for none).')
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def memo_text(memo: dict, show_dialogue: bool) -> str:
    span = f"session {memo['session_idx']}, turns {memo['turn_start']}-{memo['turn_end']}"
    text = f"Topic: {memo['topic']} ({span})\nSummary: {memo['summary']}"
    return text + (f"\nDialogue:\n{memo['dialogue']}" if show_dialogue else "")


def reply_messages(memos: list[dict], current: list[dict], request: str, respondent: str, question: bool,
                   show_dialogue: bool, style: ResponseStyle) -> Messages:
    """Response: the chosen memos and the current session -> `respondent`'s next utterance (or
    the question's answer)."""
    recalled = "\n\n".join(memo_text(m, show_dialogue) for m in memos) or "(no memo is related)"
    system = (f"You are {respondent}, in a conversation with someone you have talked with before. Memos recalled "
              "from your earlier talks are given, each with its topic, its summary and the dialogue it covers. "
              "Reply in a way that stays consistent with them and uses them where they matter; when no memo is "
              "related, reply from the current conversation alone.")
    user = f"Recalled memos:\n{recalled}\n\n" + closing_block(current, request, respondent, question, style)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


# ------------------------------------------------------------------------------- the method

def memo_rows(key: dict[str, Any], session_idx: int, turns: list[dict],
              spans: list[tuple[Topic, int, int]]) -> list[dict[str, Any]]:
    rows = []
    for topic, lo, hi in spans:
        span = turns[lo:hi + 1]
        rows.append({**key, "memo_id": f"{session_idx}:{span[0]['turn_idx']}", "topic": topic.topic.strip(),
                     "summary": topic.summary.strip(), "session_idx": session_idx,
                     "turn_start": span[0]["turn_idx"], "turn_end": span[-1]["turn_idx"],
                     "dialogue": format_unit(span),
                     "source_turn_ids": [t["source_turn_id"] for t in span if t.get("source_turn_id")]})
    return rows


def noto_row(key: dict[str, Any], session_idx: int, turns: list[dict]) -> dict[str, Any]:
    """MemoChat's fallback when a write yields no memo: the lines filed under NOTO, summarised by two
    of them drawn at random (seeded by the episode and the first line, so reruns agree)."""
    lines = [f"{t['speaker']}: {t['text']}" for t in turns]
    rng = random.Random(f"memochat-noto:{key['episode_id']}:{session_idx}:{turns[0]['turn_idx']}")
    picked = [lines[i] for i in rng.sample(range(len(lines)), min(2, len(lines)))]
    [row] = memo_rows(key, session_idx, turns, [(Topic(topic=NOTO_TOPIC, summary="", start=1), 0, len(turns) - 1)])
    return {**row, "summary": f"Partial dialogue about: {' or '.join(picked)}."}


def pending_words(turns: list[dict]) -> int:
    return len(format_unit(turns).split())


def in_order(memos: list[dict]) -> list[dict]:
    return sorted(memos, key=lambda m: (m["session_idx"], m["turn_start"]))


class MemoChat(Method[MemoChatSettings]):
    name = "memochat"
    memory = {"memos": MEMOS, "writes": WRITES}
    memory_kind = "log"

    def params(self, settings: MemoChatSettings) -> dict[str, Any]:
        return {} if settings.temperature is None else {"temperature": settings.temperature}

    async def memorize(self, llm: ChatLLM, settings: MemoChatSettings, key: dict[str, Any], session_idx: int,
                       pending: list[dict], session_over: bool) -> tuple[list[dict], dict[str, Any], list[dict]]:
        """One memorization of the pending turns: (memo rows, its `writes` row, the turns still
        pending). The last topic stays pending unless the session is over (or `close_topics`); a failed
        call keeps every pending turn for the next one (at a session's end they are lost, and the row
        says why), or files them as a NOTO memo (`noto_fallback`)."""
        result, failed = await attempt(llm.chat(write_messages(pending, session_idx, session_over), schema=Topics,
                                                **self.params(settings)))
        log = {**key, "session_idx": session_idx, "turn_start": pending[0]["turn_idx"],
               "turn_end": pending[-1]["turn_idx"], **failed}
        if result is None and settings.noto_fallback:
            return [noto_row(key, session_idx, pending)], {**log, "topics": None, "memos": 1, "pending_from": None}, []
        if result is None:
            left = [] if session_over else pending
            return [], {**log, "topics": None, "memos": 0,
                        "pending_from": left[0]["turn_idx"] if left else None}, left
        spans = topic_spans(result.parsed.topics, len(pending))
        close_all = session_over or settings.close_topics
        closed = spans if close_all else spans[:-1]
        left = [] if close_all else pending[spans[-1][1]:]
        memos = memo_rows(key, session_idx, pending, closed)
        return memos, {**log, "topics": len(spans), "memos": len(memos),
                       "pending_from": left[0]["turn_idx"] if left else None}, left

    async def build(self, ctx: MethodContext[MemoChatSettings], episode: EpisodeInput) -> dict[str, list[dict]]:
        eid = episode.episode["episode_id"]
        settings: MemoChatSettings = ctx.settings
        memos: list[dict] = []
        writes: list[dict] = []
        for s, turns in episode.sessions.items():
            pending: list[dict] = []
            new = 0  # turns since the last memorization
            for i, turn in enumerate(turns):
                pending.append(turn)
                new += 1
                over = i == len(turns) - 1
                due = ((settings.write_every and new >= settings.write_every)
                       or (settings.write_words and pending_words(pending) > settings.write_words))
                if not over and not due:
                    continue
                key = (after_session(eid, s) if over
                       else {"episode_id": eid, "snapshot_session": s, "snapshot_turn": turn["turn_idx"]})
                written, log, pending = await self.memorize(ctx.llm, settings, key, s, pending, over)
                memos += written
                writes.append(log)
                new = 0
        return {"memos": memos, "writes": writes}

    async def answer(self, ctx: MethodContext[MemoChatSettings], probe: ProbeInput, memory: dict[str, list[dict]]) -> Answer:
        llm, settings = ctx.llm, ctx.settings
        memos = in_order(memory.get("memos", []))
        question = probe.probe["kind"] == "qa"
        chosen: list[dict] = []
        details: dict[str, Any] = {"memos": len(memos), "chosen": [], **NO_FAILURE}
        if memos:
            before = probe.current
            if before and before[-1].get("text") == probe.request:  # the request is shown on its own
                before = before[:-1]
            dialogue = format_unit(last_turns(before, settings.query_turns))
            result, failed = await attempt(llm.chat(
                retrieve_messages(memos, dialogue, probe.request, settings.max_retrieved, question),
                schema=choice_schema(len(memos)), validate=lambda out: check_choice(out, len(memos)),
                **self.params(settings)))
            details.update(failed)  # a failed retrieval answers from the dialogue alone, and says so
            # A NOTO memo chosen is dropped, as MemoChat drops it.
            picks = [c for c in dict.fromkeys(result.parsed.chosen) if memos[c - 1]["topic"] != NOTO_TOPIC] if result else []
            picks = picks[:settings.max_retrieved] if settings.max_retrieved else picks
            chosen = [memos[c - 1] for c in picks]
            details["chosen"] = [m["memo_id"] for m in chosen]
        out = await llm.chat(reply_messages(chosen, probe.current, probe.request, probe.probe["respondent"], question,
                                            settings.show_dialogue, settings.response_style),
                             **self.params(settings))
        text = "\n\n".join(memo_text(m, settings.show_dialogue) for m in chosen)
        turns = sum(m["turn_end"] - m["turn_start"] + 1 for m in chosen) if settings.show_dialogue else 0
        return Answer(text=response.one_turn(out.text, probe.episode.get("speakers") or []),
                      used_ids=[m["memo_id"] for m in chosen], context_tokens=count_tokens(text) if text else 0,
                      context_turns=turns, details=details, model=out.model)

    def memory_view(self, episode: EpisodeInput, memory: dict[str, list[dict]], settings: MemoChatSettings) -> str | None:
        memos = in_order(memory.get("memos", []))
        return "\n".join(f"[session {m['session_idx']}, turns {m['turn_start']}-{m['turn_end']}] "
                         f"{m['topic']}: {m['summary']}" for m in memos) or None

    def build_stats(self, produced: dict[str, list[dict]]) -> dict[str, Any]:
        writes, memos = produced.get("writes", []), produced.get("memos", [])
        if not writes:
            return {}
        return {"memo_writes": len(writes), "failed_writes": sum(w["error"] is not None for w in writes),
                "memos": len(memos), "memos_per_episode": {writes[0]["episode_id"]: len(memos)}}
