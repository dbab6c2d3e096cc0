"""Outputs cut at max_tokens (finish_reason "length"): the fake server cuts them on demand (the
"length" fault, or `cut_at_max_tokens`); the client counts each cut output per role and never sends
it again for being cut (a structured answer the cut left invalid is re-asked as any invalid answer);
the stage's manifest, `mempipe status`, the stage's end line and the report show the counts."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
from openai import OpenAI
from pydantic import BaseModel

from conftest import llm_config
from pipeline.artifacts import MANIFEST
from pipeline.engine.progress import end_text
from pipeline.llm import DiskCallCache, LLMClient, LLMError, LocalRateLimiter, Usage
from pipeline.manifest import Manifest
from pipeline.testing.fake_openai import FakeOpenAI, _hash
from stages.cli import main
from stages.methods import METHODS
from stages.methods.base import Answer, Method, MethodContext, MethodSettings, ProbeInput
from stages.report import tables

PROBES = ["probes.from_session=2", "probes.max_per_episode=null"]


class Verdict(BaseModel):
    answer: str
    n: int


def _client(server: FakeOpenAI, **overrides: Any) -> LLMClient:
    cfg = llm_config(server, **overrides)
    return LLMClient(cfg, cache=DiskCallCache(cfg.cache_dir), limiter=LocalRateLimiter(cfg.rpm, cfg.tpm))


def _run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def _ask(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


# ------------------------------------------------------------------ the fake server


def test_the_fake_server_cuts_an_answer_at_max_tokens_or_by_the_length_fault(fake_llm: FakeOpenAI) -> None:
    api = OpenAI(base_url=fake_llm.base_url, api_key="sk-fake")
    whole = api.chat.completions.create(model="m", messages=_ask("hi"))
    text = whole.choices[0].message.content or ""
    assert whole.choices[0].finish_reason == "stop" and len(text.split()) == 3
    fake_llm.cut_at_max_tokens = True
    cut = api.chat.completions.create(model="m", messages=_ask("hi"), max_tokens=2)
    assert cut.choices[0].finish_reason == "length" and cut.choices[0].message.content == " ".join(text.split()[:2])
    assert cut.usage is not None and cut.usage.completion_tokens == 2
    within = api.chat.completions.create(model="m", messages=_ask("hi"), max_tokens=50)
    assert within.choices[0].finish_reason == "stop" and within.choices[0].message.content == text
    fake_llm.cut_at_max_tokens = False
    fake_llm.faults = {"length": 1.0}  # always: to half when within max_tokens
    faulted = api.chat.completions.create(model="m", messages=_ask("hi"))
    assert faulted.choices[0].finish_reason == "length" and faulted.choices[0].message.content == text[:len(text) // 2]
    response = api.responses.create(model="m", input="hi", max_output_tokens=16)
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert fake_llm.outcomes["length"] == 2


# ------------------------------------------------------------------ the client


def test_a_cut_plain_answer_is_kept_as_it_stands_counted_and_sent_once(fake_llm: FakeOpenAI) -> None:
    fake_llm.faults = {"length": 1.0}
    client = _client(fake_llm)
    result = _run(client.chat(_ask("tell me"), max_tokens=64))
    assert result.finish_reason == "length" and result.text.startswith("fake r") and not result.cached
    assert fake_llm.count() == 1 and (client.usage.calls, client.usage.truncated_calls) == (1, 1)
    assert (client.usage.retries, client.usage.reasks, client.usage.failed_calls) == (0, 0, 0)
    # Replayed from the cache as it was: still a cut output, counted again, not sent.
    again = _client(fake_llm)
    replay = _run(again.chat(_ask("tell me"), max_tokens=64))
    assert replay.cached and replay.text == result.text and again.usage.truncated_calls == 1
    assert fake_llm.count() == 1


def test_a_structured_answer_the_cut_left_invalid_is_reasked_as_any_invalid_answer(fake_llm: FakeOpenAI) -> None:
    fake_llm.force = ["length"]  # the first answer cut; the re-ask answered whole
    client = _client(fake_llm, structured_retries=2)
    result = _run(client.chat(_ask("judge"), schema=Verdict))
    assert result.parsed is not None and result.finish_reason == "stop"
    assert fake_llm.count() == 2 and client.usage.reasks == 1 and client.usage.truncated_calls == 1
    assert fake_llm.requests[0]["outcome"] == "length" and fake_llm.requests[1]["outcome"] is None
    # Cut every time: the row fails as an invalid answer would, and says the answers were cut.
    fake_llm.faults = {"length": 1.0}
    cut = _client(fake_llm, structured_retries=1)
    with pytest.raises(LLMError) as failed:
        _run(cut.chat(_ask("judge again"), schema=Verdict))
    assert "invalid structured output after 2 attempts" in failed.value.reason
    assert failed.value.reason.endswith("(the last answer was cut at max_tokens)")
    assert (cut.usage.failed_calls, cut.usage.truncated_calls, cut.usage.reasks) == (1, 2, 1)


def test_the_cut_count_is_summed_written_only_when_set_and_read_back() -> None:
    total = Usage(calls=2, truncated_calls=1).merge(Usage(calls=3, truncated_calls=2))
    assert total.truncated_calls == 3 and Usage.from_dict(total.to_dict()).truncated_calls == 3
    assert "truncated_calls" not in Usage(calls=1).to_dict()
    line = end_text("respond_x", 1.0, {"generator": Usage(calls=4, truncated_calls=3), "judge": Usage(calls=1)}, 0, 4)
    assert line.endswith("; outputs cut at max_tokens: generator 3")


# ------------------------------------------------------------------ a run


class ShortAnswer(Method[MethodSettings]):
    """Answers every probe with a reply of at most two tokens: the fake server's are three words."""

    name = "short_answer"

    async def answer(self, ctx: MethodContext[MethodSettings], probe: ProbeInput, memory: dict) -> Answer:
        return Answer(text=(await ctx.llm.chat([{"role": "user", "content": probe.request}], max_tokens=2)).text)


