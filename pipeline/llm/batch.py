"""OpenAI Batch API mode (`llm.batch: true`, or `roles.<name>.batch`): chat requests wait in a
queue and go out together as one batch file, at half the list price.

One `BatchQueue` per client and event loop. The client hands it the exact JSON body it would
have POSTed to /chat/completions, with the request's cache key as `custom_id`, and awaits the
answer. When no new request has come for `IDLE_S` seconds (or the queue holds the provider's
maximum of `MAX_REQUESTS` requests or `MAX_BYTES` of JSONL) the queued requests are written as
JSONL, uploaded (`files.create`, purpose "batch"), and a batch is created on /v1/chat/completions
with `completion_window = cfg.batch_window`. The batch is polled every `cfg.batch_poll_s` seconds,
the interval growing by `POLL_GROWTH` up to `POLL_MAX_FACTOR` times that; when it ends, its output
and error files are downloaded and each waiting request gets (text, prompt_tokens,
completion_tokens, model), read as a normal chat response.

Failures: a line whose status is retriable (429, 408, 5xx), a request missing from both files, or
one in a batch that `expired`, `failed` or was `cancelled`, goes into the next batch, up to
`cfg.max_retries` times; then it raises `LLMError` with the reason ("batch item failed: HTTP 500:
...", "batch expired before this request was answered"). A line the endpoint refused for good (any
other 4xx, e.g. a 400 naming the response format) raises at once with its status, as a direct call
does, so the structured-mode fallback works in batch mode too. The files / batches calls themselves
go through the client's retry loop (`Transport.send`); when that gives up, every request of that
batch fails with its reason. Every message is scrubbed of the API key.

Nothing here holds one of the client's `max_concurrency` slots while it waits: a batch may hold
any number of requests; the slots are taken only by the short files / batches calls.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

from pipeline.llm.answers import ChatAnswer, MalformedResponse, read_chat
from pipeline.llm.transport import Transport, retryable_status
from pipeline.llm.types import LLMError, short

log = logging.getLogger(__name__)

IDLE_S = 0.2  # a batch leaves when no new request has arrived for this long
MAX_REQUESTS = 50_000  # the provider's maximum requests per batch
MAX_BYTES = 190 * 1024 * 1024  # the provider's input file limit is 200 MB; a margin below it
POLL_GROWTH = 1.5  # each poll waits this much longer than the last ...
POLL_MAX_FACTOR = 10.0  # ... up to this many times `batch_poll_s`
ENDPOINT = "/v1/chat/completions"
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})

@dataclass
class _Item:
    key: str  # the cache key, sent as custom_id (unique within a batch: one item per key)
    line: bytes  # the JSONL line of the request, newline included
    waiters: list[asyncio.Future] = field(default_factory=list)
    attempts: int = 0  # batches this request went out in before the current one


@dataclass
class _Outcome:
    answer: ChatAnswer | None = None
    reason: str = ""  # why it failed, when answer is None
    status: int | None = None  # HTTP status of a line the endpoint refused
    retriable: bool = True


def queue_for(transport: Transport) -> BatchQueue:
    """The batch queue of this client (its transport) on the running event loop (made on first use)."""
    loop = asyncio.get_running_loop()
    queues: weakref.WeakKeyDictionary = transport.__dict__.setdefault("_batch_queues", weakref.WeakKeyDictionary())
    q = queues.get(loop)
    if q is None:
        q = queues[loop] = BatchQueue(transport)
    return q


class BatchQueue:
    """Collects one client's chat requests on one event loop and sends them as Batch API batches."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.cfg = transport.cfg
        self._items: dict[str, _Item] = {}  # every unanswered request, queued or in a batch
        self._queued: dict[str, _Item] = {}  # waiting for the next batch
        self._queued_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()
        self.batches_sent = 0

    async def submit(self, body: dict[str, Any], key: str) -> ChatAnswer:
        """Queue one request (the JSON body of a /chat/completions POST) and wait for its answer.
        A request with the same key already waiting shares that one's answer."""
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        item = self._items.get(key)
        if item is None:
            line = {"custom_id": key, "method": "POST", "url": ENDPOINT, "body": body}
            item = _Item(key, json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode() + b"\n")
            self._items[key] = item
            self._enqueue(item)
        item.waiters.append(fut)
        return await fut

    # ------------------------------------------------------------ queue

    def _enqueue(self, item: _Item) -> None:
        if self._queued and self._queued_bytes + len(item.line) > MAX_BYTES:
            self._flush()
        self._queued[item.key] = item
        self._queued_bytes += len(item.line)
        if len(self._queued) >= MAX_REQUESTS or self._queued_bytes >= MAX_BYTES:
            self._flush()
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(IDLE_S, self._flush)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        items = list(self._queued.values())
        self._queued, self._queued_bytes = {}, 0
        if not items:
            return
        task = asyncio.get_running_loop().create_task(self._run(items))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------ one batch

    async def _run(self, items: list[_Item]) -> None:
        try:
            outcomes = await self._send_batch(items)
        except asyncio.CancelledError:
            for item in items:  # the loop is ending: nobody is left to answer them
                self._items.pop(item.key, None)
                for w in item.waiters:
                    w.cancel()
            raise
        except LLMError as e:  # the files / batches calls gave up after their retries
            for item in items:
                self._finish(item, error=LLMError(self._scrub(f"batch request failed: {e.reason}"),
                                                  status=e.status))
            return
        except Exception as e:  # a bug or a response we cannot read: fail the rows, not the stage
            reason = self._scrub(f"batch failed: {type(e).__name__}: {short(str(e))}")
            for item in items:
                self._finish(item, error=LLMError(reason))
            return
        for item in items:
            self._settle(item, outcomes[item.key])

    async def _send_batch(self, items: list[_Item]) -> dict[str, _Outcome]:
        """Upload, create, poll, download; one outcome per item."""
        data = b"".join(item.line for item in items)
        self.batches_sent += 1
        uploaded = await self._call(
            lambda c: c.files.create(file=("batch.jsonl", data, "application/jsonl"), purpose="batch"),
            _read_id)
        batch = await self._call(
            lambda c: c.batches.create(input_file_id=uploaded, endpoint=ENDPOINT,
                                       completion_window=self.cfg.batch_window),
            _read_batch)
        log.info("batch %s: %d requests sent (%d bytes)", batch.id, len(items), len(data))
        delay = self.cfg.batch_poll_s
        while batch.status not in TERMINAL:
            await asyncio.sleep(delay)
            delay = min(delay * POLL_GROWTH, self.cfg.batch_poll_s * POLL_MAX_FACTOR)
            batch_id = batch.id
            batch = await self._call(lambda c: c.batches.retrieve(batch_id), _read_batch)
        log.info("batch %s: %s", batch.id, batch.status)
        found: dict[str, _Outcome] = {}
        results = [f for f in (getattr(batch, "output_file_id", None), getattr(batch, "error_file_id", None)) if f]
        for file_id in results:
            text = await self._call(lambda c: c.files.content(file_id), _read_text)  # awaited before the next id
            found.update(self._read_results(text))
        await self._delete_files([uploaded, *results])
        missing = _missing_reason(batch)
        return {item.key: found.get(item.key) or _Outcome(reason=missing) for item in items}

    async def _delete_files(self, file_ids: list[str]) -> None:
        """Remove the batch's files from the account once read: they hold every prompt and answer, and
        count against the account's storage. Best effort: the answers are already in hand."""
        for file_id in file_ids:
            try:
                await self._call(lambda c: c.files.delete(file_id), lambda resp: resp)  # awaited before the next id
            except Exception as e:  # noqa: BLE001 - a file left behind costs storage, not answers
                log.warning("batch file %s was not deleted (%s); delete it from the account's files", file_id,
                            self._scrub(str(e))[:200])

    async def _call(self, call: Callable[[Any], Any], read: Callable[[Any], Any]) -> Any:
        return await self.transport.send(call, 0, read)

    def _read_results(self, text: str) -> dict[str, _Outcome]:
        out: dict[str, _Outcome] = {}
        for raw in text.splitlines():
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
            except json.JSONDecodeError:
                continue  # its request reads as missing, hence retried
            key = line.get("custom_id") if isinstance(line, dict) else None
            if not isinstance(key, str):
                continue
            response = line.get("response") or {}
            status = response.get("status_code")
            body = response.get("body")
            if status == 200 and isinstance(body, dict):
                try:
                    out[key] = _Outcome(answer=read_chat(_namespace(body)))
                except MalformedResponse as e:
                    out[key] = _Outcome(reason=f"batch item failed: malformed response: {e}")
                continue
            error = (body or {}).get("error") if isinstance(body, dict) else None
            error = error or line.get("error") or {}
            message = (error.get("message") or error.get("code") if isinstance(error, dict) else str(error)) \
                or "no reason given"
            what = f"HTTP {status}: {message}" if status else str(message)
            fatal = isinstance(status, int) and not retryable_status(status) and status != 200
            out[key] = _Outcome(reason=f"batch item failed: {short(what, 400)}",
                                status=status if fatal else None, retriable=not fatal)
        return out

    # ------------------------------------------------------------ answers

    def _settle(self, item: _Item, outcome: _Outcome) -> None:
        if outcome.answer is not None:
            self._finish(item, answer=outcome.answer)
        elif outcome.retriable and item.attempts < self.cfg.max_retries:
            item.attempts += 1
            self.transport.usage.retries += 1
            log.debug("batch request %s again (%s)", item.key[:12], outcome.reason)
            self._enqueue(item)
        else:
            reason = outcome.reason
            if outcome.retriable:
                reason += f" (gave up after {item.attempts + 1} batches)"
            self._finish(item, error=LLMError(self._scrub(reason), status=outcome.status))

    def _finish(self, item: _Item, *, answer: ChatAnswer | None = None, error: LLMError | None = None) -> None:
        self._items.pop(item.key, None)
        for w in item.waiters:
            if w.done():  # its caller was cancelled
                continue
            if error is not None:
                w.set_exception(LLMError(error.reason, status=error.status))
            else:
                w.set_result(answer)

    def _scrub(self, text: str) -> str:
        return self.transport.scrub(text)


