"""llmlingua compression of dialogue units, offline: speaker tags and lines survive."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from pipeline.compression import Compressor, split_tag

MODEL_CACHE = Path(__file__).resolve().parents[1] / ".cache" / "models"

DIALOGUE = """Alice: Hi Bob, how was your weekend? Did you go hiking at the lake like you planned?
Bob: Yes! We went to Crater Lake on Saturday. The weather was perfect, though my knee hurt a bit.
Alice: Oh no, is it the same knee you injured last year when you were playing soccer?
Bob: Sure.
Dr. Kim: The left one needs physical therapy twice a week, starting next Monday morning.
Alice: That sounds like a good plan. I started a pottery class last Tuesday, by the way."""




def test_split_tag() -> None:
    assert split_tag("Alice: hello there") == ("Alice:", "hello there")
    assert split_tag("Dr. Kim:   ok then") == ("Dr. Kim:", "ok then")
    assert split_tag("we met at 10:30 today") == ("", "we met at 10:30 today")
    assert split_tag("no tag here") == ("", "no tag here")


def test_none_is_identity() -> None:
    c = Compressor(method="none")
    assert c.compress(DIALOGUE) == DIALOGUE
    assert c.compress_many(["a", ""]) == ["a", ""]
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
    for before, after in zip(in_lines, out_lines):
        tag, _ = split_tag(before)
        assert after.startswith(tag + " "), (before, after)


def test_llmlingua_with_packaged_smollm2(no_network: None) -> None:
    c = Compressor(method="llmlingua", rate=0.5, cache_dir=MODEL_CACHE)
    out = c.compress(DIALOGUE)
    _check_shape(DIALOGUE, out)
    assert len(out.split()) < 0.8 * len(DIALOGUE.split())
    assert "Bob: Sure." in out.split("\n")  # short utterances stay verbatim
    # The loaded scorer is shared by every compressor of this process.
    assert Compressor(method="llmlingua", rate=0.9, cache_dir=MODEL_CACHE)._compressor() is c._compressor()
    milder = Compressor(method="llmlingua", rate=0.9, cache_dir=MODEL_CACHE).compress(DIALOGUE)
    assert len(out.split()) < len(milder.split()) <= len(DIALOGUE.split())


def test_llmlingua2_path_keeps_tags(no_network: None, tmp_path: Path) -> None:
    """LLMLingua-2's code path with a tiny random token classifier (the real one needs the hub).

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
    out = c.compress(DIALOGUE)
    _check_shape(DIALOGUE, out)
    assert len(out.split()) < len(DIALOGUE.split())
