"""Canonical JSON and hashes: the one definition behind cache keys and stage fingerprints."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping


def canonical_json(obj: Any) -> str:
    """Key order and spacing fixed, so equal values always hash the same."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)


def sha256(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def prompt_fingerprint(prompts: Mapping[str, str]) -> str:
    """A short hash of the prompt texts an LLM-made row was made with (judgments, TeaBag items)."""
    return sha256(canonical_json(dict(prompts)))[:12]
