"""The pytest plug-in of the test kit (entry point `pytest11: mempipe`): the `fake_llm` and
`sample_corpus` fixtures, in any project's tests once mempipe is installed.

Every pytest run in that environment loads this module, so it imports nothing of the project: the
fake server's module loads when a test asks for `fake_llm`. `stages.testing.run_method` is the rest
of the kit.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pipeline.testing.fake_openai import FakeOpenAI

# The bundled sample corpus (data/sample of the project checkout the package runs from).
SAMPLE_CORPUS = Path(__file__).resolve().parents[2] / "data" / "sample"


@pytest.fixture
def fake_llm() -> Iterator[FakeOpenAI]:
    """A started fake OpenAI-compatible server: set `.responder = fn(body) -> str | None` to script
    answers (None: its default, a hash of the request or a schema-valid JSON instance)."""
    from pipeline.testing.fake_openai import FakeOpenAI

    server = FakeOpenAI().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def sample_corpus() -> Path:
    """The bundled sample corpus (sample format)."""
    return SAMPLE_CORPUS
