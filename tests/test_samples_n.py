"""A prompt's samples through `n`: one request, every choice cached under its own sample, the
fallbacks (refused or ignored `n`), the same values as one request per sample, prompt-cached tokens
and the cost of each method."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from conftest import LateSecondReads, llm_config
from pipeline.testing.fake_openai import FakeOpenAI
from pipeline.llm import DiskCallCache, LLMClient, LLMError, LocalRateLimiter
from pipeline.llm.types import ask_samples
from pipeline.llm.usage import billed_to
from stages.judging import memory_quality, pairwise

DIALOGUE = "[Session 1]\nAnn: I adopted a dog named Rex.\nBob: Lovely, what breed?"


def client_for(server: FakeOpenAI, cache_dir: Any = None, **overrides: Any) -> LLMClient:
    cfg = llm_config(server, **({"cache_dir": str(cache_dir)} if cache_dir else {}), **overrides)
    return LLMClient(cfg, cache=DiskCallCache(cfg.cache_dir) if cfg.cache_enabled else None,
                     limiter=LocalRateLimiter(cfg.rpm, cfg.tpm))


def seeded_score(body: dict[str, Any]) -> str | None:
    """A scripted judge: its 1-5 score is a function of the request's seed, as a sampled model's is."""
    return json.dumps({"score": 1 + (int(body.get("seed") or 0) * 7) % 5})


def chats(server: FakeOpenAI) -> list[dict[str, Any]]:
    return [r["body"] for r in server.requests if r["path"].endswith("/chat/completions")]


def rate(client: LLMClient, samples: Any, criterion: str = "concreteness") -> list[Any]:
    return asyncio.run(memory_quality.rate_memory(client, criterion, "Ann", "[Ann] adopted Rex.", DIALOGUE,
                                                  samples=samples, temperature=1.0, max_tokens=24))


def test_twenty_ratings_from_one_request_with_n_equal_twenty_single_requests(fake_llm: FakeOpenAI, tmp_path) -> None:
    fake_llm.responder = seeded_score
    single = rate(client_for(fake_llm, tmp_path / "single", sample_with_n=False), 20)
    assert len(chats(fake_llm)) == 20 and all("n" not in b for b in chats(fake_llm))
    fake_llm.reset()
    fake_llm.responder = seeded_score
    client = client_for(fake_llm, tmp_path / "n")
    shared = rate(client, 20)
    sent = chats(fake_llm)
    assert [b.get("n") for b in sent] == [None, 19]  # the first decides the structured mode, then one request
    assert [s for s, _ in shared] == [s for s, _ in single]  # the same 20 values, in the same order
    assert len({s for s, _ in shared}) > 1  # really 20 samples, not one answer repeated
    u = client.usage
    assert (u.calls, u.requests, u.sampled_requests, u.sampled_choices) == (20, 2, 1, 19)
    # The prompt is billed once per request: two prompts' worth, not twenty.
    one_prompt = sum(len(str(m["content"]).split()) for m in sent[0]["messages"])
    assert u.prompt_tokens == 2 * one_prompt


def test_choices_are_cached_per_sample_a_rerun_sends_nothing_and_more_samples_ask_only_the_rest(
        fake_llm: FakeOpenAI, tmp_path) -> None:
    fake_llm.responder = seeded_score
    first = rate(client_for(fake_llm, tmp_path), 20)
    assert len(chats(fake_llm)) == 2
    again = client_for(fake_llm, tmp_path)
    assert rate(again, 20) == first and rate(again, 10) == first[:10] and rate(again, [7]) == first[7:8]
    assert len(chats(fake_llm)) == 2 and again.usage.requests == 0 and again.usage.cached_calls == 31
    more = client_for(fake_llm, tmp_path)
    assert rate(more, 25)[:20] == first
    assert chats(fake_llm)[-1]["n"] == 5 and len(chats(fake_llm)) == 3


def test_an_endpoint_that_refuses_n_gets_one_request_per_sample_from_then_on(fake_llm: FakeOpenAI, tmp_path) -> None:
    fake_llm.responder = seeded_score
    fake_llm.reject_params = {"n"}
    client = client_for(fake_llm, tmp_path)
    scores = rate(client, 6)
    assert all(not isinstance(s, LLMError) for s in scores) and len(scores) == 6
    sent = chats(fake_llm)
    assert sum(1 for b in sent if "n" in b) == 1  # refused once, remembered
    assert "without n" in client.usage.structured_fallbacks
    rate(client, 6, "diversity")
    assert sum(1 for b in chats(fake_llm) if "n" in b) == 1 and client.usage.sampled_requests == 0


def test_a_server_that_ignores_n_is_asked_again_for_the_rest(fake_llm: FakeOpenAI, tmp_path) -> None:
    fake_llm.responder = seeded_score
    fake_llm.ignore_n = True  # llama-cpp-python's server answers one choice whatever n says
    client = client_for(fake_llm, tmp_path, structured_mode="json_schema")
    scores = rate(client, 5)
    assert len(scores) == 5 and all(not isinstance(s, LLMError) for s in scores)
    sent = chats(fake_llm)
    assert [b.get("n") for b in sent][0] == 5 and len(sent) == 5  # one with n (1 choice back), 4 alone
    assert "answered 1" in client.usage.structured_fallbacks["without n"]
    rate(client, 5, "diversity")
    assert all("n" not in b for b in chats(fake_llm)[5:])


def test_a_failed_n_request_fails_each_of_its_samples_with_the_reason(fake_llm: FakeOpenAI, tmp_path) -> None:
    client = client_for(fake_llm, tmp_path, structured_mode="json_schema", max_retries=0)
    fake_llm.force = ["400"]
    out = rate(client, 4)
    assert len(out) == 4 and all(isinstance(o, LLMError) for o in out) and len(chats(fake_llm)) == 1
    assert client.usage.failed_calls == 4


def test_creem_position_draws_split_an_items_samples_into_two_requests(fake_llm: FakeOpenAI, tmp_path) -> None:
    fake_llm.responder = lambda body: json.dumps({"better": "AB"[int(body.get("seed") or 0) % 2], "reason": "r"})
    client = client_for(fake_llm, tmp_path, structured_mode="json_schema")

    async def item() -> list[Any]:
        creem = pairwise.PairProtocol("creem")
        first, second = (pairwise.PairShown("Ann: hi", "Bob", "R", "O", order, "") for order in (True, False))
        return [*await pairwise.judge_pair(client, "consistency", first, creem, samples=[0, 2, 3, 7]),
                *await pairwise.judge_pair(client, "consistency", second, creem, samples=[1, 4, 5, 6])]

    verdicts = asyncio.run(item())
    assert [b.get("n") for b in chats(fake_llm)] == [4, 4] and len(verdicts) == 8
    assert {v[0] for v in verdicts} <= {"reference", "other"}


def test_a_client_without_chat_samples_gets_one_chat_per_sample() -> None:
    class Plain:
        def __init__(self) -> None:
            self.samples: list[int] = []

        async def chat(self, messages: Any, *, sample: int = 0, **_: Any) -> Any:
            self.samples.append(sample)
            if sample == 2:
                raise LLMError("no answer")
            return sample

    plain = Plain()
    out = asyncio.run(ask_samples(plain, [], [0, 2, 5]))
    assert out[0] == 0 and isinstance(out[1], LLMError) and out[2] == 5 and plain.samples == [0, 2, 5]


def test_cached_prompt_tokens_are_recorded_and_billed_at_the_cached_price(fake_llm: FakeOpenAI, tmp_path) -> None:
    fake_llm.cache_min_tokens, fake_llm.cache_step = 16, 8
    prices = {"fake-model": {"input": 2.0, "cached_input": 0.5, "output": 10.0}}
    client = client_for(fake_llm, tmp_path, prices=prices)
    long_context = " ".join(f"word{i}" for i in range(200))

    async def two() -> None:
        await client.chat([{"role": "user", "content": long_context + " first question"}])
        await client.chat([{"role": "user", "content": long_context + " second question"}])

    asyncio.run(two())
    u = client.usage
    assert u.cached_prompt_tokens >= 192  # the second prompt's shared 200 words, in steps of 8 from 16
    expected = ((u.prompt_tokens - u.cached_prompt_tokens) * 2.0 + u.cached_prompt_tokens * 0.5
                + u.completion_tokens * 10.0) / 1e6
    assert u.cost_usd == pytest.approx(expected)
    # A replay from our cache reports (and prices) the same figures.
    again = client_for(fake_llm, tmp_path, prices=prices)

    async def replay() -> None:
        await again.chat([{"role": "user", "content": long_context + " second question"}])

    asyncio.run(replay())
    assert again.usage.cached_prompt_tokens >= 192 and again.usage.requests == 0


def test_each_call_is_costed_to_the_method_it_was_made_for(fake_llm: FakeOpenAI, tmp_path) -> None:
    client = client_for(fake_llm, tmp_path, prices={"fake-model": {"input": 1.0, "output": 1.0}})

    async def calls() -> None:
        async def about(method: str, text: str) -> None:
            with billed_to(method):
                await client.chat([{"role": "user", "content": text}])

        await asyncio.gather(about("rsum", "a b c"), about("secom", "d e f g h i"), client.chat([
            {"role": "user", "content": "shared"}]))

    asyncio.run(calls())
    by = client.usage.cost_by_method
    assert set(by) == {"rsum", "secom", ""} and by["secom"] > by["rsum"] > 0
    assert sum(by.values()) == pytest.approx(client.usage.cost_usd)


def test_prompts_sampled_at_once_wait_for_one_mode_decision_then_each_goes_in_one_request(
        fake_llm: FakeOpenAI, tmp_path) -> None:
    fake_llm.responder = seeded_score
    client = client_for(fake_llm, tmp_path)

    async def seven() -> list[Any]:
        return await asyncio.gather(*(memory_quality.rate_memory(
            client, c, "Ann", "[Ann] adopted Rex.", DIALOGUE, samples=20, temperature=1.0, max_tokens=24)
            for c in memory_quality.CRITERIA))

    rated = asyncio.run(seven())
    assert all(len(r) == 20 and not any(isinstance(x, LLMError) for x in r) for r in rated)
    assert sorted(b.get("n") or 1 for b in chats(fake_llm)) == [1, *[19], *[20] * 6]
    assert client.usage.calls / client.usage.requests == 140 / 8


def test_two_calls_sampling_one_prompt_at_once_send_one_request(fake_llm: FakeOpenAI, tmp_path) -> None:
    fake_llm.responder = seeded_score
    client = client_for(fake_llm, tmp_path, structured_mode="json_schema")

    async def twice() -> list[Any]:
        return await asyncio.gather(*(memory_quality.rate_memory(
            client, "diversity", "Ann", "(empty)", DIALOGUE, samples=10, temperature=1.0) for _ in range(2)))

    first, second = asyncio.run(twice())
    assert first == second and len(first) == 10 and [b.get("n") for b in chats(fake_llm)] == [10]


def test_a_call_whose_lookup_is_older_than_the_other_calls_samples_sends_nothing(fake_llm: FakeOpenAI,
                                                                                 tmp_path) -> None:
    """The second call's lookup read the cache before the first call's `n` request came back and
    stored its choices, and answers after that request is no longer in flight: those samples are
    not missing (seen as a second request for the last 3 of 10 under load)."""
    fake_llm.responder = seeded_score
    cfg = llm_config(fake_llm, cache_dir=str(tmp_path), structured_mode="json_schema")
    client = LLMClient(cfg, cache=LateSecondReads(cfg.cache_dir), limiter=LocalRateLimiter(cfg.rpm, cfg.tpm))

    async def twice() -> list[Any]:
        first = asyncio.ensure_future(memory_quality.rate_memory(
            client, "diversity", "Ann", "(empty)", DIALOGUE, samples=10, temperature=1.0))
        await asyncio.sleep(0)  # the first call's lookup goes first and answers at once
        second = memory_quality.rate_memory(client, "diversity", "Ann", "(empty)", DIALOGUE, samples=10,
                                            temperature=1.0)
        return list(await asyncio.gather(first, second))

    first, second = asyncio.run(twice())
    assert first == second and len(first) == 10
    assert [b.get("n") for b in chats(fake_llm)] == [10]


def test_ten_locomo_j_runs_go_as_one_request_and_one_run_sends_what_it_always_did(fake_llm: FakeOpenAI,
                                                                                    tmp_path) -> None:
    """judge_answers.runs: the mem0 paper's 10 judge runs of one answer are 10 samples of its prompt."""
    from stages.judging import answers

    fake_llm.responder = lambda body: json.dumps({"reason": "r", "label": "CORRECT" if int(body.get("seed") or 0) % 3
                                                  else "WRONG"})
    call = answers.locomo_j_call("When did Ann adopt Rex?", "May 2023", "In May 2023")
    client = client_for(fake_llm, tmp_path, structured_mode="json_schema")
    runs = asyncio.run(call.runs(client, 10, temperature=0.0))
    assert [b.get("n") for b in chats(fake_llm)] == [10]
    assert [score for score, _reason, _model in runs] == [0.0 if seed % 3 == 0 else 1.0 for seed in range(10)]
    fake_llm.reset()
    once = asyncio.run(call.once(client_for(fake_llm, tmp_path / "once", structured_mode="json_schema"),
                                 temperature=0.0))
    assert once == runs[0] and [b.get("n") for b in chats(fake_llm)] == [None]  # run 0 is the single call
