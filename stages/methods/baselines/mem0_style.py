"""A mem0-style fact memory, after the public descriptions of mem0: Chhikara et al. 2025, "Mem0:
Building Production-Ready AI Agents with Scalable Long-Term Memory" (arXiv:2504.19413, Section 2:
the extraction phase over the latest message pair with m recent messages, the update phase that
compares each fact with the s most similar memories and lets the LLM pick ADD / UPDATE / DELETE /
NOOP), and mem0's documentation (docs.mem0.ai: memories scoped per user, `add` reporting ADD /
UPDATE / DELETE / NONE events, `search` by similarity). We follow the paper's two-phase pipeline
(mem0's library later moved to add-only extraction) and call NOOP "NONE" as mem0's events do. None
of mem0's code or prompt text is used: every prompt here is our own wording.

1. Extraction: after each unit of conversation (`extract_every`: `pair`, each exchange with the
   `recent_turns` before it as context, as the paper reads the latest message pair beside the m = 10
   recent messages; `turn`, each utterance with the same context; `session`, a whole session at
   once, coarser than the paper), one LLM call per speaker lists the salient facts about that
   speaker. Each fact carries the date of its session (`fact_date`), as mem0 stores a timestamp
   with each memory.
2. Update: each candidate fact, in order, is compared with the `top_s` stored facts of the same
   speaker most similar to it (cosine over the embedder's vectors; the paper's s = 10), and the LLM
   chooses ADD (new), UPDATE (which stored fact, and its new text: same subject, more or changed
   detail), DELETE (which stored fact the candidate contradicts; the candidate itself is not
   stored, as in mem0's own DELETE example) or NONE (already known). A speaker with nothing stored
   yet gets ADD without a call (ours: no other choice makes sense).
3. Answer: the `top_k` stored facts of each speaker most similar to the request (`per_speaker`, as
   mem0's LoCoMo evaluation searches each speaker's memories; else `top_k` pooled), shown per
   speaker as "date: fact" lines. A QA probe is asked with the answer rules of mem0's evaluation
   (`answer_prompt: mem0`, `MEM0_ANSWER_SYSTEM`); a next-response probe, and QA under
   `answer_prompt: ours`, in the memory baselines' response frame.

Tables: `facts` is the whole store after every unit that changed it (a `snapshots` memory, so a probe
sees the store as it was before its turn, never a later fact); `operations` is the log, one row per
candidate fact with its decision, the fact it touched, the old and new text and the ids it was shown;
`extractions` logs each extraction call (a failed one yields no facts and keeps its error).

Where ours differs from the paper: no running conversation summary in the extraction prompt; the
store is kept per speaker (mem0 scopes memories by user id); a decision call that fails adds the
candidate (nothing is lost) and records the error; the default unit is a session (`extract_every:
pair` is the paper's, about one call per speaker and exchange); by default the answer prompt asks for
the answer alone; `show_work: true` asks for the worked steps as mem0's does, and the reply is then the
whole completion (stripped), which is what mem0's evals.py scores (F1, BLEU-1 and J read it as
written, steps included). An episode whose store is emptied by DELETEs
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
from pipeline.retrieval import count_tokens, dense_scores, top_k
from stages.methods.shared import memory_response
from stages.methods.base import (SNAPSHOT_FIELDS, Answer, Embed, EpisodeInput, Method, MethodContext, MethodSettings,
                                 ProbeInput)
from stages.methods.shared import response
from stages.dialogue import build_exchanges, format_unit, last_turns
from stages.methods.shared.session_memories import session_time

FACTS = pa.schema([
    *SNAPSHOT_FIELDS,  # the store after this unit
    pa.field("fact_id", pa.string(), nullable=False),
    pa.field("speaker", pa.string(), nullable=False),  # whom the fact is about
    pa.field("text", pa.string(), nullable=False),
    pa.field("session_idx", pa.int32(), nullable=False),  # where the fact was added
    pa.field("turn_idx", pa.int32()),  # ... its turn (null: extracted from the whole session)
    pa.field("updated_session", pa.int32()),  # where an UPDATE last rewrote it (null: never)
    pa.field("fact_date", pa.string()),  # the date of the session its text comes from (null: undated corpus)
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
    # the unit read at once: an exchange (`pair`, the paper's), an utterance, or a whole session (coarser)
    extract_every: Literal["session", "pair", "turn"] = "session"
    recent_turns: int = Field(default=10, ge=0)  # context before the unit in pair / turn mode (the paper's m = 10)
    per_speaker: bool = True  # top_k facts of each speaker (mem0's evaluation); false: top_k pooled
    answer_prompt: Literal["mem0", "ours"] = "mem0"  # QA probes: mem0's evaluation answer rules, or our frame
    # answer_prompt mem0: think step by step and show the work (mem0's prompts.py), the whole completion
    # being the answer scored, as mem0's evals.py scores it; false: the answer alone, cut to one turn
    show_work: bool = False
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

def extract_messages(speaker: str, dialogue: str, focus: str | None, exchange: bool = False) -> Messages:
    """Candidate facts about `speaker` from `dialogue`; `focus`: the utterance (turn mode) or the
    exchange (pair mode) to read them from, the rest being context."""
    system = ("You build a long-term memory of a person from what they say in conversations. Write down only "
              "lasting facts about that person: who they are, their preferences, relationships, work, health, "
              "plans, and what has happened to them. Skip greetings, small talk and anything about the other "
              "speaker. Each fact is one short sentence that can be read on its own and names the person.")
    read = "these lines" if exchange else "this line"
    where = (f"Conversation:\n{dialogue}" if focus is None
             else (f"Earlier lines, for context only:\n{dialogue or '(none)'}\n\n"
                   f"Read the facts from {read}:\n{focus}"))
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
    if "fact_date" in new_fact:  # the merged text speaks as of the newer statement
        rewritten["fact_date"] = new_fact["fact_date"]
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


def fact_when(fact: dict) -> str:
    """A fact's date (its session's, "session N" when the corpus has none)."""
    return fact.get("fact_date") or f"session {fact['session_idx']}"


def dated_lines(facts: list[dict]) -> str:
    """mem0's "timestamp: memory" lines."""
    return "\n".join(f"{fact_when(f)}: {f['text']}" for f in facts)


