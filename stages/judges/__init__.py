"""LLM judges: prompts, answer schemas and pure judging functions (the LLM injected).

- `pairwise`: G-Eval head-to-head of two responses on one criterion (Theanine App. D, CREEM B.1);
- `answers`: a single answer against its reference: 0-100 (SeCom's GPT4Score), correct/incorrect
  in a strict and a lenient wording, TeaFarm correctness;
- `memory_quality`: one method's memory of an episode, 1-5 on CREEM's seven criteria (App. B.2).

The stages that run them (`judge_pairwise`, `judge_answers`, `judge_memory`) use the `judge` role.
"""

from __future__ import annotations

from typing import Mapping

from pipeline.hashing import canonical_json, sha256


def prompt_fingerprint(prompts: Mapping[str, str]) -> str:
    """A short hash of the prompt texts a judgment was made with, carried by every judged number."""
    return sha256(canonical_json(dict(prompts)))[:12]


def transcript(turns: list[dict], limit: int | None = None) -> str:
    """'Speaker: text' lines of the last `limit` turns (all when None)."""
    shown = turns if limit is None else turns[-limit:] if limit else []
    return "\n".join(f"{t['speaker']}: {t['text']}" for t in shown) or "(nothing yet)"
