"""memory_ops: what each memory operation did to the facts. Constructed memories on the LoCoMo fixture
against the fake server: one that drops facts a later question needs, one that invents a fact at
write, one that keeps everything; each is scored as such."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pipeline.artifacts import StageDir
from pipeline.engine.runner import Runner
from stages import registry
from stages.judging.memory_ops import drop_label, extracted, searched, writes_memory
from stages.methods import METHODS
from stages.methods.base import SNAPSHOT_FIELDS, Answer, EpisodeInput, MemoryItem, Method, MethodContext, MethodSettings, ProbeInput
from test_all_methods import answering_validly
from test_diagnose import WRONG, written_judge

LOCOMO = Path(__file__).parent / "fixtures" / "corpora" / "locomo" / "locomo_mini.json"
NOTES = pa.schema([*SNAPSHOT_FIELDS, pa.field("memory_id", pa.string(), nullable=False),
                   pa.field("text", pa.string(), nullable=False)])
INVENTED = "keeps a purple submarine in the garage"


def note(eid: str, s: int, turn: dict, at: int | None = None) -> dict:
    return {"episode_id": eid, "snapshot_session": s if at is None else at, "snapshot_turn": None,
            "memory_id": f"n{s}.{turn['turn_idx']}", "text": f"{turn['speaker']}: {turn['text']}"}


class Keeper(Method[MethodSettings]):
    """A note per turn, kept for good (a log)."""

    name = "keeper"
    memory = {"notes": NOTES}
    memory_kind = "log"

    async def build(self, ctx: MethodContext[MethodSettings], episode: EpisodeInput) -> dict[str, list[dict]]:
        eid = episode.episode["episode_id"]
        return {"notes": [note(eid, s, t) for s, turns in episode.sessions.items() for t in turns]}

    async def answer(self, ctx: MethodContext[MethodSettings], probe: ProbeInput, memory: dict[str, Any]) -> Answer:
        return Answer(text=WRONG)


class Forgetter(Keeper):
    """Snapshots: after each session only that session's notes, every earlier one overwritten."""

    name = "forgetter"
    memory_kind = "snapshots"


class Inventor(Keeper):
    """Every turn's note, and with each session one entry no turn supports."""

    name = "inventor"

    async def build(self, ctx: MethodContext[MethodSettings], episode: EpisodeInput) -> dict[str, list[dict]]:
        eid = episode.episode["episode_id"]
        built = await super().build(ctx, episode)
        speaker = episode.episode["speakers"][0]
        built["notes"] += [{"episode_id": eid, "snapshot_session": s, "snapshot_turn": None, "memory_id": f"x{s}",
                            "text": f"{speaker}: {INVENTED} (session {s})"} for s in episode.sessions]
        return built


BUILT = [Keeper(), Forgetter(), Inventor()]
PLUGINS = {**METHODS, **{m.name: m for m in BUILT}}
_SECTION = re.compile(r"DIALOGUE:\n(.*?)\n\nGOLD MEMORY POINTS.*?CANDIDATE MEMORY[^\n]*\n(.*?)\n\nSUPPORT", re.S)


def judge(body: dict[str, Any]) -> str | None:
    """The written check as diagnose's tests script it; HaluMem's accuracy judge: 2 when the candidate
    is a line of the dialogue shown, else 0 (a hallucinated memory)."""
    found = _SECTION.search(body["messages"][-1]["content"])
    if found is None:
        return written_judge(body)
    dialogue, candidate = found.groups()
    supported = any(line.endswith(f"] {candidate}") for line in dialogue.splitlines())
    reply = {"accuracy_score": "2" if supported else "0", "is_included_in_golden_memories": "false", "reason": "x"}
    return f"```json\n{json.dumps(reply)}\n```"


def run(run_cfg: Any, fake_llm: Any) -> tuple[Any, list[dict[str, Any]]]:
    cfg = run_cfg(f"methods=[{','.join(m.name for m in BUILT)}]", "corpus.format=locomo", f"corpus.path={LOCOMO}",
                  "corpus.limit=null", "probes.max_qa_per_episode=null", "probes.next_response=false",
                  "judge_answers.enabled=false", "judge_pairwise.enabled=false", "judge_memory.enabled=false",
                  "diagnose.max_memory_tokens=null", "diagnose.max_probes_per_episode=null",
                  "memory_ops.max_entries_per_episode=null", "memory_ops.max_dialogue_tokens=null", methods=PLUGINS)
    fake_llm.responder = judge
    Runner(cfg, registry(cfg, PLUGINS)).run()
    return cfg, StageDir(cfg.run_dir, "memory_ops").read_table("operations").to_pylist()


def test_a_dropped_fact_and_an_invented_one_are_scored_as_such(run_cfg, fake_llm):
    cfg, rows = run(run_cfg, fake_llm)
    assert rows and all(r["error"] is None for r in rows)

    def of(method: str, op: str) -> list[dict[str, Any]]:
        return [r for r in rows if r["method"] == method and r["op"] == op]

    # dropped: the keeper keeps every fact; the forgetter drops each one whose session is not the last
    assert {r["label"] for r in of("keeper", "dropped")} == {"kept"}
    forgot = of("forgetter", "dropped")
    assert len(forgot) == len(of("keeper", "dropped")) > 0
    last = max(r["session_idx"] for r in forgot)
    assert {r["label"] for r in forgot if r["session_idx"] < last} == {"dropped"}
    assert all(r["score"] == (1.0 if r["label"] == "dropped" else 0.0) for r in forgot)
    # hallucinated at write: the invented entries score 0, every note of a turn 2
    invented = [r for r in of("inventor", "accuracy") if INVENTED in r["text"]]
    assert invented and {r["score"] for r in invented} == {0.0}
    assert {r["score"] for r in of("inventor", "accuracy") if INVENTED not in r["text"]} == {2.0}
    assert {r["score"] for r in of("keeper", "accuracy")} == {2.0} and not of("keeper", "integrity")
    assert {r["gold_points"] for r in of("inventor", "accuracy")} == {False}  # LoCoMo has no gold points
    # the report counts them per method
    report = StageDir(cfg.run_dir, "report")
    summary = {r["method"]: r for r in report.read_table("memory_ops").to_pylist()}
    assert summary["forgetter"]["dropped"] == sum(r["label"] == "dropped" for r in forgot) > 0
    assert summary["keeper"]["dropped"] == 0 and summary["keeper"]["hallucinated"] == 0
    assert summary["inventor"]["hallucinated"] == len(invented) and summary["inventor"]["recall"] is None
    assert "What memory operations do to the facts" in (Path(report.final) / "report.md").read_text()


def test_extracted_search_and_drop_rules():
    a, b, c = MemoryItem("1", "a likes tea"), MemoryItem("2", "b runs"), MemoryItem("3", "c sings opera")
    assert extracted([a, b], [a, b, c]) == [c] and extracted([], [a]) == [a]
    assert searched([a, b, c], "who sings opera", 1) == ["c sings opera"] and searched([], "x", 3) == []
    assert drop_label([["1"], []], [[], []]) == "dropped"
    assert drop_label([["1"], ["2"]], [["1"], ["9"]]) == "kept"
    assert drop_label([[], []], [["1"], []]) == "never_written"


@pytest.mark.heavy(seconds=20)
def test_every_builtin_memory_writer_gets_its_operation_rows_on_the_locomo_fixture(run_cfg, fake_llm):
    writers = [n for n, m in METHODS.items() if writes_memory(m) and not type(m).__module__.endswith("_library")]
    cfg = run_cfg(f"methods=[{','.join(writers)}]", "corpus.format=locomo", f"corpus.path={LOCOMO}", "corpus.limit=1",
                  "probes.max_qa_per_episode=4", "probes.next_response=false", "judge_answers.enabled=false",
                  "judge_pairwise.enabled=false", "judge_memory.enabled=false", "memory_ops.max_entries_per_episode=3")
    fake_llm.responder = answering_validly
    out = Runner(cfg, registry(cfg)).run()
    assert out["memory_ops"] == "ran" and StageDir(cfg.run_dir, "memory_ops").manifest().errors == 0
    ops = StageDir(cfg.run_dir, "memory_ops").read_table("operations").to_pylist()
    for method in writers:
        mine = {r["op"] for r in ops if r["method"] == method}
        assert mine == {"accuracy", "dropped"}, method  # LoCoMo: no gold points, so no integrity / update


def test_the_plan_prices_the_operations_without_sending_anything(run_cfg, fake_llm):
    from pipeline.plan import make_plan

    cfg = run_cfg("methods=[inventor,forgetter]", "corpus.format=locomo", f"corpus.path={LOCOMO}", "corpus.limit=1",
                  "probes.next_response=false", "judge_answers.enabled=false", "judge_pairwise.enabled=false",
                  "judge_memory.enabled=false", methods=PLUGINS)
    priced = next(s for s in make_plan(cfg, lambda c: registry(c, PLUGINS)).stages if s.name == "memory_ops").total()
    assert priced["calls"] > 0 and priced["prompt_tokens"] > 0 and fake_llm.count() == 0
