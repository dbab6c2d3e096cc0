"""What the embedded servers serve: the packaged SmolLM2 re-encoded once as Q8_0 by llama.cpp's own
quantizer (or the file as shipped), with flash attention; each choice its own endpoint identity, so
the call cache never mixes their answers."""

from __future__ import annotations

from pathlib import Path

import llama_cpp

from pipeline.config import LLMConfig, LocalServerConfig
from pipeline.llm.identity import endpoint_identity
from pipeline.llm.local_server import LocalLLMServer
from pipeline.models import reencoded_gguf, smollm2_gguf_path


def file_type(path: Path) -> int:
    """llama.cpp's `general.file_type` of a GGUF file, read from its header (vocabulary only)."""
    model = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    try:
        return int(model.metadata["general.file_type"])
    finally:
        model.close()


def test_the_packaged_q4_1_file_is_reencoded_as_q8_0_once(tmp_path: Path) -> None:
    shipped = smollm2_gguf_path()
    assert file_type(shipped) == llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1
    served = reencoded_gguf(shipped, "q8_0", tmp_path)
    assert served.parent.parent == tmp_path and served.is_file()
    assert file_type(served) == llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    written = served.stat().st_mtime_ns
    assert reencoded_gguf(shipped, "q8_0", tmp_path) == served  # a second run finds it
    assert served.stat().st_mtime_ns == written
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".") and p.is_dir()]  # no half-built folder


def test_the_server_serves_the_reencoded_file_unless_told_otherwise(tmp_path: Path) -> None:
    def served(**local: object) -> Path:
        return LocalLLMServer(LLMConfig(local=LocalServerConfig(cache_dir=str(tmp_path), **local))).model_path()

    assert served() == reencoded_gguf(smollm2_gguf_path(), "q8_0", tmp_path)
    assert served(packaged_as="shipped") == smollm2_gguf_path()
    own = tmp_path / "mine.gguf"
    assert served(model_path=str(own)) == own  # a user's file is served as it is


def test_weights_and_attention_are_part_of_the_endpoint_identity() -> None:
    def identity(**local: object) -> str:
        return endpoint_identity(LLMConfig(local=LocalServerConfig(**local)))

    seen = {identity(), identity(packaged_as="shipped"), identity(flash_attn=False),
            identity(packaged_as="shipped", flash_attn=False), identity(model_path="/m/x.gguf")}
    assert len(seen) == 5
    # What does not change an answer does not change the identity (a warm rerun hits the cache).
    assert identity(servers=1, n_threads=2, prompt_cache_mb=0, cache_dir="/elsewhere") == identity()