def test_a_run_counts_cut_outputs_per_stage_and_role_in_manifest_status_and_report(
        fake_llm: FakeOpenAI, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("MEMPIPE_TESTING_KEY", "sk-fake-for-tests")
    method = ShortAnswer()
    monkeypatch.setitem(METHODS, method.name, method)
    fake_llm.cut_at_max_tokens = True
    sets = [f"artifacts_dir={tmp_path / 'artifacts'}", "run_name=cut", f"methods=[{method.name}]",
            "corpus.format=sample", "corpus.limit=1", "llm.provider=openai", f"llm.base_url={fake_llm.base_url}",
            "llm.api_key_env=MEMPIPE_TESTING_KEY", f"llm.cache_dir={tmp_path / 'cache'}", "ray.executor=inline",
            "teabag.enabled=false", *PROBES]
    args = [arg for s in sets for arg in ("--set", s)]
    assert main(["run", *args]) == 0
    err = capsys.readouterr().err
    stage = f"respond_{method.name}"
    manifest = Manifest.from_json(json.loads((tmp_path / "artifacts" / "cut" / stage / MANIFEST).read_text()))
    assert manifest.llm_usage is not None
    [(role, usage)] = [(r, u) for r, u in manifest.llm_usage.items() if u.truncated_calls]
    assert usage.truncated_calls == usage.calls == manifest.rows > 0
    raw = json.loads((tmp_path / "artifacts" / "cut" / stage / MANIFEST).read_text())
    assert raw["llm_usage"][role]["truncated_calls"] == manifest.rows
    # Each cut request was sent once: never asked again for being cut.
    short = [r["body"] for r in fake_llm.requests if r["body"].get("max_tokens") == 2]
    assert len(short) == manifest.rows and set(Counter(_hash(b) for b in short).values()) == {1}
    assert f"outputs cut at max_tokens: {role} {manifest.rows}" in err
    # status: the count beside the role's calls.
    assert main(["status", *args]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(stage))
    assert f"{role} {manifest.rows}/0/0 ({manifest.rows} cut at max_tokens)" in line
    # The report: per stage and per role, and in cost_breakdown.
    report = tmp_path / "artifacts" / "cut" / "report"
    md = (report / "report.md").read_text()
    section = md[md.index("## Where the money goes"):]
    assert "| stage | calls | truncated_calls |" in section and "| role | model | calls | truncated_calls |" in section
    breakdown = tables.cost_breakdown({stage: manifest}, {})
    assert breakdown["truncated_calls"].sum() == manifest.rows
