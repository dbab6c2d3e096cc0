"""CREEM (seed 004, Sections 2-3): memory kept about each speaker that blends past memories with the
ongoing dialogue and refines itself as it grows (Algorithm 1).

For each turn (every `update_every`-th) of a session, about the speaker of its last utterance:
1. generate one salient question about that speaker focused on the last utterance;
2. retrieve the top-k (5) pieces among the speaker's past memories and the session's utterances so
   far, with the question and the recent dialogue as the query;
3. blend them with the dialogue into n (2) new insights, and refine each: New (novel), Redundant
   (overlaps past memories) or Updated (past information changed); a Redundant or Updated insight
   names the retrieved memories it makes redundant or outdated, which are removed (memories that
   were not retrieved are never removed), then the insights are added. The first session blends
   without refining, with its own prompt.
A probe sees the memory after the session before its own. Before responding, CREEM blends the
retrieved memory with the current dialogue once more (the pre-response blend) and answers from
those insights and the dialogue. Ablations: `creem_no_refine`, `creem_no_preblend`.
Every insight is logged with its label, what it removed, and where it was made.

Where each phase lives (all in this module unless named):
- Algorithm 1 step 1, the query: `question_messages`, in `Creem.step`;
- step 2, retrieval over past memories and the session: `Creem.retrieve`;
- step 3, blend and refine: `blend_messages`, `blend_refine_schema`, `check_refined` (first session:
  `first_session_messages`), applied in `Creem.step`, walked by `Creem.build`;
- the response (pre-response blend, then reply): `reply_messages`, in `Creem.answer`;
- Table 5, the label shares: `label_shares`, via `Creem.report_panel` (`evolution_summary`);
- App. B.1 head-to-head judge: the `creem` protocol of `stages/judging/judge_pairwise.py`;
- App. B.2 memory-quality judge: `stages/judging/memory_quality.py`, run by `judge_memory`.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, Field, create_model

from pipeline.llm.types import ChatLLM, Messages
from pipeline.retrieval import count_tokens, dense_scores, top_k
from pipeline.failures import FAILURE_FIELDS, attempt
from stages.methods import response
from stages.methods.base import (SNAPSHOT_FIELDS, after_session, Answer, BuildContext, EpisodeInput, Method,
                                 MethodSettings, ProbeInput, ReportPanel)
from stages.methods.dialogue import format_unit

MEMORIES = pa.schema([
    *SNAPSHOT_FIELDS,  # the memory of both speakers after session snapshot_session
    pa.field("memory_id", pa.string(), nullable=False),
    pa.field("speaker", pa.string(), nullable=False),  # whom the memory is about
    pa.field("text", pa.string(), nullable=False),
    pa.field("session_idx", pa.int32(), nullable=False),  # where it was made
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
    pa.field("memory_id", pa.string()),  # the insight; null when the step failed
    pa.field("text", pa.string()),
    pa.field("label", pa.string()),
    pa.field("removed_ids", pa.list_(pa.string())),
    pa.field("removed_texts", pa.list_(pa.string())),
    *FAILURE_FIELDS,
])

# How the memory evolved (CREEM Table 5): the share of each insight label, per dataset; the report's
# `evolution_summary` table, with one row block per CREEM variant of the run.
EVOLUTION_SUMMARY = pa.schema([
    pa.field("dataset", pa.string()),
    pa.field("method", pa.string()),
    pa.field("label", pa.string()),
    pa.field("insights", pa.int64()),
    pa.field("share", pa.float64()),
])

Label = Literal["New", "Redundant", "Updated"]


class CreemSettings(MethodSettings):
    k: int = Field(default=5, ge=1)  # pieces retrieved (Section 3.2)
    insights: int = Field(default=2, ge=1)  # new memories per blend (Section 3.2)
    first_session_insights: int = Field(default=2, ge=1)  # the paper says both two and five
    refine: bool = True
    preblend: bool = True  # blend again before responding
    update_every: int = Field(default=1, ge=1)  # update after every n-th turn (1 = every turn, the paper)
    context_turns: int = Field(default=6, ge=1)  # recent turns in the query and the prompts
    response_words: int = Field(default=30, ge=5)
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
    (M1..Mn): on an endpoint that enforces the schema the answer cannot point anywhere else."""
    index: Any = Literal[tuple(range(1, retrieved + 1))] if retrieved else int  # type: ignore[misc]
    insight = create_model("RefinedInsight", text=(str, ...), label=(Label, ...),
                           removes=(list[index], Field(default_factory=list, max_length=retrieved)))
    return create_model("BlendedAndRefined", insights=(list[insight], ...))  # type: ignore[valid-type]


