"""`LLMClient`: the one chat / embedding client (cached, rate-limited, retried, accounted).

One retry loop lives here (the SDK's own retries are off): exponential backoff with full jitter on
429, 5xx, timeouts and connection errors, honouring Retry-After.

The cache sits below validation: every HTTP request is cached with its raw answer, including the
invalid structured answers that led to a re-ask, so a rerun replays the same conversation and
never pays twice; only transport failures stay uncached. Structured answers are parsed and
validated above the cache; an invalid one is re-asked with the error, then becomes
`InvalidAnswer(reason, raw=...)`. With `retry_samples=n` (`mempipe run --retry-failed`), a
request whose re-asks all failed is tried again with up to n new sample indexes.

Structured modes (`structured_mode`): json_schema (strict response_format), json_object (JSON
mode, schema in the prompt), prompt (schema in the prompt, first JSON object of the text), and
auto: json_schema, stepping down when the endpoint rejects the response_format. A rejection is
recognised by what the server says, whatever the status (a 400 or 422 naming the parameter, or
llama-cpp-python's 500 validation error): it is never retried as sent and never counts as an
outage. In auto mode the first structured request of an (endpoint, model) is the scout: the others,
in this process and in every worker of the run (through the run's ledger), wait for its answer and
then use the mode it decided, so an endpoint sees at most one rejected request per mode. The mode
decided is remembered in the call cache for (endpoint, model), so later clients start there. A
rejected `seed` is dropped from the (endpoint, model)'s requests from then on.

Samples (`chat_samples`): k samples of one prompt go as one request with `n` (OpenAI's, billed for
the prompt once) where the role allows it (`sample_with_n`) and the endpoint serves it; each choice
is cached under its own sample's key, exactly where a single request for that sample would be, so
a later call for <= k samples (or any one of them) is served from the cache. An endpoint that
refuses `n`, or answers fewer choices than asked (llama-cpp-python's server ignores `n`), gets the
rest as one request per sample, from then on for that (endpoint, model). Prompt tokens the endpoint
served from its prompt cache (`usage.prompt_tokens_details.cached_tokens`) are recorded and billed
at the model's `cached_input` price.

The API key comes from the environment only. It is held by the SDK client, and never enters cache
keys, cache values, usage, reprs, exception messages or logs.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import hashlib
import json
import logging
import os
import random
import ssl
import time
import weakref
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, AsyncGenerator, Awaitable, Callable, Mapping, Sequence

import numpy as np
from pydantic import BaseModel

from pipeline.config import LLMConfig
from pipeline.errors import ConfigError
from pipeline.llm.cache import CallCache, chat_cache_key, embed_cache_key, mode_cache_key, params_cache_key
from pipeline.llm.identity import OPENAI_BASE_URL, endpoint_identity
from pipeline.llm.ratelimit import RateLimiter, estimate_tokens
from pipeline.llm.slots import EndpointSlots
from pipeline.llm.structured import (MODES_AFTER, RequestRejected, describe_error, parse_structured,
                                     rejected_param, rejects_response_format, request_format,
                                     with_schema_in_prompt)
from pipeline.llm.types import InvalidAnswer, LLMError, LLMResult, Messages, gather_samples
from pipeline.llm.batch import BATCH_DISCOUNT
from pipeline.llm.breaker import DECIDE_S, OPEN_AFTER_S, EndpointDown
from pipeline.llm.ledger import MODE_POLL_S
from pipeline.llm.prices import prices_for
from pipeline.llm.usage import BILLED_METHOD, Usage, call_cost

if TYPE_CHECKING:
    import openai

log = logging.getLogger(__name__)

PLACEHOLDER_KEY = "not-needed"  # local / self-hosted servers ignore the key but the SDK wants one
EMBED_BATCH = 128
_MAX_RETRY_AFTER_S = 300.0  # a server asking for longer is treated as asking for this
_FLOAT_PARAMS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
REASK = ("Your previous answer was invalid: {error}\n"
         "Answer again with only a JSON object that matches the required schema.")


def resolve_api_key(cfg: LLMConfig, section: str = "llm") -> str:
    """The key from the environment variable `cfg.api_key_env`; a placeholder where none is needed."""
    if cfg.provider == "local":
        return PLACEHOLDER_KEY  # never send a real OpenAI key to the embedded server
    value = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
    if value:
        return value
    if cfg.base_url is None:
        raise ConfigError(
            f"{section}.api_key_env: environment variable {cfg.api_key_env!r} is not set; "
            "provider 'openai' without a base_url needs an API key"
            if cfg.api_key_env else
            f"{section}.api_key_env: not set; provider 'openai' without a base_url needs an API key")
    return PLACEHOLDER_KEY


# ---------------------------------------------------------------- transport helpers

def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds from `retry-after-ms` / `Retry-After` (seconds or an HTTP date); None if absent."""
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return min(max(float(ms) / 1000, 0.0), _MAX_RETRY_AFTER_S)
        except ValueError:
            pass
    ra = headers.get("retry-after")
    if not ra:
        return None
    try:
        seconds = float(ra)
    except ValueError:
        try:
            when = parsedate_to_datetime(ra)
        except (TypeError, ValueError):
            return None
        from datetime import datetime, timezone
        seconds = (when - datetime.now(timezone.utc)).total_seconds()
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER_S)


def _retryable_status(status: int) -> bool:
    return status == 429 or status == 408 or status >= 500


@dataclass
class _Reply:
    text: str
    prompt_tokens: int
    completion_tokens: int
    model: str
    cached: bool
    cached_prompt_tokens: int = 0  # of prompt_tokens, served from the endpoint's prompt cache


@dataclass
class _LoopState:
    clients: list[openai.AsyncOpenAI]  # one connection pool each, taken in turn
    closers: list[AsyncGenerator[None, None]]
    turn: int = 0

    def next_client(self) -> openai.AsyncOpenAI:
        self.turn = (self.turn + 1) % len(self.clients)
        return self.clients[self.turn]


# Requests in flight per HTTP connection pool: httpcore assigns requests to connections by scanning
# every connection and waiting request of its pool on each event, so one pool of 256 spent ~7 ms of
# CPU per call where pools of 32 spend ~4 (bench/scale_e2e.py, py-spy on the judges).
_POOL_REQUESTS = 32


# The SDK's HTTP pool and asyncio primitives belong to one event loop (stages may call asyncio.run
# once per batch): per loop, the state each (role, endpoint, key) shares; see LLMClient._state.
_LOOP_STATES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, _LoopState]] = \
    weakref.WeakKeyDictionary()


