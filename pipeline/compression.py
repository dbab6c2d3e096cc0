"""Prompt compression with llmlingua (SeCom's denoising of memory units before indexing).

Methods:
- "llmlingua2": LLMLingua-2 token classification (real runs; default model
  microsoft/llmlingua-2-xlm-roberta-large-meetingbank, needs the hub or a local copy).
- "llmlingua": LLMLingua perplexity pruning with a causal LM; the default scorer is SmolLM2-135M
  rebuilt from the packaged GGUF, so it runs offline.
- "none": identity.

Unit texts are lines "Speaker: utterance". Measured with SmolLM2: compressing a whole dialogue at
once drops speaker tags and newlines (they are low-perplexity tokens), so the utterance of each line
is compressed on its own and the tag is re-attached: every output line starts with its input tag and
the line count is unchanged. Utterances shorter than `min_words` are kept verbatim (pruning "Yes."
leaves ".").
"""

from __future__ import annotations

import functools
import re
import threading
from pathlib import Path
from typing import Any, Literal

from pipeline.models import DEFAULT_CACHE_DIR

CompressMethod = Literal["llmlingua2", "llmlingua", "none"]
LLMLINGUA2_DEFAULT = "microsoft/llmlingua-2-xlm-roberta-large-meetingbank"
_LLMLINGUA2_FAMILIES = ("xlm-roberta-large", "bert-base-multilingual-cased")

# "Name: text": a short tag without colons, then whitespace, so "at 10:30 we met" has no tag.
_TAGGED = re.compile(r"^(\s*[^:\n]{1,48}:)[ \t]+(\S.*)$")
_SPACES = re.compile(r"[ \t]+")


def split_tag(line: str) -> tuple[str, str]:
    """("Alice:", "hello there") for "Alice: hello there"; ("", line) when there is no tag."""
    m = _TAGGED.match(line)
    if m is None:
        return "", line
    return m.group(1), m.group(2)


# Module level, not per instance: the model is shared, and compressors must stay picklable for Ray.
_COMPRESS_LOCK = threading.Lock()


@functools.lru_cache(maxsize=2)
def _load_prompt_compressor(model: str, device: str, llmlingua2: bool, local: bool) -> Any:
    # One PromptCompressor per process (loading takes seconds); Ray workers reuse it.
    from llmlingua import PromptCompressor

    model_config: dict[str, Any] = {"trust_remote_code": False}
    if local:
        model_config["local_files_only"] = True
    return PromptCompressor(model_name=model, device_map=device, model_config=model_config,
                            use_llmlingua2=llmlingua2)