def speaker_blocks(groups: list[tuple[str, list[dict]]]) -> str:
    """Each speaker's retrieved facts under that speaker's name, dated."""
    return "\n\n".join(f"Memories about {speaker}:\n{dated_lines(facts) or '(none)'}" for speaker, facts in groups)


# The answer rules of mem0's LoCoMo evaluation (mem0ai/mem0 evaluation/prompts.py, ANSWER_PROMPT), in
# our words with every element (its "show your work" under `show_work`, else the answer alone): read
# both speakers' memories; the dates decide; look for a memory that states the fact asked about; the
# most recent memory wins a contradiction; relative times are resolved from the memory's date and
# given as dates, months or years; names inside memories are not the speakers; under six words;
# worked through step by step before answering.
MEM0_RULES = (
    "You answer questions from the memories kept of a conversation between two people. Each memory is "
    "about one of the two and is dated with the day of the conversation it came from.\n"
    "Rules:\n"
    "1. Go through the memories of both people before you answer.\n"
    "2. Let the dates guide you: they often decide the answer.\n"
    "3. For a question about a particular event or fact, find the memory that states it.\n"
    "4. When memories disagree, trust the most recent one.\n"
    "5. A time given relative to a memory (\"last year\", \"two months ago\") is counted from that "
    "memory's date: a memory dated 10 March 2021 saying someone moved house two months ago puts the move "
    "in January 2021.\n"
    "6. Always answer with a date, a month or a year, never with a relative time expression.\n"
    "7. Rely on the memories alone, and keep the two people apart from other names that appear inside "
    "the memories.\n"
    "8. Keep the answer under six words.\n"
    "Work it out step by step before answering: find the memories that bear on the question, read their "
    "dates and contents closely, look for explicit dates, places and events, do any date arithmetic, and "
    "check that your answer is precise, specific about time, and answers exactly what was asked.")
ANSWER_ONLY = " Reply with the answer only."
SHOW_WORK = (" Think it through step by step in your reply, writing out any date arithmetic, and end with "
             "the final answer.")
MEM0_ANSWER_SYSTEM = MEM0_RULES + ANSWER_ONLY  # the default: the answer alone
MEM0_SHOW_WORK_SYSTEM = MEM0_RULES + SHOW_WORK  # show_work: the steps written out, as mem0's prompt asks


def mem0_answer_messages(groups: list[tuple[str, list[dict]]], question: str, show_work: bool = False) -> Messages:
    user = f"{speaker_blocks(groups)}\n\nQuestion: {question}\nAnswer:"
    system = MEM0_SHOW_WORK_SYSTEM if show_work else MEM0_ANSWER_SYSTEM
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def reader_params(settings: Mem0Settings) -> dict[str, Any]:
    return {} if settings.temperature is None else {"temperature": settings.temperature}


async def read_memories(llm: ChatLLM, probe: ProbeInput, groups: list[tuple[str, list[dict]]], used_ids: list[str],
                        settings: Mem0Settings, details: dict[str, Any]) -> Answer:
    """The reply from each speaker's retrieved memories (`groups`): a question under mem0's evaluation
    answer rules (`answer_prompt: mem0`), anything else in the memory baselines' frame."""
    if probe.probe["kind"] == "qa" and settings.answer_prompt == "mem0":
        result = await llm.chat(mem0_answer_messages(groups, probe.request, settings.show_work), **reader_params(settings))
        # show_work: the completion as written is the answer, as mem0's evals.py scores it
        text = result.text.strip() if settings.show_work else response.one_turn(
            result.text, probe.episode.get("speakers") or [])
        return Answer(text=text, used_ids=used_ids, context_tokens=count_tokens(speaker_blocks(groups)),
                      model=result.model, details={**details, "answer_prompt": "mem0", "show_work": settings.show_work})
    return await memory_response.answer_from_memory(
        llm, probe, speaker_blocks(groups) if used_ids else "", used_ids, details=details,
        style=settings.response_style, **reader_params(settings))


