"""A mem0-style fact memory, after the public descriptions of mem0: Chhikara et al. 2025, "Mem0:
Building Production-Ready AI Agents with Scalable Long-Term Memory" (arXiv:2504.19413, Section 2:
the extraction phase over the latest message pair with m recent messages, the update phase that
compares each fact with the s most similar memories and lets the LLM pick ADD / UPDATE / DELETE /
NOOP), and mem0's documentation (docs.mem0.ai: memories scoped per user, `add` reporting ADD /
UPDATE / DELETE / NONE events, `search` by similarity). We follow the paper's two-phase pipeline
(mem0's library later moved to add-only extraction) and call NOOP "NONE" as mem0's events do. None
of mem0's code or prompt text is used: every prompt here is our own wording.

1. Extraction: after each unit of conversation (`extract_every`: a whole session, or every turn with
   the `recent_turns` before it as context, as the paper reads the latest exchange beside the
   recent messages), one LLM call per speaker lists the salient facts about that speaker.
2. Update: each candidate fact, in order, is compared with the `top_s` stored facts of the same
   speaker most similar to it (cosine over the embedder's vectors; the paper's s = 10), and the LLM
   chooses ADD (new), UPDATE (which stored fact, and its new text: same subject, more or changed
   detail), DELETE (which stored fact the candidate contradicts; the candidate itself is not
   stored, as in mem0's own DELETE example) or NONE (already known). A speaker with nothing stored
   yet gets ADD without a call (ours: no other choice makes sense).
3. Answer: the `top_k` stored facts most similar to the request, in the memory baselines' response
   frame.

Tables: `facts` is the whole store after every unit that changed it (a `snapshots` memory, so a probe
sees the store as it was before its turn, never a later fact); `operations` is the log, one row per
candidate fact with its decision, the fact it touched, the old and new text and the ids it was shown;
`extractions` logs each extraction call (a failed one yields no facts and keeps its error).

Where ours differs from the paper: no running conversation summary in the extraction prompt; the
store is kept per speaker (mem0 scopes memories by user id); a decision call that fails adds the
candidate (nothing is lost) and records the error. An episode whose store is emptied by DELETEs
writes no `facts` rows for that point, so a later probe sees the last non-empty store.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, Field

from pipeline.failures import FAILURE_FIELDS, NO_FAILURE, attempt
from pipeline.llm.types import ChatLLM, Messages
from pipeline.retrieval import dense_scores, top_k
from stages.methods import memory_response
from stages.methods.base import (SNAPSHOT_FIELDS, Answer, BuildContext, Embed, EpisodeInput, Method, MethodSettings,
                                 ProbeInput)
from stages.methods.dialogue import format_unit, last_turns

FACTS = pa.schema([
    *SNAPSHOT_FIELDS,  # the store after this unit
    pa.field("fact_id", pa.string(), nullable=False),
    pa.field("speaker", pa.string(), nullable=False),  # whom the fact is about
    pa.field("text", pa.string(), nullable=False),
    pa.field("session_idx", pa.int32(), nullable=False),  # where the fact was added
    pa.field("turn_idx", pa.int32()),  # ... its turn (null: extracted from the whole session)
    pa.field("updated_session", pa.int32()),  # where an UPDATE last rewrote it (null: never)
])
OPERATIONS = pa.schema([
    *SNAPSHOT_FIELDS,  # the unit whose extraction gave the candidate
    pa.field("speaker", pa.string(), nullable=False),
    pa.field("candidate", pa.string(), nullable=False),  # the extracted fact
    pa.field("op", pa.string(), nullable=False),  # ADD | UPDATE | DELETE | NONE
    pa.field("fact_id", pa.string()),  # the fact added, rewritten or removed; for NONE the one that says it
    pa.field("old_text", pa.string()),  # UPDATE / DELETE: the stored text before
    pa.field("new_text", pa.string()),  # ADD / UPDATE: the stored text after
    pa.field("similar_ids", pa.list_(pa.string())),  # the stored facts shown to the decision, most similar first
    pa.field("decided", pa.bool_(), nullable=False),  # false: no call (empty store) or the call failed
    *FAILURE_FIELDS,
])
EXTRACTIONS = pa.schema([
    *SNAPSHOT_FIELDS,
    pa.field("speaker", pa.string(), nullable=False),
    pa.field("facts", pa.int32(), nullable=False),
    *FAILURE_FIELDS,
])

Op = Literal["ADD", "UPDATE", "DELETE", "NONE"]


class Mem0Settings(MethodSettings):
    top_s: int = Field(default=10, ge=1)  # stored facts shown to each decision (the paper's s = 10)
    top_k: int = Field(default=10, ge=1)  # facts retrieved for a response
    extract_every: Literal["session", "turn"] = "session"
    recent_turns: int = Field(default=10, ge=0)  # context before the turn in `turn` mode (the paper's m = 10)
    temperature: float | None = Field(default=0.0, ge=0)  # None: the role's llm.temperature
    # short: the memory baselines' "a short, natural reply"; paper: no length asked for
    response_style: memory_response.ResponseStyle = "short"


class Facts(BaseModel):
    facts: list[str]


class Decision(BaseModel):
    op: Op
    target: int | None = None  # the stored fact (numbered as shown) for UPDATE / DELETE / NONE
    text: str | None = None  # UPDATE: the fact's new text


# ------------------------------------------------------------------------------- prompts

def extract_messages(speaker: str, dialogue: str, focus: str | None) -> Messages:
    """Candidate facts about `speaker` from `dialogue`; `focus`: the one utterance to read them from
    (turn mode), the rest being context."""
    system = ("You build a long-term memory of a person from what they say in conversations. Write down only "
              "lasting facts about that person: who they are, their preferences, relationships, work, health, "
              "plans, and what has happened to them. Skip greetings, small talk and anything about the other "
              "speaker. Each fact is one short sentence that can be read on its own and names the person.")
    where = (f"Conversation:\n{dialogue}" if focus is None
             else (f"Earlier lines, for context only:\n{dialogue or '(none)'}\n\n"
                   f"Read the facts from this line:\n{focus}"))
    user = (f"{where}\n\nList the facts about {speaker} (an empty list when there are none). "
            'Reply in JSON: {"facts": ["...", "..."]}.')
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def decide_messages(speaker: str, candidate: str, similar: list[dict]) -> Messages:
    """One operation for `candidate` against the stored facts most similar to it (numbered from 1)."""
    shown = "\n".join(f"{i + 1}. {f['text']}" for i, f in enumerate(similar))
    system = (f"You keep a store of facts about {speaker} correct and free of duplicates. A newly observed fact "
              "comes with the stored facts closest to it. Choose one operation: ADD when the store does not "
              "hold it yet; UPDATE when a stored fact is about the same thing and the new one adds detail or "
              "changes it (give that fact's number as target and the merged sentence as text); DELETE when the "
              "new fact shows a stored fact no longer holds (give its number as target); NONE when the store "
              "already says it (target: the fact that does).")
    user = (f"Stored facts:\n{shown}\n\nNew fact: {candidate}\n\n"
            'Reply in JSON: {"op": "ADD" | "UPDATE" | "DELETE" | "NONE", "target": <number or null>, '
            '"text": <the updated sentence for UPDATE, else null>}.')
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def check_decision(out: Decision, shown: int) -> None:
    """ValueError (so the call is re-asked) unless UPDATE and DELETE name a shown fact, UPDATE has
    text, and any target given is among the shown facts."""
    if out.op in ("UPDATE", "DELETE") and out.target is None:
        raise ValueError(f"{out.op} needs a target among the stored facts 1..{shown}")
    if out.target is not None and not 1 <= out.target <= shown:
        raise ValueError(f"target must be one of the stored facts 1..{shown}; got {out.target}")
    if out.op == "UPDATE" and not (out.text or "").strip():
        raise ValueError("UPDATE needs the fact's new text")


# ------------------------------------------------------------------------------- the store

def apply_decision(store: list[dict], similar: list[dict], decision: Decision, new_fact: dict
                   ) -> tuple[list[dict], dict[str, Any]]:
    """The store after one decision, and the operation row's fields (op, fact_id, old / new text).
    `new_fact` is the fact an ADD stores; UPDATE keeps the target's id and rewrites its text."""
    target = similar[decision.target - 1] if decision.target else None
    if decision.op == "ADD":
        return store + [new_fact], {"op": "ADD", "fact_id": new_fact["fact_id"], "old_text": None,
                                    "new_text": new_fact["text"]}
    if decision.op == "NONE":
        return store, {"op": "NONE", "fact_id": target["fact_id"] if target else None, "old_text": None,
                       "new_text": None}
    assert target is not None  # check_decision holds UPDATE / DELETE to a shown fact
    if decision.op == "DELETE":
        return ([f for f in store if f["fact_id"] != target["fact_id"]],
                {"op": "DELETE", "fact_id": target["fact_id"], "old_text": target["text"], "new_text": None})
    text = (decision.text or "").strip()
    rewritten = {**target, "text": text, "updated_session": new_fact["session_idx"]}
    return ([rewritten if f["fact_id"] == target["fact_id"] else f for f in store],
            {"op": "UPDATE", "fact_id": target["fact_id"], "old_text": target["text"], "new_text": text})


