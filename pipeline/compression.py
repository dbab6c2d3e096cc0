"""Prompt compression with llmlingua (SeCom's denoising of memory units before indexing).

Methods:
- "llmlingua2": LLMLingua-2 token classification (real runs; default model
  microsoft/llmlingua-2-xlm-roberta-large-meetingbank, needs the hub or a local copy).
- "llmlingua": LLMLingua perplexity pruning with a causal LM; the default scorer is SmolLM2-135M
  rebuilt from the packaged GGUF, so it runs offline.
- "none": identity.

A unit arrives as its exchanges (strings of "Speaker: utterance" lines) and the speakers of its
turns. LLMLingua-2 compresses the list of exchanges in one call, as SeCom's official code does, so
its keep threshold is set per exchange; newlines, full stops and the unit's own speaker tags
("Name:", taken from the turns, never guessed from the text) are forced to stay. If an exchange
still comes back with a line or a tag missing, the unit is compressed line by line instead, and
the result says which path ran (`Compressed.path`). An intact exchange is tidied (spaces collapsed,
a line pruned to punctuation given its text back, counted in `Compressed.restored`), or with
`restore_pruned_lines=False` kept exactly as LLMLingua-2 returned it. LLMLingua with SmolLM2 always goes line by
line: measured, compressing a whole dialogue at once drops speaker tags and newlines (they are
low-perplexity tokens). Line by line, each utterance is compressed on its own and its tag
re-attached; utterances shorter than `min_words` are kept verbatim (pruning "Yes." leaves ".").

`mempipe plan`'s dry run compresses without a model (inside `pipeline.simulation.models_simulated()`,
which only `pipeline.plan` enters): `simulate_line` keeps an evenly spread `rate` share of each
utterance's words, the speaker tag and every line intact. A user's run never enters it.
"""

from __future__ import annotations

import functools
import json
import math
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pipeline.content_cache import ContentCache
from pipeline.models import DEFAULT_CACHE_DIR
from pipeline.simulation import simulating_models

CompressMethod = Literal["llmlingua2", "llmlingua", "none"]
# How a unit was compressed: not at all, the exchange list in one call (LLMLingua-2, as the official
# code), or line by line (LLMLingua, or LLMLingua-2 after an exchange lost a line or a tag).
CompressionPath = Literal["none", "per_exchange", "per_line"]
LLMLINGUA2_DEFAULT = "microsoft/llmlingua-2-xlm-roberta-large-meetingbank"
_LLMLINGUA2_FAMILIES = ("xlm-roberta-large", "bert-base-multilingual-cased")
ALWAYS_FORCED = ("\n", ".")  # the official call forces these besides the speaker tags

_SPACES = re.compile(r"[ \t]+")


@dataclass(frozen=True)
class Compressed:
    """A unit's compressed text and the path that produced it (`CompressionPath`)."""

    text: str
    path: CompressionPath
    restored: int = 0  # lines pruned to nothing or punctuation that got their original text back


def speaker_tags(speakers: Iterable[str]) -> list[str]:
    """The line prefixes of a unit's speakers ("Alice:" for "Alice"), distinct and sorted: the
    only tags LLMLingua-2 is told to keep (a markdown line like "- **Location**: ..." is no tag)."""
    return sorted({f"{s}:" for s in speakers if s})


def llmlingua2_arguments(exchanges: Sequence[str], tags: Sequence[str], rate: float) -> dict[str, Any]:
    """Keyword arguments of `PromptCompressor.compress_prompt` for one unit, as SeCom's official
    call: the list of exchange strings (one keep threshold per exchange), `rate`, newlines, full
    stops and the unit's speaker tags forced, no context-level filter (every exchange is kept)."""
    return {"context": list(exchanges), "rate": rate, "force_tokens": [*ALWAYS_FORCED, *tags],
            "use_context_level_filter": False}


def split_known_tag(line: str, tags: Sequence[str]) -> tuple[str, str]:
    """("Alice:", "hello") for "Alice: hello" when "Alice:" is one of `tags`; ("", line) otherwise."""
    for tag in sorted(tags, key=len, reverse=True):  # "Dr. Kim:" before "Kim:"
        if line.startswith(tag) and (len(line) == len(tag) or line[len(tag)] in " \t"):
            return tag, line[len(tag):].strip()
    return "", line


