"""Sending one request to an OpenAI-compatible endpoint (its answer read by pipeline.llm.answers).

One retry loop lives here (the SDK's own retries are off): exponential backoff with jitter on 429,
5xx, timeouts, connection errors and malformed bodies, honouring Retry-After. A parameter the
endpoint refuses (`rejected_param`, raised as `RequestRejected`) is never retried as sent and never
counts as an outage. While the run's breaker says the endpoint is down (pipeline.llm.breaker),
requests wait instead of spending retries.

The OpenAI SDK's HTTP clients belong to one event loop: each loop keeps its own, shared by the
clients of one role and endpoint. The SDK's private names (its platform lookup) and its generic
`post` are used in this module only, so an SDK upgrade breaks this one file.

The API key comes from the environment only. It is held by the transport and the SDK client, and
never enters cache keys, cache values, usage, reprs, exception messages or logs (`scrub`).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import os
import random
import re
import ssl
import time
import weakref
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, AsyncGenerator, Awaitable, Callable, Mapping

from pipeline.config import LLMConfig
from pipeline.errors import ConfigError
from pipeline.llm.answers import ChatAnswer, MalformedResponse, read_chat, read_embeddings
from pipeline.llm.breaker import DECIDE_S, OPEN_AFTER_S, EndpointDown
from pipeline.llm.identity import OPENAI_BASE_URL
from pipeline.llm.ledger import Ledger
from pipeline.llm.ratelimit import RateLimiter
from pipeline.llm.slots import EndpointSlots
from pipeline.llm.types import LLMError, short
from pipeline.llm.usage import Usage

if TYPE_CHECKING:
    import openai

log = logging.getLogger(__name__)

PLACEHOLDER_KEY = "not-needed"  # local / self-hosted servers ignore the key but the SDK wants one
_MAX_RETRY_AFTER_S = 300.0  # a server asking for longer is treated as asking for this

# Requests in flight per HTTP connection pool: httpcore assigns requests to connections by scanning
# every connection and waiting request of its pool on each event, so one pool of 256 spent ~7 ms of
# CPU per call where pools of 32 spend ~4 (bench/scale_e2e.py, py-spy on the judges).
_POOL_REQUESTS = 32

# Endpoints a request of this process saw failing and no answer since: ask the breaker before
# sending, also from a client that has not failed yet (a new shard's first request).
_FAILING_ENDPOINTS: set[str] = set()
_DOWN_ENDPOINTS: set[str] = set()  # endpoints the breaker said are down, until it says up again
# Per endpoint, when the latest request of this process that was answered left (time.monotonic()):
# one sent after a request's first failure and answered shows the endpoint up, so that request's
# failures are its own and it need not wait for the breaker.
_ANSWERED_SENT_AT: dict[str, float] = {}


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


def retryable_status(status: int) -> bool:
    return status == 429 or status == 408 or status >= 500


# ---------------------------------------------------------------- a refused parameter

# Parameters an endpoint may refuse that a role can do without: response_format steps the role's
# structured mode down, seed is dropped from the role's requests, n sends a prompt's samples one by one.
STEP_DOWN_PARAMS = ("response_format", "seed", "n")
_FORMAT_WORDS = ("response_format", "json_schema", "json_object", "response format")
# pydantic / FastAPI validation errors, as JSON (`"loc": ["body", "seed"]`) or as Python's repr in
# llama-cpp-python's 500 text (`'loc': ('body', 'response_format', 'type')`).
_LOC = re.compile(r"""["']loc["']\s*:\s*[\[(]\s*["']body["']\s*,\s*["']([A-Za-z_][A-Za-z0-9_]*)["']""")
_VALIDATION_WORDS = ("validation error", "input should be", "extra inputs are not permitted", "unsupported parameter",
                     "not supported", "unrecognized request argument")


class RequestRejected(LLMError):
    """The endpoint refused a parameter of the request (whatever the HTTP status: 400, 422, or
    llama-cpp-python's 500 validation error): not an outage and never retried as sent. `param`
    names it (response_format, seed, n, ...)."""

    def __init__(self, reason: str, raw: str | None = None, status: int | None = None, param: str = "") -> None:
        super().__init__(reason, raw, status)
        self.param = param

    def __reduce__(self) -> tuple:
        return (type(self), (self.reason, self.raw, self.status, self.param))


def _body_params(body: Any) -> list[str]:
    """Parameters a JSON error body names: OpenAI's {"error": {"param": ...}}, FastAPI's
    {"detail": [{"loc": ["body", param, ...]}]} (also nested under "error")."""
    out: list[str] = []
    if not isinstance(body, dict):
        return out
    err = body.get("error")
    if isinstance(err, dict):
        if isinstance(err.get("param"), str):
            out.append(err["param"].split(".")[0].split("[")[0])
        out += _body_params(err)
    detail = body.get("detail")
    if isinstance(detail, list):
        for d in detail:
            loc = d.get("loc") if isinstance(d, dict) else None
            if isinstance(loc, list) and len(loc) >= 2 and loc[0] == "body" and isinstance(loc[1], str):
                out.append(loc[1])
    return out


def rejected_param(status: int | None, body: Any, text: str) -> str | None:
    """The request parameter an error response says the endpoint refuses, or None when the
    response is no such rejection (an outage, a rate limit, some other bad request).

    A 400 or 422 naming a parameter (or, for 400, mentioning the response format at all, as older
    OpenAI models word it) is a rejection; a 500 is one only with a validation body naming it
    (llama-cpp-python's own server answers an unsupported `response_format` so). `body`: the parsed
    JSON error body, if any; `text`: the error's text.
    """
    if status not in (400, 422, 500):
        return None
    named = _body_params(body) + _LOC.findall(text or "")
    lowered = (text or "").lower()
    if status == 500:
        # Only a validation error names what it refuses; a bare 500 that mentions a parameter in
        # passing (a traceback, a grammar failure) is an outage like any other.
        if not _LOC.search(text or "") and not (isinstance(body, dict) and isinstance(body.get("detail"), list)) \
                and not any(w in lowered for w in _VALIDATION_WORDS):
            return None
    for p in named:
        if p in STEP_DOWN_PARAMS:
            return p
    if status != 500 or any(w in lowered for w in _VALIDATION_WORDS):
        for p in STEP_DOWN_PARAMS:  # the message names it in words ("'seed' is not supported")
            if p == "response_format" and any(w in lowered for w in _FORMAT_WORDS):
                return p
            if p != "response_format" and re.search(rf"['\"`]{p}['\"`]", lowered):
                return p
    if status != 500 and named:
        return named[0]  # some other parameter: still a rejection, still not an outage
    return None


# ---------------------------------------------------------------- the SDK's clients, per event loop

@dataclass
class _LoopState:
    # One connection pool each, taken in turn; behind several servers (the embedded ones), server i's.
    clients: list[openai.AsyncOpenAI]
    closers: list[AsyncGenerator[None, None]]
    turn: int = 0

    def next_client(self) -> openai.AsyncOpenAI:
        self.turn = (self.turn + 1) % len(self.clients)
        return self.clients[self.turn]


# The SDK's HTTP pool and asyncio primitives belong to one event loop (stages may call asyncio.run
# once per batch): per loop, the state each (role, endpoint, key) shares; see Transport._state.
_LOOP_STATES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, _LoopState]] = \
    weakref.WeakKeyDictionary()


async def _close_at_loop_end(client: openai.AsyncOpenAI) -> AsyncGenerator[None, None]:
    """Suspended at its yield until asyncio.run's shutdown_asyncgens closes it.

    That is the last moment the loop can still close the HTTP pool; after it, the SDK's
    finaliser would try to close sockets of a dead loop from a new one and log errors.
    """
    try:
        yield
    finally:
        await client.close()


def warm_process() -> None:
    """Build now what this process's first request would build (its TLS context, the SDK's
    imports), e.g. while a run's first stages still read and write tables."""
    import openai  # noqa: F401

    _tls_context()


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


def prompt_text(body: dict[str, Any]) -> str:
    """The chat request's messages as one string, in order: two prompts that start alike render to
    token sequences that start alike, which a server's prompt cache reuses."""
    return "\x00".join(f"{m.get('role')}\x01{m.get('content')}" for m in body.get("messages") or ())


def _post_chat(body: dict[str, Any]) -> Callable[[openai.AsyncOpenAI], Awaitable[Any]]:
    async def call(client: openai.AsyncOpenAI) -> Any:
        from openai.types.chat import ChatCompletion

        # The SDK's generic POST: `chat.completions.create` would first walk the whole request
        # through its typed-params transform, a few ms of CPU per call that a concurrent stage
        # at hundreds of requests/s cannot spare. The body is the same JSON either way.
        return await client.post("/chat/completions", cast_to=ChatCompletion, body=body)

    return call


def _post_embeddings(body: dict[str, Any]) -> Callable[[openai.AsyncOpenAI], Awaitable[Any]]:
    async def call(client: openai.AsyncOpenAI) -> Any:
        # The SDK's generic POST returning the plain JSON (`cast_to=object`): its typed
        # `embeddings.create` builds a pydantic object per vector, ~0.1 s of CPU per
        # 128-text answer, which caps a worker far below an endpoint's rate. base64 (the
        # SDK's own default) is decoded by numpy instead of parsed as decimal text.
        return await client.post("/embeddings", cast_to=object, body=body)

    return call


# ---------------------------------------------------------------- sending

@dataclass
class _Failure:
    """One try that got no usable answer."""

    err: str
    status: int | None = None
    rejected: str | None = None  # the parameter the endpoint refuses
    fatal: bool = False  # sent again, it would fail again
    outage: bool = True  # no answer at all: a 5xx, a timeout, a refused connection, a broken body
    retry_after: float | None = None


_QUIET = object()  # a try that did not go out: the endpoint was seen failing while it waited


class Transport:
    """One client's way to its endpoint: its `max_concurrency` slots, its pace (`limiter`), the
    run's breaker (in the run's `ledger`; None outside a run), and its retries (`usage`)."""

    def __init__(self, cfg: LLMConfig, api_key: str, *, section: str, endpoint: str, slots: EndpointSlots,
                 limiter: RateLimiter | None, usage: Usage, ledger: Ledger | None) -> None:
        self.cfg = cfg
        self.endpoint = endpoint
        self.slots = slots
        self.limiter = limiter
        self.usage = usage
        self.ledger = ledger
        self.__key = api_key
        self._section = section  # the role: its clients on one loop share HTTP clients (see _state)
        self._rng = random.Random()
        self._endpoint_failing = False  # a request failed and no answer came since: ask the breaker
        self._endpoint_down = False

    def __repr__(self) -> str:
        return f"Transport(endpoint={self.endpoint!r}, section={self._section!r})"

    def __reduce__(self) -> Any:
        raise TypeError("a Transport holds the API key and is not picklable")

    def scrub(self, text: str) -> str:
        """`text` with the API key blotted out."""
        key = self.__key
        return text.replace(key, "***") if key and len(key) >= 8 else text

    async def _state(self) -> _LoopState:
        """This loop's HTTP clients. Shared by every client of one role and endpoint on the loop: a
        worker running several shards at once (pipeline.engine.execution.executors) sends their requests on one
        connection pool."""
        loop = asyncio.get_running_loop()
        shared = _LOOP_STATES.setdefault(loop, {})
        urls = self.cfg.server_urls or (self.cfg.base_url or OPENAI_BASE_URL,)
        key = (self._section, urls, self.cfg.timeout_s, self.cfg.max_concurrency,
               hashlib.sha256((self.__key or "").encode()).hexdigest())
        st = shared.get(key)
        if st is None:
            # Several servers: one pool each (a server answers one request at a time).
            pools = urls if len(urls) > 1 else urls * max(1, -(-self.cfg.max_concurrency // _POOL_REQUESTS))
            closers: list[AsyncGenerator[None, None]] = []
            clients = [await self._new_client(url, closers) for url in pools]
            st = shared[key] = _LoopState(clients, closers)
        return st

    async def _new_client(self, url: str, closers: list[AsyncGenerator[None, None]]) -> openai.AsyncOpenAI:
        """An SDK client (one connection pool) for `url`, closed when this loop ends (its closer)."""
        import openai  # here: a run answered from the cache never pays for importing the SDK

        client = openai.AsyncOpenAI(base_url=url, api_key=self.__key, max_retries=0, timeout=self.cfg.timeout_s,
                                    http_client=openai.DefaultAsyncHttpxClient(verify=_tls_context()))
        _preset_platform(client)
        closer = _close_at_loop_end(client)
        await closer.__anext__()  # registers it with this loop's async-generator hooks
        closers.append(closer)
        return client

    async def chat(self, body: dict[str, Any], est_tokens: int) -> ChatAnswer:
        """POST /chat/completions with `body` as it is; its choices and usage."""
        return await self.send(_post_chat(body), est_tokens, read_chat, affinity=lambda: prompt_text(body))

    async def embeddings(self, model: str, texts: list[str], est_tokens: int) -> tuple[list[list[float]], int]:
        """The texts' vectors in input order, and the prompt tokens they took."""
        body = {"model": model, "input": texts, "encoding_format": "base64"}

        def read(resp: Any, n: int = len(texts)) -> tuple[list[Any], int]:
            return read_embeddings(resp, n)

        return await self.send(_post_embeddings(body), est_tokens, read)

    async def send(self, call: Callable[[openai.AsyncOpenAI], Awaitable[Any]], est_tokens: int,
                   read: Callable[[Any], Any], affinity: Callable[[], str] | None = None) -> Any:
        """One request with transport retries; returns `read(response)`.

        A body that is not the expected JSON (a proxy's HTML page, JSON without `choices`) is
        transient like a 5xx: `read` raises MalformedResponse and the request is retried.
        Raises LLMError when retries are exhausted. While the run's breaker says the endpoint is
        down (pipeline.llm.breaker), the request waits instead, and its failures cost no retry.
        """
        st = await self._state()
        attempt = 0
        first_failure: float | None = None
        while True:
            asked = self._breaker_watched()
            probe = await self._wait_for_endpoint()
            got = await self._try(st, call, est_tokens, read, asked, probe, affinity)
            if got is _QUIET:
                continue  # the endpoint failed while this request waited for its slot: ask the breaker
            if not isinstance(got, _Failure):
                return got
            # Raised here, outside the except blocks, so the SDK exception (whose request carries
            # the Authorization header) is not chained onto the LLMError.
            err = self.scrub(got.err)
            down = await self._endpoint_answered(not got.outage, probe) if got.outage or probe else False
            if got.rejected is not None:
                raise RequestRejected(err, status=got.status, param=got.rejected)
            if got.fatal:
                raise LLMError(err, status=got.status)
            if down:
                continue  # no retry spent: the request waits for the endpoint with every other
            first_failure = first_failure if first_failure is not None else time.monotonic()
            if attempt >= self.cfg.max_retries and got.outage and await self._went_down_since(first_failure):
                continue
            if attempt >= self.cfg.max_retries:
                raise LLMError(f"{err} (gave up after {attempt + 1} attempts)")
            attempt += 1
            self.usage.retries += 1
            await self._back_off(attempt, err, got.retry_after)

    async def _try(self, st: _LoopState, call: Callable[[openai.AsyncOpenAI], Awaitable[Any]], est_tokens: int,
                   read: Callable[[Any], Any], asked: bool, probe: bool,
                   affinity: Callable[[], str] | None = None) -> Any:
        """One try in one endpoint slot: `read(response)`, a `_Failure`, or `_QUIET` (not sent).
        `affinity()`: the prompt's text, so that a request goes to the server holding its prefix."""
        import openai

        # One endpoint slot per request (pipeline.llm.slots): shared by every worker of a run, so
        # taken per request, not kept with the loop's HTTP clients that outlive a run in a worker.
        async with self.slots.slot():
            # Pace inside the slot so that the reserved send time is the actual send time.
            if self.limiter is not None:
                await self.limiter.acquire(est_tokens)
            if not probe and self._went_quiet(asked):
                return _QUIET
            # Several single-request servers behind the endpoint (the embedded ones): an idle one,
            # the one that read the longest start of this prompt lately (its prompt cache).
            spread = self.slots.servers > 1
            server = await self.slots.take_server(affinity() if affinity else "") if spread else 0
            sent_at = time.monotonic()
            try:
                result = read(await call(st.clients[server % len(st.clients)] if spread else st.next_client()))
            except openai.APIStatusError as e:
                status = e.status_code
                # A parameter the endpoint refuses (even in a 500 validation error): an answer,
                # not an outage; sent again it would be refused again.
                rejected = rejected_param(status, e.body, str(e.message))
                return _Failure(f"HTTP {status}: {short(e.message, 400)}", status, rejected,
                                fatal=rejected is not None or not retryable_status(status),
                                outage=rejected is None and status >= 500,
                                retry_after=parse_retry_after(e.response.headers) if status in (429, 503) else None)
            except openai.APITimeoutError:
                return _Failure(f"timeout after {self.cfg.timeout_s:g} s")
            except openai.APIConnectionError as e:
                return _Failure(f"connection error: {short(str(e.__cause__ or e))}")
            except openai.APIResponseValidationError as e:
                return _Failure(f"malformed response: {short(e.message)}")
            except json.JSONDecodeError as e:  # the SDK parses a JSON content-type eagerly
                return _Failure(f"malformed response: body is not JSON ({e.msg})")
            except MalformedResponse as e:
                return _Failure(f"malformed response: {e}")
            finally:
                if spread:
                    self.slots.give_server(server)
            _ANSWERED_SENT_AT[self.endpoint] = max(_ANSWERED_SENT_AT.get(self.endpoint, sent_at), sent_at)
            await self._endpoint_answered(True, probe)
            return result

    async def _back_off(self, attempt: int, err: str, retry_after: float | None) -> None:
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
        if self.ledger is None or not self._breaker_watched():
            return False
        while True:
            admission = await self.ledger.admit(self.endpoint)
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
        return self.ledger is not None and (self._endpoint_failing or self.endpoint in _FAILING_ENDPOINTS)

    def _went_quiet(self, asked: bool) -> bool:
        """A request that holds its slot now, past the breaker check: the endpoint was seen down
        since (or failing, where the breaker was not asked), so it must not go out. Without this
        the requests queued for slots before an instant outage all go out into it."""
        return self.ledger is not None and (self.endpoint in _DOWN_ENDPOINTS or (not asked and self._breaker_watched()))

    async def _went_down_since(self, first_failure: float) -> bool:
        """Retries ran out on outage-like failures: give the breaker until DECIDE_S after the first
        of them, and at least OPEN_AFTER_S from now (a busy machine stretches the failures other
        rows report), to call it an outage; then the request waits instead of failing. Not when a
        request this process sent after that first failure was answered: the endpoint is up."""
        if self.ledger is None:
            return False
        deadline = max(first_failure + DECIDE_S, time.monotonic() + OPEN_AFTER_S)
        while True:
            if await self.ledger.is_down(self.endpoint):
                return True
            if _ANSWERED_SENT_AT.get(self.endpoint, first_failure) > first_failure:
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(0.25, left))

    async def _endpoint_answered(self, ok: bool, probe: bool) -> bool:
        """Tell the breaker how a request went (failures, and the first answer after them);
        True when the endpoint is down now."""
        if self.ledger is None or (ok and not self._endpoint_failing and not probe
                                  and self.endpoint not in _FAILING_ENDPOINTS):
            return False
        down = await self.ledger.report(self.endpoint, ok, probe)
        if down and not self._endpoint_down:
            log.warning("endpoint %s is not answering: calls wait and one probe at a time checks it", self.endpoint)
        self._endpoint_down = down
        self._endpoint_failing = not ok or down
        for flag, on in ((_FAILING_ENDPOINTS, self._endpoint_failing), (_DOWN_ENDPOINTS, down)):
            flag.add(self.endpoint) if on else flag.discard(self.endpoint)
        return down