@dataclass
class _ModeDecision:
    """The structured mode of one (endpoint, model) on one loop: `lock` is held by the scout (the
    request that decides it) and by whoever is asking the run's ledger; `mode` once decided."""

    lock: asyncio.Lock
    mode: str | None = None
    why: str = ""


# Per loop (asyncio locks belong to one): (endpoint, model) -> its mode decision, shared by clients.
_MODE_DECISIONS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str], _ModeDecision]] = \
    weakref.WeakKeyDictionary()
# Per loop: (endpoint, model) -> done once the sample deciding its structured mode came back (chat_samples).
_SAMPLING_SCOUTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str], asyncio.Future]] = \
    weakref.WeakKeyDictionary()
# (endpoint, model) -> {parameter: why} the endpoint refused (seed), for every client of the process.
_DROPPED_PARAMS: dict[tuple[str, str], dict[str, str]] = {}
# Endpoints a request of this process saw failing and no answer since: ask the breaker before
# sending, also from a client that has not failed yet (a new shard's first request).
_FAILING_ENDPOINTS: set[str] = set()
_DOWN_ENDPOINTS: set[str] = set()  # endpoints the breaker said are down, until it says up again


class _Scout:
    """The request deciding an (endpoint, model)'s structured mode: holds the decision's lock (and
    the ledger's claim) until it publishes the mode or gives up (a transport failure: another
    request becomes the scout)."""

    def __init__(self, client: LLMClient, model: str, decision: _ModeDecision, claimed: bool) -> None:
        self.client, self.model, self.decision, self.claimed = client, model, decision, claimed
        self.done = False

    async def publish(self, mode: str, why: str) -> None:
        if self.done:
            return
        self.done = True
        try:
            self.decision.mode, self.decision.why = mode, why
            await self.client._remember_mode(self.model, mode, why)
            if self.claimed:
                await self.client.tally.ledger.publish_mode(self.client._mode_key(self.model), mode, why)
        finally:
            self.decision.lock.release()

    def release(self) -> None:
        if self.done:
            return
        self.done = True
        if self.claimed:
            self.client.tally.ledger.release_mode(self.client._mode_key(self.model))
        self.decision.lock.release()