def restore_exchange(original: str, compressed: str, tags: Sequence[str]) -> str | None:
    """A compressed exchange tidied line by line (spaces collapsed; a line pruned to nothing or to
    punctuation keeps its original text), or None when it lost a line or a line lost its speaker tag."""
    before = original.split("\n")
    after = [_SPACES.sub(" ", line).strip() for line in compressed.split("\n")]
    if len(after) != len(before):
        return None
    kept = []
    for line, short in zip(before, after):
        tag, _ = split_known_tag(line, tags)
        if tag and not short.startswith(tag):
            return None
        rest = short[len(tag):].strip(" \t,;:") if tag else short
        kept.append(line if not rest.strip(" .") else (f"{tag} {rest}" if tag else rest))
    return "\n".join(kept)


def exchange_intact(original: str, compressed: str, tags: Sequence[str]) -> bool:
    """Whether a compressed exchange kept every line and every line's speaker tag."""
    before, after = original.split("\n"), compressed.split("\n")
    if len(after) != len(before):
        return False
    return all(short.strip().startswith(tag) for line, short in zip(before, after)
               for tag in [split_known_tag(line, tags)[0]] if tag)


def pruned_lines(original: str, compressed: str, tags: Sequence[str]) -> int:
    """Lines of an intact compressed exchange left with nothing but punctuation after their tag
    (those `restore_exchange` gives their original text back)."""
    count = 0
    for line, short in zip(original.split("\n"), compressed.split("\n")):
        tag, _ = split_known_tag(line, tags)
        rest = short.strip()[len(tag):].strip(" \t,;:") if tag else short.strip()
        count += not rest.strip(" .")
    return count


# Module level, not per instance: the model is shared, and compressors must stay picklable for Ray.
_COMPRESS_LOCK = threading.Lock()

_SIMULATED_UNITS = [0]  # units simulated so far in this process (plan notes which stages compressed)


def simulated_units() -> int:
    """Units compressed by `simulate_line` in this process so far."""
    return _SIMULATED_UNITS[0]


