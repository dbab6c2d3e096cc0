"""memory_ops: what each memory operation did to the facts, per method that writes its own memory
(summaries, facts, events: `Method.evidence_check == "judge"`). One row per judged item (`operations`).

On a corpus with gold memory points (`ingest.memory_points`, HaluMem's), HaluMem's operation scores
(Chen et al. 2025; MemTensor/HaluMem eval/evaluation.py at 59402b9), per session of an episode:
- the session's *extracted* memories: the entries of the method's memory right after the session that
  were not in it right before (HaluMem takes what the system's add call returned for the session);
- `integrity`, per gold point that is not an update (an interference point included: 0 is right
  there): does the extracted memory state it (0 / 1 / 2); 0 without a call where nothing was
  extracted, as the release scores it;
- `accuracy`, per extracted entry: is it supported by the session's dialogue and its gold points
  (0 / 1 / 2), and is each of its facts a field the gold points have (`included`); the dialogue in the
  release's `[time]role: text` lines, the time being the session's (ours: the corpus keeps no time per
  message);
- `update`, per update point: the method's memory after the session searched with the point (BM25, the
  top `update_top_k`; ours: the release asks the system's own search for its top 10), classified
  Correct / Hallucination / Omission / Other against the point and the memories it replaces.
The judge calls and the aggregation are stages/judging/halumem.py's; the report aggregates the rows.

On every corpus (HaluMem's too), two operations that need no gold memory:
- `accuracy` as above where the corpus has no gold points: each entry, sampled, against the dialogue it
  was written from (the sessions up to its own, newest kept within `max_dialogue_tokens`; ours), no gold
  points shown; score 0 is a memory *hallucinated at write* (no turn supports it);
- `dropped`, per question with evidence turns (diagnose's sample of questions, diagnose's judge
  settings): the written check of the error trace (stages/judging/written.py) on the memory right after
  each evidence turn's session and on the memory at the question. An evidence turn stated then and not
  now was dropped by a later update. The check at the question is diagnose's own call (cached: a run
  with both pays it once); `session_idx` is the latest evidence session.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import pyarrow as pa
from pydantic import Field

from pipeline.config import RunConfig
from pipeline.failures import FAILURE_FIELDS, NO_FAILURE, failure
from pipeline.hashing import prompt_fingerprint
from pipeline.llm.usage import billed_to
from pipeline.retrieval import bm25_scores, top_k, within_tokens
from pipeline.engine.stage import Rows, StageContext
from stages.dialogue import format_unit, sessions_of
from stages.judging import halumem, written
from stages.judging.base import JudgeSettings, JudgeStage, judge_params, run_probe_kinds
from stages.judging.diagnose import DiagnoseStage, is_unanswerable, memory_at, newest_within, stated_in
from stages.judging.judge_answers import evidence_ids
from stages.method_stages import memory_stage_name
from stages.methods.base import MemoryItem, Method
from stages.probes import sample

OPS = ("integrity", "accuracy", "update", "dropped")
# `dropped` labels: every evidence turn stated after its session is still stated at the question (kept);
# one is no longer stated (dropped); none was ever stated after its session (never_written).
DROP_LABELS = ("kept", "dropped", "never_written")

OPERATIONS = pa.schema([
    pa.field("episode_id", pa.string(), nullable=False),
    pa.field("dataset", pa.string(), nullable=False),
    pa.field("method", pa.string(), nullable=False),
    pa.field("op", pa.string(), nullable=False),  # one of OPS
    pa.field("session_idx", pa.int32()),  # the session whose memory was judged (dropped: the latest evidence session)
    pa.field("item_id", pa.string(), nullable=False),  # gold point_id | memory entry id | probe_id
    pa.field("text", pa.string()),  # the point, the entry or the question judged
    pa.field("memory_type", pa.string()),  # gold point's (Event / Persona / Relationship Memory)
    pa.field("memory_source", pa.string()),  # gold point's (interference: should not be stored)
    pa.field("importance", pa.float64()),  # gold point's weight in HaluMem's weighted recall
    pa.field("gold_points", pa.bool_()),  # accuracy: judged with the corpus's gold points (HaluMem's protocol)
    pa.field("score", pa.float64()),  # integrity / accuracy: 0 / 1 / 2 (null: unreadable); dropped: 1 dropped
    pa.field("included", pa.bool_()),  # accuracy: every fact a field of the gold points
    pa.field("label", pa.string()),  # update: Correct / Hallucination / Omission / Other; dropped: DROP_LABELS
    pa.field("memory_entries", pa.int32()),  # entries the judge was shown
    pa.field("reply", pa.string()),  # the judge's reply, kept (HaluMem's calls)
    pa.field("judge_model", pa.string()),
    pa.field("prompt_fingerprint", pa.string(), nullable=False),
    *FAILURE_FIELDS,
])


class MemoryOpsSettings(JudgeSettings):
    max_tokens: int = Field(default=1024, ge=16)  # HaluMem's replies reason before their JSON
    temperature: float | None = Field(default=0.0, ge=0)  # HaluMem's eval: temperature 0
    # Sampled per episode and method, seeded: gold points (integrity and update), and entries (accuracy).
    max_points_per_episode: int | None = Field(default=40, ge=1)
    max_entries_per_episode: int | None = Field(default=40, ge=1)
    update_top_k: int = Field(default=10, ge=1)  # memories an update point is judged against (HaluMem's 10)
    # The memory a HaluMem call shows (newest entries kept) and the dialogue an accuracy call shows.
    max_memory_tokens: int | None = Field(default=4000, ge=1)
    max_dialogue_tokens: int | None = Field(default=6000, ge=1)


def writes_memory(method: Method) -> bool:
    """Whether a method writes memory of its own (what these operations judge)."""
    return bool(method.memory) and method.evidence_check == "judge"


def extracted(before: Sequence[MemoryItem], after: Sequence[MemoryItem]) -> list[MemoryItem]:
    """The entries of `after` whose text `before` did not have: what a session added or rewrote."""
    seen = {i.text for i in before}
    return [i for i in after if i.text not in seen]


def searched(items: Sequence[MemoryItem], query: str, k: int) -> list[str]:
    """The `k` entries BM25 ranks first for `query`, best first."""
    texts = [i.text for i in items]
    if not texts:
        return []
    return [texts[i] for i in top_k(bm25_scores(query, texts), k)]


def drop_label(after: Sequence[Sequence[str]], now: Sequence[Sequence[str]]) -> str:
    """`dropped` when an evidence turn stated right after its session is no longer stated at the question."""
    if not any(after):
        return "never_written"
    return "dropped" if any(a and not n for a, n in zip(after, now)) else "kept"


class MemoryOpsStage(JudgeStage[MemoryOpsSettings]):
    name = section = "memory_ops"
    outputs = {"operations": OPERATIONS}
    module_prompts = {**halumem.OPERATION_PROMPTS, **written.PROMPTS}
    judged_kinds = ("qa",)

    def __init__(self, methods: tuple[Method, ...] = ()) -> None:
        self.method_objects = tuple(m for m in methods if writes_memory(m))
        names = tuple(m.name for m in self.method_objects)
        super().__init__(names, extra_inputs=("probes", *(memory_stage_name(n) for n in names)))

    def selected_by(self, cfg: RunConfig, present: set[str]) -> str | None:
        if not self.settings_of(cfg).enabled or not self.methods or "qa" not in run_probe_kinds(cfg):
            return None
        return "judges what each memory operation did to the facts (memory_ops.enabled)"

    def code_roots(self) -> tuple[str, ...]:
        return (type(self).__module__, *dict.fromkeys(type(m).__module__ for m in self.method_objects))

    async def process_episode(self, ctx: StageContext[MemoryOpsSettings], episode_id: str,
                              inputs: dict[str, Rows]) -> dict[str, Rows]:
        settings = ctx.settings
        if not settings.enabled:
            return {"operations": []}
        episode = inputs["ingest.episodes"][0]
        stamp = {"episode_id": episode_id, "dataset": episode["dataset"],
                 "prompt_fingerprint": prompt_fingerprint(self.prompts), "judge_model": ctx.llm.cfg.model}
        work = [self._operations(ctx, m, inputs, stamp) for m in self.method_objects]
        return {"operations": [r for rows in await asyncio.gather(*work) for r in rows]}

    async def _operations(self, ctx: StageContext[MemoryOpsSettings], method: Method, inputs: dict[str, Rows],
                          stamp: Mapping[str, object]) -> Rows:
        with billed_to(method.name):
            parts = await asyncio.gather(self._halumem_ops(ctx, method, inputs, stamp),
                                         self._written_entries(ctx, method, inputs, stamp),
                                         self._dropped(ctx, method, inputs, stamp))
        return [r for rows in parts for r in rows]

    # --- HaluMem's operations, on gold memory points ---------------------------------------------------

    async def _halumem_ops(self, ctx: StageContext[MemoryOpsSettings], method: Method, inputs: dict[str, Rows],
                           stamp: Mapping[str, object]) -> Rows:
        settings, points = ctx.settings, inputs.get("ingest.memory_points", [])
        if not points:
            return []
        episode_id = str(stamp["episode_id"])
        picked = sample(points, settings.max_points_per_episode, settings.seed, f"{episode_id}:{method.name}:points")
        sessions = sorted({int(p["session_idx"]) for p in points})
        memory = {s: memory_at(ctx.cfg, method, inputs, s, None) for s in sessions}
        before = {s: memory_at(ctx.cfg, method, inputs, s, 0) for s in sessions}  # before its first turn
        new = {s: extracted(before[s], memory[s]) for s in sessions}
        turns = sessions_of(inputs["ingest.turns"])
        params = judge_params(settings)

        async def point_row(p: dict[str, object]) -> dict[str, object]:
            s = int(str(p["session_idx"]))
            base = {**stamp, "method": method.name, "session_idx": s, "item_id": p["point_id"], "text": p["content"],
                    "memory_type": p.get("memory_type"), "memory_source": p.get("memory_source"),
                    "importance": p.get("importance"), "gold_points": None, "score": None, "included": None,
                    "label": None, "memory_entries": None, "reply": None, **NO_FAILURE}
            content = str(p["content"])
            try:
                found = searched(memory[s], content, settings.update_top_k)
                if halumem.goes_to_update("True" if p.get("is_update") else "False", found):
                    originals = _texts(p.get("original_memories"))
                    label, reply, model = await halumem.update_call(found, content, originals).once(ctx.llm, **params)
                    return {**base, "op": "update", "label": label, "reply": reply, "judge_model": model,
                            "memory_entries": len(found)}
                shown = [i.text for i in newest_within(new[s], settings.max_memory_tokens)]
                if halumem.nothing_extracted(shown):
                    return {**base, "op": "integrity", "score": 0.0, "memory_entries": 0}
                score, reply, model = await halumem.integrity_call(shown, content).once(ctx.llm, **params)
                return {**base, "op": "integrity", "score": score, "reply": reply, "judge_model": model,
                        "memory_entries": len(shown)}
            except Exception as e:  # one judgment's failure is its row's
                return {**base, "op": "update" if p.get("is_update") else "integrity", **failure(e)}

        rows = list(await asyncio.gather(*(point_row(p) for p in picked)))
        gold = {s: [str(p["content"]) for p in points if p["session_idx"] == s and p.get("memory_source") != "interference"]
                for s in sessions}
        entries = [(s, item) for s in sessions for item in new[s]]
        picked_entries = sample([{"s": s, "item": i} for s, i in entries], settings.max_entries_per_episode,
                                settings.seed, f"{episode_id}:{method.name}:entries")
        dialogue = {s: halumem.dialogue_text(_halumem_turns(turns.get(s, []), inputs["ingest.episodes"][0]))
                    for s in sessions}
        rows += await asyncio.gather(*(self._accuracy(ctx, method, stamp, int(e["s"]), e["item"], dialogue[int(e["s"])],
                                                      gold[int(e["s"])], True) for e in picked_entries))
        return rows

    # --- entries judged for support where the corpus has no gold points -------------------------------------

    async def _written_entries(self, ctx: StageContext[MemoryOpsSettings], method: Method, inputs: dict[str, Rows],
                               stamp: Mapping[str, object]) -> Rows:
        if inputs.get("ingest.memory_points"):
            return []  # HaluMem's accuracy rows judge them, with the gold points
        settings = ctx.settings
        turns = sessions_of(inputs["ingest.turns"])
        sessions = sorted(turns)
        entries: Rows = []
        previous: list[MemoryItem] = []
        for s in sessions:
            after = memory_at(ctx.cfg, method, inputs, s, None)
            entries += [{"s": s, "item": i} for i in extracted(previous, after)]
            previous = after
        picked = sample(entries, settings.max_entries_per_episode, settings.seed,
                        f"{stamp['episode_id']}:{method.name}:entries")

        def dialogue(s: int) -> str:
            lines = [f"[Session {t['session_idx']}] {format_unit([t])}" for k in sessions if k <= s for t in turns[k]]
            return "\n".join(within_tokens(lines, settings.max_dialogue_tokens))

        return list(await asyncio.gather(*(self._accuracy(ctx, method, stamp, int(e["s"]), e["item"], dialogue(int(e["s"])),
                                                          [], False) for e in picked)))

    async def _accuracy(self, ctx: StageContext[MemoryOpsSettings], method: Method, stamp: Mapping[str, object],
                        session: int, item: MemoryItem, dialogue: str, gold: list[str], with_gold: bool) -> dict[str, object]:
        row = {**stamp, "method": method.name, "op": "accuracy", "session_idx": session, "item_id": item.id,
               "text": item.text, "memory_type": None, "memory_source": None, "importance": None,
               "gold_points": with_gold, "score": None, "included": None, "label": None, "memory_entries": None,
               "reply": None, **NO_FAILURE}
        try:
            score, included, reply, model = await halumem.accuracy_call(dialogue, gold, item.text).once(
                ctx.llm, **judge_params(ctx.settings))
        except Exception as e:  # one judgment's failure is its row's
            return {**row, **failure(e)}
        return {**row, "score": score, "included": included, "reply": reply, "judge_model": model}

    # --- facts dropped by a later update --------------------------------------------------------------------

    async def _dropped(self, ctx: StageContext[MemoryOpsSettings], method: Method, inputs: dict[str, Rows],
                       stamp: Mapping[str, object]) -> Rows:
        diagnose = DiagnoseStage().settings_of(ctx.cfg)  # the error trace's judge: its sample, its calls
        params = judge_params(diagnose)
        by_source = {t["source_turn_id"]: t for t in inputs["ingest.turns"] if t.get("source_turn_id")}
        probes = sample([p for p in inputs["probes.probes"] if p["kind"] == "qa"], diagnose.max_probes_per_episode,
                        diagnose.seed, str(stamp["episode_id"]))

        async def one(probe: dict[str, object]) -> dict[str, object] | None:
            evidence = [by_source[i] for i in dict.fromkeys(evidence_ids(_texts(probe.get("evidence")))) if i in by_source]
            if not evidence or is_unanswerable(probe):
                return None
            last = max(int(t["session_idx"]) for t in evidence)
            row = {**stamp, "method": method.name, "op": "dropped", "session_idx": last, "item_id": probe["probe_id"],
                   "text": probe["request"], "memory_type": None, "memory_source": None, "importance": None,
                   "gold_points": None, "score": None, "included": None, "label": None, "reply": None, **NO_FAILURE}
            question, reference = str(probe["request"]), None if probe.get("gold") is None else str(probe["gold"])
            turn = probe.get("turn_idx")
            try:
                now_items = newest_within(memory_at(ctx.cfg, method, inputs, int(str(probe["session_idx"])),
                                                    None if turn is None else int(str(turn))), diagnose.max_memory_tokens)
                now, model = await stated_in(ctx.llm, question, reference, evidence, now_items, params)
                after: list[list[str]] = [[] for _ in evidence]
                for s in sorted({int(t["session_idx"]) for t in evidence}):  # each turn right after its session
                    at = [i for i, t in enumerate(evidence) if t["session_idx"] == s]
                    items = newest_within(memory_at(ctx.cfg, method, inputs, s, None), diagnose.max_memory_tokens)
                    if items == now_items:  # the same memory: diagnose's answer (no call)
                        stated = [now[i] for i in at]
                    else:
                        stated, _ = await stated_in(ctx.llm, question, reference, [evidence[i] for i in at], items,
                                                    params)
                    for i, ids in zip(at, stated):
                        after[i] = ids
            except Exception as e:  # one check's failure is its row's
                return {**row, **failure(e)}
            label = drop_label(after, now)
            return {**row, "label": label, "score": float(label == "dropped"), "memory_entries": len(now_items),
                    "judge_model": model or row["judge_model"]}

        return [r for r in await asyncio.gather(*(one(p) for p in probes)) if r is not None]


def _halumem_turns(turns: Rows, episode: Mapping[str, object]) -> list[dict[str, object]]:
    """Turns as HaluMem's dialogue rendering reads them: the episode's first speaker the user."""
    speakers = episode.get("speakers")
    user = speakers[0] if isinstance(speakers, list) and speakers else None
    return [{"timestamp": t.get("session_time") or "", "role": "user" if t["speaker"] == user else "assistant",
             "content": t["text"]} for t in turns]


def _texts(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []
