"""The embedded server's grammar-last greedy sampling gives the answers the library's own
grammar-first chain gives, on the packaged model, for the kinds of schema the stages send."""

from __future__ import annotations

import gc
import json

import pytest

from pipeline.models import smollm2_gguf_path

SCHEMAS = [
    ("Give one short fact about cats.",
     {"type": "object", "properties": {"fact": {"type": "string", "maxLength": 60}}, "required": ["fact"]}),
    ("Rate this memory from 1 to 5 on three criteria: 'Ann has a dog named Rex'.",
     {"type": "object", "properties": {"scores": {"type": "array", "items": {"enum": [1, 2, 3, 4, 5]},
                                                  "minItems": 3, "maxItems": 3}}, "required": ["scores"]}),
    ("Which reply is better, A or B? A: hello there. B: I remember your dog Rex!",
     {"type": "object", "properties": {"better": {"enum": ["A", "B", "tie"]}}, "required": ["better"]}),
    ("Where does a segment start? Exchanges 1-6 talk about a dog, 7-9 about a move.",
     {"type": "object", "properties": {"starts": {"type": "array", "items": {"type": "integer"}}}, "required": ["starts"]}),
]


def answers(llm, temperature: float = 0.0) -> list[str]:
    out = []
    for question, schema in SCHEMAS:
        reply = llm.create_chat_completion([{"role": "user", "content": question}], max_tokens=80,
                                           temperature=temperature, repeat_penalty=1.1, seed=3,
                                           response_format={"type": "json_object", "schema": schema})
        out.append(reply["choices"][0]["message"]["content"])
    return out


@pytest.fixture(scope="module")
def model():
    llama_cpp = pytest.importorskip("llama_cpp")  # the `local` extra; the test extra installs it
    return lambda: llama_cpp.Llama(model_path=str(smollm2_gguf_path()), n_ctx=1024, n_threads=1, verbose=False)


@pytest.mark.heavy(seconds=16)
def test_grammar_last_greedy_answers_equal_grammar_first_and_sampling_is_untouched(model, monkeypatch):
    import llama_cpp

    from pipeline.llm import llama_sampling

    first = answers(model())
    sampled_first = answers(model(), temperature=0.9)
    monkeypatch.setattr(llama_cpp.Llama, "_init_sampler", llama_cpp.Llama._init_sampler)  # undone after the test
    llama_sampling.sample_grammar_last()
    checks: list[llama_sampling.GrammarCheck] = []
    monkeypatch.setattr(llama_sampling.GrammarCheck, "close", lambda self, close=llama_sampling.GrammarCheck.close: (
        checks.append(self), close(self))[1])
    llm = model()
    assert answers(llm) == first
    del llm
    gc.collect()
    assert len(checks) == len(SCHEMAS) and all(c.grammar is None for c in checks)  # one per request, freed
    for text, (_, schema) in zip(first, SCHEMAS):
        assert set(json.loads(text)) == set(schema["required"])  # valid under the grammar
    # At a temperature the library's chain is used as it is: the same draws with the same seed.
    llm = model()
    assert answers(llm, temperature=0.9) == sampled_first
    del llm
    gc.collect()
    assert len(checks) == len(SCHEMAS)