def _missing_reason(batch: Any) -> str:
    status = batch.status
    if status == "expired":
        return "batch expired before this request was answered"
    if status == "cancelled":
        return "batch was cancelled before this request was answered"
    if status == "failed":
        errors = getattr(getattr(batch, "errors", None), "data", None) or []
        said = "; ".join(short(f"{getattr(e, 'code', None) or 'error'}: {getattr(e, 'message', '')}", 200)
                         for e in errors[:3])
        return f"batch failed{': ' + said if said else ''}"
    return "batch item failed: missing from the batch's output and error files"


def _namespace(value: Any) -> Any:
    """A parsed JSON response as attributes, the shape `read_chat` reads from the SDK's models."""
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _namespace(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_namespace(v) for v in value]
    return value


def _read_id(resp: Any) -> str:
    file_id = getattr(resp, "id", None)
    if not isinstance(file_id, str) or not file_id:
        raise MalformedResponse("no file id in the upload's answer")
    return file_id


def _read_batch(resp: Any) -> Any:
    if not isinstance(getattr(resp, "id", None), str) or not isinstance(getattr(resp, "status", None), str):
        raise MalformedResponse("no batch id or status in the answer")
    return resp


def _read_text(resp: Any) -> str:
    if isinstance(resp, (bytes, bytearray)):
        return resp.decode("utf-8", "replace")
    if isinstance(resp, str):
        return resp
    content = getattr(resp, "content", None)
    if isinstance(content, (bytes, bytearray)):
        return content.decode("utf-8", "replace")
    raise MalformedResponse("a batch result file without content")