# ------------------------------------------------------------------------------- prompts

def question_messages(speaker: str, dialogue: str) -> Messages:
    return [{"role": "system", "content": "You help a dialogue agent remember people. Ask what is worth knowing."},
            {"role": "user", "content": f"Conversation:\n{dialogue}\n\nWrite one salient question about {speaker} "
                                        f"that the last utterance raises. Reply in JSON: {{\"question\": \"...\"}}."}]


def _pieces(memories: list[dict], utterances: list[dict]) -> str:
    past = "\n".join(f"[M{i + 1}] {m['text']}" for i, m in enumerate(memories)) or "(none)"
    now = "\n".join(f"- {u['speaker']}: {u['text']}" for u in utterances) or "(none)"
    return f"Past memories about the person:\n{past}\n\nRelevant lines of the ongoing conversation:\n{now}"


def blend_messages(speaker: str, dialogue: str, memories: list[dict], utterances: list[dict], n: int,
                   refine: bool) -> Messages:
    system = ("You keep an evolving memory about a person. Blend what is remembered with what is being said into "
              "new insights: combine facts, infer what follows, keep each insight one sentence about the person.")
    if refine:
        system += (" Then judge each insight against the past memories: New if it is novel, Redundant if past "
                   "memories already say it, Updated if it shows past information has changed. For Redundant or "
                   "Updated, list the numbers of the past memories [M#] it makes redundant or outdated.")
        reply = ('{"insights": [{"text": "...", "label": "New" | "Redundant" | "Updated", "removes": [1, ...]}]}')
    else:
        reply = '{"insights": [{"text": "..."}]}'
    user = (f"Person: {speaker}\n\n{_pieces(memories, utterances)}\n\nConversation so far:\n{dialogue}\n\n"
            f"Write {n} insights about {speaker}. Reply in JSON: {reply}.")
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def first_session_messages(speaker: str, dialogue: str, n: int) -> Messages:
    return [{"role": "system", "content": "You start a memory about a person you have just met in conversation."},
            {"role": "user", "content": f"Conversation:\n{dialogue}\n\nWrite {n} short insights about {speaker}, "
                                        'one sentence each. Reply in JSON: {"insights": [{"text": "..."}]}.'}]


def reply_messages(respondent: str, memory: list[str], dialogue: str, request: str, words: int,
                   question: bool) -> Messages:
    task = ("Answer the question in a short phrase." if question
            else f"Reply as {respondent} in at most {words} words, reflecting what you remember where it fits, "
                 "without a speaker label.")
    mem = "\n".join(f"- {m}" for m in memory) or "- (nothing remembered)"
    return [{"role": "system", "content": f"You are {respondent}, who remembers past conversations."},
            {"role": "user", "content": f"What you remember:\n{mem}\n\nConversation:\n{dialogue}\n\n"
                                        f"{'Question' if question else 'Latest message'}: {request}\n\n{task}"}]


def check_refined(out: Any, n: int, retrieved: int) -> None:
    if not out.insights:
        raise ValueError("give at least one insight")
    for i, ins in enumerate(out.insights):
        bad = [r for r in ins.removes if not 1 <= r <= retrieved]
        if bad:
            raise ValueError(f"insight {i + 1} removes {bad}, but only past memories M1..M{retrieved} were shown")


# ------------------------------------------------------------------------------- the method

