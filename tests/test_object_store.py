"""Artifacts on an S3-compatible object store (moto's server on 127.0.0.1): the same stage layout,
manifest-last publishing and resume as on a folder, and status / report / export reading from it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

import toy_stages
from conftest import driver_on_session_ray
from pipeline import storage
from pipeline.artifacts import StageDir
from pipeline.config import load_config
from pipeline.engine.runner import Runner

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
BUCKET = "mempipe-test"
pytestmark = pytest.mark.heavy  # one moto server for the module; runs on Ray


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_env(tmp_path_factory) -> Iterator[dict[str, str]]:
    """A moto S3 server on 127.0.0.1 with one bucket; the environment every S3 client reads."""
    port = _free_port()
    log = (tmp_path_factory.mktemp("moto") / "moto.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=log, stderr=subprocess.STDOUT)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ALLOW_HTTP": "true", "AWS_EC2_METADATA_DISABLED": "true"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.2)
        import boto3

        boto3.client("s3").create_bucket(Bucket=BUCKET)
        storage._filesystem.cache_clear()  # pick up this endpoint
        yield env
    finally:
        server.terminate()
        server.wait(timeout=30)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        storage._filesystem.cache_clear()


def _keys(prefix: str) -> list[str]:
    return [u.split(f"s3://{BUCKET}/", 1)[1] for u in storage.list_files(f"s3://{BUCKET}/{prefix}", recursive=True)]


@pytest.fixture
def toy_s3(s3_env, toy_dir: Path, tmp_path: Path, request):
    for name in ("work.log", "control.json", "upstream.log"):
        (toy_dir / name).unlink(missing_ok=True)
    corpus = tmp_path / "n.txt"
    corpus.write_text("5")
    artifacts = f"s3://{BUCKET}/{request.node.name}"

    def make(*sets: str) -> Runner:
        cfg = load_config(None, [f"artifacts_dir={artifacts}", f"corpus.path={corpus}", "ray.episodes_per_shard=2",
                                 "ray.executor=inline", *sets], toy_stages.config_model())
        return Runner(cfg, toy_stages.registry())

    make.corpus, make.artifacts = corpus, artifacts  # type: ignore[attr-defined]
    return make


def test_a_run_on_s3_publishes_every_stage_there_and_a_second_run_does_nothing(toy_s3, tmp_path):
    runner = toy_s3()
    assert runner.run() == {"ingest": "ran", "count": "ran", "double": "ran", "other": "ran"}
    run = f"{toy_s3.artifacts}/default"
    assert runner.cfg.run_dir == run  # a URI, not a local path
    keys = _keys(run.split(f"s3://{BUCKET}/", 1)[1])
    assert "test_a_run_on_s3_publishes_every_stage_there_and_a_second_run_does_nothing/default/count/_manifest.json" \
        in keys
    assert not any(".partial" in k or "_shards" in k or "_fingerprint" in k for k in keys)  # published, cleaned
    sd = StageDir(run, "count")
    m = sd.manifest()
    assert m.rows == 5 and m.shards == 3
    assert sorted(r["n_turns"] for r in sd.read_table("counts").to_pylist()) == [3] * 5
    # A shard reads only its parts from the store as well.
    assert sd.read_table("counts", ["ep01"]).column("episode_id").to_pylist() == ["ep01"]
    assert {s.name: s.state for s in toy_s3().status()} == dict.fromkeys(["ingest", "count", "double", "other"], "done")
    n = len(toy_stages.read_work_log())
    assert set(toy_s3().run().values()) == {"skipped"}
    assert len(toy_stages.read_work_log()) == n
    assert not (tmp_path / "artifacts").exists() and not Path("s3:").exists()  # nothing landed locally

    from pipeline.export import export_stage

    out = export_stage(sd, tmp_path / "export")
    assert (out / "counts.parquet").exists() and "5 rows" in (out / "README.md").read_text()


def test_republishing_a_changed_stage_replaces_its_objects(toy_s3):
    toy_s3().run()
    run = f"{toy_s3.artifacts}/default"
    before = set(_keys(run.split(f"s3://{BUCKET}/", 1)[1] + "/count"))
    toy_s3.corpus.write_text("2")  # fewer episodes: fewer parts; the old ones must not linger
    toy_s3().run()
    after = set(_keys(run.split(f"s3://{BUCKET}/", 1)[1] + "/count"))
    assert len([k for k in after if "part-" in k]) == 1 and len([k for k in before if "part-" in k]) == 3
    assert StageDir(run, "count").read_table("counts").num_rows == 2


def test_a_killed_run_on_s3_resumes_from_its_finished_shards(toy_s3, toy_dir, tmp_path, s3_env, ray_local):
    toy_s3().run(only=["ingest"])
    (toy_dir / "control.json").write_text(json.dumps({"hang_on": "ep04"}))
    # The killed driver runs on Ray (a job on this session's cluster), so workers write the shards to S3.
    proc = driver_on_session_ray(tmp_path, f"""
        import toy_stages
        from pipeline.config import load_config
        from pipeline.engine.runner import Runner
        cfg = load_config(None, ["artifacts_dir={toy_s3.artifacts}", "corpus.path={toy_s3.corpus}",
                                 "ray.episodes_per_shard=2"], toy_stages.config_model())
        Runner(cfg, toy_stages.registry()).run(only=["count"])
    """, s3_env)
    sd = StageDir(f"{toy_s3.artifacts}/default", "count")
    deadline = time.time() + 180
    while time.time() < deadline and len(sd.finished_shards()) < 2:
        time.sleep(0.5)
    assert len(sd.finished_shards()) == 2, (tmp_path / "driver.log").read_text()[-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert sd.manifest() is None  # nothing looks finished
    assert {s.name: s.state for s in toy_s3().status()}["count"] == "partial"

    (toy_dir / "control.json").unlink()
    n = len(toy_stages.read_work_log())
    toy_s3().run(only=["count"])
    assert [line.split()[1] for line in toy_stages.read_work_log()[n:]] == ["ep04"]  # only the unfinished shard
    m = sd.manifest()
    assert m.rows == 5 and m.timings.resumed_shards == 2


def test_a_crash_while_publishing_leaves_no_finished_stage_and_the_next_run_publishes(toy_s3, monkeypatch):
    toy_s3().run()
    run = f"{toy_s3.artifacts}/default"
    toy_s3.corpus.write_text("3")
    real_copy = storage.copy_tree

    def crash_midway(src: str, dst: str, skip=()) -> None:
        if dst.endswith("/count"):
            raise KeyboardInterrupt("killed while publishing")
        real_copy(src, dst, skip)

    monkeypatch.setattr(storage, "copy_tree", crash_midway)
    with pytest.raises(KeyboardInterrupt):
        toy_s3().run()
    sd = StageDir(run, "count")
    assert sd.manifest() is None  # the old stage stopped being finished before its objects went
    assert len(sd.finished_shards()) == 2  # the new shards wait to be published
    monkeypatch.setattr(storage, "copy_tree", real_copy)
    n = len(toy_stages.read_work_log())
    toy_s3().run()
    assert not [line for line in toy_stages.read_work_log()[n:] if line.startswith("count ")]  # nothing redone
    assert sd.manifest().rows == 3 and sd.read_table("counts").num_rows == 3


def test_the_pipeline_on_s3_writes_lance_banks_and_a_report_the_cli_reads(s3_env, run_cfg, tmp_path, capsys):
    """Real stages: the banks' Lance tables open with lancedb straight from the bucket, and
    `mempipe status / report / export` read the run from it."""
    from pipeline.lance_store import open_bank
    from stages import registry
    from stages.cli import main
    from stages.methods.secom.stages.banks import LANCE_DIR, bank_name

    sets = ["artifacts_dir=s3://mempipe-test/pipeline", "ray.executor=inline", "corpus.limit=1",
            "compress.method=none", "methods=[secom,full_history]", "judge_memory.enabled=false"]
    cfg = run_cfg(*sets)
    assert set(Runner(cfg, registry(cfg)).run().values()) == {"ran"}
    run = cfg.run_dir
    units = StageDir(run, "banks").read_table("memory_units").to_pylist()
    bank = open_bank(f"{run}/banks/{LANCE_DIR}", bank_name(units[0]["episode_id"], units[0]["granularity"]))
    assert bank.count_rows() == sum(u["granularity"] == units[0]["granularity"] and
                                    u["episode_id"] == units[0]["episode_id"] for u in units)

    args = [a for s in sets for a in ("--set", s)] + ["--set", f"corpus.path={cfg.corpus.path}"]
    config = str(ROOT / "configs" / "default.yaml")
    assert main(["status", "-c", config, *args]) == 0
    status = capsys.readouterr().out
    assert f"run default at {run}" in status and "report" in status and " done " in status
    local = tmp_path / "reports"
    assert main(["report", "-c", config, *args, "--out", str(local)]) == 0
    out = capsys.readouterr().out
    assert f"report: {local / 'report.html'}" in out
    assert "<html" in (local / "report.html").read_text().lower() and (local / "report.md").exists()
    assert main(["export", "probes", "-c", config, *args, "--out", str(tmp_path / "probes")]) == 0
    assert (tmp_path / "probes" / "probes.parquet").exists()
