"""An endpoint outage: every call pauses behind the shared circuit breaker and resumes when the
endpoint answers, so no row fails and no retry is spent; an outage longer than llm.max_outage_s
stops the run cleanly, and the same command resumes it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest

import pipeline.llm.transport as transport
from conftest import llm_config, segmenting_responder, session_ray
from pipeline.manifest import Manifest
from pipeline.llm import LLMClient, LLMError, LocalRateLimiter
from pipeline.llm.breaker import OPEN_AFTER_FAILURES, OPEN_AFTER_S, EndpointHealth
from pipeline.llm.ledger import Budget, LedgerBook, RunLedger, StageTally
from stages.cli import main

ROOT = Path(__file__).resolve().parent.parent


def _args(tmp_path: Path, fake_llm, *sets: str, executor: str = "inline") -> list[str]:
    return ["-c", str(ROOT / "configs" / "default.yaml"),
            "--set", f"artifacts_dir={tmp_path / 'a'}", "--set", "llm.provider=openai",
            "--set", f"llm.base_url={fake_llm.base_url}", "--set", "llm.api_key_env=MEMPIPE_TEST_KEY",
            "--set", f"llm.cache_dir={tmp_path / 'cache'}", "--set", "llm.model=fake-model",
            # Retries (0.1 + 0.2 + 0.4 s) that a 2.5 s outage would exhaust three times over
            # without the breaker.
            "--set", "llm.max_retries=3", "--set", "llm.backoff_base_s=0.1", "--set", "llm.backoff_max_s=0.5",
            "--set", "ray.episodes_per_shard=1", "--set", f"ray.executor={executor}",
            "--set", "corpus.limit=null", "--set", "teabag.enabled=false",
            *[x for s in sets for x in ("--set", s)]]


def _down_after(fake_llm, requests: int, seconds: float) -> threading.Thread:
    """Take the endpoint down for `seconds` once it has answered `requests` chat requests."""
    def watch() -> None:
        deadline = time.time() + 60
        while fake_llm.count() < requests and time.time() < deadline:
            time.sleep(0.01)
        fake_llm.outage_until = time.time() + seconds

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def endpoint(fake_llm, monkeypatch):
    monkeypatch.setenv("MEMPIPE_TEST_KEY", "sk-test-secret-value-123")
    fake_llm.responder = segmenting_responder
    fake_llm.latency_s = 0.05
    return fake_llm


@pytest.mark.heavy(seconds=6)
@pytest.mark.parametrize("executor", ["inline", pytest.param("ray", marks=pytest.mark.session_ray)])
def test_an_outage_mid_run_pauses_every_call_and_ends_with_no_failed_row(tmp_path, endpoint, capsys, executor, request):
    if executor == "ray":
        session_ray(request)  # the breaker is shared by workers through the ledger service
    # Back before the second probe (the breaker probes 1 s, then 3 s after it opened).
    watcher = _down_after(endpoint, 4, 2.5)
    assert main(["run", "--until", "segment", *_args(tmp_path, endpoint, executor=executor)]) == 0
    watcher.join()
    manifest = Manifest.from_json(json.loads((tmp_path / "a" / "default" / "segment" / "_manifest.json").read_text()))
    usage = manifest.llm_usage["segmenter"]
    assert usage.calls >= 20 and usage.failed_calls == 0 and manifest.stats["fallback_sessions"] == 0
    assert endpoint.outcomes["500"] >= OPEN_AFTER_FAILURES  # the outage happened, and the run rode it out
    err = capsys.readouterr().err
    if executor == "inline":  # the log says the endpoint went down and came back
        assert "down since" in err and "answers again after" in err


def test_an_outage_longer_than_max_outage_stops_the_run_and_the_same_command_resumes(tmp_path, endpoint, capsys):
    endpoint.outage_until = time.time() + 3600
    args = _args(tmp_path, endpoint, "llm.max_outage_s=2")
    started = time.time()
    assert main(["run", "--until", "segment", *args]) == 4
    assert time.time() - started < 60  # stopped, not each row burning its retries
    stop = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mempipe:")]
    assert len(stop) == 1 and "has answered no request for" in stop[0] and "llm.max_outage_s = 2" in stop[0]
    assert (tmp_path / "a" / "default" / "ingest" / "_manifest.json").exists()  # finished work kept
    assert not (tmp_path / "a" / "default" / "segment" / "_manifest.json").exists()  # nothing half published
    endpoint.outage_until = 0.0
    assert main(["run", "--until", "segment", *args]) == 0
    manifest = json.loads((tmp_path / "a" / "default" / "segment" / "_manifest.json").read_text())
    assert manifest["llm_usage"]["segmenter"]["failed_calls"] == 0


def test_the_breaker_opens_on_a_handful_of_failures_in_a_row_even_when_they_all_come_at_once():
    h = EndpointHealth()
    for _ in range(OPEN_AFTER_FAILURES - 1):  # an endpoint answering 503 at once: no time passes
        assert not h.report(False, 1000.0)
    assert h.report(False, 1000.0) and h.down and h.down_since == 1000.0
    assert h.admit(1000.0).wait_s > 0  # everyone else waits for the first probe
    few = EndpointHealth()
    for _ in range(OPEN_AFTER_FAILURES - 1):
        few.report(False, 1000.0)
    assert not few.check(1010.0)  # fewer failures are not an outage, however long ago they were


def test_the_breaker_opens_on_consecutive_failures_probes_one_at_a_time_and_closes_on_an_answer():
    h = EndpointHealth()
    t = 1000.0
    for i in range(OPEN_AFTER_FAILURES):
        h.report(False, t + i * OPEN_AFTER_S)
    assert h.down and h.down_since == t
    first = h.admit(t + 100)
    assert first.probe and first.wait_s == 0
    other = h.admit(t + 100)  # while the probe is out, everyone else waits
    assert not other.probe and other.wait_s > 0 and other.down_for_s == pytest.approx(100)
    h.report(False, t + 101, probe=True)  # the probe failed: the next one waits longer
    assert h.admit(t + 101.5).wait_s > 0
    assert h.admit(t + 104).probe
    assert not h.report(True, t + 104.5, probe=True)  # it answered: up again, and the outage is logged
    assert not h.down and h.outages == [(t, t + 104.5)] and h.admit(t + 105).wait_s == 0


def test_a_success_between_failures_keeps_the_breaker_closed():
    h = EndpointHealth()
    for i in range(10):
        h.report(False, 1000.0 + i)
        h.report(True, 1000.5 + i)
    assert not h.down


def test_a_request_out_of_retries_waits_for_the_breaker_unless_a_later_request_was_answered(fake_llm, monkeypatch):
    """Two 500s use up a request's retries (llm.max_retries=1). Alone, it gives the breaker until
    DECIDE_S after its first failure to call an outage; when a request sent after that failure was
    answered, the endpoint is up and the request fails at once, with its reason."""
    monkeypatch.setattr(transport, "DECIDE_S", 2.0)
    cfg = llm_config(fake_llm, max_retries=1, backoff_base_s=0.3, backoff_max_s=0.3, cache_enabled=False)

    async def failed_after(force: list[str | None], answered_between: bool) -> tuple[float, str]:
        """Seconds from the failing request's last try reaching the server to its LLMError."""
        client = LLMClient(cfg, cache=None, limiter=LocalRateLimiter(),
                           tally=StageTally(RunLedger.local(LedgerBook(Budget())), "stage", "judge"), section="judge")
        fake_llm.reset()
        fake_llm.force = force
        failing = asyncio.create_task(client.chat([{"role": "user", "content": "a"}]))
        if answered_between:
            while client.usage.retries < 1:  # its first try failed (its retry waits 0.3 s); another goes and is answered
                await asyncio.sleep(0.01)
            assert (await client.chat([{"role": "user", "content": "b"}])).text
        with pytest.raises(LLMError) as failed:
            await failing
        at = time.time()
        await client.aclose()
        return at - max(fake_llm.timestamps), str(failed.value)

    alone, reason = asyncio.run(failed_after(["500", "500"], answered_between=False))
    assert alone >= 2.0 - 0.3 - 0.1 and "gave up after 2 attempts" in reason  # waited out the window
    answered, reason = asyncio.run(failed_after(["500", None, "500"], answered_between=True))
    assert answered < 1.0 and "HTTP 500" in reason and "gave up after 2 attempts" in reason
