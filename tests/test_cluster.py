"""Cluster behaviour that fits in the suite: a shard whose worker dies is run again (and a part left
by the dead attempt does not matter), exceptions are not retried, the shared-storage checks.

The two-node run (token auth, `ray job submit`, a worker node killed mid-stage) is
bench/cluster.py; it is too heavy for the suite.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

import toy_stages
from pipeline.artifacts import StageDir, atomic_write_parquet, part_name
from pipeline.engine.execution.cluster import not_shared_message, require_visible, working_dir_warnings
from pipeline.config import load_config
from pipeline.errors import InputError, PipelineError
from pipeline.engine.execution.executors import task_error
from pipeline.engine.runner import Runner
from pipeline.engine.stage import EpisodeStage, StageContext
from toy_stages import COUNTS, ToyIngest, log_work, read_work_log

ROOT = Path(__file__).resolve().parent.parent


def attempts(stage: str, episode: str) -> int:
    """How many times `stage` started `episode` (every attempt logs before it acts)."""
    return read_work_log().count(f"{stage} {episode}")


class DieOnce(EpisodeStage):
    """ep01's first attempt kills its worker process, as a lost node does to its shards."""

    name = "die_once"
    inputs = ("ingest",)
    outputs = {"counts": COUNTS}

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict) -> dict:
        log_work(self.name, episode_id)
        if episode_id == "ep01" and attempts(self.name, episode_id) == 1:
            os._exit(1)
        return {"counts": [{"episode_id": episode_id, "n_turns": len(inputs["ingest.turns"]), "error": None}]}


class BadInput(EpisodeStage):
    """ep02 is bad input (InputError); with `bug` in the control file, a plain exception instead."""

    name = "bad_input"
    inputs = ("ingest",)
    outputs = {"counts": COUNTS}

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict) -> dict:
        log_work(self.name, episode_id)
        if episode_id == "ep02":
            if toy_stages.control().get("bug"):
                raise ValueError("a bug in the stage")
            raise InputError("corpus.txt", episode_id, "turns", "no turns")
        return {"counts": [{"episode_id": episode_id, "n_turns": 1, "error": None}]}


class DieOnceAsking(EpisodeStage):
    """An LLM stage (its shards go to the LLM workers): ep01's first attempt asks the endpoint and
    then kills its worker process."""

    name = "die_once_asking"
    inputs = ("ingest",)
    outputs = {"counts": COUNTS}
    roles = ("toy",)

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict) -> dict:
        log_work(self.name, episode_id)
        answer = await ctx.clients["toy"].chat([{"role": "user", "content": f"count the turns of {episode_id}"}])
        if episode_id == "ep01" and attempts(self.name, episode_id) == 1:
            os._exit(1)
        return {"counts": [{"episode_id": episode_id, "n_turns": len(inputs["ingest.turns"]),
                            "error": None if answer.text else "empty answer"}]}


class LoseWorkerOnce(EpisodeStage):
    """An LLM stage whose worker is gone for good on ep01's first attempt (the actor exits, as when
    its node is lost: Ray does not restart it)."""

    name = "lose_worker_once"
    inputs = ("ingest",)
    outputs = {"counts": COUNTS}
    roles = ("toy",)

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict) -> dict:
        import ray

        log_work(self.name, episode_id)
        if episode_id == "ep01" and attempts(self.name, episode_id) == 1:
            ray.actor.exit_actor()
        return {"counts": [{"episode_id": episode_id, "n_turns": len(inputs["ingest.turns"]), "error": None}]}


class AskOnce(EpisodeStage):
    """An LLM stage with one call per episode: a worker that ran one shard at a time would hold
    one request per shard (episode) in flight."""

    name = "ask_once"
    inputs = ("ingest",)
    outputs = {"counts": COUNTS}
    roles = ("toy",)

    async def process_episode(self, ctx: StageContext, episode_id: str, inputs: dict) -> dict:
        answer = await ctx.clients["toy"].chat([{"role": "user", "content": f"how long is {episode_id}?"}])
        return {"counts": [{"episode_id": episode_id, "n_turns": len(inputs["ingest.turns"]),
                            "error": None if answer.text else "empty answer"}]}


