"""A deterministic fake OpenAI-compatible server for tests and benchmarks.

(Over 800 lines: one endpoint, every route and fault it plays beside the others it interacts with.)

Real HTTP on 127.0.0.1 (aiohttp in a background thread), so Ray worker processes on this machine
can call it too. Answers depend only on the request: plain text from a hash of the messages, for
`response_format: json_schema` a schema-valid JSON instance, for function tools a tool call. Faults
are injected deterministically from a seeded hash of (request body, how many times that same body
was seen), so a retry of a failed request can succeed.

    server = FakeOpenAI(latency_s=0.05, max_concurrency=8).start()
    server.faults = {"429": 0.05, "500": 0.05, "timeout": 0.02, "malformed": 0.05, "html": 0.05}

Tool calls: a chat request with function `tools` is answered with one tool call (`finish_reason:
"tool_calls"`, `content: null`, a call id from the request hash) whose `arguments` are a
schema-valid instance of the function's `parameters`: the function `tool_choice` names, else the
first tool. Text instead with tool_choice "none", or under "auto" when the last message is a tool
result (so an agent loop ends). A named function that is not among the tools is a 400; a
"malformed" fault cuts the arguments short.

The `responder(body)` hook scripts answers: a string is the text (it wins over tools and schemas),
`{"tool_calls": [{"name": ..., "arguments": {...} or a JSON string}]}` those tool calls, None the
default answer.

`logprobs: true` (with `top_logprobs` k in 0..20): each choice's `logprobs.content` has one entry per
whitespace token of its text (the whitespace before it included), a negative logprob from the hash,
and k `top_logprobs`, the chosen token first. Without it `logprobs` is null.

The Responses API: POST /v1/responses is answered as the chat request it translates to
(`responses_as_chat`: `instructions` a system message, `input` a string or message / function_call /
function_call_output items, `text.format` json_schema as response_format, function tools in the
Responses shape); the output is one `message` item with an `output_text` part, or one
`function_call` item per tool call; usage as `input_tokens` / `output_tokens` (cached_tokens as
chat's). The responder sees that chat body, marked `"endpoint": "/v1/responses"`. Faults, latency
and `max_concurrency` apply as to chat; it is counted under its own path. No `n`, logprobs,
streaming or `reject_*` refusals there.

Embeddings: `embed_dim` long, or `dimensions` long when asked (a prefix of one hash stream, so
`dimensions == embed_dim` gives the default vector).

Sampling `n` (1 to 128): `n` choices, choice j answered as the same request without `n` and with
`seed` + j would be (with no seed, choice 0 as without `n` and choice j > 0 varied by j); a
`responder` is asked once per choice, with that body. Usage counts the prompt once and the
completions of every choice. `ignore_n` answers one choice whatever `n` is (as llama-cpp-python's
server does); `reject_params={"n"}` refuses it.

Prompt caching, as OpenAI reports it (`pipeline.plan.prompt_cache`): `usage.prompt_tokens_details.
cached_tokens` is the longest prefix (in prompt words, from `cache_min_tokens` by `cache_step`) that
an earlier request to the same model sent; always present, 0 with `prompt_cache` off. Each chat
request's entry in `requests` records `n` (asked), `choices` (answered) and `cached_tokens`.

Refusals (`reject_formats`, `reject_params`, worded per `reject_shape`: OpenAI's 400, FastAPI's 422,
llama-cpp-python's 500 validation error) are counted per parameter in `rejected`. An outage
(`outage_until`) answers `outage_status` (500), at once when `outage_instant`.

Faults: 429 (with Retry-After), 500, 400, timeout (answers after timeout_sleep_s), malformed (an
invalid structured answer inside a valid response), and three broken 200 bodies a misbehaving proxy
sends: html (text/html page), badjson (application/json that is not JSON), nochoices (JSON without
`choices` / `data`). And length: every choice cut short with `finish_reason: "length"` (text or tool
arguments cut at `max_tokens` words, or to half its characters when it is within them), as
`cut_at_max_tokens = True` cuts every answer longer than the request's `max_tokens` words; the
Responses API then answers `status: "incomplete"` (`max_output_tokens`).
    ... base_url=server.base_url ...
    server.stop()

The Batch API too: POST /v1/files (multipart, purpose=batch), GET /v1/files/{id}/content, POST
/v1/batches, GET /v1/batches/{id}. A batch is `validating` when created, `in_progress` until its
`batch_polls`-th retrieve, then `completed`; its lines are answered as /v1/chat/completions would
answer them (responder and reject_formats included; the fault knobs above do not apply). Knobs:
`batch_fail_ids` (custom_ids that always fail), `batch_fail_fraction` (share of items failing,
decided per request body and attempt, so a resubmitted item may pass), `batch_fail_in` ("error_file"
or "output": where a failed line is written), `batch_fail_status`, `batch_fail_message`, and
`batch_expire_next = n`: the next batch ends `expired` with only its first n items answered.
`force` applies to the files / batches requests as well (429, 500, 400).

Standalone, for benchmarks and manual runs (serves until SIGINT / SIGTERM; GET /stats gives the
counters and chat arrival times, POST /reset clears them):

    python -m pipeline.testing.fake_openai --port 8011 --latency 0.2 --max-concurrency 32 --faults 429=0.1,500=0.05
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import struct
import threading
import time
from collections import Counter
from typing import Any, Callable, TypeGuard

from aiohttp import web

from pipeline.plan.prompt_cache import PrefixCache
from pipeline.plan.simulated import LoopbackServer, SchemaInstance, hashed_vector  # shared with `mempipe plan`'s dry run

FAULT_ORDER = ("429", "500", "400", "timeout", "malformed", "html", "badjson", "nochoices", "length")
# What answers a request the fault logic let through: (body, outcome, its entry in `requests`).
Answer = Callable[[dict[str, Any], str | None, dict[str, Any] | None], web.Response]
_HTML_PAGE = "<html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1></body></html>"


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _answer_hash(body: dict[str, Any], choice: int = 0) -> str:
    """What a chat answer depends on: the messages, model and seed (not the sampling settings); and
    the choice index j > 0 of an `n` request without a seed (one with a seed varies the seed)."""
    key = {"messages": body.get("messages", []), "model": body.get("model"), "seed": body.get("seed")}
    return _hash({**key, "choice": choice} if choice else key)


def _choice_hash(body: dict[str, Any], choice: int) -> str:
    """What choice `choice` of a request depends on; `body` is that choice's own (`choice_body`)."""
    return _answer_hash(body, 0 if isinstance(body.get("seed"), int) else choice)


