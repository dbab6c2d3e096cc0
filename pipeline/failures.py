"""Failures as rows: one row whose work raised becomes a row that says why.

A row that failed carries `error` (the reason, `<Type>: <message>` unless the error gives its own)
and `raw` (the model's last output, when it gave one: an answer that failed validation is kept for
inspection, as SPEC asks). Every table whose rows can fail ends its schema with `FAILURE_FIELDS`.

Two scopes:
- `attempt`: one LLM call inside a method's own algorithm; only `LLMError` is caught, so the
  method decides what an unanswered call means (RSum keeps its previous memory).
- `row_or_failure` / `guarded`: one output row of a stage (a probe's answer, a judgment, a memory
  build); any exception is caught, logged with its traceback, and becomes that row's failure, so a
  bug in a method, judge or third-party library on one row never fails the stage or loses other
  rows. Not caught: `RunStopped` (budget, endpoint down, models missing), cancellation and
  KeyboardInterrupt, which stop the run; and every exception under `--fail-fast` (`fail_fast`).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from typing import Any, Awaitable, Iterator, TypeVar

import pyarrow as pa

from pipeline.errors import RunStopped
from pipeline.llm.types import LLMError

log = logging.getLogger("mempipe")

FAILURE_FIELDS = [
    pa.field("error", pa.string()),  # null: the row succeeded
    pa.field("raw", pa.string()),  # the model's last output when the row failed on it
]
_REASON_CHARS = 2000

# --fail-fast: the first failed row stops the run (set per shard by the executor, from the task).
_FAIL_FAST: contextvars.ContextVar[bool] = contextvars.ContextVar("mempipe_fail_fast", default=False)


@contextlib.contextmanager
def fail_fast(on: bool) -> Iterator[None]:
    """Within this block, a row's exception is raised instead of becoming a failed row."""
    token = _FAIL_FAST.set(on)
    try:
        yield
    finally:
        _FAIL_FAST.reset(token)


def failing_fast() -> bool:
    return _FAIL_FAST.get()


def failure_reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or f"{type(exc).__name__}: {exc}"
    return reason[:_REASON_CHARS]


def failure(exc: BaseException) -> dict[str, Any]:
    """The failure columns of a row whose work raised `exc`."""
    return {"error": failure_reason(exc), "raw": getattr(exc, "raw", None)}


NO_FAILURE: dict[str, Any] = {"error": None, "raw": None}
T = TypeVar("T")


def row_failure(exc: Exception, where: str) -> dict[str, Any]:
    """The failure columns for a row whose work raised `exc`, or `exc` raised again when the run
    must stop (`RunStopped`) or fails fast. A bug (anything but an LLMError) is logged with its
    traceback, naming `where` (the stage and row)."""
    if isinstance(exc, RunStopped) or failing_fast():
        raise exc
    if not isinstance(exc, LLMError):
        log.error("%s failed: %s", where, failure_reason(exc), exc_info=exc)
    return failure(exc)


async def attempt(work: Awaitable[T]) -> tuple[T | None, dict[str, Any]]:
    """Await one LLM call of a method's algorithm: (its result, `NO_FAILURE`), or (None, the failure
    columns) when the call failed. Other exceptions pass: the row around it fails (`guarded`)."""
    try:
        return await work, dict(NO_FAILURE)
    except LLMError as e:
        if failing_fast():
            raise
        return None, failure(e)


async def guarded(work: Awaitable[T], where: str) -> tuple[T | None, dict[str, Any]]:
    """Await one row's work: (its result, `NO_FAILURE`), or (None, the failure columns) when it
    raised anything but what stops the run (`row_failure`)."""
    try:
        return await work, dict(NO_FAILURE)
    except Exception as e:  # noqa: BLE001 - one row's failure, whatever raised it, is that row's
        return None, row_failure(e, where)


async def row_or_failure(row: dict[str, Any], work: Awaitable[dict[str, Any]], where: str = "") -> dict[str, Any]:
    """`row` with the fields `work` returns, or with the failure columns when it raised: one failed
    row never fails the stage."""
    fields, failed = await guarded(work, where or f"row {row.get('probe_id') or row.get('episode_id') or ''}")
    return {**row, **failed, **(fields or {})}
