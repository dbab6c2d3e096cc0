"""Every registered method, together in one run, on the bundled sample and on a LongMemEval-shaped
corpus, against the fake server: nothing fails, every probe is answered by every method. The
sample run is on Ray (the one run of every method's stages in Ray's workers, up to the answers);
the LongMemEval one, in this process, also scores, judges and reports every method."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.artifacts import StageDir
from pipeline.engine.runner import Runner
from stages import registry
from conftest import segmenting_responder
from stages.judging.memory_ops import writes_memory
from stages.methods import METHODS

AFTER_THE_METHODS = ("score", "response_metrics", "judge_", "diagnose", "memory_ops", "report")
LONGMEMEVAL = Path(__file__).resolve().parent / "fixtures" / "corpora" / "longmemeval" / "longmemeval_mini.json"


def answering_validly(body: dict) -> str | None:
    """The memory-pool update asks for exactly one operation per new memory, which a schema cannot
    say and the fake server's schema instances miss: answer it as a model would (append each)."""
    prompt = body["messages"][-1]["content"]
    if "New memories from the latest session:" in prompt:
        new = prompt.split("New memories from the latest session:\n", 1)[1].split("\n\n", 1)[0].splitlines()
        return json.dumps({"operations": [{"new": i + 1, "op": "append", "target": None} for i in range(len(new))]})
    return segmenting_responder(body)


@pytest.mark.heavy(seconds=40)
@pytest.mark.parametrize("corpus", [pytest.param("sample", marks=pytest.mark.session_ray), "longmemeval"])
def test_every_method_runs_with_no_failed_rows(run_cfg, fake_llm, corpus):
    # One episode on Ray (several shards at once are the cluster tests' subject); three in this process.
    sets = [f"methods={json.dumps(list(METHODS))}", "corpus.limit=1", "judge_memory.samples=1", "judge_pairwise.samples=1"]
    if corpus == "longmemeval":
        sets += ["corpus.format=longmemeval", f"corpus.path={LONGMEMEVAL}", "corpus.limit=3"]
    if corpus == "sample":
        # On Ray: every method's own stages and what they read. The stages after them (scores,
        # judges, report) are the same code for every method: the LongMemEval run has them.
        names = registry(run_cfg(*sets))
        sets.append("stages=[" + ",".join(n for n in names if not n.startswith(AFTER_THE_METHODS)) + "]")
    cfg = run_cfg(*sets, executor="ray" if corpus == "sample" else "inline")
    fake_llm.responder = answering_validly
    out = Runner(cfg, registry(cfg)).run()
    assert set(out.values()) == {"ran"}
    failed = {name: m.errors for name in out if (m := StageDir(cfg.run_dir, name).manifest()).errors}
    assert failed == {}
    probes = StageDir(cfg.run_dir, "probes").read_table("probes").num_rows
    responses = StageDir(cfg.run_dir, "respond_mem0_style").read_table("responses").num_rows
    assert probes and responses == probes
    answered = {name[len("respond_"):] for name in out if name.startswith("respond_")}
    assert answered == set(METHODS)
    if "memory_ops" in out:  # every method that writes memory gets its operations judged (the library
        # systems' too; mem0 and a_mem write nothing from this fake server's replies: only `dropped` rows)
        ops = StageDir(cfg.run_dir, "memory_ops").read_table("operations").to_pylist()
        writers = {name for name, m in METHODS.items() if writes_memory(m)}
        assert writers and {r["method"] for r in ops if r["op"] == "dropped"} == writers
        assert len({r["method"] for r in ops if r["op"] == "accuracy"}) >= len(writers) - 2