def _answer_id(body: dict[str, Any]) -> str:
    return _answer_hash(body)[:8]


def _words(text: str) -> int:
    return len(text.split())


def _prompt_words(messages: list[dict[str, Any]]) -> list[tuple[int, str, str]]:
    """The prompt as the prefix cache sees it: each content word tagged with its message's index and
    role (so two prompts share a prefix only with the same messages, split alike), as many as the
    prompt tokens counted, so cached_tokens never exceeds prompt_tokens."""
    return [(i, str(m.get("role")), w) for i, m in enumerate(messages) for w in str(m.get("content") or "").split()]


MAX_N = 128  # OpenAI's upper bound on `n`


def _asked_n(body: dict[str, Any]) -> int | None:
    """The body's `n` (1 when absent), or None when it is not an integer in 1..MAX_N."""
    n = body.get("n", 1)
    return n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_N else None


def choice_body(body: dict[str, Any], j: int) -> dict[str, Any]:
    """The request whose single answer is choice j of `body`: `n` removed and, with a seed, seed + j."""
    out = {k: v for k, v in body.items() if k != "n"}
    if j and isinstance(out.get("seed"), int):
        out["seed"] += j
    return out


class FakeOpenAI(LoopbackServer):
    thread_name = "fake-openai"

    def __init__(self, *, latency_s: float = 0.0, max_concurrency: int | None = None,
                 faults: dict[str, float] | None = None, fault_seed: int = 0,
                 retry_after_s: float | None = 1, timeout_sleep_s: float = 3.0, embed_dim: int = 16,
                 ignore_n: bool = False, prompt_cache: bool = True, cache_min_tokens: int = 1024,
                 cache_step: int = 128) -> None:
        super().__init__()  # port 0; set .port before start() to bind a fixed one
        self.latency_s = latency_s
        self.max_concurrency = max_concurrency
        self.faults: dict[str, float] = dict(faults or {})
        self.fault_seed = fault_seed
        self.retry_after_s = retry_after_s  # None: 429 without a Retry-After header
        self.timeout_sleep_s = timeout_sleep_s  # a "timeout" fault answers after this long
        self.embed_dim = embed_dim
        self.ignore_n = ignore_n  # answer one choice whatever `n` asks (llama-cpp-python's server)
        # OpenAI's prompt caching (see the module docstring); tests lower the sizes to short prompts
        self.prompt_cache = prompt_cache
        self.cache_min_tokens = cache_min_tokens
        self.cache_step = cache_step
        self._cache_lock = threading.Lock()  # not _lock: _finish_batch answers under _lock
        self._cache: PrefixCache | None = None
        # Scripts answers (see the module docstring): a string (the text), {"tool_calls": [...]}, or None
        self.responder: Callable[[dict[str, Any]], str | dict[str, Any] | None] | None = None
        # response_format types refused, as older OpenAI models (400) or llama-cpp-python's own server
        # (500 validation error) refuse json_schema; request parameters refused the same way (seed, n)
        self.reject_formats: set[str] = set()
        self.reject_params: set[str] = set()
        # How a refusal is worded: "openai400" ({"error": {"param": ...}}), "fastapi422" ({"detail":
        # [{"loc": ["body", param, ...]}]}), "llama500" (llama-cpp-python 0.3's HTTP 500 validation text)
        self.reject_shape = "openai400"
        self.outage_status = 500  # what an outage answers
        self.outage_instant = False  # an outage answers at once, without `latency_s` (a load balancer's 503)
        self.force: list[str | None] = []  # outcomes for the next requests, before `faults`
        self.outage_until = 0.0  # wall time: until then every chat / embeddings request gets a 500
        self.cut_at_max_tokens = False  # answers over the request's max_tokens (in words) are cut there
        self.echo_auth = False  # error bodies repeat the request's Authorization header (a careless proxy)
        # Batch API knobs (see the module docstring).
        self.batch_polls = 2  # retrieves before a batch completes
        self.batch_fail_ids: set[str] = set()
        self.batch_fail_fraction = 0.0
        self.batch_fail_in = "error_file"  # or "output"
        self.batch_fail_status = 500
        self.batch_fail_message = "fake batch item failure"
        self.batch_expire_next: int | None = None
        self._lock = threading.Lock()
        self._sem: asyncio.Semaphore | None = None
        self._sem_size: int | None = None
        self.reset()

    # ------------------------------------------------------------ counters

    def reset(self) -> None:
        with self._lock:
            self.requests: list[dict[str, Any]] = []  # {"path", "body", "t", "outcome", "auth"}
            self.by_path: Counter[str] = Counter()
            self.outcomes: Counter[str] = Counter()
            self.timestamps: list[float] = []  # time.time() at arrival, chat + embeddings
            self.seen: Counter[str] = Counter()  # body hash -> attempts
            self.in_flight = 0
            self.max_in_flight = 0
            self.force = []
            self.rejected: Counter[str] = Counter()  # refused parameter -> requests refused
            self.files: dict[str, dict[str, Any]] = {}  # file id -> {"content": bytes, "purpose", "filename"}
            self.files_made = 0  # ids are never reused, also after a DELETE
            self.batches: dict[str, dict[str, Any]] = {}  # batch id -> the batch object, plus "_polls"
            self.batch_seen: Counter[str] = Counter()  # body hash -> batch attempts
            self.batch_failed: list[str] = []  # custom_ids of the items written as failed
        with self._cache_lock:
            self._cache = None  # the prompts sent so far are forgotten too

    @property
    def total(self) -> int:
        return len(self.requests)

    def count(self, path: str = "/v1/chat/completions") -> int:
        return self.by_path[path]

    def count_like(self, prefix: str) -> int:
        """Requests to every path that starts with `prefix` (e.g. "/v1/batches/": the polls)."""
        return sum(n for p, n in self.by_path.items() if p.startswith(prefix))

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    # ------------------------------------------------------------ lifecycle

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/files", self._file_upload)
        app.router.add_get("/v1/files/{file_id}/content", self._file_content)
        app.router.add_delete("/v1/files/{file_id}", self._file_delete)
        app.router.add_post("/v1/batches", self._batch_create)
        app.router.add_get("/v1/batches/{batch_id}", self._batch_retrieve)
        app.router.add_get("/stats", self._stats)
        app.router.add_post("/reset", self._reset)
        app.router.add_post("/outage", self._outage)

    # ------------------------------------------------------------ request handling

    async def _sleep(self, seconds: float) -> None:
        """Sleep that ends early when the server stops, so stop() never waits on a fault."""
        if seconds <= 0:
            return
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)  # type: ignore[union-attr]
        except asyncio.TimeoutError:
            pass

    def _semaphore(self) -> asyncio.Semaphore | None:
        if self.max_concurrency != self._sem_size:  # a test may change the cap between requests
            self._sem_size = self.max_concurrency
            self._sem = asyncio.Semaphore(self.max_concurrency) if self.max_concurrency else None
        return self._sem

    def _decide(self, body: dict[str, Any]) -> str | None:
        h = _hash(body)
        with self._lock:
            attempt = self.seen[h]
            self.seen[h] += 1
            if self.force:
                return self.force.pop(0)
            if time.time() < self.outage_until:  # "500" as before for bench/faults.py's counts
                return "500" if self.outage_status == 500 and not self.outage_instant else "outage"
        r = int(hashlib.sha256(f"{self.fault_seed}:{h}:{attempt}".encode()).hexdigest()[:15], 16) / 16**15
        acc = 0.0
        for name in FAULT_ORDER:
            acc += self.faults.get(name, 0.0)
            if r < acc:
                return name
        return None

    async def _handle(self, request: web.Request, answer: Answer) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return _error(400, "request body is not JSON")
        outcome = self._decide(body)
        record = {"path": request.path, "body": body, "t": time.time(), "outcome": outcome,
                  "auth": request.headers.get("Authorization"), "done": None}
        if request_path_is_chat(body):  # filled in when answered
            record.update(n=body.get("n", 1), choices=0, cached_tokens=0)
        with self._lock:
            self.requests.append(record)
            self.by_path[request.path] += 1
            self.outcomes[outcome or "ok"] += 1
            self.timestamps.append(time.time())
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if outcome == "outage" and self.outage_instant:
                return _error(self.outage_status, "fake outage", None, "server_error")
            sem = self._semaphore()
            auth = request.headers.get("Authorization") if self.echo_auth else None
            if sem is not None:
                async with sem:
                    return await self._respond(body, outcome, answer, auth, record)
            return await self._respond(body, outcome, answer, auth, record)
        finally:
            with self._lock:
                self.in_flight -= 1
                record["done"] = time.time()  # answered (or the client went away)

    async def _respond(self, body: dict[str, Any], outcome: str | None, answer: Answer,
                       auth: str | None = None, record: dict[str, Any] | None = None) -> web.StreamResponse:
        await self._sleep(self.latency_s)
        echo = f" (request sent with {auth})" if auth else ""
        if outcome == "429":
            headers = {} if self.retry_after_s is None else {"Retry-After": f"{self.retry_after_s:g}"}
            return _error(429, "fake rate limit" + echo, headers, "rate_limit_exceeded")
        if outcome == "500":
            return _error(500, "fake internal error" + echo, None, "server_error")
        if outcome == "outage":
            return _error(self.outage_status, "fake internal error" + echo, None, "server_error")
        if outcome == "400":
            return _error(400, "fake bad request" + echo, None, "invalid_request_error")
        if outcome == "timeout":
            await self._sleep(self.timeout_sleep_s)
        if request_path_is_chat(body):
            rejected = self._rejected(body)
            if rejected is not None:
                return rejected
        if outcome == "html":
            return web.Response(status=200, text=_HTML_PAGE, content_type="text/html")
        if outcome == "badjson":
            return web.Response(status=200, text=_HTML_PAGE, content_type="application/json")
        if outcome == "nochoices":
            return web.json_response({"object": "error", "detail": "upstream unavailable"})
        return answer(body, outcome, record)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, self._chat_answer)

    def _rejected(self, body: dict[str, Any]) -> web.Response | None:
        kind = (body.get("response_format") or {}).get("type")
        if kind in self.reject_formats:
            param, value, msg = "response_format", kind, "Input should be 'text' or 'json_object'"
            said = f"Invalid parameter: 'response_format' of type '{kind}' is not supported with this model."
        else:
            refused = next((p for p in sorted(self.reject_params) if p in body), None)
            if refused is None:
                return None
            param = refused
            value, msg = body[param], "Extra inputs are not permitted"
            said = f"Unsupported parameter: '{param}' is not supported with this model."
        with self._lock:
            self.rejected[param] += 1
        loc = ["body", param] + (["type"] if param == "response_format" else [])
        if self.reject_shape == "fastapi422":
            return web.json_response({"detail": [{"type": "literal_error", "loc": loc, "msg": msg, "input": value}]},
                                     status=422)
        if self.reject_shape == "llama500":  # llama-cpp-python 0.3.36's own server, word for word but the path
            text = (f"1 validation error:\n  {{'type': 'literal_error', 'loc': {tuple(loc)!r}, 'msg': {msg!r}, "
                    f"'input': {value!r}}}\n\n  File \"llama_cpp/server/app.py\", line 376, in "
                    "create_chat_completion\n    POST /v1/chat/completions")
            return web.json_response({"error": {"message": text, "type": "internal_server_error", "param": None,
                                                "code": None}}, status=500)
        return web.json_response({"error": {"message": said, "type": "invalid_request_error", "param": param,
                                            "code": "unsupported_parameter"}}, status=400)

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, self._embed_answer)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, self._responses_answer)

    async def _models(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            self.by_path[request.path] += 1
        return web.json_response({"object": "list", "data": [
            {"id": "fake-model", "object": "model", "created": 0, "owned_by": "fake"}]})

    async def _stats(self, request: web.Request) -> web.StreamResponse:
        """Counters, plus one entry per chat request: arrival `t`, `done` (null while in flight),
        `key` (hash of the body: equal keys are the same request sent again), `outcome` (null: ok),
        `structured`, `tokens` (prompt words + max_tokens, what a tpm limiter budgets) and
        `est_tokens` (the client's own estimate, pipeline.llm.ratelimit.estimate_tokens: prompt
        characters // 4 + max_tokens, what its tpm pacing budgeted for the request) and `head`
        (the first 120 characters of the first message: which prompt, hence which stage, sent it) and
        `answer` (the id in the reply text, "fake reply <answer>" for a plain call: finds the reply in a
        call cache), `n` (asked), `choices` (answered) and `cached_tokens`. `embeddings`: one entry per
        embeddings request: `t`, `done`, `outcome` and `inputs` (how many texts it carried). With
        `?bodies=1` each chat entry also carries its request `body` (a benchmark replays them)."""
        bodies = request.query.get("bodies") == "1"
        with self._lock:
            chat = [{"t": r["t"], "done": r["done"], "key": _hash(r["body"])[:16], "outcome": r["outcome"],
                     "structured": bool(r["body"].get("response_format")),
                     "tokens": sum(_words(str(m.get("content") or "")) for m in r["body"].get("messages", []))
                     + int(r["body"].get("max_tokens") or 0),
                     "est_tokens": sum(len(str(m.get("content") or "")) for m in r["body"].get("messages", [])) // 4
                     + int(r["body"].get("max_tokens") or 0),
                     "head": str((r["body"].get("messages") or [{}])[0].get("content") or "")[:120],
                     "answer": _answer_id(r["body"]), "n": r.get("n"), "choices": r.get("choices"),
                     "cached_tokens": r.get("cached_tokens"), **({"body": r["body"]} if bodies else {})}
                    for r in self.requests if r["path"] == "/v1/chat/completions"]
            embeddings = [{"t": r["t"], "done": r["done"], "outcome": r["outcome"],
                           "inputs": len(r["body"].get("input") or []) if isinstance(r["body"].get("input"), list)
                           else 1}
                          for r in self.requests if r["path"] == "/v1/embeddings"]
            return web.json_response({"total": len(self.requests), "by_path": dict(self.by_path),
                                      "outcomes": dict(self.outcomes), "max_in_flight": self.max_in_flight,
                                      "chat": chat, "embeddings": embeddings, "chat_times": [c["t"] for c in chat],
                                      "plain_chat_times": [c["t"] for c in chat if not c["structured"]]})

    async def _outage(self, request: web.Request) -> web.StreamResponse:
        """POST /outage {"seconds": 60}: every chat / embeddings request fails with a 500 from now
        for that long (an endpoint that is down)."""
        seconds = float((await request.json()).get("seconds", 0))
        self.outage_until = time.time() + seconds
        return web.json_response({"outage_until": self.outage_until})

    async def _reset(self, request: web.Request) -> web.StreamResponse:
        self.reset()
        return web.json_response({"ok": True})

    def _chat_answer(self, body: dict[str, Any], outcome: str | None,
                     record: dict[str, Any] | None = None) -> web.Response:
        if _asked_n(body) is None and not self.ignore_n:  # as OpenAI answers n=0 or n="2"
            return _invalid("n", f"expected an integer in 1..{MAX_N}, got {body.get('n')!r}")
        k = body.get("top_logprobs")
        if k is not None and not (isinstance(k, int) and not isinstance(k, bool) and 0 <= k <= MAX_TOP_LOGPROBS):
            return _invalid("top_logprobs", f"expected an integer in 0..{MAX_TOP_LOGPROBS}, got {k!r}")
        unknown = _unknown_tool_choice(body)
        if unknown is not None:
            return _invalid("tool_choice", f"no function named {unknown!r} in tools")
        out = self._chat_body(body, outcome)
        if record is not None:
            with self._lock:
                record.update(choices=len(out["choices"]),
                              cached_tokens=out["usage"]["prompt_tokens_details"]["cached_tokens"])
        return web.json_response(out)

    def _prefix_cache(self) -> PrefixCache:
        """The prompt cache, rebuilt (empty) when a test changes its sizes."""
        with self._cache_lock:
            c = self._cache
            if c is None or (c.min_tokens, c.step) != (self.cache_min_tokens, self.cache_step):
                c = self._cache = PrefixCache(self.cache_min_tokens, self.cache_step)
            return c

    def _chat_content(self, body: dict[str, Any], outcome: str | None, choice: int,
                      scripted: str | None) -> str:
        """One choice's text; `body` is that choice's own request (`choice_body`), `scripted` what the
        responder answered for it."""
        messages = body.get("messages", [])
        h = _choice_hash(body, choice)
        rf = body.get("response_format") or {}
        # The schema comes with the response_format (json_schema), or in the prompt (json_object and
        # prompt modes); in prompt mode the JSON comes wrapped in prose, as chat models write it.
        schema = rf.get("json_schema", {}).get("schema") if rf.get("type") == "json_schema" else schema_in_prompt(messages)
        structured = schema is not None
        content = scripted
        if outcome == "malformed":
            content = '{"answer": "truncated' if structured else "malformed {"
        elif content is None:
            if schema is not None:
                content = json.dumps(SchemaInstance(schema, h[:8]).build(schema))
                if not rf:
                    content = f"Here is the JSON you asked for:\n{content}\nLet me know if you need more."
            else:
                content = f"fake reply {h[:8]}"
        return content

    def _chat_message(self, body: dict[str, Any], outcome: str | None, choice: int) -> dict[str, Any]:
        """One choice's assistant message: text, or tool calls when the request offers function tools
        (`_called_tool`) or the responder scripts them; `body` is that choice's own request."""
        h = _choice_hash(body, choice)
        scripted = self.responder(body) if self.responder is not None else None
        tool = _called_tool(body)
        if isinstance(scripted, dict):
            calls = [(c["name"], c["arguments"] if isinstance(c.get("arguments"), str)
                      else json.dumps(c.get("arguments") or {})) for c in scripted["tool_calls"]]
        elif scripted is not None or tool is None:
            return {"role": "assistant", "content": self._chat_content(body, outcome, choice, scripted)}
        else:
            params = tool.get("parameters") or {"type": "object", "properties": {}}
            calls = [(tool["name"], json.dumps(SchemaInstance(params, h[:8]).build(params)))]
        if outcome == "malformed":  # arguments cut short, as a truncated structured answer
            calls = [(name, '{"truncated') for name, _ in calls]
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{_hash([h, i])[:24]}", "type": "function", "function": {"name": name, "arguments": args}}
            for i, (name, args) in enumerate(calls)]}

    def _chat_body(self, body: dict[str, Any], outcome: str | None) -> dict[str, Any]:
        messages = body.get("messages", [])
        h = _answer_hash(body)
        n = 1 if self.ignore_n else _asked_n(body) or 1
        answers = [self._chat_message(choice_body(body, j), outcome, j) for j in range(n)]
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        cutting = outcome == "length" or self.cut_at_max_tokens
        cut = [cutting and _cut(a, limit if isinstance(limit, int) else None, outcome == "length") for a in answers]
        prompt = sum(_words(str(m.get("content") or "")) for m in messages)  # once, whatever n is
        completion = sum(max(1, _message_words(a)) for a in answers)
        cached = self._prefix_cache().observe(str(body.get("model")), _prompt_words(messages)) \
            if self.prompt_cache else 0
        choices = []
        for j, a in enumerate(answers):
            seed = _choice_hash(choice_body(body, j), j)
            logprobs = _logprobs(a["content"], seed, body.get("top_logprobs") or 0) if body.get("logprobs") else None
            finish = "length" if cut[j] else "tool_calls" if a.get("tool_calls") else "stop"
            choices.append({"index": j, "message": a, "logprobs": logprobs, "finish_reason": finish})
        return {
            "id": f"chatcmpl-fake-{h[:12]}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "fake-model"), "choices": choices,
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion, "prompt_tokens_details": {"cached_tokens": cached}},
        }

    # ------------------------------------------------------------ Responses API

    def _responses_answer(self, body: dict[str, Any], outcome: str | None,
                          record: dict[str, Any] | None = None) -> web.Response:
        """A Responses API request, answered as its chat translation (`responses_as_chat`) would be."""
        chat = responses_as_chat(body)
        unknown = _unknown_tool_choice(chat)
        if unknown is not None:
            return _invalid("tool_choice", f"no function named {unknown!r} in tools")
        out = self._chat_body(chat, outcome)
        message, h = out["choices"][0]["message"], _answer_hash(chat)
        if message.get("tool_calls"):
            output = [{"type": "function_call", "id": f"fc_{_hash([h, c['id']])[:24]}", "call_id": c["id"],
                       "name": c["function"]["name"], "arguments": c["function"]["arguments"], "status": "completed"}
                      for c in message["tool_calls"]]
        else:
            output = [{"type": "message", "id": f"msg_{h[:24]}", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": message["content"], "annotations": []}]}]
        usage = out["usage"]
        tool_choice = body.get("tool_choice", "auto")
        cut = out["choices"][0]["finish_reason"] == "length"
        return web.json_response({
            "id": f"resp_{h[:24]}", "object": "response", "created_at": int(time.time()),
            "model": body.get("model", "fake-model"), "status": "incomplete" if cut else "completed",
            "error": None, "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "instructions": body.get("instructions"), "output": output,
            "max_output_tokens": body.get("max_output_tokens"), "metadata": body.get("metadata") or {},
            "parallel_tool_calls": body.get("parallel_tool_calls", True), "tool_choice": tool_choice,
            "tools": body.get("tools") or [], "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "text": body.get("text") or {"format": {"type": "text"}},
            "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                      "total_tokens": usage["total_tokens"],
                      "input_tokens_details": {"cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                                               "cache_write_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}},
        })

    # ------------------------------------------------------------ Batch API

    def _record(self, request: web.Request, body: dict[str, Any]) -> web.Response | None:
        """Count a files / batches request; an error response when `force` says it fails (429,
        500 or 400; other forced outcomes are used up and ignored here)."""
        with self._lock:
            outcome = self.force.pop(0) if self.force else None
            self.requests.append({"path": request.path, "body": body, "t": time.time(), "outcome": outcome,
                                  "auth": request.headers.get("Authorization"), "done": time.time()})
            self.by_path[request.path] += 1
        if outcome == "429":
            headers = {} if self.retry_after_s is None else {"Retry-After": f"{self.retry_after_s:g}"}
            return _error(429, "fake rate limit", headers, "rate_limit_exceeded")
        if outcome == "500":
            return _error(500, "fake internal error", None, "server_error")
        if outcome == "400":
            return _error(400, "fake bad request", None, "invalid_request_error")
        return None

    async def _file_upload(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        upload = form.get("file")
        purpose = str(form.get("purpose") or "")
        if not isinstance(upload, web.FileField):
            return self._record(request, {"purpose": purpose}) or \
                _error(400, "'file' is a required multipart field", None, "invalid_request_error")
        content = upload.file.read()
        fault = self._record(request, {"purpose": purpose, "bytes": len(content), "filename": upload.filename})
        if fault is not None:
            return fault
        if purpose != "batch":
            return _error(400, f"unsupported purpose {purpose!r} in this fake", None, "invalid_request_error")
        with self._lock:
            file_id = self._new_file_id()
            self.files[file_id] = {"content": content, "purpose": purpose, "filename": upload.filename}
        return web.json_response(self._file_object(file_id))

    def _new_file_id(self) -> str:
        self.files_made += 1
        return f"file-fake-{self.files_made}"

    async def _file_delete(self, request: web.Request) -> web.StreamResponse:
        fault = self._record(request, {})
        if fault is not None:
            return fault
        file_id = request.match_info["file_id"]
        with self._lock:
            if self.files.pop(file_id, None) is None:
                return _error(404, "no such file", None, "not_found")
        return web.json_response({"id": file_id, "object": "file", "deleted": True})

    def _file_object(self, file_id: str) -> dict[str, Any]:
        f = self.files[file_id]
        return {"id": file_id, "object": "file", "bytes": len(f["content"]), "created_at": int(time.time()),
                "filename": f["filename"] or "file.jsonl", "purpose": f["purpose"], "status": "processed"}

    async def _file_content(self, request: web.Request) -> web.StreamResponse:
        fault = self._record(request, {})
        if fault is not None:
            return fault
        f = self.files.get(request.match_info["file_id"])
        if f is None:
            return _error(404, "no such file", None, "not_found")
        return web.Response(body=f["content"], content_type="application/octet-stream")

    async def _batch_create(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return _error(400, "request body is not JSON")
        fault = self._record(request, body)
        if fault is not None:
            return fault
        if body.get("endpoint") != "/v1/chat/completions":
            return _error(400, f"endpoint {body.get('endpoint')!r} is not served by this fake", None,
                          "invalid_request_error")
        if body.get("input_file_id") not in self.files:
            return _error(404, "no such input file", None, "not_found")
        with self._lock:
            batch_id = f"batch_fake_{len(self.batches) + 1}"
            expire, self.batch_expire_next = self.batch_expire_next, None
            self.batches[batch_id] = {
                "id": batch_id, "object": "batch", "endpoint": body["endpoint"], "errors": None,
                "input_file_id": body["input_file_id"], "completion_window": body.get("completion_window"),
                "status": "validating", "output_file_id": None, "error_file_id": None,
                "created_at": int(time.time()), "request_counts": {"total": 0, "completed": 0, "failed": 0},
                "metadata": body.get("metadata"), "_polls": 0, "_expire": expire}
            return web.json_response(_public(self.batches[batch_id]))

    async def _batch_retrieve(self, request: web.Request) -> web.StreamResponse:
        fault = self._record(request, {})
        if fault is not None:
            return fault
        with self._lock:
            batch = self.batches.get(request.match_info["batch_id"])
            if batch is None:
                return _error(404, "no such batch", None, "not_found")
            if batch["status"] in ("validating", "in_progress"):
                batch["_polls"] += 1
                if batch["_polls"] < self.batch_polls:
                    batch["status"] = "in_progress"
                else:
                    self._finish_batch(batch)
            return web.json_response(_public(batch))

    def _finish_batch(self, batch: dict[str, Any]) -> None:
        """Answer a batch's lines (under the lock) and write its output / error files."""
        content = self.files[batch["input_file_id"]]["content"].decode()
        lines = [json.loads(x) for x in content.splitlines() if x.strip()]
        ids = [line.get("custom_id") for line in lines]
        duplicate = next((i for i in ids if ids.count(i) > 1), None)
        bad_url = next((line.get("url") for line in lines if line.get("url") != batch["endpoint"]), None)
        if duplicate is not None or bad_url is not None:
            message = (f"duplicate custom_id {duplicate!r}" if duplicate is not None
                       else f"line url {bad_url!r} is not the batch's endpoint")
            batch.update(status="failed", errors={"object": "list", "data": [
                {"code": "invalid_request", "message": message, "line": None, "param": None}]})
            return
        answered = lines if batch["_expire"] is None else lines[: batch["_expire"]]
        output: list[dict] = []
        errors: list[dict] = []
        for n, line in enumerate(answered):
            cid, body = line["custom_id"], line.get("body") or {}
            h = _hash(body)
            attempt = self.batch_seen[h]
            self.batch_seen[h] += 1
            r = int(hashlib.sha256(f"batch:{self.fault_seed}:{h}:{attempt}".encode()).hexdigest()[:15], 16) / 16**15
            rf_type = (body.get("response_format") or {}).get("type")
            if cid in self.batch_fail_ids or r < self.batch_fail_fraction:
                self.batch_failed.append(cid)
                response = {"status_code": self.batch_fail_status,
                            "body": {"error": {"message": self.batch_fail_message, "type": "server_error"}}}
            elif rf_type in self.reject_formats:
                response = {"status_code": 400, "body": {"error": {
                    "message": f"Invalid parameter: 'response_format' of type '{rf_type}' is not supported with "
                               "this model.", "type": "invalid_request_error"}}}
            else:
                response = {"status_code": 200, "body": self._chat_body(body, None)}
            response["request_id"] = f"req_fake_{batch['id']}_{n}"
            out = {"id": f"batch_req_{batch['id']}_{n}", "custom_id": cid, "response": response, "error": None}
            ok = response["status_code"] == 200
            (output if ok or self.batch_fail_in == "output" else errors).append(out)
        counts = {"total": len(lines), "completed": sum(o["response"]["status_code"] == 200 for o in output),
                  "failed": len(errors) + sum(o["response"]["status_code"] != 200 for o in output)}
        for name, rows in (("output_file_id", output), ("error_file_id", errors)):
            if rows:
                file_id = self._new_file_id()
                content = "".join(json.dumps(o) + "\n" for o in rows).encode()
                self.files[file_id] = {"content": content, "purpose": "batch_output", "filename": f"{name}.jsonl"}
                batch[name] = file_id
        batch.update(status="expired" if batch["_expire"] is not None else "completed", request_counts=counts)

    def _embed_answer(self, body: dict[str, Any], outcome: str | None,
                      record: dict[str, Any] | None = None) -> web.Response:
        inputs = body.get("input", [])
        if isinstance(inputs, str):
            inputs = [inputs]
        dim = body.get("dimensions", self.embed_dim)
        if not (isinstance(dim, int) and not isinstance(dim, bool) and dim >= 1):
            return _invalid("dimensions", f"expected a positive integer, got {dim!r}")
        data = []
        for i, text in enumerate(inputs):
            vec = self.vector(str(text), dim)
            if body.get("encoding_format") == "base64":
                emb: Any = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
            else:
                emb = vec
            data.append({"object": "embedding", "index": i, "embedding": emb})
        tokens = sum(_words(str(t)) for t in inputs)
        return web.json_response({"object": "list", "data": data, "model": body.get("model", "fake-embed"),
                                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    def vector(self, text: str, dim: int | None = None) -> list[float]:
        """The deterministic embedding of `text`, `dim` long (default `embed_dim`; tests compare
        against it). A shorter one is a prefix of a longer one, as the hash stream is one."""
        return [round(x, 6) for x in hashed_vector(text, dim or self.embed_dim)]


def _public(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in batch.items() if not k.startswith("_")}


def request_path_is_chat(body: dict[str, Any]) -> bool:
    return "messages" in body


def _function_tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat request's function tools, each its `function` object ({"name", "parameters", ...})."""
    return [t["function"] for t in body.get("tools") or []
            if isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)]


def _names_function(choice: Any) -> TypeGuard[dict]:
    """Whether a chat `tool_choice` names one function ({"type": "function", "function": {"name"}})."""
    return isinstance(choice, dict) and choice.get("type") == "function"


def _unknown_tool_choice(body: dict[str, Any]) -> str | None:
    """The function `tool_choice` names when no tool has that name (OpenAI refuses it), else None."""
    choice = body.get("tool_choice")
    if not _names_function(choice):
        return None
    name = (choice.get("function") or {}).get("name")
    return None if any(t.get("name") == name for t in _function_tools(body)) else str(name)


def _called_tool(body: dict[str, Any]) -> dict[str, Any] | None:
    """The function a chat answer calls: the one `tool_choice` names, else the first tool. None (a text
    answer) without function tools, with tool_choice "none", or under "auto" when the last message is
    a tool result, so an agent loop over this server ends instead of calling tools forever."""
    tools = _function_tools(body)
    choice = body.get("tool_choice", "auto")
    if not tools or choice == "none":
        return None
    if _names_function(choice):
        name = (choice.get("function") or {}).get("name")
        return next((t for t in tools if t.get("name") == name), None)
    last = (body.get("messages") or [{}])[-1]
    if choice != "required" and isinstance(last, dict) and last.get("role") == "tool":
        return None
    return tools[0]


def _message_words(message: dict[str, Any]) -> int:
    """Completion words of an assistant message: its text, or its tool calls' arguments."""
    calls = message.get("tool_calls") or []
    return _words(message.get("content") or "") + sum(_words(c["function"]["arguments"]) for c in calls)


def _cut_text(text: str, limit: int | None, always: bool) -> str | None:
    """`text` cut after its `limit`-th word when it has more; else, when `always`, to half its
    characters; None when it stays whole."""
    words = list(re.finditer(r"\S+", text))
    if limit is not None and 0 < limit < len(words):
        return text[:words[limit - 1].end()]
    return text[:len(text) // 2] if always else None


def _cut(message: dict[str, Any], limit: int | None, always: bool) -> bool:
    """Cut an assistant message (in place) as an endpoint does at max_tokens: its text, or each tool
    call's arguments, after `limit` words; `always` (the "length" fault): to half when within them.
    Returns whether anything was cut."""
    cut = False
    for part, key in [(c["function"], "arguments") for c in message.get("tool_calls") or []] + [(message, "content")]:
        if isinstance(part.get(key), str) and (short := _cut_text(part[key], limit, always)) is not None:
            part[key], cut = short, True
    return cut


MAX_TOP_LOGPROBS = 20  # OpenAI's upper bound on `top_logprobs`


def _logprobs(content: str | None, seed: str, k: int) -> dict[str, Any]:
    """Chat logprobs of `content`: one entry per whitespace token (with the whitespace before it, so the
    tokens join back into the text), a negative logprob drawn from `seed`, and `k` top_logprobs, the
    chosen token first and made-up alternatives after it, each less likely."""
    entries = []
    for i, m in enumerate(re.finditer(r"\s*\S+", content or "")):
        token, r = m.group(), _hash([seed, i])
        lp = -2 * (1 + int(r[:8], 16)) / 16**8  # in (-2, 0): never exactly certain
        step = 0.5 + int(r[8:12], 16) / 16**4
        top = [(token, lp)] + [(f"{token}~{j}", lp - j * step) for j in range(1, k)]
        entries.append({"token": token, "logprob": round(lp, 6), "bytes": list(token.encode()),
                        "top_logprobs": [{"token": t, "logprob": round(x, 6), "bytes": list(t.encode())}
                                         for t, x in top[:k]]})
    return {"content": entries, "refusal": None}


def _input_text(content: object) -> str:
    """A Responses input item's content as text: a string, or its text parts joined by newlines."""
    if isinstance(content, list):
        return "\n".join(str(p.get("text") or "") for p in content if isinstance(p, dict) and "text" in p)
    return str(content or "")


def responses_as_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request a Responses API request is answered as: `instructions` a system message first;
    `input` (a string, or items) as messages: message items with their text parts joined,
    `function_call` items as assistant tool calls, `function_call_output` items as tool messages;
    `text.format` as `response_format`; function tools and `tool_choice` in chat's shape;
    `max_output_tokens` as `max_tokens`; and `"endpoint": "/v1/responses"`, so a responder can tell."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": _input_text(body["instructions"])})
    items = body.get("input")
    for item in [{"role": "user", "content": items}] if isinstance(items, str) else items or []:
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            messages.append({"role": item.get("role", "user"), "content": _input_text(item.get("content"))})
        elif kind == "function_call":
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": item.get("call_id"), "type": "function",
                 "function": {"name": item.get("name"), "arguments": item.get("arguments")}}]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": str(item.get("output"))})
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages, "endpoint": "/v1/responses"}
    fmt = (body.get("text") or {}).get("format") or {}
    if fmt.get("type") == "json_schema":
        chat["response_format"] = {"type": "json_schema", "json_schema": {
            k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}
    elif fmt.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    tools = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
             for t in body.get("tools") or [] if isinstance(t, dict) and t.get("type") == "function"]
    if tools:
        chat["tools"] = tools
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif isinstance(choice, str):  # "auto", "none", "required"
        chat["tool_choice"] = choice
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    return chat