@pytest.fixture
def runner(tmp_path: Path, ray_local, toy_dir: Path):
    (toy_dir / "work.log").unlink(missing_ok=True)
    (toy_dir / "control.json").unlink(missing_ok=True)
    corpus = tmp_path / "n.txt"
    corpus.write_text("5")

    def make(*sets: str) -> Runner:
        cfg = load_config(None, [f"artifacts_dir={tmp_path / 'artifacts'}", f"corpus.path={corpus}",
                                 "ray.episodes_per_shard=2", *sets], toy_stages.config_model())
        return Runner(cfg, {s.name: s for s in [ToyIngest(), DieOnce(), BadInput(), DieOnceAsking(), AskOnce(), LoseWorkerOnce()]})

    yield make
    (toy_dir / "control.json").unlink(missing_ok=True)


def test_shard_whose_worker_dies_is_rerun_over_a_stale_part(runner, tmp_path):
    r = runner("stages=[ingest,die_once]")
    r.run(only=["ingest"])
    # What an attempt that died between its part and its marker leaves: a part with wrong rows,
    # and a temporary file of an unfinished write.
    sd = StageDir(r.run_dir, "die_once")
    sd.open_partial(r.fingerprints()["die_once"])
    stale = pa.Table.from_pylist([{"episode_id": "stale", "n_turns": -1, "error": None}], COUNTS)
    atomic_write_parquet(sd.partial / "counts" / part_name(0), stale)
    (sd.partial / "counts" / f".{part_name(0)}.x.tmp").write_bytes(b"half a parquet file")

    assert r.run(only=["die_once"]) == {"die_once": "ran"}
    assert attempts("die_once", "ep01") == 2  # the dead attempt, then the retry
    assert [attempts("die_once", f"ep{i:02d}") for i in (2, 3, 4)] == [1, 1, 1]
    counts = sd.read_table("counts").sort_by("episode_id").to_pylist()
    assert counts == [{"episode_id": f"ep{i:02d}", "n_turns": 3, "error": None} for i in range(5)]
    assert sd.manifest().rows == 5


def test_an_llm_stage_whose_worker_dies_is_rerun_and_the_next_llm_stage_still_runs(runner, fake_llm, monkeypatch):
    monkeypatch.setenv("MEMPIPE_TEST_KEY", "sk-test-secret-value-123")
    r = runner("stages=[ingest,die_once_asking]", "llm.provider=openai", f"llm.base_url={fake_llm.base_url}",
               "llm.model=fake-model", "llm.api_key_env=MEMPIPE_TEST_KEY", f"llm.cache_dir={fake_llm.cache_dir}")
    assert r.run() == {"ingest": "ran", "die_once_asking": "ran"}
    assert attempts("die_once_asking", "ep01") == 2  # the dead attempt, then the restarted worker's
    # Shards the dead worker held beside ep01's ran again; none was lost or written twice.
    assert all(attempts("die_once_asking", f"ep{i:02d}") in (1, 2) for i in (0, 2, 3, 4))
    counts = StageDir(r.run_dir, "die_once_asking").read_table("counts").sort_by("episode_id").to_pylist()
    assert counts == [{"episode_id": f"ep{i:02d}", "n_turns": 3, "error": None} for i in range(5)]
    assert StageDir(r.run_dir, "die_once_asking").manifest().llm_usage["toy"].failed_calls == 0


