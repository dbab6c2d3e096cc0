"""ingest: the corpus is parsed and written part by part, so one worker never holds a big corpus,
with the same tables, parts and errors as parsing it whole."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.artifacts import StageDir
from pipeline.config import resolve_paths
from pipeline.corpus import load_corpus
from pipeline.errors import PipelineError
from pipeline.engine.runner import Runner
from pipeline.engine.shard import _write_global_parts
from pipeline.engine.stage import StageContext
from stages import load_config, registry
from stages.ingest import IngestStage

ROOT = Path(__file__).resolve().parent.parent


def episode(i: int, sessions: int = 2, turns: int = 4) -> dict:
    return {"episode_id": f"ep-{i:05d}", "speakers": ["Ann", "Bob"],
            "sessions": [{"time": None, "gap": None,
                          "turns": [{"speaker": ("Ann", "Bob")[t % 2], "text": f"episode {i} session {s} turn {t} "
                                     + "word " * 12} for t in range(turns)]} for s in range(sessions)],
            "qa": [{"qa_id": f"ep-{i:05d}-q0", "question": f"what in episode {i}?", "answer": "words",
                    "evidence": ["D1:1"], "category": "single-hop"}]}


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def config(tmp_path: Path, corpus: Path, *sets: str):
    cfg = load_config(None, [f"artifacts_dir={tmp_path / 'artifacts'}", "corpus.format=sample", f"corpus.path={corpus}",
                             "stages=[ingest]", "methods=[]", "teabag.enabled=false", "ray.executor=inline",
                             "ray.episodes_per_shard=2", *sets])
    return resolve_paths(cfg)


def run_ingest(cfg) -> StageDir:
    Runner(cfg, registry(cfg)).run(only=["ingest"])
    return StageDir(cfg.run_dir, "ingest")


@pytest.mark.parametrize("corpus", [ROOT / "data" / "sample", None], ids=["sample corpus", "five episodes"])
def test_streamed_ingest_writes_the_files_and_layout_the_whole_corpus_would_have_been_cut_into(tmp_path, corpus):
    corpus = corpus or write(tmp_path / "c.jsonl", [episode(i) for i in range(5)])
    sd = run_ingest(config(tmp_path, corpus))
    whole = load_corpus("sample", corpus).tables()
    expected_dir = tmp_path / "expected"
    layout = _write_global_parts(expected_dir, whole, 2)  # what ingest wrote before it streamed
    manifest = sd.manifest()
    assert manifest.parts == layout
    assert manifest.tables == {t: tbl.num_rows for t, tbl in whole.items()}
    for table, tbl in whole.items():
        written = sorted(p.name for p in sd.table_dir(table).glob("*.parquet"))
        assert written == sorted(p.name for p in (expected_dir / table).glob("*.parquet"))
        for name in written:
            assert pq.read_table(sd.table_dir(table) / name).equals(pq.read_table(expected_dir / table / name))
        assert sd.read_table(table).to_pylist() == tbl.to_pylist()


def test_every_part_holds_at_most_a_shard_of_episodes_and_the_parser_holds_one_part(tmp_path):
    n = 400
    corpus = write(tmp_path / "c.jsonl", [episode(i) for i in range(n)])
    cfg = config(tmp_path, corpus, "ray.episodes_per_shard=10")
    ctx = StageContext(cfg=cfg, stage=IngestStage(), out_dir=tmp_path)

    tracemalloc.start()
    sizes = []
    for part in IngestStage().run_parts(ctx, {}, 10):
        sizes.append(part["episodes"].num_rows)
        del part
    _, streamed_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    tracemalloc.start()
    whole = load_corpus("sample", corpus).tables()
    _, whole_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    assert sizes == [10] * (n // 10) and whole["episodes"].num_rows == n
    # one part of 10 episodes at a time: a small share of parsing all 400 at once
    assert streamed_peak < whole_peak / 5


def test_a_bad_record_in_a_late_part_names_file_record_and_field_and_publishes_nothing(tmp_path):
    records = [episode(i) for i in range(7)]
    records[5]["sessions"][1]["turns"][0]["speaker"] = 7
    corpus = write(tmp_path / "c.jsonl", records)
    cfg = config(tmp_path, corpus)
    with pytest.raises(PipelineError) as err:
        run_ingest(cfg)
    text = str(err.value)
    assert "c.jsonl" in text and "line 6" in text and "speaker" in text
    assert StageDir(cfg.run_dir, "ingest").manifest() is None

    records[5] = episode(5)  # fixed: the rerun publishes every episode and no part of the failed attempt
    write(corpus, records)
    sd = run_ingest(cfg)
    assert sd.read_table("episodes").column("episode_id").to_pylist() == [f"ep-{i:05d}" for i in range(7)]
    assert len(list(sd.table_dir("turns").glob("*.parquet"))) == 4


def test_an_episode_id_in_two_sources_is_refused(tmp_path):
    first = write(tmp_path / "a.jsonl", [episode(i) for i in range(3)])
    second = write(tmp_path / "b.jsonl", [episode(7), episode(1)])
    cfg = config(tmp_path, first, f"corpus.extra=[{{format: sample, path: {second}}}]")
    with pytest.raises(PipelineError, match=r"episode 'ep-00001' of .*b\.jsonl is also in .*a\.jsonl"):
        run_ingest(cfg)
    assert StageDir(cfg.run_dir, "ingest").manifest() is None


def test_a_file_of_episode_ids_enters_the_fingerprint_by_its_content(tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text("a\n")
    cfg = load_config(None, [f"corpus.episode_ids={ids}"])
    before = IngestStage().extra_fingerprint(cfg)
    ids.write_text("b\n")
    after = IngestStage().extra_fingerprint(cfg)
    assert before["episode_id_files"] != after["episode_id_files"] and before["files"] == after["files"]
