"""The stage runner: fingerprints, skipping, invalidation, row errors, status, resume after a kill."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

import toy_stages
from conftest import driver_on_session_ray
from pipeline.artifacts import StageDir
from pipeline.config import load_config
from pipeline.errors import PipelineError
from pipeline.manifest import Manifest
from pipeline.engine.runner import Runner
from pipeline.engine.selection import Selection

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


@pytest.fixture
def toy(tmp_path: Path, ray_local, toy_dir: Path):
    (toy_dir / "work.log").unlink(missing_ok=True)
    (toy_dir / "control.json").unlink(missing_ok=True)
    (toy_dir / "upstream.log").unlink(missing_ok=True)
    corpus = tmp_path / "n.txt"
    corpus.write_text("5")

    def make(*sets: str, executor: str = "ray") -> Runner:
        cfg = load_config(None, [
            f"artifacts_dir={tmp_path / 'artifacts'}", f"corpus.path={corpus}", "ray.episodes_per_shard=2",
            f"ray.executor={executor}", *sets,
        ], toy_stages.config_model())
        return Runner(cfg, toy_stages.registry())

    make.corpus = corpus  # type: ignore[attr-defined]
    make.run_dir = tmp_path / "artifacts" / "default"  # type: ignore[attr-defined]
    return make


def work() -> list[str]:
    return toy_stages.read_work_log()


def test_first_run_writes_everything_and_second_run_does_nothing(toy):
    out = toy().run()
    assert out == {"ingest": "ran", "count": "ran", "double": "ran", "other": "ran"}
    run_dir = toy.run_dir
    m = json.loads((run_dir / "count" / "_manifest.json").read_text())
    assert m["rows"] == 5 and m["errors"] == 0 and m["shards"] == 3
    assert sorted(p.name for p in (run_dir / "count" / "counts").iterdir()) == [
        "part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    counts = StageDir(run_dir, "count").read_table("counts").to_pylist()
    assert sorted(r["n_turns"] for r in counts) == [3] * 5
    doubled = StageDir(run_dir, "double").read_table("doubled").column("value").to_pylist()
    assert doubled == [6] * 5
    assert not list(run_dir.glob("*.partial"))
    before = len(work())
    assert before == 1 + 5 * 3

    out = toy().run()
    assert set(out.values()) == {"skipped"}
    assert len(work()) == before


def test_upstream_change_reruns_downstream_only(toy):
    toy().run()
    n = len(work())
    # count.* is count's section: count and its downstream re-run; ingest and other do not.
    out = toy("count.seed=7").run()
    assert out == {"ingest": "skipped", "count": "ran", "double": "ran", "other": "skipped"}
    stages_run = {line.split()[0] for line in work()[n:]}
    assert stages_run == {"count", "double"}
    # An unrelated section touches only its own stage.
    n = len(work())
    out = toy("count.seed=7", "other.size=[2]").run()
    assert out == {"ingest": "skipped", "count": "skipped", "double": "skipped", "other": "ran"}
    # Input data change re-runs everything downstream of ingest.
    toy.corpus.write_text("6")
    out = toy("count.seed=7", "other.size=[2]").run()
    assert set(out.values()) == {"ran"}
    assert StageDir(toy.run_dir, "double").manifest().rows == 6


def test_row_failure_is_recorded_not_fatal(toy, toy_dir):
    (toy_dir / "control.json").write_text(json.dumps({"fail_row": "ep03"}))
    toy().run()
    m = StageDir(toy.run_dir, "count").manifest()
    assert m.rows == 5 and m.errors == 1
    rows = {r["episode_id"]: r for r in StageDir(toy.run_dir, "count").read_table("counts").to_pylist()}
    assert rows["ep03"]["error"] == "toy failure" and rows["ep01"]["error"] is None


def test_a_selection_is_checked_when_made_and_run_takes_it_or_its_keywords(toy):
    with pytest.raises(PipelineError, match="use one of --only, --from, --until, --retry-failed"):
        Selection(only=["count"], until="double")
    sel = Selection(only=["ingest"])
    assert sel == Selection(only=("ingest",)) and len({sel, Selection(only=("ingest",))}) == 1  # frozen
    with pytest.raises(TypeError):
        toy().run(sel, force=["count"])
    assert toy().run(sel) == {"ingest": "ran"}


def test_only_force_from_and_status(toy):
    r = toy()
    assert r.run(only=["ingest"]) == {"ingest": "ran"}
    states = {s.name: s.state for s in toy().status()}
    assert states == {"ingest": "done", "count": "missing", "double": "missing", "other": "missing"}
    with pytest.raises(PipelineError, match="needs 'count'"):
        toy().run(only=["double"])
    toy().run()
    n = len(work())
    assert toy().run(force=["count"]) == {"ingest": "skipped", "count": "ran", "double": "skipped", "other": "skipped"}
    assert {line.split()[0] for line in work()[n:]} == {"count"}
    n = len(work())
    assert toy().run(from_="count") == {"count": "ran", "double": "ran"}
    assert {line.split()[0] for line in work()[n:]} == {"count", "double"}
    states = {s.name: s.state for s in toy("count.seed=3").status()}
    assert states == {"ingest": "done", "count": "stale", "double": "stale", "other": "done"}


def test_a_stopped_attempt_shows_its_own_failure_and_counts_never_the_older_published_ones(toy, toy_dir):
    toy().run()
    assert StageDir(toy.run_dir, "count").manifest().rows == 5
    (toy_dir / "control.json").write_text(json.dumps({"raise_on": "ep03"}))
    edited = toy("count.seed=3", executor="inline")
    with pytest.raises(Exception, match="toy crash on ep03"):
        edited.run()
    count = {s.name: s for s in edited.status()}["count"]
    # The attempt's first shard (ep00, ep01) finished; the published stage's 5 rows are not its counts.
    assert (count.state, count.shards_done, count.attempt_rows) == ("partial", 1, 2)
    assert "toy crash on ep03" in count.failed["reason"]
    # status and select decide the state alike: the rerun resumes the attempt.
    assert {s.name: why for s, why in edited.select()} == {"ingest": "done", "count": "partial", "double": "stale",
                                                           "other": "done"}


def test_inline_and_ray_executors_write_the_same_tables_and_manifests(toy):
    toy("run_name=inline", executor="inline").run()
    toy("run_name=ray", executor="ray").run()
    inline, on_ray = toy.run_dir.parent / "inline", toy.run_dir.parent / "ray"
    for stage, tables in {s.name: s.outputs for s in toy_stages.registry().values()}.items():
        for table in tables:
            a = StageDir(inline, stage).read_table(table).sort_by("episode_id")
            assert a.num_rows > 0 and a.equals(StageDir(on_ray, stage).read_table(table).sort_by("episode_id"))
        ma, mb = StageDir(inline, stage).manifest(), StageDir(on_ray, stage).manifest()
        assert ma is not None and mb is not None
        # Only Ray says which node ran a shard; timings differ run to run.
        assert not ma.timings.shards_per_node and sum(mb.timings.shards_per_node.values()) == mb.shards
        assert {**ma.to_json(), "timings": None} == {**mb.to_json(), "timings": None}


# The layout of _manifest.json that artifacts on disk and bench/ read as plain JSON.
MANIFEST_KEYS = {"stage", "fingerprint", "upstream", "code_version", "config_section", "tables", "rows", "errors",
                 "shards", "parts", "llm_usage", "roles", "retry_round", "timings"}
TIMINGS_KEYS = {"finished_at", "started_at", "wall_s", "shard_s", "resumed_shards", "shards_per_node"}


def test_manifest_json_keeps_its_layout_and_round_trips_unchanged(toy):
    toy().run()
    for stage in toy_stages.registry():
        raw = json.loads((toy.run_dir / stage / "_manifest.json").read_text())
        stats = {"counted"} if stage == "count" else set()  # CountTurns.shard_stats, flat beside the fields
        assert set(raw) == MANIFEST_KEYS | stats and set(raw["timings"]) == TIMINGS_KEYS
        manifest = StageDir(toy.run_dir, stage).manifest()
        assert manifest is not None and manifest.to_json() == raw == Manifest.from_json(raw).to_json()
    count = StageDir(toy.run_dir, "count").manifest()
    assert count.stats == {"counted": 5} and count.tables == {"counts": 5} and count.upstream == {
        "ingest": toy().fingerprints()["ingest"]}


def test_a_stage_context_carries_its_finished_upstream_manifests(toy):
    toy().run()
    seen = toy_stages.read_upstream_log()
    assert len(seen) == 5 and {s["stage"] for s in seen} == {"double"}  # one record per episode
    count = StageDir(toy.run_dir, "count").manifest()
    assert all(s["upstream"] == {"count": count.to_json()} for s in seen)  # its inputs only, as published


def test_a_stage_that_asks_gets_its_whole_upstreams_manifests_in_pipeline_order(toy):
    runner = toy()
    Runner(runner.cfg, {**toy_stages.registry(), "whole": toy_stages.WholeUpstream()}).run()
    seen = [s for s in toy_stages.read_upstream_log() if s["stage"] == "whole"]
    assert len(seen) == 5
    published = {n: StageDir(toy.run_dir, n).manifest().to_json() for n in ("ingest", "count", "double")}
    for s in seen:
        assert list(s["upstream"]) == ["ingest", "count", "double"]  # each after the stages it read
        assert s["upstream"] == published
    assert "other" not in seen[0]["upstream"]  # in the run, but not upstream of it


@pytest.mark.heavy(seconds=5)
def test_resume_after_killed_run(toy, toy_dir, tmp_path):
    toy().run(only=["ingest"])
    (toy_dir / "control.json").write_text(json.dumps({"hang_on": "ep04"}))
    proc = driver_on_session_ray(tmp_path, f"""
        import toy_stages
        from pipeline.config import load_config
        from pipeline.engine.runner import Runner
        cfg = load_config(None, ["artifacts_dir={tmp_path / 'artifacts'}", "corpus.path={toy.corpus}",
                                 "ray.episodes_per_shard=2"], toy_stages.config_model())
        Runner(cfg, toy_stages.registry()).run(only=["count"])
    """)
    sd = StageDir(toy.run_dir, "count")
    deadline = time.time() + 120
    while time.time() < deadline and len(sd.finished_shards()) < 2:
        time.sleep(0.5)
    assert len(sd.finished_shards()) == 2, (tmp_path / "driver.log").read_text()[-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert sd.manifest() is None  # nothing looks finished
    assert {s.name: s.state for s in toy().status()}["count"] == "partial"

    (toy_dir / "control.json").unlink()
    n = len(work())
    toy().run(only=["count"])
    redone = [line.split()[1] for line in work()[n:]]
    assert redone == ["ep04"]  # only the unfinished shard
    m = sd.manifest()
    assert m.rows == 5 and m.timings.resumed_shards == 2
    uninterrupted = toy("run_name=fresh")
    uninterrupted.run()
    a = sd.read_table("counts").sort_by("episode_id")
    b = StageDir(toy.run_dir.parent / "fresh", "count").read_table("counts").sort_by("episode_id")
    assert a.equals(b)


def test_each_shard_reads_only_the_upstream_parts_that_hold_its_episodes(toy):
    runner = toy()
    runner.run()
    run_dir = toy.run_dir
    # The global ingest splits its per-episode tables into parts of episodes_per_shard episodes.
    ingest = json.loads((run_dir / "ingest" / "_manifest.json").read_text())
    assert [len(ids) for ids in ingest["parts"].values()] == [2, 2, 1]
    assert sorted(p.name for p in (run_dir / "ingest" / "turns").iterdir()) == [
        "part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    for stage in ("count", "double"):
        for task in runner._shards(runner.registry[stage]):
            for upstream, parts in task.upstream_parts.items():
                layout = StageDir(run_dir, upstream).episode_parts()
                assert parts == sorted({layout[e] for e in task.episode_ids}) and len(parts) == 1
    # and what they read is every row of their episodes
    counts = StageDir(run_dir, "count").read_table("counts").to_pylist()
    assert sorted(r["n_turns"] for r in counts) == [3] * 5
