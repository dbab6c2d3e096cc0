"""`mempipe export predictions --format locomo_plus`: one `<method>.json` a method, the records the
release's task_eval/evaluate_qa.py writes and llm_as_judge.py reads (question_input, evidence as
"Speaker：text" lines, the release's category names, ground_truth "" where none, prediction, model),
cognitive items first; built on a run published by hand (no pipeline runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import resolve_paths
from pipeline.corpus import load_corpus
from stages import load_config
from stages.method_stages.respond import RESPONSES
from stages.predictions import SUMMARY_FILE, export_predictions
from stages.probes import PROBES, qa_probes

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "corpora" / "locomo_plus"


def _publish(run_dir: Path, stage: str, tables: dict[str, pa.Table]) -> None:
    for name, table in tables.items():
        (run_dir / stage / name).mkdir(parents=True)
        pq.write_table(table, run_dir / stage / name / "part-00000.parquet")
    (run_dir / stage / "_manifest.json").write_text(json.dumps({"stage": stage, "fingerprint": "test"}))


def test_each_method_gets_the_releases_prediction_records_cognitive_first(tmp_path: Path) -> None:
    cfg = resolve_paths(load_config(ROOT / "configs" / "default.yaml", [
        f"artifacts_dir={tmp_path / 'artifacts'}", "run_name=lp", "corpus.format=locomo_plus",
        f"corpus.path={FIXTURE}", "methods=[zero_history]"]))
    run_dir = Path(cfg.run_dir)
    tables = load_corpus("locomo_plus", FIXTURE).tables()
    _publish(run_dir, "ingest", tables)
    qa = tables["qa"].to_pylist()
    probes = [p for e in tables["episodes"].to_pylist()
              for p in qa_probes(e, [q for q in qa if q["episode_id"] == e["episode_id"]])]
    _publish(run_dir, "probes", {"probes": pa.Table.from_pylist(probes, schema=PROBES)})
    rows = [{"episode_id": p["episode_id"], "probe_id": p["probe_id"], "method": "zero_history",
             "response": None if p["qa_id"] == "locomo_plus-c1-q0" else f"reply to {p['qa_id']}",
             "memory_ids": None, "details_json": None,
             "error": "LLMError: gave up" if p["qa_id"] == "locomo_plus-c1-q0" else None} for p in probes]
    _publish(run_dir, "respond_zero_history", {"responses": pa.Table.from_pylist(rows, schema=RESPONSES)})

    out = export_predictions(cfg, "locomo_plus", None, tmp_path / "exports")
    assert sorted(p.name for p in out.iterdir()) == [SUMMARY_FILE, "zero_history.json"]
    records = json.loads((out / "zero_history.json").read_text(encoding="utf-8"))
    assert len(records) == len(qa) == 9
    assert records[0] == {
        "question_input": "Priya: I ended up volunteering for that project, and now I'm totally overwhelmed.",
        "evidence": "Priya：After learning to say 'no', I've felt a lot less stressed overall.\n"
                    "Dev：That's a great skill to develop; protecting your time is important.",
        "category": "Cognitive", "ground_truth": "", "prediction": "reply to locomo_plus-c0-q0",
        "model": "zero_history"}
    assert records[1]["prediction"] == ""  # a failed answer is exported empty: the judge scores it wrong
    assert [r["category"] for r in records[3:]] == [
        "single-hop", "multi-hop", "temporal", "common-sense", "adversarial", "single-hop"]
    assert records[3]["ground_truth"] == "sourdough bread" and records[3]["evidence"].startswith("Dev：")
    assert records[7]["ground_truth"] == ""  # adversarial: no answer, as the release's unified input
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert summary["methods"]["zero_history"]["failed"] == 1
