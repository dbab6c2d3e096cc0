"""Failures as rows: one LLM call that could not be answered becomes a row that says why.

A row that failed carries `error` (the reason) and `raw` (the model's last output, when it gave
one: an answer that failed validation is kept for inspection, as SPEC asks). Every table whose
rows can fail ends its schema with `FAILURE_FIELDS`; the stage or method calls `row_or_failure`
instead of writing its own `except LLMError` block.
"""

from __future__ import annotations

from typing import Any, Awaitable, TypeVar

import pyarrow as pa

from pipeline.llm.types import LLMError

FAILURE_FIELDS = [
    pa.field("error", pa.string()),  # null: the row succeeded
    pa.field("raw", pa.string()),  # the model's last output when the row failed on it
]
_REASON_CHARS = 2000


def failure_reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or f"{type(exc).__name__}: {exc}"
    return reason[:_REASON_CHARS]


def failure(exc: BaseException) -> dict[str, Any]:
    """The failure columns of a row whose LLM call raised `exc`."""
    return {"error": failure_reason(exc), "raw": getattr(exc, "raw", None)}


NO_FAILURE: dict[str, Any] = {"error": None, "raw": None}
T = TypeVar("T")


async def attempt(work: Awaitable[T]) -> tuple[T | None, dict[str, Any]]:
    """Await LLM work: (its result, `NO_FAILURE`), or (None, the failure columns) when it failed."""
    try:
        return await work, dict(NO_FAILURE)
    except LLMError as e:
        return None, failure(e)


async def row_or_failure(row: dict[str, Any], work: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """`row` with the fields `work` returns, or with the failure columns when its LLM call failed:
    one failed row never fails the stage."""
    fields, failed = await attempt(work)
    return {**row, **failed, **(fields or {})}