_SCHEMA_BLOCK = re.compile(r"JSON schema:\n```json\n(.*?)\n```", re.DOTALL)


def schema_in_prompt(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The JSON schema the client spelled out in the prompt (json_object / prompt modes)."""
    text = "\n".join(str(m.get("content") or "") for m in messages)
    found = _SCHEMA_BLOCK.findall(text)
    return json.loads(found[-1]) if found else None


def _invalid(param: str, message: str) -> web.Response:
    """OpenAI's 400 for a parameter out of range."""
    return web.json_response({"error": {"message": f"Invalid '{param}': {message}.", "type": "invalid_request_error",
                                        "param": param, "code": "invalid_value"}}, status=400)


def _error(status: int, message: str, headers: dict[str, str] | None = None, code: str | None = None
           ) -> web.Response:
    return web.json_response({"error": {"message": message, "type": code or "error", "code": code}},
                             status=status, headers=headers)


def main(argv: list[str] | None = None) -> None:
    import argparse
    import signal

    ap = argparse.ArgumentParser(description="A deterministic fake OpenAI-compatible server.")
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    ap.add_argument("--latency", type=float, default=0.0, help="seconds per request")
    ap.add_argument("--max-concurrency", type=int, default=None, help="requests served at once; more wait")
    ap.add_argument("--faults", default="", help="e.g. 429=0.1,500=0.05,timeout=0.02,malformed=0.05")
    ap.add_argument("--retry-after", type=float, default=1.0, help="Retry-After seconds of a 429")
    ap.add_argument("--timeout-sleep", type=float, default=3.0, help="how long a 'timeout' fault hangs")
    args = ap.parse_args(argv)
    faults = {k: float(v) for k, v in (p.split("=") for p in args.faults.split(",") if p)}
    unknown = set(faults) - set(FAULT_ORDER)
    if unknown:
        ap.error(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULT_ORDER)}")
    server = FakeOpenAI(latency_s=args.latency, max_concurrency=args.max_concurrency, faults=faults,
                        retry_after_s=args.retry_after, timeout_sleep_s=args.timeout_sleep)
    server.port = args.port
    server.start()
    print(f"fake OpenAI server on {server.base_url}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    server.stop()


if __name__ == "__main__":
    main()