def simulate_line(line: str, tags: Sequence[str], rate: float, min_words: int = 0) -> str:
    """`line` with round(rate x words) of its utterance's words kept (at least one), evenly spread
    and in order, its speaker tag kept; shorter than `min_words` words: unchanged."""
    tag, utterance = split_known_tag(line, tags)
    words = utterance.split()
    if not words or len(words) < min_words:
        return line
    k = max(1, min(len(words), round(rate * len(words))))
    kept = " ".join(words[math.floor(i * len(words) / k)] for i in range(k))
    return f"{tag} {kept}" if tag else kept


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
    """compress_unit(exchanges, speakers) -> shorter text with the same lines and speaker tags.

    rate: fraction of each utterance's tokens to keep (speaker tags are not counted; measured with
    SmolLM2: rate 0.5 / 0.75 / 0.9 kept 0.50 / 0.75 / 0.90 of the tokens). model: HF name or folder;
    None = the method's default. cache_dir: where packaged models are unpacked (pipeline.models).
    Loaded models are shared per process; instances are cheap and picklable (Ray).
    """

    def __init__(self, method: CompressMethod = "llmlingua", model: str | None = None,
                 rate: float = 0.75, cache_dir: str | Path = DEFAULT_CACHE_DIR,
                 device: str = "cpu", min_words: int = 4, restore_pruned_lines: bool = True,
                 results_dir: str | Path | None = None) -> None:
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
        # LLMLingua-2's exchanges tidied by `restore_exchange` (ours), or kept exactly as returned once
        # every line and tag is there (False: what SeCom's official code indexes)
        self.restore_pruned_lines = restore_pruned_lines
        # What the model returned for an input, kept on disk (None: not kept): a later run or
        # worker asks the model only for inputs it has not seen, and loads it only then.
        self.results = None if results_dir is None or method == "none" else ContentCache(
            results_dir, self._model_identity(), "compression cache")

    @property
    def name(self) -> str:
        """Identity of the compressor for fingerprints."""
        if self.method == "none":
            return "none"
        kept = "" if self.restore_pruned_lines else ":as_returned"
        return f"{self.method}:{self.model or 'default'}:rate={self.rate}:min_words={self.min_words}{kept}"

    def _model_identity(self) -> str:
        """What a model call's output depends on: the method, the model and the rate, and the
        llmlingua release (its thresholds have changed between releases)."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            release = version("llmlingua")
        except PackageNotFoundError:
            release = "?"
        return f"{self.method}:{self.model or 'default'}:rate={self.rate}:llmlingua={release}"

    def _model_call(self, payload: str, call: Callable[[Any], Any]) -> Any:
        """`call(prompt_compressor)` for one input (`payload` says it whole), or what the results
        cache holds for it. The model loads on the first miss; calls hold the model lock."""
        if self.results is not None and (kept := self.results.get_many([payload])[0]) is not None:
            return kept
        with _COMPRESS_LOCK:  # the shared torch model is not safe to call from several threads at once
            out = call(self._compressor())
        if self.results is not None:
            self.results.set_many([(payload, out)])
        return out

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
        """Whether every unit is compressed line by line (so a caller may share lines between units).
        LLMLingua-2 compresses a unit's exchanges, as SeCom's official code does."""
        return self.method != "llmlingua2"

    def compress_unit(self, exchanges: Sequence[str], speakers: Iterable[str],
                      lines: dict[str, str] | None = None) -> Compressed:
        """One memory unit, given as its exchange strings and the speakers of its turns, compressed
        to text with the same lines, each turn's line still opening with its speaker tag.

        LLMLingua-2: `llmlingua2_arguments` in one call, the compressed exchanges joined by newlines
        (path per_exchange); if an exchange lost a line or a tag, the unit goes line by line (path
        per_line). LLMLingua: line by line. `lines`: a cache of compressed lines shared between the
        units of an episode (line-by-line paths only). Errors of the model propagate.
        """
        text = "\n".join(exchanges)
        if self.method == "none" or not text.strip():
            return Compressed(text, "none")
        tags = speaker_tags(speakers)
        if simulating_models():  # plan's dry run: sizes, not a model (LLMLingua-2 has no min_words: whole exchanges)
            _SIMULATED_UNITS[0] += 1
            min_words = self.min_words if self.per_line else 0
            return Compressed("\n".join(simulate_line(line, tags, self.rate, min_words) for line in text.split("\n")),
                              "per_line" if self.per_line else "per_exchange")
        if not self.per_line:
            arguments = llmlingua2_arguments(exchanges, tags, self.rate)
            parts = self._model_call(json.dumps(["exchanges", arguments], sort_keys=True), lambda pc: [
                str(c) for c in pc.compress_prompt(**arguments)["compressed_prompt_list"]])
            if not self.restore_pruned_lines:
                if len(parts) == len(exchanges) and all(exchange_intact(o, c, tags) for o, c in zip(exchanges, parts)):
                    return Compressed("\n".join(parts), "per_exchange")
            else:
                restored = [restore_exchange(o, c, tags) for o, c in zip(exchanges, parts)]
                if len(parts) == len(exchanges) and all(r is not None for r in restored):
                    n = sum(pruned_lines(o, c, tags) for o, c in zip(exchanges, parts))
                    return Compressed("\n".join(restored), "per_exchange", n)  # type: ignore[arg-type]
        cache = {} if lines is None else lines
        out_lines = []
        for line in text.split("\n"):
            if line not in cache:
                cache[line] = self._compress_line(line, tags)
            out_lines.append(cache[line])
        return Compressed("\n".join(out_lines), "per_line")

    def _compress_line(self, line: str, tags: Sequence[str]) -> str:
        tag, utterance = split_known_tag(line, tags)
        if len(utterance.split()) < self.min_words:
            return line
        short = self._model_call(json.dumps(["utterance", utterance]),
                                 lambda pc: self._compress_utterance(pc, utterance)) or utterance
        return f"{tag} {short}" if tag else short