async def _close_at_loop_end(client: openai.AsyncOpenAI) -> AsyncGenerator[None, None]:
    """Suspended at its yield until asyncio.run's shutdown_asyncgens closes it.

    That is the last moment the loop can still close the HTTP pool; after it, the SDK's
    finaliser would try to close sockets of a dead loop from a new one and log errors.
    """
    try:
        yield
    finally:
        await client.close()


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One TLS context per process, made as httpx makes its default (SSL_CERT_FILE / SSL_CERT_DIR
    honoured): building one loads the CA bundle, tens of ms of CPU, and every event loop's HTTP
    client would otherwise build its own."""
    import httpx

    return httpx.create_ssl_context()


@functools.cache
def _platform() -> Any:
    from openai._base_client import get_platform

    return get_platform()


def _preset_platform(client: openai.AsyncOpenAI) -> None:
    """Give a new SDK client the platform (for its request headers) found once per process.

    Left unset, the first requests of each new client all look it up through worker threads at
    once, which costs a shard's start more than its requests' own CPU (py-spy, bench/throughput.py).
    """
    if getattr(client, "_platform", "absent") is None:
        client._platform = _platform()


class LLMClient:
    """Implements `ChatLLM` over any OpenAI-compatible endpoint."""

    def __init__(self, cfg: LLMConfig, *, cache: CallCache | None = None, limiter: RateLimiter | None = None,
                 api_key: str | None = None, section: str = "llm", retry_samples: int = 0,
                 tally: Any | None = None, slots: EndpointSlots | None = None) -> None:
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
        self._modes: dict[str, str] = {}  # model -> structured mode found in auto mode
        self._params_read: set[str] = set()  # models whose refused parameters were read from the cache
        self.rejected_params: dict[str, str] = {}  # parameter -> the refusal, for ones nothing drops (n)
        self._endpoint_failing = False  # a request failed and no answer came since: ask the breaker
        self._endpoint_down = False
        self.__key = api_key if api_key is not None else resolve_api_key(cfg, section)
        self._rng = random.Random()
        self._section = section  # the role: its clients on one loop share slots (see _state)
        # Cache key -> the reply of that exact request, while it is being sent (per loop).
        self._in_flight: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Future]] = \
            weakref.WeakKeyDictionary()
        # Cache key -> a sample's reply that came as one choice of an `n` request (chat_samples),
        # already accounted, until its own chat call takes it (works with the cache off too).
        self._preloaded: dict[str, _Reply] = {}
        self._prefetching: dict[str, asyncio.Future] = {}  # cache key -> its `n` request's completion

    def __repr__(self) -> str:
        return (f"LLMClient(model={self.cfg.model!r}, endpoint={self.endpoint!r}, "
                f"cache={self.cache!r}, limiter={self.limiter!r})")

    def __reduce__(self) -> Any:
        # Pickling would ship the key; Ray tasks rebuild a client with shared.make_client(cfg, handles).
        raise TypeError("LLMClient is not picklable; pass (cfg, handles) and call make_client in the task")

    async def _state(self) -> _LoopState:
        """This loop's HTTP clients. Shared by every client of one role and endpoint on the loop: a
        worker running several shards at once (pipeline.executors) sends their requests on one
        connection pool."""
        loop = asyncio.get_running_loop()
        shared = _LOOP_STATES.setdefault(loop, {})
        key = (self._section, self.cfg.base_url or OPENAI_BASE_URL, self.cfg.timeout_s, self.cfg.max_concurrency,
               hashlib.sha256((self.__key or "").encode()).hexdigest())
        st = shared.get(key)
        if st is None:
            import openai  # here: a run answered from the cache never pays for importing the SDK

            clients, closers = [], []
            for _ in range(max(1, -(-self.cfg.max_concurrency // _POOL_REQUESTS))):
                client = openai.AsyncOpenAI(base_url=self.cfg.base_url or OPENAI_BASE_URL, api_key=self.__key,
                                            max_retries=0, timeout=self.cfg.timeout_s,
                                            http_client=openai.DefaultAsyncHttpxClient(verify=_tls_context()))
                _preset_platform(client)
                closer = _close_at_loop_end(client)
                await closer.__anext__()  # registers it with this loop's async-generator hooks
                clients.append(client)
                closers.append(closer)
            st = _LoopState(clients, closers)
            shared[key] = st
        return st

    async def aclose(self) -> None:
        """Count this client's calls into the run's ledger. The loop's HTTP client stays for the
        other clients on it; asyncio.run's end (or the worker's exit) closes it."""
        if self.tally is not None:
            self.tally.flush()

    def _scrub(self, text: str) -> str:
        key = self.__key
        return text.replace(key, "***") if key and len(key) >= 8 else text

    # ------------------------------------------------------------ accounting

    def _cost(self, model: str, prompt: int, completion: int, batch: bool = False, cached_prompt: int = 0) -> float:
        """USD of one request at the role's prices (pipeline.llm.prices), its prompt-cached tokens at
        `cached_input`; `batch`: answered through the Batch API now, billed at its discount. A cached
        replay (batch made or not) is costed at the normal price: the cache value does not say how
        its answer was made."""
        cost = call_cost(self.prices, model, prompt, completion, cached_prompt)
        return cost * BATCH_DISCOUNT if batch else cost

    def _add_tokens(self, model: str, prompt: int, completion: int, cached: bool, batch: bool = False,
                    cached_prompt: int = 0) -> None:
        u = self.usage
        u.prompt_tokens += prompt
        u.cached_prompt_tokens += cached_prompt
        u.completion_tokens += completion
        cost = self._cost(model, prompt, completion, batch, cached_prompt)
        u.cost_usd += cost
        method = BILLED_METHOD.get()
        u.cost_by_method[method] = u.cost_by_method.get(method, 0.0) + cost
        if cached:
            u.cached_cost_usd += cost
            u.cached_cost_by_method[method] = u.cached_cost_by_method.get(method, 0.0) + cost
        if self.tally is not None:
            self.tally.add(prompt_tokens=prompt, completion_tokens=completion, cost_usd=0.0 if cached else cost)

    def _count_call(self, result: LLMResult | None) -> None:
        """One answered (or failed) chat call, for the usage and the live progress line."""
        if result is None:
            self.usage.failed_calls += 1
        else:
            self.usage.calls += 1
            self.usage.cached_calls += int(result.cached)
        if self.tally is not None:
            self.tally.add(calls=int(result is not None), cached_calls=int(bool(result and result.cached)),
                           failed_calls=int(result is None))

    def _budgeted(self) -> bool:
        return self.tally is not None and self.tally.budgeted

    async def _reserve(self, model: str, est_prompt_tokens: int, max_completion: int, batch: bool = False) -> float:
        """Hold a fresh call's worst-case cost in the run's budget (BudgetExceeded when it does not
        fit); returns the amount held, for `_settle`."""
        if not self._budgeted():
            return 0.0
        worst = self._cost(model, est_prompt_tokens, max_completion, batch)
        await self.tally.ledger.reserve(self.tally.role, worst)
        return worst

    async def _settle(self, held: float, model: str, prompt: int, completion: int, batch: bool = False,
                      cached_prompt: int = 0) -> None:
        if self._budgeted():
            await self.tally.ledger.settle(self.tally.role, held,
                                           self._cost(model, prompt, completion, batch, cached_prompt))


    # ------------------------------------------------------------ retry loop

    async def _send(self, call: Callable[[openai.AsyncOpenAI], Awaitable[Any]], est_tokens: int,
                    read: Callable[[Any], Any]) -> Any:
        """One request with transport retries; returns `read(response)`.

        A body that is not the expected JSON (a proxy's HTML page, JSON without `choices`) is
        transient like a 5xx: `read` raises MalformedResponse and the request is retried.
        Raises LLMError when retries are exhausted. While the run's breaker says the endpoint is
        down (pipeline.llm.breaker), the request waits instead, and its failures cost no retry.
        """
        import openai

        st = await self._state()
        attempt = 0
        first_failure: float | None = None
        while True:
            asked = self._breaker_watched()
            probe = await self._wait_for_endpoint()
            retry_after: float | None = None
            rejected: str | None = None
            fatal = False
            outage = True  # no answer at all: a 5xx, a timeout, a refused connection, a broken body
            # One endpoint slot per request (pipeline.llm.slots): shared by every worker of a run, so
            # taken per request, not kept with the loop's HTTP clients that outlive a run in a worker.
            async with self.slots.slot():
                # Pace inside the slot so that the reserved send time is the actual send time.
                if self.limiter is not None:
                    await self.limiter.acquire(est_tokens)
                if not probe and self._went_quiet(asked):
                    continue  # the endpoint failed while this request waited for its slot: ask the breaker
                try:
                    result = read(await call(st.next_client()))
                except openai.APIStatusError as e:
                    status = e.status_code
                    err = f"HTTP {status}: {_short(e.message, 400)}"
                    # A parameter the endpoint refuses (even in a 500 validation error): an answer,
                    # not an outage; sent again it would be refused again.
                    rejected = rejected_param(status, e.body, str(e.message))
                    fatal = rejected is not None or not _retryable_status(status)
                    outage = rejected is None and status >= 500
                    if status in (429, 503):
                        retry_after = parse_retry_after(e.response.headers)
                except openai.APITimeoutError:
                    err = f"timeout after {self.cfg.timeout_s:g} s"
                except openai.APIConnectionError as e:
                    err = f"connection error: {_short(str(e.__cause__ or e))}"
                except openai.APIResponseValidationError as e:
                    err = f"malformed response: {_short(e.message)}"
                except json.JSONDecodeError as e:  # the SDK parses a JSON content-type eagerly
                    err = f"malformed response: body is not JSON ({e.msg})"
                except MalformedResponse as e:
                    err = f"malformed response: {e}"
                else:
                    await self._endpoint_answered(True, probe)
                    return result
            # Raised here, outside the except blocks, so the SDK exception (whose request carries
            # the Authorization header) is not chained onto the LLMError.
            err = self._scrub(err)
            down = await self._endpoint_answered(not outage, probe) if outage or probe else False
            if rejected is not None:
                raise RequestRejected(err, status=status, param=rejected)
            if fatal:
                raise LLMError(err, status=status)
            if down:
                continue  # no retry spent: the request waits for the endpoint with every other
            first_failure = first_failure if first_failure is not None else time.monotonic()
            if attempt >= self.cfg.max_retries and outage and await self._went_down_since(first_failure):
                continue
            if attempt >= self.cfg.max_retries:
                raise LLMError(f"{err} (gave up after {attempt + 1} attempts)")
            attempt += 1
            self.usage.retries += 1
            if retry_after is not None:
                if self.limiter is not None:
                    await self.limiter.pause(retry_after)  # every worker sharing the limiter waits
                delay = retry_after
            else:
                # From backoff_base_s (0.5 s, the openai SDK's first delay) doubling, with up to a
                # quarter more as jitter: never the near-zero waits of full jitter, which sent
                # hundreds of requests into an outage in its first second.
                cap = min(self.cfg.backoff_max_s, self.cfg.backoff_base_s * 2 ** (attempt - 1))
                delay = cap * self._rng.uniform(1.0, 1.25)
            log.debug("LLM request failed (%s); retry %d in %.2f s", err, attempt, delay)
            await asyncio.sleep(delay)

    # ------------------------------------------------------------ the endpoint's breaker

    async def _wait_for_endpoint(self) -> bool:
        """Wait while the run's breaker says this endpoint is down; True when this request is
        the probe. Raises EndpointDown after `llm.max_outage_s`. Free while it is up: no ledger
        call until this client has seen a failure."""
        if not self._breaker_watched():
            return False
        while True:
            admission = await self.tally.ledger.admit(self.endpoint)
            down_for = admission.down_for_s
            if down_for is None:
                _DOWN_ENDPOINTS.discard(self.endpoint)  # up again (another worker's probe was answered)
            if down_for is not None and down_for > self.cfg.max_outage_s:
                raise EndpointDown(self.endpoint, down_for, self.cfg.max_outage_s)
            if admission.wait_s <= 0:
                return admission.probe
            await asyncio.sleep(admission.wait_s)

    def _breaker_watched(self) -> bool:
        """Whether a request must ask the breaker before it goes: this client or another of the
        process saw the endpoint fail, and no answer came since."""
        return self.tally is not None and (self._endpoint_failing or self.endpoint in _FAILING_ENDPOINTS)

    def _went_quiet(self, asked: bool) -> bool:
        """A request that holds its slot now, past the breaker check: the endpoint was seen down
        since (or failing, where the breaker was not asked), so it must not go out. Without this
        the requests queued for slots before an instant outage all go out into it."""
        return self.tally is not None and (self.endpoint in _DOWN_ENDPOINTS or (not asked and self._breaker_watched()))

    async def _went_down_since(self, first_failure: float) -> bool:
        """Retries ran out on outage-like failures: give the breaker until DECIDE_S after the first
        of them, and at least OPEN_AFTER_S from now (a busy machine stretches the failures other
        rows report), to call it an outage; then the request waits instead of failing."""
        if self.tally is None:
            return False
        deadline = max(first_failure + DECIDE_S, time.monotonic() + OPEN_AFTER_S)
        while True:
            if await self.tally.ledger.is_down(self.endpoint):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(0.25, left))

    async def _endpoint_answered(self, ok: bool, probe: bool) -> bool:
        """Tell the breaker how a request went (failures, and the first answer after them);
        True when the endpoint is down now."""
        if self.tally is None or (ok and not self._endpoint_failing and not probe
                                  and self.endpoint not in _FAILING_ENDPOINTS):
            return False
        down = await self.tally.ledger.report(self.endpoint, ok, probe)
        if down and not self._endpoint_down:
            log.warning("endpoint %s is not answering: calls wait and one probe at a time checks it", self.endpoint)
        self._endpoint_down = down
        self._endpoint_failing = not ok or down
        for flag, on in ((_FAILING_ENDPOINTS, self._endpoint_failing), (_DOWN_ENDPOINTS, down)):
            flag.add(self.endpoint) if on else flag.discard(self.endpoint)
        return down

    # ------------------------------------------------------------ chat

    def _sampling(self, sample: int, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        p: dict[str, Any] = {"temperature": self.cfg.temperature, "top_p": self.cfg.top_p,
                             "max_tokens": self.cfg.max_tokens, "seed": self.cfg.seed}
        p.update(params)
        model = p.pop("model", None) or self.cfg.model
        if sample and p.get("seed") is not None:
            p["seed"] = int(p["seed"]) + sample
        for k in _FLOAT_PARAMS:  # 0 and 0.0 must give the same cache key
            if isinstance(p.get(k), int):
                p[k] = float(p[k])
        return model, {k: v for k, v in p.items() if v is not None}

    async def chat(self, messages: Messages, *, schema: type[BaseModel] | None = None,
                   validate: Callable[[Any], None] | None = None, sample: int = 0, **params: Any) -> LLMResult:
        try:
            if schema is None:
                model, sampling = self._sampling(sample, params)
                reply = await self._request(model, messages, sampling, None, sample)
                result = LLMResult(text=reply.text, prompt_tokens=reply.prompt_tokens,
                                   completion_tokens=reply.completion_tokens, model=reply.model, cached=reply.cached)
            else:
                result = await self._structured_samples(messages, schema, validate, sample, params)
        except LLMError:
            self._count_call(None)
            raise
        self._count_call(result)
        return result

    async def chat_samples(self, messages: Messages, samples: int | Sequence[int], *,
                           schema: type[BaseModel] | None = None, validate: Callable[[Any], None] | None = None,
                           **params: Any) -> list[LLMResult | LLMError]:
        """Several samples of one prompt (`samples`: how many, from index 0, or their indexes), each
        exactly what `chat(messages, sample=i)` answers, in order; a sample that failed is its
        LLMError. The samples not yet cached go out as one request with `n` (see the module's
        docstring); each is then parsed, validated and re-asked on its own."""
        indexes = list(range(samples)) if isinstance(samples, int) else list(samples)
        results: list[LLMResult | LLMError] = []
        if len(indexes) > 1 and self._asks_n():
            model, _ = self._sampling(indexes[0], params)
            if schema is not None and self._known_mode(model) is None:
                deciding = _SAMPLING_SCOUTS.setdefault(asyncio.get_running_loop(), {})
                scout = deciding.get((self.endpoint, model))
                if scout is not None:
                    await asyncio.shield(scout)  # another prompt's first sample is finding the mode
                else:
                    # This prompt's first sample alone decides the structured mode (auto mode's
                    # scout); its other samples, and every other prompt's, then go with `n` in it.
                    scout = deciding[self.endpoint, model] = asyncio.get_running_loop().create_future()
                    try:
                        results = await self._each(messages, indexes[:1], schema, validate, params)
                    finally:
                        scout.set_result(None)
                        deciding.pop((self.endpoint, model), None)
                    indexes = indexes[1:]
            failed = await self._prefetch(model, messages, indexes, schema, params)
            if failed is not None:
                for _ in indexes:
                    self._count_call(None)
                return results + [failed] * len(indexes)
        return results + await self._each(messages, indexes, schema, validate, params)

    async def _each(self, messages: Messages, indexes: list[int], schema: type[BaseModel] | None,
                    validate: Callable[[Any], None] | None, params: dict[str, Any]) -> list[LLMResult | LLMError]:
        return await gather_samples(self, messages, indexes, schema=schema, validate=validate, **params)

    def _asks_n(self) -> bool:
        """Whether this role sends a prompt's samples as one request with `n`: the config allows it,
        not through the Batch API (one answer per line there), and the endpoint has not refused or
        ignored `n` for the model."""
        if not self.cfg.sample_with_n or self.cfg.batch:
            return False
        return "n" not in _DROPPED_PARAMS.get((self.endpoint, self.cfg.model), {})

    def _known_mode(self, model: str) -> str | None:
        """The structured mode requests of `model` go in, when already decided (no waiting)."""
        if self.cfg.structured_mode != "auto":
            return self.cfg.structured_mode
        if model in self._modes:
            return self._modes[model]
        decision = _MODE_DECISIONS.get(asyncio.get_running_loop(), {}).get((self.endpoint, model))
        return self._learn_mode(model, decision.mode, decision.why) if decision and decision.mode else None

    async def _prefetch(self, model: str, messages: Messages, indexes: list[int], schema: type[BaseModel] | None,
                        params: dict[str, Any]) -> LLMError | None:
        """Ask for the samples in `indexes` that are not cached in one request with `n`, leaving each
        choice where `chat(..., sample=i)` finds it (the cache and `_preloaded`). Returns the error
        when that request failed for good (each sample then fails with it rather than being sent
        again into the same failure); a refusal of `n` or fewer choices than asked leaves the rest to
        one request each."""
        mode = self._known_mode(model) if schema is not None else None
        if schema is not None and mode is None:
            return None  # the first sample could not decide the mode: each goes alone
        conversation = messages if schema is None or mode == "json_schema" else with_schema_in_prompt(messages, schema)
        response_format = request_format(schema, mode) if schema is not None and mode else None
        while True:
            dropped = await self._dropped(model)
            if "n" in dropped:
                return None
            keyed = []
            for i in indexes:
                _, sampling = self._sampling(i, params)
                sampling = {k: v for k, v in sampling.items() if k not in dropped}
                keyed.append((i, sampling, chat_cache_key(self.endpoint, model, conversation, sampling,
                                                          response_format, i)))
            hits = await _cache_get_many(self.cache, [k for *_, k in keyed]) if self.cache is not None \
                else [None] * len(keyed)
            # Samples another call of the same prompt is asking for right now: wait for its answer.
            theirs = {id(f): f for *_, key in keyed if (f := self._prefetching.get(key)) is not None}
            missing = [(i, sampling, key) for (i, sampling, key), hit in zip(keyed, hits)
                       if hit is None and key not in self._preloaded and key not in self._prefetching]
            try:
                if len(missing) >= 2:  # else nothing shares a request
                    await self._ask_n_once(model, conversation, missing, response_format)
                if theirs:
                    await asyncio.gather(*(asyncio.shield(f) for f in theirs.values()))
                return None
            except RequestRejected as e:
                if e.param == "seed" and "seed" not in dropped:
                    await self._drop_param(model, "seed", e.reason)
                    continue
                if e.param == "n":
                    await self._drop_param(model, "n", e.reason)
                return None  # asked one by one, where each meets (and handles) the refusal itself
            except LLMError as e:
                return e

    async def _ask_n_once(self, model: str, messages: Messages, missing: list[tuple[int, dict[str, Any], str]],
                          response_format: dict[str, Any] | None) -> None:
        """`_ask_n`, its samples marked as being asked (an identical prompt sampled at the same time
        waits for them rather than pay twice)."""
        done = asyncio.get_running_loop().create_future()
        done.add_done_callback(lambda f: f.cancelled() or f.exception())
        keys = [key for *_, key in missing]
        self._prefetching.update(dict.fromkeys(keys, done))
        try:
            await self._ask_n(model, messages, missing, response_format)
        except BaseException as e:
            done.set_exception(e) if not isinstance(e, asyncio.CancelledError) else done.cancel()
            raise
        else:
            done.set_result(None)
        finally:
            for key in keys:
                self._prefetching.pop(key, None)

    async def _ask_n(self, model: str, messages: Messages, missing: list[tuple[int, dict[str, Any], str]],
                     response_format: dict[str, Any] | None) -> None:
        """One request for len(missing) samples: the first missing sample's parameters with `n`."""
        _, sampling, _ = missing[0]
        n = len(missing)
        body: dict[str, Any] = {"model": model, "messages": messages, **sampling, "n": n}
        if response_format is not None:
            body["response_format"] = response_format

        async def call(client: openai.AsyncOpenAI) -> Any:
            from openai.types.chat import ChatCompletion

            return await client.post("/chat/completions", cast_to=ChatCompletion, body=body)

        max_tokens = int(sampling.get("max_tokens") or 0)
        held = await self._reserve(model, estimate_tokens(messages, 0) * 4 // 3 + 8, max_tokens * n)
        try:
            answer = await self._send(call, estimate_tokens(messages, max_tokens * n), _read_chat)
        except BaseException:
            await self._settle(held, model, 0, 0)
            raise
        await self._settle(held, model, answer.prompt, answer.completion, cached_prompt=answer.cached_prompt)
        got = answer.texts[:n]
        u = self.usage
        u.requests += 1
        u.sampled_requests += 1
        u.sampled_choices += len(got)
        self._add_tokens(model, answer.prompt, answer.completion, cached=False, cached_prompt=answer.cached_prompt)
        # The prompt is billed once: its tokens go with the first choice; completions by length.
        shares = _split_tokens(answer.completion, [max(1, len(t)) for t in got])
        replies = [(key, _Reply(text, answer.prompt if j == 0 else 0, shares[j], answer.model or model, cached=False,
                                cached_prompt_tokens=answer.cached_prompt if j == 0 else 0))
                   for j, ((_, _, key), text) in enumerate(zip(missing, got))]
        self._preloaded.update(replies)
        if self.cache is not None:
            await _cache_set_many(self.cache, [(key, _cache_value(reply)) for key, reply in replies])
        if len(got) < n:
            # llama-cpp-python's server answers one choice whatever `n` says: the rest go one by one,
            # and so do this model's samples from now on.
            await self._drop_param(model, "n", f"asked for {n} choices, the endpoint answered {len(got)}")

    async def _structured_samples(self, messages: Messages, schema: type[BaseModel],
                                  validate: Callable[[Any], None] | None, sample: int,
                                  params: dict[str, Any]) -> LLMResult:
        """The structured call; in retry mode, new sample indexes after an all-invalid conversation."""
        invalid: InvalidAnswer | None = None
        for s in range(sample, sample + 1 + self.retry_samples):
            model, sampling = self._sampling(s, params)
            try:
                return await self._structured(model, messages, sampling, s, schema, validate)
            except InvalidAnswer as e:
                invalid = e
        assert invalid is not None
        raise invalid

    async def _structured(self, model: str, messages: Messages, sampling: dict[str, Any], sample: int,
                          schema: type[BaseModel], validate: Callable[[Any], None] | None) -> LLMResult:
        mode, scout = await self._structured_mode(model)
        try:
            while True:
                answered = None
                if scout is not None and mode != "prompt":
                    # The scout's first answered request settles the mode for everyone waiting.
                    answered = functools.partial(scout.publish, mode, self.usage.structured_fallbacks.get(mode, ""))
                try:
                    result = await self._ask_valid(model, messages, sampling, sample, schema, validate, mode, answered)
                except InvalidAnswer:
                    # Counted too: a role whose every answer failed still says which mode it was in.
                    _bump(self.usage.structured_modes, mode)
                    _bump(self.usage.structured_invalid, mode)
                    raise
                except LLMError as e:
                    if self.cfg.structured_mode != "auto" or not rejects_response_format(e) or mode not in MODES_AFTER:
                        raise
                    rejected, mode = mode, MODES_AFTER[mode]
                    log.info("%s rejected the response format (%s); structured mode is now %s", self.endpoint,
                             e.reason, mode)
                    why = f"the endpoint rejected {rejected}: {_short(e.reason, 160)}"
                    self.usage.structured_fallbacks[mode] = why
                    self._modes[model] = mode
                    if scout is not None and mode == "prompt":
                        await scout.publish(mode, why)  # prompt mode cannot be refused
                    elif scout is None:
                        # Sent before the decision reached this client (an older remembered mode).
                        await self._remember_mode(model, mode, why)
                    continue
                _bump(self.usage.structured_modes, mode)
                return result
        finally:
            if scout is not None:
                scout.release()  # no-op once published; else another request decides

    async def _ask_valid(self, model: str, messages: Messages, sampling: dict[str, Any], sample: int,
                         schema: type[BaseModel], validate: Callable[[Any], None] | None, mode: str,
                         answered: Callable[[], Awaitable[None]] | None = None) -> LLMResult:
        """One structured conversation: ask, validate, re-ask with the error; each request cached.
        `answered` is awaited once the first request got an answer (the endpoint took the mode)."""
        conversation = list(messages) if mode == "json_schema" else with_schema_in_prompt(messages, schema)
        response_format = request_format(schema, mode)
        attempts = 1 + self.cfg.structured_retries
        prompt_tokens = completion_tokens = 0
        cached = True
        last_text, last_error = "", ""
        for i in range(attempts):
            if i:
                self.usage.reasks += 1
            reply = await self._request(model, conversation, sampling, response_format, sample)
            if answered is not None:
                await answered()
                answered = None
            prompt_tokens += reply.prompt_tokens
            completion_tokens += reply.completion_tokens
            cached = cached and reply.cached
            try:
                parsed = parse_structured(reply.text, schema)
                if validate is not None:
                    validate(parsed)
            except ValueError as e:
                last_text, last_error = reply.text, describe_error(e)
                conversation = conversation + [{"role": "assistant", "content": reply.text},
                                               {"role": "user", "content": REASK.format(error=last_error)}]
                continue
            return LLMResult(text=reply.text, parsed=parsed, prompt_tokens=prompt_tokens,
                             completion_tokens=completion_tokens, model=reply.model, cached=cached)
        raise InvalidAnswer(f"invalid structured output after {attempts} attempts: {last_error}", raw=last_text)

    def _mode_key(self, model: str) -> str:
        """The ledger's name for this (endpoint, model)'s structured-mode decision."""
        return f"{self.endpoint} {model}"

    def _learn_mode(self, model: str, mode: str, why: str) -> str:
        self._modes[model] = mode
        if mode != "json_schema":  # decided by another request or an earlier run: say why, as it did
            self.usage.structured_fallbacks.setdefault(mode, why or "found earlier")
        return mode

    async def _structured_mode(self, model: str) -> tuple[str, _Scout | None]:
        """The mode for this request, and the scout token when this request is the one deciding it
        (auto mode, nothing decided yet): it sends json_schema and publishes what the endpoint took.
        Every other request waits here until the mode is decided, in this process on the
        decision's lock, across workers through the run's ledger."""
        if self.cfg.structured_mode != "auto":
            return self.cfg.structured_mode, None
        if model in self._modes:
            return self._modes[model], None
        decisions = _MODE_DECISIONS.setdefault(asyncio.get_running_loop(), {})
        decision = decisions.setdefault((self.endpoint, model), _ModeDecision(asyncio.Lock()))
        if decision.mode is not None:
            return self._learn_mode(model, decision.mode, decision.why), None
        await decision.lock.acquire()
        try:
            if decision.mode is None:
                found = await self.cache.get(mode_cache_key(self.endpoint, model)) if self.cache is not None else None
                if found and found.get("structured_mode"):
                    decision.mode, decision.why = found["structured_mode"], found.get("why") or ""
            if decision.mode is None and self.cfg.batch:
                # A Batch API request answers in minutes to hours: no one waits for a scout there;
                # each queued request learns from its own rejection.
                decision.mode = "json_schema"
            claimed = False
            if decision.mode is None and self.tally is not None:
                ledger, key, pause = self.tally.ledger, self._mode_key(model), MODE_POLL_S[0]
                while True:
                    state, mode, why = await ledger.claim_mode(key)
                    if state == "decided":
                        decision.mode, decision.why = mode, why
                        break
                    if state == "scout":
                        claimed = True
                        break
                    await asyncio.sleep(pause)  # another worker's scout is out: ask again soon
                    pause = min(pause * 2, MODE_POLL_S[1])
            if decision.mode is None:
                return "json_schema", _Scout(self, model, decision, claimed)  # the lock stays held
        except BaseException:
            decision.lock.release()
            raise
        decision.lock.release()
        return self._learn_mode(model, decision.mode, decision.why), None

    async def _remember_mode(self, model: str, mode: str, why: str) -> None:
        self._modes[model] = mode
        if self.cache is not None:
            await self.cache.set(mode_cache_key(self.endpoint, model), {"structured_mode": mode, "model": model,
                                                                         "why": why})

    # ------------------------------------------------------------ parameters the endpoint refuses

    async def _dropped(self, model: str) -> dict[str, str]:
        """{parameter: why} this endpoint refused for the model (seed), from this process or an
        earlier run (the call cache); read from the cache once per client and model."""
        key = (self.endpoint, model)
        if key not in _DROPPED_PARAMS and self.cache is not None and model not in self._params_read:
            self._params_read.add(model)
            found = await self.cache.get(params_cache_key(self.endpoint, model))
            if found and found.get("rejected_params"):
                _DROPPED_PARAMS.setdefault(key, {}).update(found["rejected_params"])
        return _DROPPED_PARAMS.get(key, {})

    async def _drop_param(self, model: str, param: str, reason: str) -> None:
        dropped = _DROPPED_PARAMS.setdefault((self.endpoint, model), {})
        if param in dropped:
            return
        why = f"the endpoint rejected {param}: {_short(reason, 160)}"
        dropped[param] = why
        # `n` only costs more when gone (one request per sample), and the embedded server ignores it.
        log.log(logging.INFO if param == "n" else logging.WARNING,
                "%s rejected the parameter %r (%s); it is left out of this model's requests from now on",
                self.endpoint, param, _short(reason, 160))
        self.usage.structured_fallbacks[f"without {param}"] = why
        if self.cache is not None:
            await self.cache.set(params_cache_key(self.endpoint, model), {"rejected_params": dict(dropped),
                                                                          "model": model})

    async def _request(self, model: str, messages: Messages, sampling: dict[str, Any],
                       response_format: dict[str, Any] | None, sample: int) -> _Reply:
        """One exact request: from the cache, or sent and then cached (whatever the model said).
        A sampling parameter the endpoint refuses (seed) is dropped, and the request sent without."""
        while True:
            dropped = await self._dropped(model)
            if any(p in sampling for p in dropped):
                sampling = {k: v for k, v in sampling.items() if k not in dropped}
            try:
                return await self._request_once(model, messages, sampling, response_format, sample)
            except RequestRejected as e:
                if e.param == "seed" and "seed" in sampling:
                    await self._drop_param(model, "seed", e.reason)
                    continue
                if e.param not in ("response_format", "seed"):
                    # a parameter nothing drops: say so once, and fail the call.
                    self.rejected_params.setdefault(e.param, e.reason)
                raise

    async def _request_once(self, model: str, messages: Messages, sampling: dict[str, Any],
                            response_format: dict[str, Any] | None, sample: int) -> _Reply:
        """One exact request as given: from the cache, or sent and then cached."""
        key = chat_cache_key(self.endpoint, model, messages, sampling, response_format, sample)
        preloaded = self._preloaded.pop(key, None)
        if preloaded is not None:
            return preloaded  # a choice of this call's `n` request: sent and accounted there
        if self.cache is not None:
            hit = await self.cache.get(key)
            if hit is not None:
                reply = _reply_of(hit, model)
                self._add_tokens(model, reply.prompt_tokens, reply.completion_tokens, cached=True,
                                 cached_prompt=reply.cached_prompt_tokens)
                return reply
            # The same request already on its way (two rows with one prompt): share its answer
            # rather than pay twice and cache whichever came last.
            twin = await self._twin(key)
            if twin is not None:
                self._add_tokens(model, twin.prompt_tokens, twin.completion_tokens, cached=True,
                                 cached_prompt=twin.cached_prompt_tokens)
                return twin
        # Before the claim: a refused call leaves no twin waiting on it.
        # 3 characters a token: a worst case for the prompt as max_tokens is for the answer.
        held = await self._reserve(model, estimate_tokens(messages, 0) * 4 // 3 + 8,
                                   int(sampling.get("max_tokens") or 0), self.cfg.batch)
        pending = self._claim(key) if self.cache is not None else None
        try:
            reply = await self._fetch(model, messages, sampling, response_format, key)
        except BaseException as e:
            await self._settle(held, model, 0, 0, self.cfg.batch)
            if pending is not None:
                pending.cancel() if isinstance(e, asyncio.CancelledError) else pending.set_exception(e)
            raise
        finally:
            if pending is not None:
                self._in_flight[asyncio.get_running_loop()].pop(key, None)
        await self._settle(held, model, reply.prompt_tokens, reply.completion_tokens, self.cfg.batch,
                           reply.cached_prompt_tokens)
        if pending is not None:
            pending.set_result(reply)
        return reply

    async def _twin(self, key: str) -> _Reply | None:
        """The reply of an identical request in flight on this loop, marked as not sent; None when
        there is none (or it failed: the caller then sends its own)."""
        pending = self._in_flight.get(asyncio.get_running_loop(), {}).get(key)
        if pending is None:
            return None
        try:
            reply = await asyncio.shield(pending)
        except BaseException:
            if pending.done():  # that request failed or was cancelled: this one is sent on its own
                return None
            raise  # this call itself was cancelled
        return _Reply(reply.text, reply.prompt_tokens, reply.completion_tokens, reply.model, cached=True,
                      cached_prompt_tokens=reply.cached_prompt_tokens)

    def _claim(self, key: str) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        pending: asyncio.Future = loop.create_future()
        # A failure nobody else awaited must not be reported as "exception never retrieved".
        pending.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._in_flight.setdefault(loop, {})[key] = pending
        return pending

    async def _fetch(self, model: str, messages: Messages, sampling: dict[str, Any],
                     response_format: dict[str, Any] | None, key: str) -> _Reply:
        """Send the request (with retries) and cache its reply."""
        body: dict[str, Any] = {"model": model, "messages": messages, **sampling}
        if response_format is not None:
            body["response_format"] = response_format

        async def call(client: openai.AsyncOpenAI) -> Any:
            from openai.types.chat import ChatCompletion

            # The SDK's generic POST: `chat.completions.create` would first walk the whole request
            # through its typed-params transform, a few ms of CPU per call that a concurrent stage
            # at hundreds of requests/s cannot spare. The body is the same JSON either way.
            return await client.post("/chat/completions", cast_to=ChatCompletion, body=body)

        if self.cfg.batch:
            from pipeline.llm.batch import queue_for

            # Waits in this loop's Batch API queue, holding no `max_concurrency` slot; the custom_id
            # is the cache key, and the reply is cached below exactly as a direct call's.
            answer = await queue_for(self).submit(body, key)
            self.usage.batch_calls += 1
        else:
            answer = await self._send(call, estimate_tokens(messages, sampling.get("max_tokens")), _read_chat)
        text, pt, ct, cpt, resp_model = answer.texts[0], answer.prompt, answer.completion, answer.cached_prompt, \
            answer.model
        self.usage.requests += 1
        self._add_tokens(model, pt, ct, cached=False, batch=self.cfg.batch, cached_prompt=cpt)
        reply = _Reply(text, pt, ct, resp_model or model, cached=False, cached_prompt_tokens=cpt)
        if self.cache is not None:
            await self.cache.set(key, _cache_value(reply))
        return reply

    # ------------------------------------------------------------ embeddings

    async def embed(self, texts: list[str], model: str) -> list[list[float]]:
        """Embedding vectors in input order; each text is cached on its own."""
        keys = [embed_cache_key(self.endpoint, model, t) for t in texts]
        out: list[list[float] | None] = [None] * len(texts)
        if self.cache is not None:
            hits = await _cache_get_many(self.cache, keys)
            found = tokens_found = 0
            for i, hit in enumerate(hits):
                if hit is not None:
                    out[i] = hit["embedding"]
                    found += 1
                    tokens_found += int(hit.get("prompt_tokens", 0))
            # Counted once for the lot (a call per text), not per text: thousands of texts per call.
            if found:
                self.usage.calls += found
                self.usage.cached_calls += found
                if self.tally is not None:
                    self.tally.add(calls=found, cached_calls=found)
                self._add_tokens(model, tokens_found, 0, cached=True)
        key_of = dict(zip(texts, keys))
        todo: dict[str, list[int]] = {}  # text -> positions, so duplicates are sent once
        for i, t in enumerate(texts):
            if out[i] is None:
                todo.setdefault(t, []).append(i)
        pending = list(todo)

        async def one_batch(batch: list[str]) -> None:
            async def call(client: openai.AsyncOpenAI) -> Any:
                # The SDK's generic POST returning the plain JSON (`cast_to=object`): its typed
                # `embeddings.create` builds a pydantic object per vector, ~0.1 s of CPU per
                # 128-text answer, which caps a worker far below an endpoint's rate. base64 (the
                # SDK's own default) is decoded by numpy instead of parsed as decimal text.
                return await client.post("/embeddings", cast_to=object,
                                         body={"model": model, "input": batch, "encoding_format": "base64"})

            def read(resp: Any, n: int = len(batch)) -> tuple[list[Any], int]:
                return _read_embeddings(resp, n)

            est = sum(len(t) for t in batch) // 4 + len(batch)
            held = await self._reserve(model, est, 0)
            try:
                vectors, total = await self._send(call, est, read)
            except LLMError:
                await self._settle(held, model, 0, 0)
                self.usage.failed_calls += len(batch)
                raise
            # The slot just freed wakes a waiting batch: let it go out before this one's bookkeeping.
            await asyncio.sleep(0)
            await self._settle(held, model, total, 0)
            shares = _split_tokens(total, [len(t) for t in batch])
            for text, vec in zip(batch, vectors):
                for i in todo[text]:
                    out[i] = vec
            self.usage.calls += len(batch)
            if self.tally is not None:
                self.tally.add(calls=len(batch))
            self._add_tokens(model, total, 0, cached=False)
            if self.cache is not None:
                # The batch's vectors in one write: one by one, each waited for its own round trip.
                await _cache_set_many(self.cache, [
                    (key_of[text], {"embedding": vec, "prompt_tokens": tokens, "model": model})
                    for text, vec, tokens in zip(batch, vectors, shares)])

        # The batches go at once, each taking a `max_concurrency` slot (and the limiter's pace) in _send.
        results = await asyncio.gather(*(one_batch(pending[i:i + EMBED_BATCH])
                                         for i in range(0, len(pending), EMBED_BATCH)), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        return out  # type: ignore[return-value]


async def _cache_get_many(cache: CallCache, keys: list[str]) -> list[dict[str, Any] | None]:
    """Many lookups at once: the cache's own `get_many` where it has one (one thread hop), else
    concurrent `get`s (which a Ray cache proxy coalesces into one actor call)."""
    many = getattr(cache, "get_many", None)
    if many is not None:
        return await many(keys)
    return list(await asyncio.gather(*(cache.get(k) for k in keys)))


async def _cache_set_many(cache: CallCache, items: list[tuple[str, dict[str, Any]]]) -> None:
    many = getattr(cache, "set_many", None)
    if many is not None:
        await many(items)
    else:
        await asyncio.gather(*(cache.set(k, v) for k, v in items))


class MalformedResponse(ValueError):
    """A 200 answer whose body is not the shape the API promises; retried like a 5xx."""


def _describe_body(resp: Any) -> str:
    if isinstance(resp, str):  # the SDK hands back the text of a non-JSON content type
        return f"a non-JSON body ({_short(resp, 80)!r})"
    return f"a {type(resp).__name__} without the expected fields"


def _read_embeddings(resp: Any, n: int) -> tuple[list[list[float]], int]:
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
class _Answer:
    """A chat completion's choices (by index) and usage: prompt tokens once, completion tokens over
    every choice, and the prompt tokens the endpoint served from its prompt cache."""

    texts: list[str]
    prompt: int
    completion: int
    cached_prompt: int
    model: str


def _read_chat(resp: Any) -> _Answer:
    choices = getattr(resp, "choices", None)
    if not isinstance(choices, list) or not choices or any(getattr(c, "message", None) is None for c in choices):
        raise MalformedResponse(f"no choices in {_describe_body(resp)}")
    texts = []
    for choice in sorted(choices, key=lambda c: getattr(c, "index", 0) or 0):
        msg = choice.message
        text = msg.content
        if text is None:
            refusal = getattr(msg, "refusal", None)
            text = "" if not refusal else f"(refused: {refusal})"
        texts.append(text)
    usage = getattr(resp, "usage", None)
    details = getattr(usage, "prompt_tokens_details", None)
    return _Answer(texts, int(getattr(usage, "prompt_tokens", 0) or 0), int(getattr(usage, "completion_tokens", 0) or 0),
                   int(getattr(details, "cached_tokens", 0) or 0), getattr(resp, "model", "") or "")


def _reply_of(hit: dict[str, Any], model: str) -> _Reply:
    """A cached chat value as a reply (marked cached)."""
    return _Reply(hit["text"], int(hit.get("prompt_tokens", 0)), int(hit.get("completion_tokens", 0)),
                  hit.get("model") or model, cached=True, cached_prompt_tokens=int(hit.get("cached_prompt_tokens", 0)))


def _cache_value(reply: _Reply) -> dict[str, Any]:
    value = {"text": reply.text, "prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
             "model": reply.model}
    if reply.cached_prompt_tokens:
        value["cached_prompt_tokens"] = reply.cached_prompt_tokens
    return value


def _split_tokens(total: int, weights: list[int]) -> list[int]:
    """Split a batch's token count over its texts in proportion to length; sums to total."""
    w = sum(weights) or len(weights) or 1
    shares = [total * x // w for x in weights]
    if shares:
        shares[-1] += total - sum(shares)
    return shares


def _bump(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."
