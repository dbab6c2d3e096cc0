"""Shared fixtures: the fake OpenAI-compatible server and an LLMConfig pointing at it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from fake_openai import FakeOpenAI
from pipeline.config import LLMConfig

TEST_KEY_ENV = "MEMPIPE_TEST_LLM_KEY"  # tests set a fake secret here; never a real key


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