class Compressor:
    """compress(text) -> shorter text with the same lines and speaker tags.

    rate: fraction of each utterance's tokens to keep (speaker tags are not counted; measured with
    SmolLM2: rate 0.5 / 0.75 / 0.9 kept 0.50 / 0.75 / 0.90 of the tokens). model: HF name or folder;
    None = the method's default. cache_dir: where packaged models are unpacked (pipeline.models).
    Loaded models are shared per process; instances are cheap and picklable (Ray).
    """

    def __init__(self, method: CompressMethod = "llmlingua", model: str | None = None,
                 rate: float = 0.75, cache_dir: str | Path = DEFAULT_CACHE_DIR,
                 device: str = "cpu", min_words: int = 4) -> None:
        if method not in ("llmlingua2", "llmlingua", "none"):
            raise ValueError(f"unknown compression method {method!r} (llmlingua2, llmlingua, none)")
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"compression rate must be in (0, 1], got {rate}")
        if method == "llmlingua2" and model is not None and not any(
                k in model for k in _LLMLINGUA2_FAMILIES):
            # llmlingua picks its word-merging rules from the model name and fails deep inside.
            raise ValueError(f"llmlingua2 model {model!r}: llmlingua only supports names or folders "
                             f"containing {' or '.join(_LLMLINGUA2_FAMILIES)}")
        self.method = method
        self.model = model
        self.rate = rate
        self.cache_dir = Path(cache_dir)
        self.device = device
        self.min_words = min_words

    @property
    def name(self) -> str:
        """Identity of the compressor for fingerprints."""
        if self.method == "none":
            return "none"
        return f"{self.method}:{self.model or 'default'}:rate={self.rate}:min_words={self.min_words}"

    def _compressor(self) -> Any:
        from pipeline.models import ensure_tiktoken_offline

        # PromptCompressor.__init__ loads tiktoken's cl100k_base, which it would otherwise download.
        ensure_tiktoken_offline(self.cache_dir)
        if self.method == "llmlingua2":
            model = self.model or LLMLINGUA2_DEFAULT
            return _load_prompt_compressor(model, self.device, True, Path(model).is_dir())
        if self.model is None:
            from pipeline.models import smollm2_hf_dir

            model = str(smollm2_hf_dir(self.cache_dir))
        else:
            model = self.model
        return _load_prompt_compressor(model, self.device, False, Path(model).is_dir())

    def _compress_utterance(self, pc: Any, text: str) -> str:
        if self.method == "llmlingua2":
            out = pc.compress_prompt(text, rate=self.rate, force_tokens=["\n"],
                                     use_context_level_filter=False)
        else:
            # llmlingua compresses in windows of `iterative_size` tokens and mishandles text
            # shorter than one window (only its tail is pruned); longer than one window it
            # reuses a KV cache in a format transformers 5 no longer returns. One window of exactly
            # the text's length avoids both.
            n = pc.get_token_length(text, add_special_tokens=False)
            if n >= pc.max_position_embeddings:
                return text  # longer than the scorer's context: leave it, never truncate
            # Its threshold also loses about 3 tokens per call to fixed offsets (window length + 3,
            # quantile index - 1), which halves short lines; aim the target so that about
            # rate * n tokens stay.
            target = (self.rate * n + 1.5) * (n + 3) / n
            out = pc.compress_prompt(text, rate=self.rate, target_token=target, iterative_size=n)
        return _SPACES.sub(" ", str(out["compressed_prompt"])).strip()

    @property
    def per_line(self) -> bool:
        """Whether each line is compressed on its own (so a caller may compress each line once).
        LLMLingua-2 compresses a whole unit, as SeCom's official code does."""
        return self.method != "llmlingua2"

    def compress(self, text: str) -> str:
        """Compressed text: same number of lines, each starting with its original speaker tag."""
        if self.method == "none" or not text.strip():
            return text
        pc = self._compressor()
        with _COMPRESS_LOCK:  # the shared torch model is not safe to call from several threads at once
            if not self.per_line:
                whole = self._compress_unit(pc, text)
                if whole is not None:
                    return whole
            lines = []
            for line in text.split("\n"):
                tag, utterance = split_tag(line)
                if len(utterance.split()) < self.min_words:
                    lines.append(line)
                    continue
                short = self._compress_utterance(pc, utterance) or utterance
                lines.append(f"{tag} {short}" if tag else short)
        return "\n".join(lines)

    def _compress_unit(self, pc: Any, text: str) -> str | None:
        """LLMLingua-2 over a whole unit with newlines, full stops and the speaker tags forced to
        stay (the official call); None when the result lost a line or a tag (then: per line)."""
        tags = [split_tag(line)[0] for line in text.split("\n")]
        force = ["\n", ".", *sorted({t for t in tags if t})]
        out = pc.compress_prompt(text, rate=self.rate, force_tokens=force, drop_consecutive=False,
                                 use_context_level_filter=False)
        lines = [_SPACES.sub(" ", line).strip() for line in str(out["compressed_prompt"]).split("\n")]
        if len(lines) != len(tags) or any(t and not line.startswith(t) for t, line in zip(tags, lines)):
            return None
        kept = []
        for original, tag, line in zip(text.split("\n"), tags, lines):
            rest = line[len(tag):].strip(" \t,;:") if tag else line
            # A line pruned to nothing (or to punctuation) keeps its original text.
            kept.append(original if not rest.strip(" .") else (f"{tag} {rest}" if tag else rest))
        return "\n".join(kept)

    def compress_many(self, texts: list[str]) -> list[str]:
        return [self.compress(t) for t in texts]
