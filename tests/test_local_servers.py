"""The embedded default uses every core: `llm.local.servers` single-thread llama.cpp servers behind
one endpoint identity, the role's cap the servers, each request sent to the least busy server;
answers, cache keys and fingerprints as with one server; every server stopped at the end."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from pipeline.config import LLMConfig, LocalServerConfig, RunConfig
from pipeline.llm.cache import DiskCallCache
from pipeline.llm.client import LLMClient
from pipeline.llm.identity import answer_identity
from pipeline.llm.local_server import LocalLLMServer, LocalLLMServers
from pipeline.llm.slots import EndpointSlots, ServerPicker, SlotPoolService, shared_start
from pipeline.testing.fake_openai import FakeOpenAI

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fakes() -> Iterator[list[FakeOpenAI]]:
    """Two fake servers standing in for two embedded llama.cpp servers (0.3 s an answer)."""
    servers = [FakeOpenAI(latency_s=0.3).start() for _ in range(2)]
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


def local_role(urls: list[str], **llm: Any) -> LLMConfig:
    """A local role's config once the runner started `urls` for it (RunConfig.set_local_url)."""
    cfg = RunConfig(llm=LLMConfig(provider="local", model="fake-model", max_concurrency=8, **llm))
    cfg.set_local_url(cfg.llm, urls)
    return cfg.role("generator")


def ask(cfg: LLMConfig, prompts: list[str], at_once: bool, cache: DiskCallCache | None = None) -> list[str]:
    async def go() -> list[str]:
        client = LLMClient(cfg, cache=cache)
        try:
            if at_once:
                results = await asyncio.gather(*(client.chat([{"role": "user", "content": p}]) for p in prompts))
            else:
                results = [await client.chat([{"role": "user", "content": p}]) for p in prompts]
            return [r.text for r in results]
        finally:
            await client.aclose()

    return asyncio.run(asyncio.wait_for(go(), 60))


def test_a_local_role_with_two_servers_has_one_identity_and_a_cap_of_two() -> None:
    role = local_role(["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"])
    assert role.max_concurrency == 2 and role.base_url == "http://127.0.0.1:1/v1"
    assert role.server_urls == ("http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1")
    assert EndpointSlots.for_role(role).servers == 2


def test_two_requests_at_once_go_to_two_servers_and_none_holds_two(fakes: list[FakeOpenAI]) -> None:
    role = local_role([f.base_url for f in fakes])
    ask(role, ["a", "b"], at_once=True)
    assert [f.count() for f in fakes] == [1, 1]
    ask(role, [f"q{i}" for i in range(6)], at_once=True)
    assert [f.count() for f in fakes] == [4, 4] and [f.max_in_flight for f in fakes] == [1, 1]


def test_requests_one_at_a_time_keep_to_the_first_server(fakes: list[FakeOpenAI]) -> None:
    """The first server's prompt cache keeps the previous request's prefix, as with one server."""
    ask(local_role([f.base_url for f in fakes]), ["a", "b", "c"], at_once=False)
    assert [f.count() for f in fakes] == [3, 0]


def test_cache_keys_and_fingerprints_do_not_change_with_the_servers(fakes: list[FakeOpenAI], tmp_path: Path) -> None:
    prompts = ["a", "b", "c"]
    one, two = local_role([fakes[0].base_url]), local_role([f.base_url for f in fakes])
    assert answer_identity(one) == answer_identity(two)
    first = ask(one, prompts, at_once=True, cache=DiskCallCache(tmp_path / "cache"))
    fakes[0].reset()
    # Every answer of the one-server run is found by the two-server run: nothing is sent.
    assert ask(two, prompts, at_once=True, cache=DiskCallCache(tmp_path / "cache")) == first
    assert [f.count() for f in fakes] == [0, 0]

    from pipeline.engine.fingerprint import stage_fingerprints
    from stages import load_config, registry

    cfg = load_config(ROOT / "configs" / "default.yaml")
    before = stage_fingerprints(cfg, registry(cfg).values())
    cfg.set_local_url(cfg.llm, ["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"])
    assert stage_fingerprints(cfg, registry(cfg).values()) == before


def test_on_ray_the_runs_slot_pool_spreads_the_requests(fakes: list[FakeOpenAI], ray_local) -> None:
    import uuid

    from pipeline.llm.slots import start_slot_pool

    role = local_role([f.base_url for f in fakes])
    handle = start_slot_pool(role, f"test-{uuid.uuid4().hex[:8]}")
    try:
        async def go() -> None:
            client = LLMClient(role, cache=None, slots=EndpointSlots.for_role(role, handle))
            try:
                await asyncio.gather(*(client.chat([{"role": "user", "content": f"q{i}"}]) for i in range(4)))
            finally:
                await client.aclose()

        asyncio.run(asyncio.wait_for(go(), 60))
        assert [f.count() for f in fakes] == [2, 2] and [f.max_in_flight for f in fakes] == [1, 1]
    finally:
        handle.close()


