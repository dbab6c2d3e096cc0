"""What an endpoint refuses is an answer, not an outage: a rejected parameter is recognised by what the
server says (OpenAI's 400, FastAPI's 422, llama-cpp-python's 500 validation error), the role steps
down after one rejected request however many are in flight, and the breaker opens only on failures
a plain request would meet too (and then lets few requests into an outage)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import pipeline.llm.breaker as breaker
import pipeline.llm.params as params_module
from conftest import llm_config, session_ray
from pipeline.testing.fake_openai import FakeOpenAI
from pipeline.config import LLMConfig
from pipeline.llm import DiskCallCache, LLMClient, LLMError, LLMResult, LocalRateLimiter
from pipeline.llm.ledger import Budget, LedgerBook, RunLedger, StageTally
from pipeline.llm.transport import RequestRejected, rejected_param

SHAPES = ["openai400", "fastapi422", "llama500"]
LLAMA_500 = ("1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
             "'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema', 'ctx': "
             "{'expected': \"'text' or 'json_object'\"}}\n\n  File \"llama_cpp/server/app.py\", line 376, in "
             "create_chat_completion\n    POST /v1/chat/completions")


class Answer(BaseModel):
    answer: str
    n: int


def msgs(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def run(coro: Any, timeout: float = 60) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def client_for(server: FakeOpenAI, *, cache: bool = True, ledger: RunLedger | None = None, role: str = "judge",
               **overrides: Any) -> LLMClient:
    cfg = llm_config(server, **overrides)
    tally = StageTally(ledger, "stage", role) if ledger is not None else None
    return LLMClient(cfg, cache=DiskCallCache(cfg.cache_dir) if cache else None,
                     limiter=LocalRateLimiter(cfg.rpm, cfg.tpm), tally=tally, section=role)


def new_ledger() -> RunLedger:
    return RunLedger.local(LedgerBook(Budget()))


# ------------------------------------------------------------------ recognising a rejection


def test_a_rejection_is_recognised_by_the_parameter_the_body_names_whatever_the_status() -> None:
    assert rejected_param(500, {"error": {"message": LLAMA_500, "param": None}}, LLAMA_500) == "response_format"
    assert rejected_param(422, {"detail": [{"loc": ["body", "response_format", "type"], "msg": "x"}]},
                          "Error code: 422") == "response_format"
    assert rejected_param(400, {"error": {"param": "response_format", "message": "Invalid parameter"}},
                          "Invalid parameter") == "response_format"
    assert rejected_param(400, None, "Invalid parameter: 'response_format' of type 'json_schema' is not "
                                     "supported with this model.") == "response_format"
    assert rejected_param(400, {"error": {"param": "seed", "message": "Unsupported parameter"}}, "") == "seed"
    assert rejected_param(422, {"detail": [{"loc": ["body", "n"], "msg": "Input should be a valid integer"}]},
                          "") == "n"
    assert rejected_param(500, None, "1 validation error: {'type': 'int_parsing', 'loc': ('body', 'seed'), "
                                     "'msg': 'Input should be a valid integer'}") == "seed"


def test_a_bare_server_error_or_a_rate_limit_is_no_rejection() -> None:
    assert rejected_param(500, {"error": {"message": "fake internal error"}}, "fake internal error") is None
    # A traceback that mentions the parameter in passing is an outage like any other 500.
    assert rejected_param(500, None, "Traceback: response_format grammar compile failed") is None
    assert rejected_param(503, None, "response_format") is None
    assert rejected_param(429, {"error": {"param": "response_format"}}, "rate limit") is None
    assert rejected_param(400, None, "fake bad request") is None


# ------------------------------------------------------------------ one rejected request per role


@pytest.mark.parametrize("shape", SHAPES)
def test_twenty_concurrent_structured_calls_cost_one_rejected_request_and_step_down(fake_llm: FakeOpenAI,
                                                                                     shape: str) -> None:
    fake_llm.reject_formats, fake_llm.reject_shape, fake_llm.latency_s = {"json_schema"}, shape, 0.05
    client = client_for(fake_llm)

    async def go() -> list[Any]:
        return await asyncio.gather(*(client.chat(msgs(f"q{i}"), schema=Answer) for i in range(20)))

    results = run(go())
    assert all(isinstance(r.parsed, Answer) for r in results)
    assert fake_llm.rejected == {"response_format": 1} and fake_llm.count() == 21
    assert client.usage.structured_modes == {"json_object": 20} and client.usage.retries == 0
    assert client.usage.failed_calls == 0 and "json_schema" in client.usage.structured_fallbacks["json_object"]
    # Remembered for later runs: a new client on the same cache sends json_object at once.
    run(client_for(fake_llm).chat(msgs("later"), schema=Answer))
    assert fake_llm.rejected == {"response_format": 1}
    assert fake_llm.requests[-1]["body"]["response_format"] == {"type": "json_object"}


def test_workers_sharing_the_run_ledger_send_one_rejected_request_between_them(fake_llm: FakeOpenAI) -> None:
    """Two workers (two event loops, no shared cache) learn the mode from one scout through the ledger."""
    fake_llm.reject_formats, fake_llm.reject_shape, fake_llm.latency_s = {"json_schema"}, "llama500", 0.1
    ledger = new_ledger()
    out: dict[int, Any] = {}

    def worker(w: int) -> None:
        client = client_for(fake_llm, cache=False, ledger=ledger)

        async def go() -> list[Any]:
            return await asyncio.gather(*(client.chat(msgs(f"w{w} q{i}"), schema=Answer) for i in range(10)))

        out[w] = (run(go()), client.usage)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r.parsed, Answer) for w in out for r in out[w][0])
    assert fake_llm.rejected == {"response_format": 1} and fake_llm.count() == 21
    assert [out[w][1].structured_modes for w in range(2)] == [{"json_object": 10}] * 2
    decided = ledger.modes.ref.service.decided
    assert decided and {m for m, _ in decided.values()} == {"json_object"}


@pytest.mark.parametrize("where", ["inline", pytest.param("actor", marks=pytest.mark.session_ray)])
def test_the_ledger_gives_one_scout_the_decision_and_everyone_the_mode_it_publishes(where, request) -> None:
    if where == "actor":
        session_ray(request)
        ledger = RunLedger.start(LedgerBook(Budget()), f"modes-{os.getpid()}")
    else:
        ledger = new_ledger()

    async def go() -> list[Any]:
        key = "http://e/v1 m"
        first, second = await ledger.modes.claim(key), await ledger.modes.claim(key)
        ledger.modes.release(key)  # the scout's request failed: the next to ask decides
        third = await ledger.modes.claim(key)
        await ledger.modes.publish(key, "json_object", "rejected json_schema")
        return [first, second, third, await ledger.modes.claim(key), await ledger.modes.claim("http://e/v1 other")]

    try:
        assert run(go()) == [("scout", "", ""), ("wait", "", ""), ("scout", "", ""),
                             ("decided", "json_object", "rejected json_schema"), ("scout", "", "")]
    finally:
        if where == "actor":
            ledger.close()


def test_a_scout_whose_request_fails_hands_the_decision_to_the_next_request(fake_llm: FakeOpenAI) -> None:
    fake_llm.reject_formats = {"json_schema"}
    fake_llm.force = ["500"]  # the scout's request fails for good (no retries): no mode decided
    client = client_for(fake_llm, max_retries=0)

    async def go() -> list[Any]:
        return await asyncio.gather(*(client.chat(msgs(f"q{i}"), schema=Answer) for i in range(5)),
                                    return_exceptions=True)

    results = run(go())
    assert sum(isinstance(r, LLMError) for r in results) == 1
    assert sum(getattr(r, "parsed", None) is not None for r in results) == 4
    assert fake_llm.rejected == {"response_format": 1}  # the next scout was rejected once, then json_object


def test_an_endpoint_that_takes_json_schema_gets_it_from_every_request(fake_llm: FakeOpenAI) -> None:
    client = client_for(fake_llm)

    async def go() -> list[Any]:
        return await asyncio.gather(*(client.chat(msgs(f"q{i}"), schema=Answer) for i in range(10)))

    assert all(isinstance(r.parsed, Answer) for r in run(go()))
    kinds = {r["body"]["response_format"]["type"] for r in fake_llm.requests}
    assert kinds == {"json_schema"} and fake_llm.count() == 10 and client.usage.structured_fallbacks == {}


# ------------------------------------------------------------------ a rejection is never an outage


def test_a_500_validation_rejection_is_not_retried_and_never_opens_the_breaker(fake_llm: FakeOpenAI) -> None:
    fake_llm.reject_formats, fake_llm.reject_shape = {"json_schema"}, "llama500"
    ledger = new_ledger()
    client = client_for(fake_llm, ledger=ledger, structured_mode="json_schema")  # a fixed mode: every call refused

    async def go() -> list[Any]:
        return await asyncio.gather(*(client.chat(msgs(f"q{i}"), schema=Answer) for i in range(12)),
                                    return_exceptions=True)

    results = run(go())
    assert all(isinstance(r, RequestRejected) and r.status == 500 and r.param == "response_format" for r in results)
    assert fake_llm.count() == 12 and client.usage.retries == 0  # each refused once, none sent again
    health = ledger.book.service.health.get(client.endpoint)
    assert health is None or (not health.down and health.failures == 0)
    assert not ledger.snapshot()["down"]


def test_a_bare_500_still_counts_as_an_outage(fake_llm: FakeOpenAI) -> None:
    """The control for the test above: the same number of plain 500s does open the breaker."""
    fake_llm.faults = {"500": 1.0}
    ledger = new_ledger()
    client = client_for(fake_llm, ledger=ledger, max_retries=0, max_outage_s=0.5)

    async def go() -> list[Any]:
        return await asyncio.gather(*(client.chat(msgs(f"q{i}")) for i in range(12)), return_exceptions=True)

    run(go())
    assert ledger.book.service.health[client.endpoint].failures >= breaker.OPEN_AFTER_FAILURES
    assert ledger.book.service.health[client.endpoint].outages or ledger.book.service.health[client.endpoint].down


@pytest.mark.parametrize("shape", SHAPES)
def test_a_refused_seed_is_dropped_from_the_roles_requests_and_remembered(fake_llm: FakeOpenAI, shape: str) -> None:
    fake_llm.reject_params, fake_llm.reject_shape = {"seed"}, shape
    client = client_for(fake_llm)
    first = run(client.chat(msgs("q")))
    assert first.text.startswith("fake reply") and client.usage.failed_calls == 0 and client.usage.retries == 0
    assert [("seed" in r["body"]) for r in fake_llm.requests] == [True, False]
    assert "seed" in client.usage.structured_fallbacks["without seed"]
    run(client.chat(msgs("q2"), schema=Answer))
    assert fake_llm.rejected == {"seed": 1} and "seed" not in fake_llm.requests[-1]["body"]
    # A later run (a new process: nothing remembered in memory) reads it from the call cache.
    params_module._DROPPED_PARAMS.clear()
    run(client_for(fake_llm).chat(msgs("q3")))
    assert fake_llm.rejected == {"seed": 1} and "seed" not in fake_llm.requests[-1]["body"]


def test_a_refused_n_is_recognised_recorded_and_not_retried(fake_llm: FakeOpenAI) -> None:
    fake_llm.reject_params, fake_llm.reject_shape = {"n"}, "fastapi422"
    client = client_for(fake_llm)
    with pytest.raises(RequestRejected) as ei:
        run(client.chat(msgs("q"), n=2))
    assert ei.value.param == "n" and ei.value.status == 422 and fake_llm.count() == 1
    assert "n" in client.rejected_params and client.usage.failed_calls == 1


# ------------------------------------------------------------------ an instant-503 outage


@pytest.mark.heavy(seconds=7)
def test_a_60_s_outage_answering_503_at_once_receives_at_most_60_requests(fake_llm: FakeOpenAI, monkeypatch) -> None:
    """Default concurrency, retries and backoff; three shards' clients of one role on one ledger. The
    probe pauses run ten times faster (1 s -> 0.1 s, 10 s -> 1 s), so 6 s here stand for 60 s."""
    monkeypatch.setattr(breaker, "PROBE_FIRST_S", 0.1)
    monkeypatch.setattr(breaker, "PROBE_MAX_S", 1.0)
    scale = 10
    fake_llm.outage_status, fake_llm.outage_instant, fake_llm.latency_s = 503, True, 0.02
    ledger = new_ledger()
    defaults = LLMConfig()
    clients = [client_for(fake_llm, ledger=ledger, backoff_base_s=defaults.backoff_base_s,
                          backoff_max_s=defaults.backoff_max_s, max_retries=defaults.max_retries,
                          max_concurrency=defaults.max_concurrency) for _ in range(3)]
    outage_s = 60 / scale

    async def go() -> list[Any]:
        async def shard(c: LLMClient, s: int) -> list[Any]:
            return await asyncio.gather(*(c.chat(msgs(f"s{s} q{i}")) for i in range(40)), return_exceptions=True)

        async def outage() -> None:
            while fake_llm.count() < 30:
                await asyncio.sleep(0.005)
            fake_llm.outage_until = time.time() + outage_s

        results = await asyncio.gather(outage(), *(shard(c, s) for s, c in enumerate(clients)))
        return [r for shard_results in results[1:] for r in shard_results]

    started = time.time()
    results = run(go(), timeout=120)
    during = [r for r in fake_llm.requests if r["outcome"] == "outage"]
    first_second = [r for r in during if r["t"] - during[0]["t"] < 1 / scale]
    print(f"requests into the outage: {len(during)} ({len(first_second)} in its first {1 / scale:g} s), "
          f"run {time.time() - started:.1f} s")
    assert all(not isinstance(r, BaseException) for r in results)  # every call rode it out
    assert len(during) <= 60
    assert len(first_second) <= 3 * defaults.max_concurrency  # the first wave: what was in flight
    assert ledger.book.service.health[clients[0].endpoint].outages  # the breaker opened, and closed again


# ------------------------------------------------------------------ llama-cpp-python's own server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory) -> Any:
    """`python -m llama_cpp.server` with the packaged SmolLM2, as a user would start it (no shim)."""
    from pipeline.models import smollm2_gguf_path

    port = _free_port()
    log_path = tmp_path_factory.mktemp("llama") / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_gguf_path()),
                                 "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048",
                                 # One thread: beside the other test worker, a second one spins.
                                 "--n_threads", "1", "--n_threads_batch", "1"],
                                stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"{base_url}/models", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    pytest.fail(f"llama_cpp.server did not start:\n{log_path.read_text()[-2000:]}")
                time.sleep(0.3)
        yield base_url, log_path
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _refused(log_path: Path) -> int:
    """Chat requests the server answered with its 500 (uvicorn's access log)."""
    return sum(1 for line in log_path.read_text(errors="replace").splitlines()
               if '"POST /v1/chat/completions HTTP/1.1" 500' in line)


class Colour(BaseModel):
    # A default: in json_object mode the 135M model writes JSON (the server's grammar sees to that)
    # but often copies the schema's keywords in beside or instead of the field.
    colour: str = ""


@pytest.mark.heavy(seconds=8)
def test_llama_cpp_servers_own_500_steps_the_role_down_after_one_rejected_request(llama_server, tmp_path) -> None:
    base_url, log_path = llama_server
    before = _refused(log_path)
    cfg = LLMConfig(provider="openai", base_url=base_url, model="smollm2", api_key_env=None,
                    cache_dir=str(tmp_path / "cache"), max_tokens=128, temperature=0.0, timeout_s=120,
                    max_outage_s=60)
    ledger = new_ledger()
    client = LLMClient(cfg, cache=DiskCallCache(cfg.cache_dir), limiter=LocalRateLimiter(),
                       tally=StageTally(ledger, "stage", "judge"), section="judge")
    questions = ["What colour is the sky?", "What colour is grass?", "What colour is snow?"]

    async def go() -> list[Any]:
        # An example answer: a 135M model otherwise copies the schema out of the prompt.
        return await asyncio.gather(*(client.chat([
            {"role": "system", "content": 'Answer with one JSON object, for example {"colour": "red"}.'},
            {"role": "user", "content": q}], schema=Colour) for q in questions), return_exceptions=True)

    results = run(go(), timeout=300)
    assert _refused(log_path) - before == 1  # one json_schema request refused, however many were waiting
    assert all(isinstance(getattr(r, "parsed", None), Colour) for r in results), [(r.reason, r.raw) if isinstance(r, LLMError) else r.text for r in results]
    assert client.usage.structured_modes == {"json_object": 3} and client.usage.retries == 0
    assert "json_schema" in client.usage.structured_fallbacks["json_object"]
    assert not ledger.book.service.health.get(client.endpoint) or not ledger.book.service.health[client.endpoint].outages


@pytest.mark.heavy(seconds=4)
def test_llama_cpp_servers_single_choice_for_n_gets_the_rest_asked_one_by_one(llama_server, tmp_path) -> None:
    base_url, _ = llama_server
    cfg = LLMConfig(provider="openai", base_url=base_url, model="smollm2", api_key_env=None,
                    cache_dir=str(tmp_path / "cache"), max_tokens=8, temperature=1.0, timeout_s=120, max_outage_s=60)
    client = LLMClient(cfg, cache=DiskCallCache(cfg.cache_dir), limiter=LocalRateLimiter(), section="judge")

    async def go() -> tuple[list[Any], list[Any]]:
        first = await client.chat_samples(msgs("Name a colour."), 4)
        return first, await client.chat_samples(msgs("Name a fruit."), 3)

    first, second = run(go(), timeout=300)
    assert all(isinstance(r, LLMResult) for r in first + second) and (len(first), len(second)) == (4, 3)
    u = client.usage
    # One request with n=4 came back with one choice: the other three went alone, and so did the
    # next prompt's samples (no second n request).
    assert (u.requests, u.sampled_requests, u.sampled_choices) == (7, 1, 1)
    assert "answered 1" in u.structured_fallbacks["without n"]