def test_a_shard_whose_llm_worker_is_gone_for_good_runs_on_a_new_worker(runner, fake_llm, monkeypatch):
    monkeypatch.setenv("MEMPIPE_TEST_KEY", "sk-test-secret-value-123")
    r = runner("stages=[ingest,lose_worker_once]", "llm.provider=openai", f"llm.base_url={fake_llm.base_url}",
               "llm.model=fake-model", "llm.api_key_env=MEMPIPE_TEST_KEY", f"llm.cache_dir={fake_llm.cache_dir}")
    assert r.run() == {"ingest": "ran", "lose_worker_once": "ran"}
    assert attempts("lose_worker_once", "ep01") == 2
    counts = StageDir(r.run_dir, "lose_worker_once").read_table("counts").sort_by("episode_id").to_pylist()
    assert [c["episode_id"] for c in counts] == [f"ep{i:02d}" for i in range(5)]


def test_llm_workers_run_several_shards_at_once_within_one_cap_per_endpoint(runner, fake_llm, monkeypatch):
    monkeypatch.setenv("MEMPIPE_TEST_KEY", "sk-test-secret-value-123")
    fake_llm.latency_s = 0.6  # long beside a shard's own work: requests sent together overlap
    llm = ["llm.provider=openai", f"llm.base_url={fake_llm.base_url}", "llm.model=fake-model",
           "llm.api_key_env=MEMPIPE_TEST_KEY", "ray.episodes_per_shard=1"]
    # Five one-episode shards on two workers, one request each. One slot for the run: one request
    # at a time over both workers (this run also starts the workers, so the next one's start together).
    one = runner("stages=[ingest,ask_once]", *llm, "llm.max_concurrency=1", "run_name=one_slot",
                 f"llm.cache_dir={fake_llm.cache_dir}-one")
    assert one.run() == {"ingest": "ran", "ask_once": "ran"}
    assert fake_llm.max_in_flight == 1 and fake_llm.count() == 5
    # 4 slots: never passed (a cap per worker lets all 5 go when the workers start together); at
    # least 3 at once, the first worker's shards (a busy machine may start the second one late).
    fake_llm.reset()
    r = runner("stages=[ingest,ask_once]", *llm, "llm.max_concurrency=4", f"llm.cache_dir={fake_llm.cache_dir}")
    assert r.run() == {"ingest": "ran", "ask_once": "ran"}
    assert 3 <= fake_llm.max_in_flight <= 4
    assert StageDir(r.run_dir, "ask_once").manifest().tables == {"counts": 5}


def test_no_retries_configured_fails_the_stage_and_says_why(runner):
    r = runner("stages=[ingest,die_once]", "ray.max_task_retries=0")
    with pytest.raises(PipelineError, match="worker process or node was lost 1 time"):
        r.run()
    assert attempts("die_once", "ep01") == 1
    assert StageDir(r.run_dir, "die_once").manifest() is None
    assert r.run() == {"ingest": "skipped", "die_once": "ran"}  # a rerun resumes, ep01 now lives
    assert attempts("die_once", "ep01") == 2


@pytest.mark.parametrize("bug", [False, True])
def test_exceptions_are_not_retried(runner, toy_dir, bug):
    if bug:
        (toy_dir / "control.json").write_text('{"bug": true}')
    r = runner("stages=[ingest,bad_input]")
    with pytest.raises(PipelineError) as info:
        r.run()
    if bug:
        assert "ValueError: a bug in the stage" in str(info.value)
    else:
        assert isinstance(info.value, InputError) and "record ep02" in str(info.value)
    assert attempts("bad_input", "ep02") == 1
    assert StageDir(r.run_dir, "bad_input").manifest() is None


def test_task_error_unwraps_and_names_lost_workers():
    import ray

    class Wrapped(Exception):
        cause = InputError("f", "r", None, "bad")

    assert isinstance(task_error(Wrapped()), InputError)
    lost = task_error(ray.exceptions.WorkerCrashedError(), retries=3)
    assert isinstance(lost, PipelineError) and "lost 4 time(s)" in str(lost) and "max_task_retries=3" in str(lost)
    other = ValueError("x")
    assert task_error(other) is other


