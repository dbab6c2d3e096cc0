"""llmlingua compression of dialogue units: the official LLMLingua-2 call over a unit's exchanges,
only the unit's real speaker tags forced, the path each unit took recorded; offline throughout."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from pipeline.compression import (
    Compressor,
    llmlingua2_arguments,
    restore_exchange,
    speaker_tags,
    split_known_tag,
)
from stages.methods.secom.stages.compress import compress_units
from stages.methods.secom.units import unit_exchanges

MODEL_CACHE = Path(__file__).resolve().parents[1] / ".cache" / "models"

DIALOGUE = """Alice: Hi Bob, how was your weekend? Did you go hiking at the lake like you planned?
Bob: Yes! We went to Crater Lake on Saturday. The weather was perfect, though my knee hurt a bit.
Alice: Oh no, is it the same knee you injured last year when you were playing soccer?
Bob: Sure.
Dr. Kim: The left one needs physical therapy twice a week, starting next Monday morning.
Alice: That sounds like a good plan. I started a pottery class last Tuesday, by the way."""
SPEAKERS = ["Alice", "Bob", "Alice", "Bob", "Dr. Kim", "Alice"]
EXCHANGES = ["\n".join(DIALOGUE.split("\n")[0:2]), "\n".join(DIALOGUE.split("\n")[2:5]), DIALOGUE.split("\n")[5]]

# A Long-MT-Bench+ exchange: the assistant's markdown answer has lines that look like "Name: text".
MARKDOWN = ("user: Where should we stay in Kyoto for three nights?\n"
            "assistant: Here are two options:\n"
            "- **Location**: Gion, close to the temples\n"
            "- **Budget**: about 120 dollars a night")


class FakeLingua:
    """Stands in for llmlingua's PromptCompressor: records every call; a list context comes back
    as `compressed_prompt_list` (by default each exchange with its last word dropped), a string as
    `compressed_prompt`."""

    max_position_embeddings = 10_000

    def __init__(self, reply: Any = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.reply = reply

    def get_token_length(self, text: str, add_special_tokens: bool = False) -> int:
        return len(text.split())

    def compress_prompt(self, context: Any, **kwargs: Any) -> dict[str, Any]:
        self.calls.append({"context": context, **kwargs})
        if isinstance(context, list):
            out = self.reply(context) if self.reply else [c.rsplit(" ", 1)[0] for c in context]
            return {"compressed_prompt_list": out, "compressed_prompt": "\n\n".join(out)}
        return {"compressed_prompt": " ".join(context.split()[:-1])}


def fake_compressor(monkeypatch: pytest.MonkeyPatch, fake: FakeLingua, method: str = "llmlingua2") -> Compressor:
    c = Compressor(method=method, rate=0.75)  # type: ignore[arg-type]
    monkeypatch.setattr(c, "_compressor", lambda: fake)
    return c


def test_only_the_units_own_speakers_are_tags() -> None:
    assert speaker_tags(["Bob", "Alice", "Bob", ""]) == ["Alice:", "Bob:"]
    tags = speaker_tags(["user", "assistant"])
    assert split_known_tag("assistant: Here are two options:", tags) == ("assistant:", "Here are two options:")
    # A markdown line is not a speaker line, whatever its shape.
    assert split_known_tag("- **Location**: Gion", tags) == ("", "- **Location**: Gion")
    assert split_known_tag("Dr. Kim: ok then", speaker_tags(["Kim", "Dr. Kim"])) == ("Dr. Kim:", "ok then")
    assert split_known_tag("we met at 10:30 today", ["we:"]) == ("", "we met at 10:30 today")


def test_llmlingua2_arguments_are_the_official_call_over_the_exchange_list() -> None:
    """SeCom's official code: compress_prompt([exchange, ...], rate, use_context_level_filter=False,
    force_tokens=["\\n", ".", <speaker tags>]); the tags here are the unit's speakers, never a regex's."""
    args = llmlingua2_arguments([MARKDOWN, "user: thanks"], speaker_tags(["user", "assistant", "user"]), 0.75)
    assert args == {"context": [MARKDOWN, "user: thanks"], "rate": 0.75,
                    "force_tokens": ["\n", ".", "assistant:", "user:"], "use_context_level_filter": False}


def test_llmlingua2_compresses_a_unit_as_its_exchanges_and_joins_them_by_newlines(monkeypatch) -> None:
    fake = FakeLingua()
    c = fake_compressor(monkeypatch, fake)
    out = c.compress_unit(EXCHANGES, SPEAKERS)
    assert len(fake.calls) == 1
    call = fake.calls[0]
    assert call["context"] == EXCHANGES  # one string per exchange: one keep threshold per exchange
    assert call["force_tokens"] == ["\n", ".", "Alice:", "Bob:", "Dr. Kim:"]
    assert call["use_context_level_filter"] is False and call["rate"] == 0.75
    assert out.path == "per_exchange"
    assert out.text == "\n".join(e.rsplit(" ", 1)[0] for e in EXCHANGES)


def test_markdown_lines_are_never_forced_tokens(monkeypatch) -> None:
    fake = FakeLingua()
    out = fake_compressor(monkeypatch, fake).compress_unit([MARKDOWN], ["user", "assistant"])
    assert fake.calls[0]["force_tokens"] == ["\n", ".", "assistant:", "user:"]
    assert out.path == "per_exchange"
    assert out.text.split("\n")[2:] == ["- **Location**: Gion, close to the temples", "- **Budget**: about 120 dollars a"]


def test_an_exchange_that_loses_a_speaker_tag_sends_the_unit_line_by_line_and_says_so(monkeypatch) -> None:
    fake = FakeLingua(reply=lambda ctx: [ctx[0], ctx[1].replace("Bob: ", "", 1), ctx[2]])
    out = fake_compressor(monkeypatch, fake).compress_unit(EXCHANGES, SPEAKERS)
    assert out.path == "per_line"
    # Then every line of at least 4 words is compressed alone (a string context) with its tag re-attached.
    singles = [call["context"] for call in fake.calls[1:]]
    assert len(singles) == 5 and not any(s.startswith(("Alice:", "Bob:", "Dr. Kim:")) for s in singles)
    lines = out.text.split("\n")
    assert [split_known_tag(line, speaker_tags(SPEAKERS))[0] for line in lines] == [f"{s}:" for s in SPEAKERS]
    assert lines[3] == "Bob: Sure."  # short utterances stay verbatim


def test_a_lost_line_also_falls_back_and_a_line_pruned_to_punctuation_keeps_its_text() -> None:
    tags = speaker_tags(["A", "B"])
    assert restore_exchange("A: one two\nB: three", "A: one two B: three", tags) is None
    assert restore_exchange("A: one two\nB: three four", "A:  two\nB: .", tags) == "A: two\nB: three four"
    assert restore_exchange("A: x\n- **Key**: value", "A: x\nvalue", tags) == "A: x\nvalue"


def test_the_per_line_compressor_shares_lines_between_units(monkeypatch) -> None:
    fake = FakeLingua()
    c = fake_compressor(monkeypatch, fake, method="llmlingua")
    cache: dict[str, str] = {}
    first = c.compress_unit(EXCHANGES[:1], SPEAKERS[:2], cache)
    again = c.compress_unit(EXCHANGES[:1], SPEAKERS[:2], cache)
    assert first == again and first.path == "per_line" and len(fake.calls) == 2  # two lines, once each


def test_compress_stage_records_each_units_path_and_errors(monkeypatch) -> None:
    turns = [{"episode_id": "e", "session_idx": 1, "turn_idx": i, "speaker": s, "text": t,
              "session_time": None, "source_turn_id": f"D1:{i}"}
             for i, (s, t) in enumerate([("user", "plan a trip to Kyoto for me please"),
                                         ("assistant", "Here are two options:\n- **Budget**: about 120 dollars"),
                                         ("user", "thanks, that helps a lot indeed")])]
    assert unit_exchanges(turns) == [
        "user: plan a trip to Kyoto for me please\nassistant: Here are two options:\n- **Budget**: about 120 dollars",
        "user: thanks, that helps a lot indeed"]
    segments = [{"session_idx": 1, "segment_idx": 0, "turn_start": 0, "turn_end": 2}]
    fake = FakeLingua()
    c = fake_compressor(monkeypatch, fake)
    rows = compress_units(c, {1: turns}, segments, ["turn", "segment"], "llmlingua2@0.75")
    assert [(r["granularity"], r["compression_path"], r["error"]) for r in rows] == [
        ("turn", "per_exchange", None), ("turn", "per_exchange", None), ("segment", "per_exchange", None)]
    assert fake.calls[-1]["context"] == unit_exchanges(turns)  # the segment: its two exchanges
    assert fake.calls[-1]["force_tokens"] == ["\n", ".", "assistant:", "user:"]

    def broken(*a: Any, **k: Any) -> Any:
        raise RuntimeError("model exploded")

    monkeypatch.setattr(fake, "compress_prompt", broken)
    rows = compress_units(c, {1: turns}, segments, ["segment"], "llmlingua2@0.75")
    assert rows[0]["compression_path"] == "error" and rows[0]["compressed_text"] is None
    assert "model exploded" in rows[0]["error"]
    plain = compress_units(Compressor(method="none"), {1: turns}, segments, ["segment"], "none")
    assert plain[0]["compression_path"] == "none" and plain[0]["compressed_text"] == plain[0]["text"]


def test_none_is_identity() -> None:
    c = Compressor(method="none")
    assert c.compress_unit(EXCHANGES, SPEAKERS).text == DIALOGUE
    assert c.name == "none"
    # Compressors travel to Ray workers.
    clone = pickle.loads(pickle.dumps(Compressor(method="llmlingua", rate=0.6)))
    assert (clone.method, clone.rate) == ("llmlingua", 0.6)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="rate"):
        Compressor(rate=0)
    with pytest.raises(ValueError, match="unknown compression method"):
        Compressor(method="zip")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="xlm-roberta-large"):
        Compressor(method="llmlingua2", model="some/other-model")


def _check_shape(original: str, compressed: str) -> None:
    in_lines, out_lines = original.split("\n"), compressed.split("\n")
    assert len(out_lines) == len(in_lines)
    tags = speaker_tags(SPEAKERS)
    for before, after in zip(in_lines, out_lines):
        tag, _ = split_known_tag(before, tags)
        assert after.startswith(tag + " "), (before, after)


@pytest.mark.heavy(seconds=18)
def test_llmlingua_with_packaged_smollm2(no_network: None) -> None:
    c = Compressor(method="llmlingua", rate=0.5, cache_dir=MODEL_CACHE)
    out = c.compress_unit(EXCHANGES, SPEAKERS)
    assert out.path == "per_line"
    _check_shape(DIALOGUE, out.text)
    assert len(out.text.split()) < 0.8 * len(DIALOGUE.split())
    assert "Bob: Sure." in out.text.split("\n")  # short utterances stay verbatim
    # The loaded scorer is shared by every compressor of this process.
    assert Compressor(method="llmlingua", rate=0.9, cache_dir=MODEL_CACHE)._compressor() is c._compressor()
    milder = Compressor(method="llmlingua", rate=0.9, cache_dir=MODEL_CACHE).compress_unit(EXCHANGES, SPEAKERS)
    assert len(out.text.split()) < len(milder.text.split()) <= len(DIALOGUE.split())


def test_llmlingua2_path_keeps_tags(no_network: None, tmp_path: Path) -> None:
    """LLMLingua-2's code path with a tiny random token classifier (the real one needs the hub):
    the exchange list in one call, the speaker tags and lines kept.

    llmlingua picks its word rules from the model name, hence the folder name.
    """
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForTokenClassification

    from pipeline.models import minilm_model_dir

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_model_dir(MODEL_CACHE)))
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, num_labels=2)
    folder = tmp_path / "tiny-bert-base-multilingual-cased"
    BertForTokenClassification(config).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))

    c = Compressor(method="llmlingua2", model=str(folder), rate=0.5, cache_dir=MODEL_CACHE)
    out = c.compress_unit(EXCHANGES, SPEAKERS)
    _check_shape(DIALOGUE, out.text)
    assert out.path == "per_exchange"  # forced tags and newlines survive LLMLingua-2 itself
    assert len(out.text.split()) < len(DIALOGUE.split())


@pytest.mark.parametrize("method", ["llmlingua2", "llmlingua"])
def test_kept_results_are_served_without_the_model_and_only_for_the_same_method_and_rate(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, method: str) -> None:
    fake = FakeLingua()
    first = Compressor(method=method, rate=0.75, results_dir=tmp_path / "kept")  # type: ignore[arg-type]
    monkeypatch.setattr(first, "_compressor", lambda: fake)
    out = first.compress_unit(EXCHANGES, SPEAKERS)
    asked = len(fake.calls)
    assert asked > 0

    # A later run (a fresh instance, as in another worker) is answered from disk: the model is never loaded.
    again = pickle.loads(pickle.dumps(Compressor(method=method, rate=0.75, results_dir=tmp_path / "kept")))  # type: ignore[arg-type]
    monkeypatch.setattr(again, "_compressor", lambda: pytest.fail("the model was loaded for a kept result"))
    assert again.compress_unit(EXCHANGES, SPEAKERS) == out

    # Another rate is another model output: asked anew.
    other = Compressor(method=method, rate=0.5, results_dir=tmp_path / "kept")  # type: ignore[arg-type]
    monkeypatch.setattr(other, "_compressor", lambda: fake)
    other.compress_unit(EXCHANGES, SPEAKERS)
    assert len(fake.calls) == 2 * asked


def test_while_smollm2_is_rebuilt_each_gguf_file_is_parsed_once_and_gguf_is_left_as_it_was(tmp_path: Path) -> None:
    import gguf
    import numpy as np

    from pipeline.models import _gguf_parsed_once

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.zeros((4, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    real_reader, real_name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with _gguf_parsed_once():
        from gguf import GGUFReader, get_tensor_name_map  # as transformers looks them up, at call time

        first = GGUFReader(path)
        assert GGUFReader(str(path)) is first and [t.name for t in first.tensors] == ["token_embd.weight"]
        arch = gguf.MODEL_ARCH.LLAMA
        assert get_tensor_name_map(arch, 2) is get_tensor_name_map(arch, 2)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (real_reader, real_name_map)
    assert gguf.GGUFReader(path) is not first
