"""The endpoints we serve ourselves (the fake OpenAI server of the tests, the dry run's simulated
endpoint) answer `n` samples in one request and report OpenAI's prompt caching
(`usage.prompt_tokens_details.cached_tokens`), as `pipeline.plan.prompt_cache` models the rule."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import openai
import pytest

from pipeline.testing.fake_openai import FakeOpenAI
from pipeline.plan.prompt_cache import PrefixCache
from pipeline.plan.simulated import SimulatedEndpoint, chat_prompt_ids, chat_prompt_tokens
from pipeline.llm.transport import rejected_param
from pipeline.retrieval import count_tokens

MESSAGES = [{"role": "system", "content": "You answer."}, {"role": "user", "content": "Say something, please."}]


def sdk(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)


def texts(r: Any) -> list[str]:
    return [c.message.content for c in r.choices]


def words(n: int, start: int = 0) -> str:
    return " ".join(f"w{i}" for i in range(start, start + n))


# ------------------------------------------------------------------ PrefixCache


def test_prefix_cache_follows_openais_rule():
    cache = PrefixCache()
    long = list(range(1500))
    assert cache.observe("m", long) == 0  # first sight
    assert cache.observe("m", long) == 1408  # 1024 + 3 x 128 <= 1500
    assert cache.observe("other", long) == 0  # per model
    assert cache.observe("m", long[:1300] + [-1] * 500) == 1280  # shared 1300 tokens, rounded down
    assert cache.observe("m", [-2] + long[1:]) == 0  # a prefix from the first token only
    assert cache.observe("m", long[:1023]) == 0  # under the minimum, however often sent
    assert cache.observe("m", long[:1023]) == 0
    assert cache.observe("m", long + list(range(2000, 2200))) == 1408  # longer prompt: what was sent before
    assert cache.observe("m", long[:1024]) == 1024
    # repr keeps apart tokens that print alike
    assert cache.observe("s", ["1"] * 1024) == 0 and cache.observe("s", [1] * 1024) == 0


def test_prefix_cache_small_sizes_and_digests_per_boundary():
    cache = PrefixCache(min_tokens=4, step=2)
    assert list(cache.boundaries(9)) == [4, 6, 8]
    assert len(cache.digests(list("abcdefghi"))) == 3
    assert cache.observe("m", list("abcdefghi")) == 0
    assert cache.observe("m", list("abcdefXYZ")) == 6
    assert cache.observe("m", list("abcXYZ")) == 0  # shares 3 < 4
    cache.clear()
    assert len(cache) == 0 and cache.observe("m", list("abcdefghi")) == 0
    with pytest.raises(ValueError):
        PrefixCache(min_tokens=0)


def test_prefix_cache_is_thread_safe():
    cache = PrefixCache(min_tokens=8, step=4)
    got: list[int] = []
    prompt = list(range(40))

    def send() -> None:
        for _ in range(50):
            got.append(cache.observe("m", prompt))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got.count(0) == 1 and set(got) == {0, 40}  # exactly one request sent it first


# ------------------------------------------------------------------ the fake server: n


def test_fake_n_choices_equal_single_requests_with_seed_plus_j(fake_llm):
    client = sdk(fake_llm.base_url)
    r = client.chat.completions.create(model="fake-model", messages=MESSAGES, seed=7, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    singles = [texts(client.chat.completions.create(model="fake-model", messages=MESSAGES, seed=7 + j))[0]
               for j in range(3)]
    assert texts(r) == singles and len(set(singles)) == 3
    assert r.usage.prompt_tokens == 5  # once, not per choice
    assert r.usage.completion_tokens == sum(len(t.split()) for t in singles)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    entry = fake_llm.requests[0]
    assert (entry["n"], entry["choices"]) == (3, 3) and fake_llm.requests[1]["n"] == 1


def test_fake_n_without_seed_keeps_choice_zero_and_varies_the_rest(fake_llm):
    client = sdk(fake_llm.base_url)
    single = texts(client.chat.completions.create(model="fake-model", messages=MESSAGES))
    r = client.chat.completions.create(model="fake-model", messages=MESSAGES, n=4)
    again = client.chat.completions.create(model="fake-model", messages=MESSAGES, n=4)
    assert texts(r)[0] == single[0] and len(set(texts(r))) == 4
    assert texts(again) == texts(r)  # deterministic
    # and a structured request too: n schema-valid instances
    schema = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
    s = client.chat.completions.create(model="fake-model", messages=MESSAGES, n=2, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert len(s.choices) == 2 and all(t.startswith('{"label": ') for t in texts(s))


def test_fake_n_asks_the_responder_once_per_choice_with_that_choices_seed(fake_llm):
    seen: list[dict[str, Any]] = []

    def responder(body: dict[str, Any]) -> str:
        seen.append(body)
        return f"seed was {body.get('seed')}"

    fake_llm.responder = responder
    client = sdk(fake_llm.base_url)
    r = client.chat.completions.create(model="fake-model", messages=MESSAGES, seed=10, n=3)
    assert texts(r) == ["seed was 10", "seed was 11", "seed was 12"]
    assert [texts(client.chat.completions.create(model="fake-model", messages=MESSAGES, seed=10 + j))[0]
            for j in range(3)] == texts(r)
    assert all("n" not in b for b in seen) and len(seen) == 6
    assert r.usage.completion_tokens == 9


def test_fake_faults_apply_to_the_whole_n_request(fake_llm):
    fake_llm.force = ["malformed"]
    r = sdk(fake_llm.base_url).chat.completions.create(model="fake-model", messages=MESSAGES, n=2)
    assert texts(r) == ["malformed {", "malformed {"]
    fake_llm.force = ["500"]
    with pytest.raises(openai.InternalServerError):
        sdk(fake_llm.base_url).chat.completions.create(model="fake-model", messages=MESSAGES, n=2)
    assert fake_llm.requests[-1]["choices"] == 0 and fake_llm.requests[-1]["n"] == 2


def test_fake_ignore_n_answers_one_choice(fake_llm):
    fake_llm.ignore_n = True
    client = sdk(fake_llm.base_url)
    r = client.chat.completions.create(model="fake-model", messages=MESSAGES, seed=3, n=5)
    assert len(r.choices) == 1 and texts(r) == texts(client.chat.completions.create(
        model="fake-model", messages=MESSAGES, seed=3))
    assert (fake_llm.requests[0]["n"], fake_llm.requests[0]["choices"]) == (5, 1)


@pytest.mark.parametrize("bad", [0, -1, 129, "2", 1.5, True])
def test_fake_refuses_an_invalid_n(fake_llm, bad):
    r = httpx.post(f"{fake_llm.base_url}/chat/completions", json={"model": "fake-model", "messages": MESSAGES,
                                                                  "n": bad})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


@pytest.mark.parametrize("shape,status", [("openai400", 400), ("fastapi422", 422), ("llama500", 500)])
def test_fake_rejects_n_in_each_shape(fake_llm, shape, status):
    fake_llm.reject_params = {"n"}
    fake_llm.reject_shape = shape
    url = f"{fake_llm.base_url}/chat/completions"
    r = httpx.post(url, json={"model": "fake-model", "messages": MESSAGES, "n": 2})
    assert r.status_code == status and fake_llm.rejected["n"] == 1
    assert rejected_param(r.status_code, r.json(), r.text) == "n"  # the client recognises the refusal
    ok = httpx.post(url, json={"model": "fake-model", "messages": MESSAGES})  # without n: answered
    assert ok.status_code == 200 and fake_llm.rejected["n"] == 1


def test_fake_batch_lines_still_answer(fake_llm):
    body = fake_llm._chat_body({"model": "fake-model", "messages": MESSAGES}, None)
    assert len(body["choices"]) == 1 and body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


# ------------------------------------------------------------------ the fake server: prompt caching


def test_fake_reports_cached_prompt_tokens(fake_llm):
    fake_llm.cache_min_tokens, fake_llm.cache_step = 16, 4
    client = sdk(fake_llm.base_url)
    system = {"role": "system", "content": words(20)}

    def ask(user: str, model: str = "fake-model") -> int:
        r = client.chat.completions.create(model=model, messages=[system, {"role": "user", "content": user}])
        assert r.usage.prompt_tokens == 20 + len(user.split())
        return r.usage.prompt_tokens_details.cached_tokens

    assert ask(words(10, 100)) == 0  # first prompt: nothing cached
    assert ask(words(10, 200)) == 20  # shares the 20-word system prompt (16 + 4)
    assert ask(words(3, 100)) == 20  # shares 23 words: 20, rounded down to the step
    assert ask(words(10, 100)) == 28  # the same 30 words: 28 (16 + 3 x 4)
    assert ask(words(10, 100), model="other") == 0  # per model
    assert [r["cached_tokens"] for r in fake_llm.requests] == [0, 20, 20, 28, 0]
    stats = httpx.get(f"http://{fake_llm.host}:{fake_llm.port}/stats").json()
    assert [c["cached_tokens"] for c in stats["chat"]] == [0, 20, 20, 28, 0]
    # the same words in another role, or split into other messages, are another prompt
    moved = client.chat.completions.create(model="fake-model", messages=[
        {"role": "user", "content": system["content"]}, {"role": "user", "content": words(10, 100)}])
    assert moved.usage.prompt_tokens_details.cached_tokens == 0
    fake_llm.reset()  # forgets the prompts too
    assert ask(words(10, 100)) == 0


def test_fake_caches_nothing_under_the_minimum_or_when_off(fake_llm):
    fake_llm.cache_min_tokens, fake_llm.cache_step = 16, 4
    client = sdk(fake_llm.base_url)
    short = [{"role": "user", "content": words(15)}]
    for _ in range(3):
        r = client.chat.completions.create(model="fake-model", messages=short)
        assert r.usage.prompt_tokens_details.cached_tokens == 0
    fake_llm.prompt_cache = False
    long = [{"role": "user", "content": words(40)}]
    for _ in range(2):
        r = client.chat.completions.create(model="fake-model", messages=long)
        assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_fake_default_minimum_is_openais(fake_llm):
    client = sdk(fake_llm.base_url)
    prompt = [{"role": "user", "content": words(1100)}]
    first = client.chat.completions.create(model="fake-model", messages=prompt, n=2)
    second = client.chat.completions.create(model="fake-model", messages=prompt)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == 1024


# ------------------------------------------------------------------ the simulated endpoint


def test_simulated_serves_n_and_counts_choices():
    with SimulatedEndpoint(completion_fraction=0.5) as sim:
        client = sdk(sim.base_url)
        sim.stage = "s"
        single = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=40)
        r = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=40, n=3)
        assert [c.index for c in r.choices] == [0, 1, 2]
        assert texts(r)[0] == texts(single)[0] and len(set(texts(r))) == 3
        assert r.usage.prompt_tokens == single.usage.prompt_tokens == chat_prompt_tokens(MESSAGES)
        assert r.usage.completion_tokens == sum(count_tokens(t) for t in texts(r))
        assert r.usage.prompt_tokens_details.cached_tokens == 0
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="m", messages=MESSAGES, n=0)
        counts = sim.stage_counts("s")[("chat", "m")]
    assert counts["requests"] == 2 and counts["choices"] == 4 and counts["texts"] == 2
    assert counts["max_tokens"] == 80  # per request, not per choice
    assert counts["prompt_tokens"] == 2 * chat_prompt_tokens(MESSAGES) and counts["cached_prompt_tokens"] == 0
    assert counts["completion_tokens"] == single.usage.completion_tokens + r.usage.completion_tokens


def test_simulated_prompt_ids_are_the_counted_tokens():
    msgs = MESSAGES + [{"role": "user", "name": "ann", "content": [{"type": "text", "text": "part one"}]}]
    ids = chat_prompt_ids(msgs)
    assert len(ids) == chat_prompt_tokens(msgs) == 3 + sum(
        3 + count_tokens(m["role"]) + count_tokens(m["content"] if isinstance(m["content"], str) else "part one")
        for m in msgs) + 1 + count_tokens("ann")


def test_simulated_reports_cached_prompt_tokens():
    shared = words(3000)  # a long system prompt, well over 1024 cl100k tokens
    first = [{"role": "system", "content": shared}, {"role": "user", "content": "first question"}]
    second = [{"role": "system", "content": shared}, {"role": "user", "content": "another one entirely"}]
    with SimulatedEndpoint() as sim:
        client = sdk(sim.base_url)
        sim.stage = "s"
        a = client.chat.completions.create(model="m", messages=first, max_tokens=10)
        b = client.chat.completions.create(model="m", messages=second, max_tokens=10)
        c = client.chat.completions.create(model="other", messages=second, max_tokens=10)
        small = [{"role": "user", "content": "short"}]
        d = [client.chat.completions.create(model="m", messages=small, max_tokens=10) for _ in range(2)]
        counts = sim.stage_counts("s")
    ids_a, ids_b = chat_prompt_ids(first), chat_prompt_ids(second)
    common = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y)
    assert common > 1024
    expected = 1024 + (common - 1024) // 128 * 128
    assert a.usage.prompt_tokens_details.cached_tokens == 0
    assert b.usage.prompt_tokens_details.cached_tokens == expected
    assert c.usage.prompt_tokens_details.cached_tokens == 0  # another model
    assert [x.usage.prompt_tokens_details.cached_tokens for x in d] == [0, 0]  # under 1024 tokens
    assert counts[("chat", "m")]["cached_prompt_tokens"] == expected
    assert counts[("chat", "other")]["cached_prompt_tokens"] == 0


def test_simulated_cache_sizes_are_knobs():
    msgs = [{"role": "user", "content": words(30)}]
    with SimulatedEndpoint(cache_min_tokens=8, cache_step=4) as sim:
        client = sdk(sim.base_url)
        client.chat.completions.create(model="m", messages=msgs, max_tokens=5)
        r = client.chat.completions.create(model="m", messages=msgs, max_tokens=5)
    n = chat_prompt_tokens(msgs)
    assert r.usage.prompt_tokens_details.cached_tokens == 8 + (n - 8) // 4 * 4