def test_not_shared_storage_message_names_nodes_and_the_fix(tmp_path, monkeypatch):
    msg = not_shared_message("/home/me/artifacts", ["10.0.0.7 (node 1a2b3c4d)"])
    assert "artifacts_dir /home/me/artifacts is not shared storage" in msg
    assert "10.0.0.7 (node 1a2b3c4d)" in msg and "--set artifacts_dir=/shared/artifacts" in msg

    marker = tmp_path / "_shards" / "00003.json"
    monkeypatch.setattr("pipeline.engine.execution.cluster.MARKER_GRACE_S", 0.2)
    with pytest.raises(PipelineError, match="not shared storage: Ray node"):
        require_visible(marker, "ffffeeee0000", str(tmp_path))  # the other node wrote to its own disk
    marker.parent.mkdir()
    marker.write_text("{}")
    require_visible(marker, "ffffeeee0000", str(tmp_path))


def test_paths_inside_a_submitted_jobs_working_dir_are_flagged(tmp_path):
    wd = tmp_path / "_ray_pkg_0123"
    inside = load_config(None, [f"artifacts_dir={wd / 'artifacts'}", f"llm.cache_dir={wd / '.cache/llm'}"],
                         toy_stages.config_model())
    warnings = working_dir_warnings(inside, wd)
    assert len(warnings) == 2
    assert "artifacts_dir" in warnings[0] and "--set artifacts_dir=/shared/artifacts" in warnings[0]
    assert "llm.cache_dir" in warnings[1] and "--set llm.cache_dir=" in warnings[1]
    outside = load_config(None, [f"artifacts_dir={tmp_path / 'shared'}", f"llm.cache_dir={tmp_path / 'cache'}"],
                          toy_stages.config_model())
    assert working_dir_warnings(outside, wd) == []


def test_single_node_run_passes_the_storage_check(runner):
    """One node: nothing to probe; the check must not slow down or break ordinary runs."""
    from pipeline.engine.execution.cluster import check_cluster_paths

    check_cluster_paths(runner().cfg)


def test_storage_probe_runs_on_the_given_nodes(runner, tmp_path):
    """The probe task itself (on a multi-node cluster it runs once per other node): this node sees
    the file, and the probe file is removed afterwards."""
    import ray

    from pipeline.engine.execution.cluster import nodes_not_seeing

    node = [n for n in ray.nodes() if n["NodeID"] == ray.get_runtime_context().get_node_id()]
    assert nodes_not_seeing(tmp_path / "artifacts", node) == []
    assert list((tmp_path / "artifacts").iterdir()) == []


def test_checkout_and_its_uploaded_copy_give_the_same_fingerprints(tmp_path, monkeypatch):
    """`ray job submit --working-dir .` runs the driver in a copy of the checkout on the head; relative
    paths (corpus.path: data/sample) resolve inside it. `mempipe status` in the checkout must compute
    the same fingerprints, or it calls the submitted run stale."""
    import shutil

    import stages
    from pipeline.config import resolve_paths

    copy = tmp_path / "runtime_resources" / "working_dir_files" / "_ray_pkg_0123"
    for d in ("configs", "data"):
        shutil.copytree(ROOT / d, copy / d)

    def fingerprints(where: Path) -> dict[str, str]:
        monkeypatch.chdir(where)
        cfg = resolve_paths(stages.load_config("configs/default.yaml", [f"artifacts_dir={tmp_path / 'a'}"]))
        return Runner(cfg, stages.registry(cfg)).fingerprints()

    assert fingerprints(copy) == fingerprints(ROOT)


