"""The embedded llama.cpp server with the packaged SmolLM2 model, through the `openai` client.

This is the default (offline) LLM path of the pipeline, so a missing llama-cpp-python is a failure
with install advice, not a skip.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipeline.config import LLMConfig, LocalServerConfig
from pipeline.llm.local_server import (
    LocalLLMServer,
    LocalServerError,
    openai_response_format_to_llama,
)

try:
    import llama_cpp.server  # noqa: F401

    LLAMA_ERROR = None
except ImportError as e:  # pragma: no cover - depends on the environment
    LLAMA_ERROR = str(e)


def require_llama() -> None:
    if LLAMA_ERROR is not None:
        pytest.fail(
            f"llama-cpp-python is not installed ({LLAMA_ERROR}); the embedded LLM is a core path: "
            "install the 'local' extra: pip install -e '.[local]' (build flags in README)"
        )


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_response_format_rewrite() -> None:
    body = {"model": "m", "response_format": {
        "type": "json_schema", "json_schema": {"name": "p", "schema": PERSON_SCHEMA, "strict": True}}}
    out = openai_response_format_to_llama(body)
    assert out["response_format"] == {"type": "json_object", "schema": PERSON_SCHEMA}
    assert body["response_format"]["type"] == "json_schema"  # input not mutated
    plain = {"model": "m", "response_format": {"type": "json_object"}}
    assert openai_response_format_to_llama(plain) == plain


def test_chat_and_json_schema_then_stopped(tmp_path: Path) -> None:
    require_llama()
    import openai

    # One llama.cpp thread: with one per core, a CPU-heavy job beside the tests left its threads
    # waiting on each other and a 48-token answer took over a minute.
    cfg = LLMConfig(model="SmolLM2-135M-Instruct", local=LocalServerConfig(n_ctx=2048, n_threads=1))
    with LocalLLMServer(cfg, log_path=tmp_path / "server.log") as server:
        pid = server.pid
        assert pid is not None and server.base_url.startswith("http://127.0.0.1:")
        # n_threads reaches both of llama.cpp's settings: reading the prompt too (its default: every core).
        args = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        assert args[args.index("--n_threads") + 1] == args[args.index("--n_threads_batch") + 1] == "1"
        client = openai.OpenAI(base_url=server.base_url, api_key="local", max_retries=0, timeout=300)

        plain = client.chat.completions.create(
            model=cfg.model, messages=[{"role": "user", "content": "Name one fruit."}],
            max_tokens=16, temperature=0, seed=0,
        )
        assert plain.choices[0].message.content.strip()
        assert plain.model == cfg.model
        assert plain.usage.completion_tokens > 0

        # OpenAI's json_schema shape, as the pipeline's client sends it.
        structured = client.chat.completions.create(
            model=cfg.model,
            messages=[{"role": "user", "content": "Alice is 30 years old. Reply with her as JSON."}],
            max_tokens=48, temperature=0, seed=0,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True}},
        )
        data = json.loads(structured.choices[0].message.content)
        assert set(data) == {"name", "age"}
        assert isinstance(data["name"], str) and isinstance(data["age"], int)
    assert process_gone(pid)
    assert not server.running
    with pytest.raises(LocalServerError):
        server.base_url


def test_stopped_when_the_block_raises(tmp_path: Path) -> None:
    require_llama()
    server = LocalLLMServer(LLMConfig(local=LocalServerConfig(n_ctx=512)), log_path=tmp_path / "s.log")
    with pytest.raises(RuntimeError, match="boom"):
        with server:
            pid = server.pid
            raise RuntimeError("boom")
    assert process_gone(pid)


def test_missing_model_file_is_a_clear_error(tmp_path: Path) -> None:
    require_llama()
    missing = tmp_path / "nope.gguf"
    with pytest.raises(LocalServerError, match="no such model file.*nope.gguf"):
        LocalLLMServer(LLMConfig(local=LocalServerConfig(model_path=str(missing)))).start()


def test_bad_model_file_reports_the_log_tail(tmp_path: Path) -> None:
    require_llama()
    bad = tmp_path / "bad.gguf"
    bad.write_text("this is not a gguf file\n")
    server = LocalLLMServer(LLMConfig(local=LocalServerConfig(model_path=str(bad))),
                            log_path=tmp_path / "bad.log")
    with pytest.raises(LocalServerError) as info:
        server.start()
    message = str(info.value)
    assert "exited with code" in message
    assert "Failed to load model" in message  # the tail of the server's own log
    assert not server.running
