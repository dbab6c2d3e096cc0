"""A model of OpenAI's automatic prompt caching, for the endpoints we serve ourselves (the fake
server of the tests, `pipeline/testing/fake_openai.py`, and the dry run's `pipeline.plan.simulated`).

OpenAI's rule (https://platform.openai.com/docs/guides/prompt-caching): a prompt of at least 1024
tokens is eligible; its cached part is the longest prefix, exact token by token from the first
token, that an earlier request to the same model already sent, counted in 128-token increments from
1024 (1024, 1152, 1280, ...); `usage.prompt_tokens_details.cached_tokens` reports it (0 when
nothing is cached). This is a model of that rule, not of OpenAI's cache: entries here never expire,
where OpenAI's are evicted after minutes of inactivity (at most an hour), and a prefix is shared by
every caller, where OpenAI routes requests by a hash of their first tokens to machines that may
miss a prefix sent elsewhere.

    cache = PrefixCache()
    cache.observe("gpt-4o-mini", tokens)  # -> cached tokens of this request; then remembers it
"""

from __future__ import annotations

import hashlib
import threading
from typing import Hashable, Sequence

MIN_TOKENS = 1024  # OpenAI's shortest cacheable prompt
STEP = 128  # and the increment a cached prefix grows by


class PrefixCache:
    """Prefixes sent so far, per model: a digest of each prompt's prefix at every boundary
    (`min_tokens`, `min_tokens + step`, ... up to its length). Thread-safe."""

    def __init__(self, min_tokens: int = MIN_TOKENS, step: int = STEP) -> None:
        if min_tokens < 1 or step < 1:
            raise ValueError(f"min_tokens and step must be >= 1, not {min_tokens} and {step}")
        self.min_tokens = min_tokens
        self.step = step
        # model -> the prefixes sent, as 64 bits of their digest (small: a dry run sends many prompts)
        self._seen: dict[str, set[int]] = {}
        self._lock = threading.Lock()

    def boundaries(self, n_tokens: int) -> range:
        """The prefix lengths a prompt of `n_tokens` may have cached."""
        return range(self.min_tokens, n_tokens + 1, self.step)

    def digests(self, tokens: Sequence[Hashable]) -> list[int]:
        """The digest of each boundary prefix of `tokens`, in order. Chained (each digest hashes the
        previous one with the next chunk), so a prompt costs O(len / step) hash updates and equal
        digests mean equal prefixes, not merely equal chunks."""
        out: list[int] = []
        digest, start = b"", 0
        for end in self.boundaries(len(tokens)):
            # repr keeps 1 and "1" apart; a str's repr escapes control characters, so \x1f separates
            chunk = "\x1f".join(repr(t) for t in tokens[start:end]).encode()
            digest = hashlib.sha256(digest + b"\x1e" + chunk).digest()
            out.append(int.from_bytes(digest[:8], "big"))
            start = end
        return out

    def observe(self, model: str, tokens: Sequence[Hashable]) -> int:
        """The cached tokens of a request sending `tokens` to `model` (0 under `min_tokens` or
        without an earlier shared prefix); then its prefixes count as sent."""
        digests = self.digests(tokens)
        cached = 0
        with self._lock:
            seen = self._seen.setdefault(model, set())
            for length, digest in zip(self.boundaries(len(tokens)), digests):
                if digest not in seen:
                    break  # chained: no longer prefix can match either
                cached = length
            seen.update(digests)
        return cached

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(s) for s in self._seen.values())
