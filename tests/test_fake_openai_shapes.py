"""The fake OpenAI server answers in the shapes third-party memory libraries parse: tool calls,
logprobs, the Responses API and embeddings with `dimensions`, through the real `openai` SDK."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest
from openai.types.responses import Response

from pipeline.testing.fake_openai import FakeOpenAI

MESSAGES = [{"role": "user", "content": "Alice moved to Paris in May and adopted a cat named Tom."}]
ADD_MEMORY = {"type": "object", "additionalProperties": False, "required": ["facts", "importance"], "properties": {
    "facts": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    "importance": {"type": "integer", "minimum": 1, "maximum": 5},
    "kind": {"enum": ["ADD", "UPDATE", "DELETE"]}}}
SEARCH = {"type": "object", "required": ["query", "limit"], "properties": {
    "query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}, "exact": {"type": "boolean"}}}
TOOLS = [{"type": "function", "function": {"name": "add_memory", "parameters": ADD_MEMORY}},
         {"type": "function", "function": {"name": "search_memory", "parameters": SEARCH}}]


@pytest.fixture
def client(fake_llm: FakeOpenAI) -> openai.OpenAI:
    return openai.OpenAI(base_url=fake_llm.base_url, api_key="sk-fake", max_retries=0)


def test_a_request_with_tools_is_answered_with_one_schema_valid_call_of_the_first_tool(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model="fake-model", messages=MESSAGES, tools=TOOLS)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "add_memory" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), ADD_MEMORY)
    assert out.usage.completion_tokens >= 1


def test_tool_choice_naming_the_second_tool_calls_it(client: openai.OpenAI) -> None:
    for choice in ({"type": "function", "function": {"name": "search_memory"}}, "required"):
        out = client.chat.completions.create(model="fake-model", messages=MESSAGES, tools=TOOLS, tool_choice=choice)
        (call,) = out.choices[0].message.tool_calls
        expected = "search_memory" if isinstance(choice, dict) else "add_memory"
        assert call.function.name == expected
        jsonschema.validate(json.loads(call.function.arguments), SEARCH if isinstance(choice, dict) else ADD_MEMORY)


def test_no_tool_call_with_tool_choice_none_or_after_a_tool_result_under_auto(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model="fake-model", messages=MESSAGES, tools=TOOLS, tool_choice="none")
    assert out.choices[0].message.tool_calls is None and out.choices[0].finish_reason == "stop"
    first = client.chat.completions.create(model="fake-model", messages=MESSAGES, tools=TOOLS).choices[0].message
    call = first.tool_calls[0]
    loop = MESSAGES + [first.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "ok"}]
    after = client.chat.completions.create(model="fake-model", messages=loop, tools=TOOLS)
    assert after.choices[0].message.content.startswith("fake reply") and after.choices[0].message.tool_calls is None


def test_a_tool_choice_naming_an_unknown_function_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="fake-model", messages=MESSAGES, tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})


def test_a_responder_scripts_tool_calls_and_its_text_still_wins(fake_llm: FakeOpenAI, client: openai.OpenAI) -> None:
    fake_llm.responder = lambda body: {"tool_calls": [
        {"name": "search_memory", "arguments": {"query": "cat", "limit": 3}},
        {"name": "add_memory", "arguments": '{"facts": ["x"], "importance": 2}'}]}
    out = client.chat.completions.create(model="fake-model", messages=MESSAGES, tools=TOOLS)
    calls = out.choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("search_memory", {"query": "cat", "limit": 3}), ("add_memory", {"facts": ["x"], "importance": 2})]
    assert len({c.id for c in calls}) == 2
    fake_llm.responder = lambda body: "scripted text"
    out = client.chat.completions.create(model="fake-model", messages=MESSAGES, tools=TOOLS)
    assert out.choices[0].message.content == "scripted text" and out.choices[0].finish_reason == "stop"


def test_logprobs_one_entry_per_token_with_k_top_logprobs_the_chosen_first(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model="fake-model", messages=MESSAGES, logprobs=True, top_logprobs=3)
    choice = out.choices[0]
    entries = choice.logprobs.content
    assert len(entries) == len(choice.message.content.split())
    assert "".join(e.token for e in entries) == choice.message.content
    for e in entries:
        assert e.logprob < 0 and e.bytes == list(e.token.encode())
        assert len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token
        assert e.top_logprobs[0].logprob == e.logprob
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)
    bare = client.chat.completions.create(model="fake-model", messages=MESSAGES, logprobs=True)
    assert all(e.top_logprobs == [] for e in bare.choices[0].logprobs.content)


def test_no_logprobs_unless_asked(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model="fake-model", messages=MESSAGES)
    assert out.choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="fake-model", messages=MESSAGES, logprobs=True, top_logprobs=21)


def test_responses_create_answers_text_with_output_text(fake_llm: FakeOpenAI, client: openai.OpenAI) -> None:
    response = client.responses.create(model="fake-model", input="Where does Alice live?", instructions="Be brief.",
                                       max_output_tokens=50)
    assert isinstance(response, Response) and response.status == "completed"
    assert response.output_text.startswith("fake reply")
    assert response.output[0].type == "message" and response.output[0].content[0].type == "output_text"
    assert response.usage.input_tokens == 6 and response.usage.total_tokens == 6 + response.usage.output_tokens
    Response.model_validate(response.model_dump())  # every field the SDK requires is there
    assert fake_llm.count("/v1/responses") == 1 and fake_llm.requests[-1]["path"] == "/v1/responses"


def test_responses_with_a_json_schema_format_answer_schema_valid_json(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="fake-model", input=[{"role": "user", "content": [{"type": "input_text", "text": "Extract."}]}],
        text={"format": {"type": "json_schema", "name": "memory", "schema": ADD_MEMORY, "strict": True}})
    jsonschema.validate(json.loads(response.output_text), ADD_MEMORY)


def test_responses_with_a_function_tool_answer_a_function_call_item(client: openai.OpenAI) -> None:
    tools = [{"type": "function", "name": "search_memory", "parameters": SEARCH, "strict": False}]
    response = client.responses.create(model="fake-model", input="Find the cat.", tools=tools)
    (item,) = response.output
    assert item.type == "function_call" and item.name == "search_memory" and item.call_id.startswith("call_")
    jsonschema.validate(json.loads(item.arguments), SEARCH)
    assert response.output_text == ""
    follow = client.responses.create(model="fake-model", tools=tools, input=[
        {"role": "user", "content": "Find the cat."}, item.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": item.call_id, "output": "Tom"}])
    assert follow.output_text.startswith("fake reply")


def test_the_responder_sees_a_responses_request_as_a_marked_chat_body(fake_llm: FakeOpenAI,
                                                                      client: openai.OpenAI) -> None:
    seen: list[dict[str, Any]] = []
    fake_llm.responder = lambda body: seen.append(body) or f"answered {body['messages'][-1]['content']}"
    response = client.responses.create(model="fake-model", input="hello there", instructions="sys")
    assert response.output_text == "answered hello there"
    assert seen[0]["endpoint"] == "/v1/responses"
    assert seen[0]["messages"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello there"}]


def test_faults_apply_to_the_responses_api(fake_llm: FakeOpenAI, client: openai.OpenAI) -> None:
    fake_llm.force = ["500"]
    with pytest.raises(openai.InternalServerError):
        client.responses.create(model="fake-model", input="hi")
    assert fake_llm.outcomes["500"] == 1 and fake_llm.count("/v1/responses") == 1


def test_embeddings_are_dimensions_long_when_asked_and_embed_dim_long_otherwise(fake_llm: FakeOpenAI,
                                                                                client: openai.OpenAI) -> None:
    seven = client.embeddings.create(model="fake-embed", input=["a", "b"], dimensions=7)
    assert [len(d.embedding) for d in seven.data] == [7, 7]
    plain = client.embeddings.create(model="fake-embed", input="a")
    assert len(plain.data[0].embedding) == fake_llm.embed_dim
    assert plain.data[0].embedding == pytest.approx(fake_llm.vector("a"), abs=1e-6)
    same = client.embeddings.create(model="fake-embed", input="a", dimensions=fake_llm.embed_dim)
    assert same.data[0].embedding == plain.data[0].embedding
    assert seven.data[0].embedding == pytest.approx(fake_llm.vector("a", 7), abs=1e-6)


def test_the_same_request_gets_the_same_answer(client: openai.OpenAI) -> None:
    def ask() -> tuple[Any, ...]:
        chat = client.chat.completions.create(model="fake-model", messages=MESSAGES, tools=TOOLS,
                                              logprobs=True, top_logprobs=2)
        text = client.chat.completions.create(model="fake-model", messages=MESSAGES, logprobs=True, top_logprobs=2)
        resp = client.responses.create(model="fake-model", input="Extract.", text={"format": {
            "type": "json_schema", "name": "memory", "schema": ADD_MEMORY, "strict": True}})
        emb = client.embeddings.create(model="fake-embed", input="a", dimensions=7)
        return (chat.choices[0].message.model_dump(), text.choices[0].model_dump(), resp.id,
                resp.output_text, emb.data[0].embedding)

    assert ask() == ask()
