"""An OpenAI-compatible endpoint on 127.0.0.1 for a third-party memory library inside one worker.

A library that takes an OpenAI base URL (mem0, Graphiti, LangMem, A-MEM) is pointed here, with a
dummy key naming the method it runs for (`api_key(method)`); the real key never reaches it. Every
request goes through the role's `LLMClient.raw` (the call cache, the endpoint's one concurrency cap,
the budget, retries, usage and cost billed to that method), embeddings through the run's embedder
(the node's local model, or the `embedder` role), so a library's calls are ours to count, cache and
stop. The server runs on the worker's event loop; the library itself runs in threads of the
gateway's own (`call`), so the loop serving it never blocks, and a library call never waits for a
thread of the loop's default executor that the cache or the embedder need to answer it.

An error answered to the library is kept (`errors`): a library that swallows it (returns an empty
memory) still has its row failed by the adapter (`raise_for_errors`). A budget stop is answered as a
503 and kept as `stopped`; the adapter re-raises it after the library call, so a stop is a stop, not
a failed row."""

from __future__ import annotations

import asyncio
import base64
import functools
import ipaddress
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, TypeVar

import numpy as np
from aiohttp import web

from pipeline.errors import RunStopped
from pipeline.llm.types import LLMError
from pipeline.llm.usage import billed_to
from pipeline.retrieval import count_tokens

KEY_PREFIX = "mempipe-gateway-"  # the dummy key: the method a request is billed to follows it
Embed = Callable[[list[str]], Awaitable[np.ndarray]]
T = TypeVar("T")


class GatewayErrors(RuntimeError):
    """Errors the gateway answered a library with, which the library may have swallowed."""


class Gateway:
    def __init__(self, llm: Any, embed: Embed | None = None, threads: int = 8) -> None:
        """`llm`: the role's LLMClient (its `raw`); `embed`: texts -> vectors, None where the method
        embeds nothing (then /embeddings answers 404); `threads`: library calls run at once."""
        self.llm, self.embed = llm, embed
        self.errors: list[str] = []
        self.stopped: RunStopped | None = None
        self._runner: web.AppRunner | None = None
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="library")
        self.port = 0

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)`, a library's synchronous call, in one of the gateway's threads; then
        a budget stop or an error the gateway answered during it is raised (`raise_for_errors`)."""
        since = len(self.errors)
        try:
            out = await asyncio.get_running_loop().run_in_executor(self._threads, functools.partial(fn, *args, **kwargs))
        except Exception:
            if self.stopped is not None:
                raise self.stopped from None
            raise
        self.raise_for_errors(since)
        return out

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @staticmethod
    def api_key(method: str) -> str:
        return KEY_PREFIX + method

    async def __aenter__(self) -> "Gateway":
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/chat/completions", self._passed("/chat/completions"))
        app.router.add_post("/v1/responses", self._passed("/responses"))
        app.router.add_post("/v1/embeddings", self._embeddings)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)  # loopback only, a free port
        await site.start()
        self.address = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
        self.port = self.address[1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        self._threads.shutdown(wait=False, cancel_futures=True)

    def raise_for_errors(self, since: int = 0) -> None:
        """After a library call: a budget stop the gateway answered is re-raised (a stop, not a
        failed row); errors it answered since index `since` fail the caller's row, even where the
        library went on as if nothing happened."""
        if self.stopped is not None:
            raise self.stopped
        if len(self.errors) > since:
            raise GatewayErrors(f"{len(self.errors) - since} gateway error(s) during the library call: "
                                + "; ".join(self.errors[since:since + 3]))

    # ------------------------------------------------------------ routes

    def _passed(self, path: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            return await self._answer(request, lambda body: self.llm.raw(path, body))

        return handle

    async def _embeddings(self, request: web.Request) -> web.Response:
        return await self._answer(request, self._embedded)

    async def _embedded(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.embed is None:
            raise LookupError("this method embeds nothing: no embedder behind the gateway")
        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else list(texts or [])
        if not all(isinstance(t, str) for t in texts):
            raise ValueError("input: the gateway embeds text (a string or a list of strings), not token ids")
        vectors = np.asarray(await self.embed(texts), dtype=np.float32) if texts else np.zeros((0, 0), np.float32)
        asked = body.get("dimensions")
        if asked is not None and texts and int(asked) != vectors.shape[1]:
            raise ValueError(f"dimensions: {asked} asked, the run's embedder gives {vectors.shape[1]} "
                             "(configure the library with the run's embedding size)")
        b64 = body.get("encoding_format") == "base64"
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if b64 else v.tolist()}
                for i, v in enumerate(vectors)]
        tokens = sum(count_tokens(t) for t in texts)
        return {"object": "list", "data": data, "model": str(body.get("model") or ""),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    async def _answer(self, request: web.Request, work: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
                      ) -> web.Response:
        if not _loopback(request.remote):
            return _error(403, "the gateway answers this machine only")
        auth = request.headers.get("Authorization", "")
        method = auth.removeprefix("Bearer ").removeprefix(KEY_PREFIX) if KEY_PREFIX in auth else ""
        try:
            body = await request.json()
        except ValueError:
            return self._failed(400, "the body is not JSON")
        try:
            with billed_to(method):
                return web.json_response(await work(body))
        except RunStopped as e:
            self.stopped = self.stopped or e
            return self._failed(503, f"the run stopped: {e}")
        except LLMError as e:
            return self._failed(e.status if e.status and 400 <= e.status < 600 else 502, e.reason)
        except (ValueError, LookupError) as e:
            return self._failed(400 if isinstance(e, ValueError) else 404, str(e))
        except Exception as e:  # a bug behind the gateway is the library's failed call, not a dead worker
            return self._failed(500, f"{type(e).__name__}: {e}")

    def _failed(self, status: int, message: str) -> web.Response:
        self.errors.append(f"HTTP {status}: {message}")
        return _error(status, message)


def _loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "gateway_error", "code": status}}, status=status)