def test_the_pool_picks_the_least_busy_server_for_every_worker() -> None:
    """The run's slot pool (one per endpoint, shared by every LLM worker) picks for all of them."""
    pool = SlotPoolService(cap=3, servers=3)
    picks = [pool.take_server() for _ in range(3)]
    assert sorted(picks) == [0, 1, 2]
    pool.give_server(1)
    assert pool.take_server() == 1
    picker = ServerPicker(2)
    assert [picker.take(), picker.take(), picker.take()] == [0, 1, 0]  # past the cap: still spread


def test_an_idle_server_that_read_the_prompts_start_gets_it() -> None:
    """Prefix affinity: of the idle servers, the one that lately read the longest start of the
    prompt (its prompt cache skips that part); never a busy server while another is idle."""
    picker = ServerPicker(2)
    judge, reply = "system: judge these answers. Past: " + "x" * 500, "system: reply in one turn. " + "y" * 500
    assert picker.take(judge + " A") == 0
    assert picker.take(reply + " 1") == 1  # server 0 busy: the idle one, whatever it read
    picker.give(0), picker.give(1)
    assert picker.take(reply + " 2") == 1 and picker.take(judge + " B") == 0  # each to its own prefix
    picker.give(0), picker.give(1)
    assert picker.take("unrelated") == 0  # nothing shared: the first idle one
    assert picker.take(judge + " C") == 1  # server 0 busy: not queued behind it
    assert shared_start("abcdef", "abcxyz") == 3 and shared_start("", "a") == 0 and shared_start("ab", "ab") == 2


def test_one_server_per_core_with_one_thread_each_by_default() -> None:
    local = LocalServerConfig()
    cores = len(os.sched_getaffinity(0))
    assert local.server_count() == cores and local.threads_per_server() == 1
    assert LocalServerConfig(servers=1).threads_per_server() == cores


# --------------------------------------------------------------------- the real embedded servers

def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_every_server_stops_when_the_block_raises(tmp_path: Path) -> None:
    servers = LocalLLMServers(LLMConfig(local=LocalServerConfig(n_ctx=512, servers=2, n_threads=1)),
                              log_path=tmp_path / "llm-server.log")
    with pytest.raises(RuntimeError, match="boom"):
        with servers as urls:
            pids = [s.pid for s in servers.servers]
            assert len(set(urls)) == 2 and all(pids)
            raise RuntimeError("boom")
    assert all(_gone(pid) for pid in pids)
    assert (tmp_path / "llm-server.log").exists() and (tmp_path / "llm-server.1.log").exists()


def test_a_server_that_fails_to_start_stops_the_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[LocalLLMServer] = []
    real_start = LocalLLMServer.start

    def start(self: LocalLLMServer) -> str:
        if self.log_path is not None and self.log_path.name == "llm-server.1.log":
            raise RuntimeError("no room for the second server")
        started.append(self)
        return real_start(self)

    monkeypatch.setattr(LocalLLMServer, "start", start)
    servers = LocalLLMServers(LLMConfig(local=LocalServerConfig(n_ctx=512, servers=2, n_threads=1)),
                              log_path=tmp_path / "llm-server.log")
    with pytest.raises(RuntimeError, match="no room"):
        servers.start()
    assert started and not any(s.running for s in servers.servers)


@pytest.mark.heavy(seconds=20)
def test_two_single_thread_servers_answer_as_one_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Temperature 0 and a seed: the same text from two servers as from one, byte for byte, plain
    and structured (the grammar path), with the requests spread over both."""
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    picked: list[int] = []
    take = ServerPicker.take
    monkeypatch.setattr(ServerPicker, "take", lambda self, prompt="": picked.append(take(self, prompt)) or picked[-1])
    llm = dict(model="SmolLM2-135M-Instruct", temperature=0.0, seed=0, max_tokens=24, structured_retries=0)

    def answers(servers: int) -> list[str]:
        cfg = RunConfig(llm=LLMConfig(provider="local", **llm,
                                      local=LocalServerConfig(n_ctx=1024, servers=servers, n_threads=1)))
        with LocalLLMServers(cfg.llm, log_path=tmp_path / f"n{servers}" / "llm-server.log") as urls:
            cfg.set_local_url(cfg.llm, urls)
            role = cfg.role("generator")

            async def go() -> list[str]:
                client = LLMClient(role, cache=None)
                try:
                    msgs = [[{"role": "user", "content": q}] for q in ("Name one fruit.", "Say hello to Bob.")]
                    plain = [client.chat(m) for m in msgs]
                    person = client.chat([{"role": "user", "content": "Alice is 30. Reply as JSON."}], schema=Person)
                    results = await asyncio.gather(*plain, person, return_exceptions=True)
                    # The 135M model may write invalid JSON: the error (with its text) must match too.
                    return [getattr(r, "text", None) or f"{type(r).__name__}: {r}" for r in results]
                finally:
                    await client.aclose()

            return asyncio.run(asyncio.wait_for(go(), 240))

    one = answers(1)
    assert not picked  # one server: nothing to pick
    two = answers(2)
    assert sorted(set(picked)) == [0, 1]  # both servers answered
    print("one server:", one, "\ntwo servers:", two)
    assert two == one and all(one)
