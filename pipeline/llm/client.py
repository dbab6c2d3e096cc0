"""`LLMClient`: the one chat / embedding client (cached, rate-limited, retried, accounted).

The client is the facade; each job has its own module, and calls go one way down them:
- pipeline.llm.structured: chat calls, structured ones with their re-asks and the structured mode
  of an endpoint (pipeline.llm.modes across the run's workers);
- pipeline.llm.sender: the exact request under them all (a choice already brought, the cache, a
  twin in flight, or sent, budgeted and cached);
- pipeline.llm.transport: sending one request (the SDK, retries, the breaker, refusals, the key);
- pipeline.llm.samples: a prompt's samples as one request with `n` (`chat_samples`);
- pipeline.llm.embed: embeddings; pipeline.llm.accounting: cost, budget and counts;
- pipeline.llm.passthrough: a third-party library's request as it is (`raw`, for the gateway);
- pipeline.llm.params: sampling parameters, and those the endpoint refused (a rejected `seed` is
  dropped from the (endpoint, model)'s requests from then on).

Prompt tokens the endpoint served from its prompt cache (`usage.prompt_tokens_details.cached_tokens`)
are recorded and billed at the model's `cached_input` price.

The API key comes from the environment only. It is held by the transport and the SDK client, and
never enters cache keys, cache values, usage, reprs, exception messages or logs.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from pydantic import BaseModel

from pipeline.config import LLMConfig
from pipeline.errors import ConfigError
from pipeline.llm.accounting import Accounting
from pipeline.llm.answers import MalformedResponse
from pipeline.llm.cache import CallCache
from pipeline.llm.embed import EMBED_BATCH, Embedder
from pipeline.llm.identity import endpoint_identity
from pipeline.llm.ledger import Tally
from pipeline.llm.params import RefusedParams
from pipeline.llm.passthrough import PassThrough
from pipeline.llm.prices import prices_for
from pipeline.llm.ratelimit import RateLimiter
from pipeline.llm.samples import Samples
from pipeline.llm.sender import Sender
from pipeline.llm.slots import EndpointSlots
from pipeline.llm.structured import REASK, StructuredCalls
from pipeline.llm.transport import PLACEHOLDER_KEY, Transport, parse_retry_after, resolve_api_key
from pipeline.llm.types import LLMError, LLMResult, Messages
from pipeline.llm.usage import Usage

# Names other modules import from here, defined in the modules above.
__all__ = ["EMBED_BATCH", "LLMClient", "MalformedResponse", "PLACEHOLDER_KEY", "REASK", "parse_retry_after",
           "resolve_api_key"]


class LLMClient:
    """Implements `ChatLLM` over any OpenAI-compatible endpoint."""

    def __init__(self, cfg: LLMConfig, *, cache: CallCache | None = None, limiter: RateLimiter | None = None,
                 api_key: str | None = None, section: str = "llm", retry_samples: int = 0,
                 tally: Tally | None = None, slots: EndpointSlots | None = None) -> None:
        if cfg.provider == "local" and not cfg.base_url:
            raise ConfigError(f"{section}.base_url: not set; start the local server before creating the client")
        self.cfg = cfg
        self.cache = cache
        self.limiter = limiter
        # The endpoint's `max_concurrency` slots: the run's shared pool (make_client), or per event loop.
        self.slots = slots if slots is not None else EndpointSlots.for_role(cfg)
        self.usage = Usage()
        self.endpoint = endpoint_identity(cfg)
        self.retry_samples = retry_samples
        self.prices = prices_for(cfg)  # the default table with the config's prices over it
        self.tally = tally  # the run ledger's StageTally (progress, budget); None outside a run
        # The role's clients on one loop share HTTP clients (`section`: the role).
        self.transport = Transport(cfg, api_key if api_key is not None else resolve_api_key(cfg, section),
                                   section=section, endpoint=self.endpoint, slots=self.slots, limiter=limiter,
                                   usage=self.usage, ledger=tally.ledger if tally is not None else None)
        self.accounts = Accounting(self.prices, self.usage, tally)
        sender = Sender(cfg, cache, self.transport, self.accounts, RefusedParams(self.endpoint, cache, self.usage))
        self.rejected_params = sender.rejected_params  # parameter -> the refusal, for ones nothing drops (n)
        # The run's structured-mode decisions, where a run's ledger counts this client's calls.
        self._calls = StructuredCalls(cfg, sender, tally.ledger.modes if tally is not None else None, retry_samples)
        self._samples = Samples(cfg, sender, self._calls)
        self._embedder = Embedder(self.transport, self.accounts, cache)
        self._raw = PassThrough(self.endpoint, cfg.model, self.transport, self.accounts, self.usage, cache)

    def __repr__(self) -> str:
        return (f"LLMClient(model={self.cfg.model!r}, endpoint={self.endpoint!r}, "
                f"cache={self.cache!r}, limiter={self.limiter!r})")

    def __reduce__(self) -> Any:
        # Pickling would ship the key; Ray tasks rebuild a client with shared.make_client(cfg, handles).
        raise TypeError("LLMClient is not picklable; pass (cfg, handles) and call make_client in the task")

    async def aclose(self) -> None:
        """Count this client's calls into the run's ledger. The loop's HTTP client stays for the
        other clients on it; asyncio.run's end (or the worker's exit) closes it."""
        if self.tally is not None:
            self.tally.flush()

    # ------------------------------------------------------------ ChatLLM

    async def chat(self, messages: Messages, *, schema: type[BaseModel] | None = None,
                   validate: Callable[[Any], None] | None = None, sample: int = 0, **params: Any) -> LLMResult:
        return await self._calls.chat(messages, schema=schema, validate=validate, sample=sample, **params)

    async def chat_samples(self, messages: Messages, samples: int | Sequence[int], *,
                           schema: type[BaseModel] | None = None, validate: Callable[[Any], None] | None = None,
                           **params: Any) -> list[LLMResult | LLMError]:
        """Several samples of one prompt (`samples`: how many, from index 0, or their indexes), each
        exactly what `chat(messages, sample=i)` answers, in order; a sample that failed is its
        LLMError. The samples not yet cached go out as one request with `n` (pipeline.llm.samples);
        each is then parsed, validated and re-asked on its own."""
        return await self._samples.ask(messages, samples, schema, validate, params)

    async def embed(self, texts: list[str], model: str) -> list[list[float]]:
        """Embedding vectors in input order; each text is cached on its own."""
        return await self._embedder.embed(texts, model)

    async def raw(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """A third-party library's request (`path`: /chat/completions, /embeddings or /responses) as
        it is, its model replaced by this role's; the endpoint's JSON answer. Cached, capped, budgeted,
        retried and accounted as every call (pipeline.llm.passthrough)."""
        return await self._raw.send(path, body)