def test_readme_cluster_commands_are_the_ones_the_bench_runs():
    """bench/cluster.py runs docs/cluster.md's `ray job submit` line; both must stay what a user needs."""
    import importlib.util
    import sys

    import yaml

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("bench_cluster", ROOT / "bench" / "cluster.py")
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    argv = bench.readme_submit()
    assert argv[:10] == ["ray", "job", "submit", "--address", "http://<head>:8265", "--working-dir", ".", "--",
                         "mempipe", "run"]
    sets = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--set")
    assert sets["artifacts_dir"].startswith("/") and sets["llm.cache_dir"].startswith("/")  # not in the upload
    block = bench.readme_block()
    for line in ("ray get-auth-token --generate", "export RAY_AUTH_MODE=token", "export MALLOC_ARENA_MAX=1",
                 "ray start --head", "ray start --address=<head>:6379"):
        assert line in block
    launcher = yaml.safe_load((ROOT / "ray_cluster.yaml").read_text())
    assert launcher["file_mounts"] == {"~/.ray/auth_token": "~/.ray/auth_token"}
    for cmd in (launcher["head_start_ray_commands"][-1], launcher["worker_start_ray_commands"][-1]):
        assert cmd.startswith("RAY_AUTH_MODE=token MALLOC_ARENA_MAX=1 ray start")  # the local workers' arena too


@pytest.mark.heavy(seconds=14)
def test_a_local_ray_instance_gives_its_workers_one_malloc_arena_and_this_checkout(tmp_path):
    """`ray_session` on a new local instance (a fresh process: this one may hold the tests' Ray)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    script = (
        "import os, ray\n"
        "from pipeline.config import load_config\n"
        "from pipeline.engine.execution.executors import ray_session\n"
        f"cfg = load_config(None, ['artifacts_dir={tmp_path}', 'ray.num_cpus=1'])\n"
        "with ray_session(cfg):\n"
        "    env = ray.get(ray.remote(lambda: (os.environ.get('MALLOC_ARENA_MAX'), os.environ.get('PYTHONPATH', ''))).remote())\n"
        "print(env[0], env[1])\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr[-2000:]
    arenas, path = out.stdout.split()[-2:]
    assert arenas == "1" and str(root) in path.split(os.pathsep)


@pytest.mark.heavy(seconds=22)
def test_workers_embed_through_their_nodes_one_model(ray_local, run_cfg, tmp_path):
    """The Ray executor's embedding service: one model per node, which a worker's stage context
    uses (the vectors of a model of its own) without importing sentence-transformers itself."""
    import ray

    from pipeline.engine.execution.embedding_service import EmbeddingServices, service_name
    from pipeline.embeddings import LocalEmbedder

    # The tests' embedding settings: the session's other Ray runs may have started this service
    # already (a model load in a process of its own saved), which is what a later stage finds too.
    cfg = run_cfg()
    EmbeddingServices.ensure(cfg)
    EmbeddingServices.ensure(cfg)  # a second stage: the same service
    texts = ["Ann's dog barks at night", "Bob sold his bike", "the dog is old"]

    def in_a_worker(cfg, texts):
        import asyncio
        import sys

        from pipeline.engine.execution.embedding_service import node_embedder
        from stages.methods.secom.stages.banks import BanksStage

        # What the Ray executor hands its shards' contexts (pipeline.engine.execution.executors).
        ctx = StageContext(cfg=cfg, stage=BanksStage(), out_dir=Path("."), embedder_factory=node_embedder)
        vectors = asyncio.run(ctx.lazy_embed()(texts))
        return type(ctx.embedder).__name__, vectors, "sentence_transformers" in sys.modules

    # A process of its own: a reused worker may have loaded the model for an earlier test's inline code.
    fresh = {"env_vars": {**ray.get_runtime_context().runtime_env.get("env_vars", {}), "MEMPIPE_FRESH": tmp_path.name}}
    kind, vectors, loaded_here = ray.get(ray.remote(in_a_worker).options(runtime_env=fresh).remote(cfg, texts))
    assert kind == "ServiceEmbedder" and not loaded_here
    direct = LocalEmbedder(cfg.embedding).encode(texts)
    assert vectors.shape == direct.shape and float(abs(vectors - direct).max()) < 1e-5
    job = ray.get_runtime_context().get_job_id()
    mine = {service_name(job, n["NodeID"], cfg.embedding) for n in ray.nodes() if n["Alive"]}
    assert mine <= set(ray.util.list_named_actors())  # one per node, by name