class Creem(Method):
    name = "creem"
    Settings = CreemSettings
    memory = {"memories": MEMORIES, "evolution": EVOLUTION}
    memory_kind = "snapshots"
    uses_embedder = True
    report_table = ("evolution_summary", EVOLUTION_SUMMARY)

    def retrieve(self, embed: Any, query: str, memories: list[dict], utterances: list[dict], k: int
                 ) -> tuple[list[dict], list[dict]]:
        """Top-k pieces over the speaker's memories and the session's utterances: (memories, utterances)."""
        pieces = [("m", m, m["text"]) for m in memories] + [("u", u, f"{u['speaker']}: {u['text']}") for u in utterances]
        if not pieces:
            return [], []
        if embed is None or len(pieces) <= k:
            chosen = pieces[-k:]
        else:
            vecs = np.asarray(embed([p[2] for p in pieces]), dtype=np.float32)
            qvec = np.asarray(embed([query])[0], dtype=np.float32)
            chosen = [pieces[i] for i in sorted(top_k(dense_scores(qvec, vecs), k))]
        return [p[1] for p in chosen if p[0] == "m"], [p[1] for p in chosen if p[0] == "u"]

    async def step(self, llm: ChatLLM, embed: Any, settings: CreemSettings, memory: dict[str, list[dict]],
                   speaker: str, session: int, turns: list[dict], first: bool, counter: list[int]
                   ) -> list[dict]:
        """One update about `speaker` after `turns` (the session so far); mutates `memory`, returns log rows."""
        dialogue = format_unit(turns[-settings.context_turns:])
        t = turns[-1]["turn_idx"]
        params = {"max_tokens": settings.max_tokens} if settings.max_tokens else {}
        base = {"speaker": speaker, "session_idx": session, "turn_idx": t}

        async def insights() -> tuple[str | None, list[tuple[str, str, list[dict]]]]:
            """The step's question (none in the first session) and its insights: text, label, removed."""
            if first:
                res = await llm.chat(first_session_messages(speaker, dialogue, settings.first_session_insights),
                                     schema=Blended, **params)
                return None, [(i.text, "Blended", []) for i in res.parsed.insights]
            question = (await llm.chat(question_messages(speaker, dialogue), schema=Question)).parsed.question
            mems, utts = self.retrieve(embed, f"{question}\n{dialogue}", memory.get(speaker, []), turns[:-1],
                                       settings.k)
            if settings.refine:
                res = await llm.chat(blend_messages(speaker, dialogue, mems, utts, settings.insights, True),
                                     schema=blend_refine_schema(len(mems)), **params,
                                     validate=lambda out, n=len(mems): check_refined(out, settings.insights, n))
                return question, [(i.text, i.label, [mems[r - 1] for r in i.removes] if i.label != "New" else [])
                                  for i in res.parsed.insights]
            res = await llm.chat(blend_messages(speaker, dialogue, mems, utts, settings.insights, False),
                                 schema=Blended, **params)
            return question, [(i.text, "New", []) for i in res.parsed.insights]

        step, failed = await attempt(insights())
        if step is None:  # the memory stays as it was; the failure is logged
            return [{**base, "question": None, "memory_id": None, "text": None, "label": None, "removed_ids": [],
                     "removed_texts": [], **failed}]
        question, made = step
        rows = []
        for text, label, removed in made:
            gone = {m["memory_id"] for m in removed}
            memory[speaker] = [m for m in memory.get(speaker, []) if m["memory_id"] not in gone]
            counter[0] += 1
            new = {"memory_id": f"c{counter[0]}", "speaker": speaker, "text": text.strip(), "session_idx": session,
                   "turn_idx": t, "label": label}
            memory[speaker].append(new)
            rows.append({**base, "question": question, "memory_id": new["memory_id"], "text": new["text"],
                         "label": label, "removed_ids": sorted(gone), "removed_texts": [m["text"] for m in removed],
                         **failed})
        return rows

    async def build(self, ctx: BuildContext, episode: EpisodeInput) -> dict[str, list[dict]]:
        settings: CreemSettings = ctx.settings
        eid = episode.episode["episode_id"]
        memory: dict[str, list[dict]] = {}  # speaker -> memories, kept apart
        out: dict[str, list[dict]] = {"memories": [], "evolution": []}
        counter = [0]
        for n, (s, turns) in enumerate(episode.sessions.items()):
            for i in range(len(turns)):
                if (i + 1) % settings.update_every and i != len(turns) - 1:
                    continue
                rows = await self.step(ctx.llm, ctx.embed, settings, memory, turns[i]["speaker"], s, turns[:i + 1],
                                       first=n == 0, counter=counter)
                dataset = episode.episode.get("dataset", "")
                out["evolution"] += [{**after_session(eid, s), "dataset": dataset, **r} for r in rows]
            out["memories"] += [{**after_session(eid, s), **m} for ms in memory.values() for m in ms]
        return out

    async def answer(self, llm: ChatLLM, probe: ProbeInput, memory: dict[str, list[dict]], settings: Any) -> Answer:
        respondent = probe.probe["respondent"]
        speakers = probe.episode.get("speakers") or []
        other = next((s for s in speakers if s != respondent), respondent)
        past = memory.get("memories", [])
        turns = probe.current
        dialogue = format_unit(turns[-settings.context_turns:]) if turns else probe.request
        question = probe.probe["kind"] == "qa"
        # Memory about the person spoken to, then about oneself.
        about = [m for m in past if m["speaker"] == other] + [m for m in past if m["speaker"] == respondent]
        query = (await llm.chat(question_messages(other, dialogue), schema=Question)).parsed.question
        mems, utts = self.retrieve(probe.embed, f"{query}\n{dialogue}", about, turns, settings.k)
        lines = [m["text"] for m in mems]
        details: dict[str, Any] = {"question": query, "retrieved": [m["memory_id"] for m in mems]}
        if settings.preblend and (mems or utts):
            res = await llm.chat(blend_messages(other, dialogue, mems, utts, settings.insights, False), schema=Blended,
                                 **({"max_tokens": settings.max_tokens} if settings.max_tokens else {}))
            lines = [i.text for i in res.parsed.insights] + lines
            details["preblend"] = [i.text for i in res.parsed.insights]
        result = await llm.chat(reply_messages(respondent, lines, dialogue, probe.request, settings.response_words,
                                               question))
        return Answer(text=response.one_turn(result.text, speakers), used_ids=[m["memory_id"] for m in mems],
                      context_tokens=count_tokens("\n".join(lines)) if lines else 0, model=result.model,
                      details=details)

    def memory_view(self, episode: EpisodeInput, memory: dict[str, list[dict]], settings: Any) -> str | None:
        return "\n".join(f"[{m['speaker']}] {m['text']}" for m in memory.get("memories", [])) or None

    def report_panel(self, memory: dict[str, list[dict]], responses: list[dict]) -> ReportPanel | None:
        rows = label_shares(self.name, memory.get("evolution", []))
        if not rows:
            return None
        return ReportPanel("Memory evolution", "Share of each insight label of the self-refining memory (CREEM "
                           "Table 5: New, Redundant, Updated; first-session insights are Blended).", rows)

    def build_stats(self, produced: dict[str, list[dict]]) -> dict[str, Any]:
        labels = Counter(r["label"] for r in produced.get("evolution", []) if r["label"])
        return {"insights": dict(labels), "failed_steps": sum(r["error"] is not None
                                                               for r in produced.get("evolution", []))}


def label_shares(method: str, evolution: list[dict]) -> list[dict]:
    """Insights per label and their share per dataset, from the evolution log of every episode."""
    counts = Counter((r["dataset"], r["label"]) for r in evolution if r["label"])
    totals = Counter[str]()
    for (dataset, _), n in counts.items():
        totals[dataset] += n
    return [{"dataset": d, "method": method, "label": label, "insights": n, "share": n / totals[d]}
            for (d, label), n in sorted(counts.items())]


class CreemNoRefineSettings(CreemSettings):
    refine: Literal[False] = False  # type: ignore[assignment]


class CreemNoPreblendSettings(CreemSettings):
    preblend: Literal[False] = False  # type: ignore[assignment]


class CreemNoRefine(Creem):
    name = "creem_no_refine"
    Settings = CreemNoRefineSettings


class CreemNoPreblend(Creem):
    name = "creem_no_preblend"
    Settings = CreemNoPreblendSettings