class Mem0Style(Method[Mem0Settings]):
    name = "mem0_style"
    memory = {"facts": FACTS, "operations": OPERATIONS, "extractions": EXTRACTIONS}
    memory_kind = "snapshots"
    uses_embedder = True
    prompts = {  # each prompt with its slots, so a prompt edit shows in the stage's fingerprint inputs
        "extract_session": str(extract_messages("{speaker}", "{dialogue}", None)),
        "extract_turn": str(extract_messages("{speaker}", "{dialogue}", "{utterance}")),
        "extract_pair": str(extract_messages("{speaker}", "{dialogue}", "{exchange}", exchange=True)),
        "decide": str(decide_messages("{speaker}", "{candidate}", [{"text": "{similar}"}])),
        "answer_mem0": str(mem0_answer_messages([("{speaker}", [])], "{question}")),
        "answer_mem0_show_work": str(mem0_answer_messages([("{speaker}", [])], "{question}", show_work=True)),
    }

    def params(self, settings: Mem0Settings) -> dict[str, Any]:
        return reader_params(settings)

    def units(self, turns: list[dict], settings: Mem0Settings) -> list[tuple[int | None, list[tuple[str, Messages]]]]:
        """(turn the unit reads up to, or None for the whole session; its extraction calls by speaker)."""
        if settings.extract_every == "session":
            speakers = list(dict.fromkeys(t["speaker"] for t in turns))
            return [(None, [(sp, extract_messages(sp, format_unit(turns), None)) for sp in speakers])]
        if settings.extract_every == "pair":  # each exchange, keyed by its last turn
            pairs = []
            for lo, hi in build_exchanges(turns):
                pair = turns[lo:hi + 1]
                before = format_unit(last_turns(turns[:lo], settings.recent_turns)) if settings.recent_turns else ""
                calls = [(sp, extract_messages(sp, before, format_unit(pair), exchange=True))
                         for sp in dict.fromkeys(t["speaker"] for t in pair)]
                pairs.append((pair[-1]["turn_idx"], calls))
            return pairs
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

    async def build(self, ctx: MethodContext[Mem0Settings], episode: EpisodeInput) -> dict[str, list[dict]]:
        settings: Mem0Settings = ctx.settings
        eid = episode.episode["episode_id"]
        out: dict[str, list[dict]] = {"facts": [], "operations": [], "extractions": []}
        store: list[dict] = []
        ids: Iterator[str] = (f"f{n}" for n in itertools.count(1))
        for s, turns in episode.sessions.items():
            date = session_time(turns)  # the session's date, mem0's timestamp of each memory
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
                               "turn_idx": turn, "updated_session": None, "fact_date": date}
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

    async def retrieve(self, embed: Embed | None, probe: ProbeInput, facts: list[dict], settings: Mem0Settings
                       ) -> list[tuple[str, list[dict]]]:
        """(speaker, the facts retrieved for them, nearest first) for each speaker: the episode's
        speakers in order, then any other speaker with facts."""
        speakers = list(dict.fromkeys([*(probe.episode.get("speakers") or []), *(f["speaker"] for f in facts)]))
        if settings.per_speaker:
            return [(sp, await most_similar(embed, probe.request, [f for f in facts if f["speaker"] == sp],
                                            settings.top_k)) for sp in speakers]
        pooled = await most_similar(embed, probe.request, facts, settings.top_k)
        return [(sp, [f for f in pooled if f["speaker"] == sp]) for sp in speakers]

    async def answer(self, ctx: MethodContext[Mem0Settings], probe: ProbeInput, memory: dict[str, list[dict]]) -> Answer:
        llm, settings = ctx.llm, ctx.settings
        facts = memory.get("facts", [])
        groups = await self.retrieve(ctx.embed, probe, facts, settings)
        chosen = [f for _, group in groups for f in group]
        snapshot = max(((f["snapshot_session"], f["snapshot_turn"]) for f in facts),
                       key=lambda k: (k[0], float("inf") if k[1] is None else k[1]), default=None)
        details = {"memory_after_session": snapshot[0] if snapshot else None,
                   "memory_after_turn": snapshot[1] if snapshot else None, "facts_stored": len(facts)}
        return await read_memories(llm, probe, groups, [f["fact_id"] for f in chosen], settings, details)

    def memory_view(self, episode: EpisodeInput, memory: dict[str, list[dict]], settings: Mem0Settings) -> str | None:
        return fact_lines(memory.get("facts", [])) or None

    def build_stats(self, produced: dict[str, list[dict]]) -> dict[str, Any]:
        ops = produced.get("operations", [])
        extractions = produced.get("extractions", [])
        if not extractions:
            return {}
        return {"operations": dict(Counter(r["op"] for r in ops)), "extraction_calls": len(extractions),
                "failed_extractions": sum(r["error"] is not None for r in extractions),
                "failed_decisions": sum(r["error"] is not None for r in ops)}