async def most_similar(embed: Embed | None, query: str, facts: list[dict], k: int) -> list[dict]:
    """The k facts nearest to `query` by cosine, nearest first."""
    if not facts:
        return []
    if embed is None:  # showing arbitrary facts would quietly change the method
        raise RuntimeError("mem0_style compares facts by embedding similarity but was given no embedder")
    vectors = np.asarray(await embed([f["text"] for f in facts] + [query]), dtype=np.float32)
    vectors, qvec = vectors[:-1], vectors[-1]
    return [facts[i] for i in top_k(dense_scores(qvec, vectors), k)]


def fact_lines(facts: list[dict]) -> str:
    return "\n".join(f"[{f['speaker']}] {f['text']}" for f in facts)


class Mem0Style(Method):
    name = "mem0_style"
    Settings = Mem0Settings
    memory = {"facts": FACTS, "operations": OPERATIONS, "extractions": EXTRACTIONS}
    memory_kind = "snapshots"
    uses_embedder = True
    prompts = {  # each prompt with its slots, so a prompt edit shows in the stage's fingerprint inputs
        "extract_session": str(extract_messages("{speaker}", "{dialogue}", None)),
        "extract_turn": str(extract_messages("{speaker}", "{dialogue}", "{utterance}")),
        "decide": str(decide_messages("{speaker}", "{candidate}", [{"text": "{similar}"}])),
    }

    def params(self, settings: Mem0Settings) -> dict[str, Any]:
        return {} if settings.temperature is None else {"temperature": settings.temperature}

    def units(self, turns: list[dict], settings: Mem0Settings) -> list[tuple[int | None, list[tuple[str, Messages]]]]:
        """(turn the unit reads up to, or None for the whole session; its extraction calls by speaker)."""
        if settings.extract_every == "session":
            speakers = list(dict.fromkeys(t["speaker"] for t in turns))
            return [(None, [(sp, extract_messages(sp, format_unit(turns), None)) for sp in speakers])]
        out = []
        for i, t in enumerate(turns):
            before = format_unit(last_turns(turns[:i], settings.recent_turns)) if settings.recent_turns else ""
            out.append((t["turn_idx"], [(t["speaker"], extract_messages(t["speaker"], before,
                                                                        f"{t['speaker']}: {t['text']}"))]))
        return out

    async def decide(self, llm: ChatLLM, speaker: str, candidate: str, similar: list[dict], settings: Mem0Settings
                     ) -> tuple[Decision, bool, dict[str, Any]]:
        """(decision, whether the LLM made it, failure columns); an empty store or a failed call adds."""
        if not similar:
            return Decision(op="ADD"), False, dict(NO_FAILURE)
        result, failed = await attempt(llm.chat(decide_messages(speaker, candidate, similar), schema=Decision,
                                                validate=lambda out: check_decision(out, len(similar)),
                                                **self.params(settings)))
        if result is None:
            return Decision(op="ADD"), False, failed
        return result.parsed, True, failed

    async def build(self, ctx: BuildContext, episode: EpisodeInput) -> dict[str, list[dict]]:
        settings: Mem0Settings = ctx.settings
        eid = episode.episode["episode_id"]
        out: dict[str, list[dict]] = {"facts": [], "operations": [], "extractions": []}
        store: list[dict] = []
        ids: Iterator[str] = (f"f{n}" for n in itertools.count(1))
        for s, turns in episode.sessions.items():
            for turn, calls in self.units(turns, settings):
                key = {"episode_id": eid, "snapshot_session": s, "snapshot_turn": turn}
                extracted = await asyncio.gather(*(attempt(ctx.llm.chat(msgs, schema=Facts, **self.params(settings)))
                                                   for _, msgs in calls))
                changed = False
                for (speaker, _), (result, failed) in zip(calls, extracted):
                    facts = [f.strip() for f in result.parsed.facts if f.strip()] if result else []
                    out["extractions"].append({**key, "speaker": speaker, "facts": len(facts), **failed})
                    for candidate in facts:  # in order: a later fact is decided against the earlier ones' result
                        own = [f for f in store if f["speaker"] == speaker]
                        similar = await most_similar(ctx.embed, candidate, own, settings.top_s)
                        decision, decided, failed_call = await self.decide(ctx.llm, speaker, candidate, similar,
                                                                           settings)
                        new = {"fact_id": "", "speaker": speaker, "text": candidate, "session_idx": s,
                               "turn_idx": turn, "updated_session": None}
                        if decision.op == "ADD":
                            new["fact_id"] = next(ids)
                        store, fields = apply_decision(store, similar, decision, new)
                        changed |= fields["op"] != "NONE"
                        out["operations"].append({**key, "speaker": speaker, "candidate": candidate, **fields,
                                                  "similar_ids": [f["fact_id"] for f in similar],
                                                  "decided": decided, **failed_call})
                if changed:
                    out["facts"] += [{**key, **f} for f in store]
        return out

    async def answer(self, llm: ChatLLM, probe: ProbeInput, memory: dict[str, list[dict]], settings: Any) -> Answer:
        facts = memory.get("facts", [])
        chosen = await most_similar(probe.embed, probe.request, facts, settings.top_k)
        snapshot = max(((f["snapshot_session"], f["snapshot_turn"]) for f in facts),
                       key=lambda k: (k[0], float("inf") if k[1] is None else k[1]), default=None)
        return await memory_response.answer_from_memory(
            llm, probe, fact_lines(chosen), [f["fact_id"] for f in chosen],
            details={"memory_after_session": snapshot[0] if snapshot else None,
                     "memory_after_turn": snapshot[1] if snapshot else None, "facts_stored": len(facts)},
            style=settings.response_style, **self.params(settings))

    def memory_view(self, episode: EpisodeInput, memory: dict[str, list[dict]], settings: Any) -> str | None:
        return fact_lines(memory.get("facts", [])) or None

    def build_stats(self, produced: dict[str, list[dict]]) -> dict[str, Any]:
        ops = produced.get("operations", [])
        extractions = produced.get("extractions", [])
        if not extractions:
            return {}
        return {"operations": dict(Counter(r["op"] for r in ops)), "extraction_calls": len(extractions),
                "failed_extractions": sum(r["error"] is not None for r in extractions),
                "failed_decisions": sum(r["error"] is not None for r in ops)}
