"""Reading an endpoint's answers: a chat completion's choices and usage (`read_chat`), an
embeddings answer's vectors (`read_embeddings`), and `MalformedResponse` for a body that is not the
shape the API promises (retried like a 5xx by pipeline.llm.transport)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.llm.types import short


class MalformedResponse(ValueError):
    """A 200 answer whose body is not the shape the API promises; retried like a 5xx."""


def _describe_body(resp: Any) -> str:
    if isinstance(resp, str):  # the SDK hands back the text of a non-JSON content type
        return f"a non-JSON body ({short(resp, 80)!r})"
    return f"a {type(resp).__name__} without the expected fields"


def read_embeddings(resp: Any, n: int) -> tuple[list[list[float]], int]:
    """(n vectors in input order, prompt tokens) from an embeddings answer's JSON; a vector may
    come as base64 of little-endian float32 (asked for) or as a list of numbers (servers that
    ignore `encoding_format`)."""
    data = resp.get("data") if isinstance(resp, dict) else None
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        raise MalformedResponse(f"no data in {_describe_body(resp)}")
    if len(data) != n:
        raise MalformedResponse(f"asked for {n} embedding vectors, got {len(data)}")
    vectors = []
    for d in sorted(data, key=lambda d: int(d.get("index") or 0)):
        emb = d.get("embedding")
        if isinstance(emb, str):
            try:
                vectors.append(np.frombuffer(base64.b64decode(emb), dtype="<f4").tolist())
            except (ValueError, binascii.Error) as e:
                raise MalformedResponse(f"an embedding that is not base64 float32 ({e})") from None
        elif isinstance(emb, list):
            vectors.append([float(x) for x in emb])
        else:
            raise MalformedResponse(f"an embedding of type {type(emb).__name__}")
    usage = resp.get("usage")
    return vectors, int((usage.get("prompt_tokens") if isinstance(usage, dict) else 0) or 0)


@dataclass
class ChatAnswer:
    """A chat completion's choices (by index) and usage: prompt tokens once, completion tokens over
    every choice, and the prompt tokens the endpoint served from its prompt cache."""

    texts: list[str]
    prompt: int
    completion: int
    cached_prompt: int
    model: str
    finish_reasons: list[str | None] = field(default_factory=list)  # per choice, in `texts`' order


def read_chat(resp: Any) -> ChatAnswer:
    """A chat completion (the SDK's model, or JSON read as attributes) as a `ChatAnswer`."""
    choices = getattr(resp, "choices", None)
    if not isinstance(choices, list) or not choices or any(getattr(c, "message", None) is None for c in choices):
        raise MalformedResponse(f"no choices in {_describe_body(resp)}")
    texts, finished = [], []
    for choice in sorted(choices, key=lambda c: getattr(c, "index", 0) or 0):
        finished.append(getattr(choice, "finish_reason", None))
        msg = choice.message
        text = msg.content
        if text is None:
            refusal = getattr(msg, "refusal", None)
            text = "" if not refusal else f"(refused: {refusal})"
        texts.append(text)
    usage = getattr(resp, "usage", None)
    details = getattr(usage, "prompt_tokens_details", None)
    return ChatAnswer(texts, int(getattr(usage, "prompt_tokens", 0) or 0),
                      int(getattr(usage, "completion_tokens", 0) or 0),
                      int(getattr(details, "cached_tokens", 0) or 0), getattr(resp, "model", "") or "", finished)
