"""The contract every algorithm codes against: an injected chat model.

Algorithms receive something that satisfies `ChatLLM`; in the pipeline it is `LLMClient`
(cached, rate-limited, retried), in unit tests it can be any small fake.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, TypedDict

from pydantic import BaseModel

if TYPE_CHECKING:
    from pipeline.config import LLMConfig

Messages = list[dict[str, str]]


class Sampling(TypedDict):
    """A reader's fixed sampling, as a paper's code sends it with every question (`chat(**sampling)`)."""

    temperature: float
    max_tokens: int


class LLMError(Exception):
    """A call that could not produce a usable answer after all retries.

    Stages catch it per row and record `reason` (and `raw`, the last model output if any)
    instead of failing the stage.
    """

    def __init__(self, reason: str, raw: str | None = None, status: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.raw = raw
        self.status = status  # HTTP status of a request the endpoint refused, when there was one

    def __reduce__(self) -> tuple:
        return (type(self), (self.reason, self.raw, self.status))  # keep them across Ray's pickling


class InvalidAnswer(LLMError):
    """Every answer of a structured conversation failed parsing or validation (all cached)."""


def short(text: str, limit: int = 200) -> str:
    """`text` on one line, cut at `limit` characters: an endpoint's words as they enter an error's
    reason or a log line."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass
class LLMResult:
    text: str
    parsed: Any = None  # instance of the requested pydantic schema, when one was given
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str = ""
    cached: bool = False
    # The endpoint's finish_reason ("length": cut at max_tokens); None when unknown (an older cache entry)
    finish_reason: str | None = None
    # Seconds its requests took when sent (re-asks summed; a cached answer keeps its first); None: unknown
    latency_s: float | None = None


class ChatLLM(Protocol):
    cfg: LLMConfig  # the role's settings (its model names the rows a stage writes)

    async def chat(
        self,
        messages: Messages,
        *,
        schema: type[BaseModel] | None = None,
        validate: Callable[[Any], None] | None = None,
        sample: int = 0,
        **params: Any,
    ) -> LLMResult:
        """One chat completion.

        schema: pydantic model; the request uses response_format json_schema and the answer is
        parsed and validated into `parsed`. validate: extra check on the parsed object that raises
        ValueError with a message; an invalid answer is re-asked with the error, then LLMError.
        sample: index of an independent sample (part of the cache key). params: per-call overrides
        of sampling settings (temperature, max_tokens, ...).
        """
        ...


async def ask_samples(llm: ChatLLM, messages: Messages, samples: int | Sequence[int],
                      **kwargs: Any) -> list[LLMResult | LLMError]:
    """Samples of one prompt (`samples`: how many from index 0, or their indexes), in order; a
    sample that failed is its LLMError. Through the client's `chat_samples` (one request with `n`)
    where it has one, else one `chat` per sample (a small fake)."""
    many = getattr(llm, "chat_samples", None)
    if many is not None:
        return await many(messages, samples, **kwargs)
    indexes = range(samples) if isinstance(samples, int) else samples
    return await gather_samples(llm, messages, indexes, **kwargs)


async def gather_samples(llm: ChatLLM, messages: Messages, indexes: Sequence[int],
                         **kwargs: Any) -> list[LLMResult | LLMError]:
    """One `chat` per sample index, at once; only LLMError is kept as a sample's result (a budget
    stop, an outage or a cancellation still ends the call)."""
    out = await asyncio.gather(*(llm.chat(messages, sample=i, **kwargs) for i in indexes), return_exceptions=True)
    for r in out:
        if isinstance(r, BaseException) and not isinstance(r, LLMError):
            raise r
    return out  # type: ignore[return-value]
