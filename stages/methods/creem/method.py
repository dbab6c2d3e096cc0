"""CREEM (seed 004, Sections 2-3): memory kept about each speaker that blends past memories with the
ongoing dialogue and refines itself as it grows (Algorithm 1).

The turn step: before turn t of session s, about one speaker (`step_about`): `last_speaker`, the
speaker of the last utterance (turn t-1), the partner the responder answers (App. C Table 6: the
memory shown for B's reply is about A, who spoke last, and the reply recalls it as "you mentioning";
A.1 asks about the speaker "focusing mainly on the last utterance"), or `next_speaker`, the one who
responds at turn t (a reading of A.4's single {speaker} in "[Memory of {speaker}]" and "[Response]
{speaker}:"):
1. GQ: ask one salient high-level question about that speaker, mainly about the last utterance,
   from the whole session so far D^s_[1,t-1] (App. A.1);
2. R: retrieve the top-k (5) pieces among the speaker's memories and the utterances of D^s_[1,t-1],
   by dense similarity to the question; the memories of the past sessions only (`retrieve_from:
   past_sessions`, Algorithm 1 line 4's M_[1,s-1]), or the in-session insights too (`all`);
3. BR: blend the retrieved pieces (and only them, App. A.3) into n (2) new insights and refine each:
   New (novel), Redundant (overlaps past memories) or Updated (past information changed); a
   Redundant or Updated insight names the retrieved memories it makes redundant or outdated, which
   are removed (memories that were not retrieved are never removed), then the insights are added.
   The first session blends without refining, with its own prompt (A.2): `first_session: per_turn`
   at every step over its `first_session_turns` recent utterances, or `once` per speaker after the
   whole session (A.2's "two insights for the first session" allows both readings).
4. GR: respond from the step's result with the whole current session (App. A.4, whose frame lives
   in `memory_response.py`: CREEM's stand-in baselines answer with it too): its n new insights only
   (`reply_memory: added`, Sec. 2.3's "the added insights", Algorithm 1 line 6's GR(M_t^s, ...) and
   Table 6's two sentences), or the retrieved memories it kept plus them (`kept_and_added`).

`build` runs the step at every `update_every`-th turn and logs every change to the memory keyed by
the turn it read up to, so a probe at turn t sees the memory evolved up to turn t-1 (in-session
insights are retrieved only under `retrieve_from: all`). The step that reads up to turn t-1 is the one Algorithm 1 runs before
responding at turn t: `answer` reuses it when `build` ran it, and runs it on the visible memory
otherwise (`update_every` > 1, a probe with its own context, a step that failed in `build`). The
ablations: `creem_no_refine` labels every insight New and removes nothing; `creem_no_preblend`
responds from the memory accumulated in the past sessions only (Section 3.3.3): the question and
retrieval over it, no blend.

Where each phase lives (all in this module unless named; the prompts and their checks in `prompts.py`):
- the query: `question_messages`, in `Creem.step` / `Creem.recall`;
- retrieval over memories and the session: `Creem.retrieve`;
- blend and refine: `blend_messages`, `blend_refine_schema`, `check_refined` (first session:
  `first_session_messages`), applied in `Creem.step`, walked by `Creem.build`;
- the memory at a point: `replay` over the `memories` log (add / remove rows);
- the response: `memory_response.creem_reply_messages`, in `Creem.answer`, shown `reply_lines`;
- Table 5, the label shares: `label_shares`, via `Creem.report_panel` (`evolution_summary`);
- App. B.1 head-to-head judge: the `creem` protocol of `stages/judging/judge_pairwise.py`;
- App. B.2 memory-quality judge: `stages/judging/memory_quality.py`, run by `judge_memory`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, Field, create_model

from pipeline.failures import FAILURE_FIELDS, NO_FAILURE, attempt
from pipeline.llm.types import ChatLLM
from pipeline.retrieval import count_tokens, dense_scores, top_k
from stages.methods.base import (SNAPSHOT_FIELDS, Answer, Embed, EpisodeInput, MemoryItem, Method, MethodContext, MethodSettings,
                                 ProbeInput, ReportPanel, asked_ahead)
from stages.methods.creem.prompts import (blend_messages, check_count, check_refined, first_session_messages,
                                          question_messages)
from stages.methods.shared import memory_response, response
from stages.dialogue import format_unit, last_turns
from stages.metrics.significance import cluster_bootstrap_interval

# A log: one row per change, keyed by the turn the step that made it read up to (snapshot_turn),
# so the memory at any point is the adds minus the removes keyed at or before it (`replay`).
MEMORIES = pa.schema([
    *SNAPSHOT_FIELDS,
    pa.field("op", pa.string(), nullable=False),  # add | remove
    pa.field("memory_id", pa.string(), nullable=False),
    pa.field("speaker", pa.string(), nullable=False),  # whom the memory is about
    pa.field("text", pa.string(), nullable=False),
    pa.field("session_idx", pa.int32(), nullable=False),  # where the memory was made
    pa.field("turn_idx", pa.int32(), nullable=False),
    pa.field("label", pa.string(), nullable=False),  # New | Redundant | Updated | Blended (first session)
])
EVOLUTION = pa.schema([
    *SNAPSHOT_FIELDS,
    pa.field("dataset", pa.string(), nullable=False),
    pa.field("speaker", pa.string(), nullable=False),
    pa.field("session_idx", pa.int32(), nullable=False),
    pa.field("turn_idx", pa.int32(), nullable=False),
    pa.field("question", pa.string()),
    pa.field("retrieved_ids", pa.list_(pa.string())),  # the memories the step retrieved (M1..Mk)
    pa.field("retrieved_turns", pa.list_(pa.int32())),  # the utterances it retrieved
    pa.field("memory_id", pa.string()),  # the insight; null when the step failed
    pa.field("text", pa.string()),
    pa.field("label", pa.string()),
    pa.field("removed_ids", pa.list_(pa.string())),
    pa.field("removed_texts", pa.list_(pa.string())),
    *FAILURE_FIELDS,
])

# How the memory evolved (CREEM Table 5): per dataset, the share of New, Redundant and Updated among
# the refined insights, with its 95% episode-level cluster bootstrap interval (an episode's insights
# resampled together, as the other summaries' intervals); first-session Blended insights are counted
# with a null share. The report's `evolution_summary` table, one row block per CREEM variant of the run.
EVOLUTION_SUMMARY = pa.schema([
    pa.field("dataset", pa.string()),
    pa.field("method", pa.string()),
    pa.field("label", pa.string()),
    pa.field("insights", pa.int64()),
    pa.field("items", pa.int64()),  # the refined insights the share is over (null for Blended)
    pa.field("episodes", pa.int64()),  # episodes those insights come from
    pa.field("share", pa.float64()),  # of New + Redundant + Updated; null for Blended
    pa.field("share_low", pa.float64()),
    pa.field("share_high", pa.float64()),
])

Label = Literal["New", "Redundant", "Updated"]
StepAbout = Literal["next_speaker", "last_speaker"]
REFINE_LABELS: tuple[str, ...] = ("New", "Redundant", "Updated")


class CreemSettings(MethodSettings):
    k: int = Field(default=5, ge=1)  # pieces retrieved (Section 3.2)
    insights: int = Field(default=2, ge=1)  # new memories per blend (Section 3.2)
    first_session_insights: int = Field(default=2, ge=1)  # the paper says both two and five
    first_session_turns: int | None = Field(default=6, ge=1)  # recent utterances a first-session blend reads
    refine: bool = True
    preblend: bool = True  # respond from the turn step's memory (False: past sessions' memory only)
    update_every: int = Field(default=1, ge=1)  # update after every n-th turn (1 = every turn, the paper)
    # whom a turn step (and the response) is about: the last utterance's speaker (App. C Table 6) or the next one
    step_about: StepAbout = "last_speaker"
    # what the response is shown: the step's new insights (Sec. 2.3, Alg. 1 line 6) or the kept retrieved memories too
    reply_memory: Literal["added", "kept_and_added"] = "added"
    # the memories a step retrieves from: the past sessions' (Alg. 1 line 4, M_[1,s-1]) or the in-session ones too
    retrieve_from: Literal["past_sessions", "all"] = "past_sessions"
    # the first session's blend: at every step (per_turn) or once per speaker after the session (once)
    first_session: Literal["per_turn", "once"] = "per_turn"
    # retrieval score: cosine, or the dot product (Contriever's own, with `embedding.normalize: false`)
    similarity: Literal["cosine", "dot"] = "cosine"
    # None: "a short, natural reply", the length instruction of the memory baselines' frame
    # (stages/methods/shared/memory_response.py), so a head-to-head compares memories, not lengths.
    response_words: int | None = Field(default=None, ge=5)
    max_tokens: int | None = Field(default=None, ge=16)  # for the blend calls; None = the role's


class Question(BaseModel):
    question: str


class Insight(BaseModel):
    text: str


class Blended(BaseModel):
    insights: list[Insight]


@lru_cache(maxsize=64)
def blend_refine_schema(retrieved: int) -> type[BaseModel]:
    """The blend-and-refine answer, where `removes` can only name the retrieved past memories shown
    (M1..Mn): on an endpoint that enforces the schema the answer cannot point anywhere else. With
    no memory retrieved (only utterances) there is nothing to remove, and no `removes` field."""
    fields: dict[str, Any] = {"text": (str, ...), "label": (Label, ...)}
    if retrieved:
        index: Any = Literal[tuple(range(1, retrieved + 1))]
        fields["removes"] = (list[index], Field(default_factory=list, max_length=retrieved))
    insight = create_model("RefinedInsight", **fields)
    return create_model("BlendedAndRefined", insights=(list[insight], ...))


# ------------------------------------------------------------------------------- the memory log

def _point(row: dict) -> tuple[int, float]:
    turn = row["snapshot_turn"]
    return (row["snapshot_session"], float("inf") if turn is None else turn)


MEMORY_KEYS = ("memory_id", "speaker", "text", "session_idx", "turn_idx", "label")


def replay(log: list[dict], until: tuple[int, float] | None = None) -> dict[str, list[dict]]:
    """The memory about each speaker (creation order) after the `memories` log rows keyed at or
    before `until` (all when None): every add, less every remove."""
    memory: dict[str, dict[str, dict]] = {}
    for row in sorted(log, key=_point):  # stable: the order of rows within one key is kept
        if until is not None and _point(row) > until:
            continue
        bank = memory.setdefault(row["speaker"], {})
        if row["op"] == "add":
            bank[row["memory_id"]] = {k: row[k] for k in MEMORY_KEYS}
        else:
            bank.pop(row["memory_id"], None)
    return {speaker: list(bank.values()) for speaker, bank in memory.items()}


@dataclass
class TurnStep:
    """One turn step about `speaker`: its question, what it retrieved, what it made and removed."""

    speaker: str
    session: int
    turn: int
    question: str | None = None
    memories: list[dict] = field(default_factory=list)  # retrieved memories, as shown (M1..Mk)
    utterances: list[dict] = field(default_factory=list)  # retrieved utterances
    insights: list[tuple[dict, list[dict]]] = field(default_factory=list)  # each new memory, what it named
    removed: list[dict] = field(default_factory=list)  # the memories deleted, each once
    failed: dict[str, Any] = field(default_factory=lambda: dict(NO_FAILURE))
    source: str = "build"  # build | answer | past_sessions

    @property
    def added(self) -> list[dict]:
        return [m for m, _ in self.insights]

    def kept(self) -> list[dict]:
        """The retrieved memories the step did not delete."""
        gone = {m["memory_id"] for m in self.removed}
        return [m for m in self.memories if m["memory_id"] not in gone]

    def evolution_rows(self) -> list[dict]:
        base = {"speaker": self.speaker, "session_idx": self.session, "turn_idx": self.turn,
                "question": self.question, "retrieved_ids": [m["memory_id"] for m in self.memories],
                "retrieved_turns": [u["turn_idx"] for u in self.utterances]}
        if not self.insights:  # failed: the memory stays as it was; the failure is logged
            return [{**base, "memory_id": None, "text": None, "label": None, "removed_ids": [],
                     "removed_texts": [], **self.failed}]
        return [{**base, "memory_id": new["memory_id"], "text": new["text"], "label": new["label"],
                 "removed_ids": [m["memory_id"] for m in named], "removed_texts": [m["text"] for m in named],
                 **self.failed} for new, named in self.insights]


def reply_lines(step: TurnStep, reply_memory: str) -> list[dict]:
    """The memories the response is shown: a step that blended shows its new insights (`added`) or
    the retrieved memories it kept before them (`kept_and_added`); a step without a blend (the
    (-) pre-RG BLEND ablation: retrieval over the past sessions only) shows what it retrieved."""
    if step.source == "past_sessions" or reply_memory == "kept_and_added":
        return step.kept() + step.added
    return step.added


def step_speaker(turns: list[dict], i: int, speakers: list[str], about: StepAbout) -> str:
    """Whom the step after turn `i` is about: the speaker of that turn (`last_speaker`), or whoever
    speaks next (`next_speaker`: turn i+1's speaker; after a session's last turn, the speaker after
    it in the episode's order)."""
    last = turns[i]["speaker"]
    if about == "last_speaker":
        return last
    if i + 1 < len(turns):
        return turns[i + 1]["speaker"]
    return speakers[(speakers.index(last) + 1) % len(speakers)] if last in speakers else last


# ------------------------------------------------------------------------------- the method

class Creem(Method[CreemSettings]):
    name = "creem"
    memory = {"memories": MEMORIES, "evolution": EVOLUTION}
    memory_kind = "log"
    uses_embedder = True
    report_table = ("evolution_summary", EVOLUTION_SUMMARY)
    prompts = {  # each prompt with its slots, so a prompt edit shows in the stage's fingerprint inputs
        "question": str(question_messages("{speaker}", "{dialogue}")),
        "blend_refine": str(blend_messages("{speaker}", [], [], 2, True)),
        "blend": str(blend_messages("{speaker}", [], [], 2, False)),
        "first_session": str(first_session_messages("{speaker}", "{statements}", 2)),
        "reply": str(memory_response.creem_reply_messages("{respondent}", "{speaker}", [], "{dialogue}", "{request}",
                                                          None, False)),
        "reply_qa": str(memory_response.creem_reply_messages("{respondent}", "{speaker}", [], "{dialogue}",
                                                             "{request}", None, True)),
    }

    async def retrieve(self, embed: Embed | None, query: str, memories: list[dict], utterances: list[dict], k: int,
                       similarity: str = "cosine") -> tuple[list[dict], list[dict]]:
        """Top-k pieces over the speaker's memories and the session's utterances by `similarity` to
        the query, each group in its own order: (memories, utterances). Without an embedder (unit
        tests only; the pipeline always supplies one) the k most recent pieces."""
        pieces = ([("m", m, m["text"]) for m in memories]
                  + [("u", u, f"{u['speaker']}: {u['text']}") for u in utterances])
        if not pieces:
            return [], []
        if embed is None or len(pieces) <= k:
            chosen = pieces[-k:]
        else:
            vecs = np.asarray(await embed([p[2] for p in pieces] + [query]), dtype=np.float32)
            vecs, qvec = vecs[:-1], vecs[-1]
            chosen = [pieces[i] for i in sorted(top_k(dense_scores(qvec, vecs, similarity), k))]
        return [p[1] for p in chosen if p[0] == "m"], [p[1] for p in chosen if p[0] == "u"]

    @staticmethod
    async def ask(llm: ChatLLM, speaker: str, turns: list[dict]) -> str:
        """GQ: the step's question over the session so far (it reads the dialogue, not the memory)."""
        return (await llm.chat(question_messages(speaker, format_unit(turns)), schema=Question)).parsed.question

    async def recall(self, llm: ChatLLM, embed: Embed | None, settings: CreemSettings, memory: dict[str, list[dict]],
                     step: TurnStep, turns: list[dict], question: Awaitable[str] | None = None) -> None:
        """GQ and R of the step: its question over the session so far (`question`, when asked
        already), then the top-k pieces."""
        step.question = await (question if question is not None else self.ask(llm, step.speaker, turns))
        pool = memory.get(step.speaker, [])
        if settings.retrieve_from == "past_sessions":  # Algorithm 1 line 4: M_[1,s-1]
            pool = [m for m in pool if m["session_idx"] < step.session]
        step.memories, step.utterances = await self.retrieve(embed, step.question, pool, turns, settings.k,
                                                             settings.similarity)

    async def step(self, llm: ChatLLM, embed: Embed | None, settings: CreemSettings, memory: dict[str, list[dict]],
                   speaker: str, session: int, turns: list[dict], first: bool, ids: Iterator[str],
                   question: Awaitable[str] | None = None) -> TurnStep:
        """The step after `turns` (the session so far) about `speaker`; mutates `memory`. `question`:
        its GQ answer when asked ahead (see `build`)."""
        step = TurnStep(speaker, session, turns[-1]["turn_idx"])
        params = {"max_tokens": settings.max_tokens} if settings.max_tokens else {}

        async def made() -> list[tuple[str, str, list[int]]]:
            """The insights: text, label, the retrieved memories it names (1-based)."""
            if first:
                n = settings.first_session_insights
                statements = format_unit(last_turns(turns, settings.first_session_turns))
                res = await llm.chat(first_session_messages(speaker, statements, n), schema=Blended, **params,
                                     validate=lambda out: check_count(out, n))
                return [(i.text, "Blended", []) for i in res.parsed.insights]
            await self.recall(llm, embed, settings, memory, step, turns, question)
            n, shown = settings.insights, len(step.memories)
            if settings.refine:
                res = await llm.chat(blend_messages(speaker, step.memories, step.utterances, n, True),
                                     schema=blend_refine_schema(shown), **params,
                                     validate=lambda out: check_refined(out, n, shown))
                return [(i.text, i.label, sorted(set(getattr(i, "removes", []))) if i.label != "New" else [])
                        for i in res.parsed.insights]
            res = await llm.chat(blend_messages(speaker, step.memories, step.utterances, n, False), schema=Blended,
                                 **params, validate=lambda out: check_count(out, n))
            return [(i.text, "New", []) for i in res.parsed.insights]

        result, step.failed = await attempt(made())
        for text, label, names in result or []:
            named = [step.memories[r - 1] for r in names]
            present = {m["memory_id"] for m in memory.get(speaker, [])}
            step.removed += [m for m in named if m["memory_id"] in present]  # a memory is deleted once
            gone = {m["memory_id"] for m in named}
            new = {"memory_id": next(ids), "speaker": speaker, "text": text.strip(), "session_idx": session,
                   "turn_idx": step.turn, "label": label}
            memory[speaker] = [m for m in memory.get(speaker, []) if m["memory_id"] not in gone] + [new]
            step.insights.append((new, named))
        return step

    async def build(self, ctx: MethodContext[CreemSettings], episode: EpisodeInput) -> dict[str, list[dict]]:
        settings: CreemSettings = ctx.settings
        eid = episode.episode["episode_id"]
        dataset = episode.episode.get("dataset", "")
        speakers = list(episode.episode.get("speakers") or [])
        memory: dict[str, list[dict]] = {}  # speaker -> memories, kept apart
        out: dict[str, list[dict]] = {"memories": [], "evolution": []}
        ids = (f"c{n}" for n in itertools.count(1))

        def record(step: TurnStep, s: int, turn: int) -> None:
            key = {"episode_id": eid, "snapshot_session": s, "snapshot_turn": turn}
            out["memories"] += ([{**key, "op": "remove", **m} for m in step.removed]
                                + [{**key, "op": "add", **m} for m in step.added])
            out["evolution"] += [{**key, "dataset": dataset, **r} for r in step.evolution_rows()]

        # Algorithm 1's steps in order: (session, its turns so far, whose memory, first session?).
        steps: list[tuple[int, list[dict], str, bool]] = []
        for n, (s, turns) in enumerate(episode.sessions.items()):
            if n == 0 and settings.first_session == "once" and turns:
                continue  # blended once after the session, below
            steps += [(s, turns[:i + 1], step_speaker(turns, i, speakers, settings.step_about), n == 0)
                      for i in range(len(turns)) if not (i + 1) % settings.update_every or i == len(turns) - 1]
        # Each step's question (GQ) reads only the dialogue, so all are asked at once; each blend
        # reads the memory the step before wrote, so the blends go one after another. The same
        # calls as asking each question in its step: a chain of blends, not of question-blend pairs.
        questions = [None if first else asyncio.ensure_future(self.ask(ctx.llm, about, turns))
                     for _, turns, about, first in steps]
        with asked_ahead(questions):
            for n, (s, turns) in enumerate(episode.sessions.items()):
                if n == 0 and settings.first_session == "once" and turns:
                    # One blend per speaker after the whole first session, over all of it.
                    whole = settings.model_copy(update={"first_session_turns": None})
                    for who in dict.fromkeys(t["speaker"] for t in turns):
                        record(await self.step(ctx.llm, ctx.embed, whole, memory, who, s, turns, first=True,
                                               ids=ids), s, turns[-1]["turn_idx"])
            for (s, turns, about, first), question in zip(steps, questions):
                record(await self.step(ctx.llm, ctx.embed, settings, memory, about, s, turns, first=first, ids=ids,
                                       question=question), s, turns[-1]["turn_idx"])
        return out

    def built_step(self, memory: dict[str, list[dict]], session: int, last: dict, about: str) -> TurnStep | None:
        """The step about `about` that `build` made after `last` (the turn before the probe), from the
        logs; None when it made none there (or it failed)."""
        at = [r for r in memory.get("evolution", []) if r["snapshot_session"] == session
              and r["snapshot_turn"] == last["turn_idx"] and r["speaker"] == about]
        if not at or any(r["memory_id"] is None for r in at):
            return None
        log = memory.get("memories", [])
        made = {r["memory_id"]: {k: r[k] for k in MEMORY_KEYS} for r in log if r["op"] == "add"}
        removed = [made[r["memory_id"]] for r in log if r["op"] == "remove" and r["snapshot_session"] == session
                   and r["snapshot_turn"] == last["turn_idx"] and r["memory_id"] in made]
        step = TurnStep(about, session, last["turn_idx"], question=at[0]["question"],
                        memories=[made[i] for i in at[0]["retrieved_ids"] if i in made], removed=removed)
        step.insights = [(made[r["memory_id"]], [made[i] for i in r["removed_ids"] if i in made]) for r in at]
        return step

    async def answer(self, ctx: MethodContext[CreemSettings], probe: ProbeInput, memory: dict[str, list[dict]]) -> Answer:
        llm, settings = ctx.llm, ctx.settings
        respondent = probe.probe["respondent"]
        speakers = probe.episode.get("speakers") or []
        question = probe.probe["kind"] == "qa"
        session = probe.probe["session_idx"]
        turns, asked = memory_response.creem_turns(probe)
        last = turns[-1]
        # Whose memory the step works on and the response sees: the last utterance's speaker (the partner
        # being answered, App. C Table 6), or the responder's own.
        about = respondent if settings.step_about == "next_speaker" else last["speaker"]
        log = memory.get("memories", [])
        if not settings.preblend:  # (-) pre-RG blend: the memory accumulated in the past sessions only
            step = TurnStep(about, session, last["turn_idx"], source="past_sessions")
            _, step.failed = await attempt(self.recall(llm, ctx.embed, settings,
                                                       replay(log, (session - 1, float("inf"))), step, turns))
        elif not probe.history and settings.first_session == "once":
            # The first session's memory is blended only after it ends: nothing is remembered yet.
            step = TurnStep(about, session, last["turn_idx"], source="first_session_once")
        else:
            reuse = probe.probe.get("context") is None and not asked
            built = self.built_step(memory, session, last, about) if reuse else None
            if built is not None:
                step = built
            else:  # Algorithm 1's step for this turn, on the visible memory (not kept)
                step = await self.step(llm, ctx.embed, settings, replay(log), about, session, turns,
                                       first=not probe.history, ids=(f"a{n}" for n in itertools.count(1)))
                step.source = "answer"
        shown = reply_lines(step, settings.reply_memory)
        lines = [m["text"] for m in shown]
        dialogue = format_unit(probe.current if question else turns)
        result = await llm.chat(memory_response.creem_reply_messages(respondent, step.speaker, lines, dialogue,
                                                                     probe.request, settings.response_words, question))
        stored = {r["memory_id"] for r in log}  # insights made at answer time are not in the tables
        details: dict[str, Any] = {
            "step": step.source, "memory_of": step.speaker, "question": step.question,
            "retrieved": [m["memory_id"] for m in step.memories],
            "retrieved_turns": [u["turn_idx"] for u in step.utterances],
            "insights": [m["text"] for m in step.added], "removed": [m["memory_id"] for m in step.removed],
            **({"step_error": step.failed["error"]} if step.failed["error"] else {})}
        return Answer(text=response.one_turn(result.text, speakers),
                      used_ids=[m["memory_id"] for m in shown if m["memory_id"] in stored],
                      context_tokens=count_tokens("\n".join(lines)) if lines else 0, model=result.model,
                      details=details)

    def memory_view(self, episode: EpisodeInput, memory: dict[str, list[dict]], settings: CreemSettings) -> str | None:
        final = replay(memory.get("memories", []))
        return "\n".join(f"[{m['speaker']}] {m['text']}" for ms in final.values() for m in ms) or None

    def memory_items(self, memory: dict[str, list[dict]], settings: CreemSettings) -> list[MemoryItem]:
        """The insights in store (every add, less every remove), tagged with whom each is about."""
        return [MemoryItem(m["memory_id"], f"[{m['speaker']}] {m['text']}")
                for ms in replay(memory.get("memories", [])).values() for m in ms]

    def report_panel(self, memory: dict[str, list[dict]], responses: list[dict]) -> ReportPanel | None:
        rows = label_shares(self.name, memory.get("evolution", []))
        if not rows:
            return None
        return ReportPanel("Memory evolution", (
            "Insights per label of the self-refining memory; `share` is the share among New, Redundant and "
            "Updated, as CREEM Table 5 counts them (MSC: 55.81% New, 24.61% Redundant, 19.59% Updated). First-"
            "session insights are Blended, counted apart with no share. CREEM's baselines REBOT_CC and SumMem_MSC "
            "are fine-tuned models we do not have; configs/creem_msc.yaml runs LLM stand-ins: `all_memories` "
            "(session memories of both speakers) for REBOT_CC, `ld_agent` with persona banks only (each "
            "utterance's traits, per speaker; creem_msc shows its reply the partner's traits only) for SumMem_MSC, "
            "each given its entire memory in CREEM's response frame. `share_low`/`share_high`: the 95% "
            "episode-level cluster bootstrap interval of the share."), rows)

    def build_stats(self, produced: dict[str, list[dict]]) -> dict[str, Any]:
        evolution = produced.get("evolution", [])
        labels = Counter(r["label"] for r in evolution if r["label"])
        return {"insights": dict(labels), "failed_steps": sum(r["error"] is not None for r in evolution),
                "removed": sum(r["op"] == "remove" for r in produced.get("memories", []))}


def label_shares(method: str, evolution: list[dict]) -> list[dict]:
    """Insights per label and dataset from the evolution log of every episode, with the share of
    New / Redundant / Updated among the three (Table 5) and its episode-level cluster bootstrap
    interval (each refined insight a 0/1 item of its episode); Blended rows carry a null share."""
    made = [r for r in evolution if r["label"]]
    counts = Counter((r["dataset"], r["label"]) for r in made)
    episodes: dict[tuple[str, str], set] = {}
    for r in made:
        episodes.setdefault((r["dataset"], r["label"]), set()).add(r.get("episode_id"))
    refined = {d: [r for r in made if r["dataset"] == d and r["label"] in REFINE_LABELS] for d, _ in counts}
    order = {label: i for i, label in enumerate(REFINE_LABELS)}
    rows = []
    for (d, label), n in sorted(counts.items(), key=lambda x: (x[0][0], order.get(x[0][1], 9), x[0][1])):
        low = high = share = items = None
        if label in REFINE_LABELS:
            items, share = len(refined[d]), n / len(refined[d])
            low, high = cluster_bootstrap_interval([float(r["label"] == label) for r in refined[d]],
                                                   [str(r.get("episode_id")) for r in refined[d]])
        rows.append({"dataset": d, "method": method, "label": label, "insights": n, "items": items,
                     "episodes": len(episodes[d, label]), "share": share, "share_low": low, "share_high": high})
    return rows


class CreemNoRefineSettings(CreemSettings):
    refine: Literal[False] = False


class CreemNoPreblendSettings(CreemSettings):
    preblend: Literal[False] = False


class CreemNoRefine(Creem):
    name = "creem_no_refine"
    Settings = CreemNoRefineSettings


class CreemNoPreblend(Creem):
    name = "creem_no_preblend"
    Settings = CreemNoPreblendSettings
