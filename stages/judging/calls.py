"""A judge's call as data: its prompt, the schema its reply must fit and how a reply becomes the
judgment's values, so the same judge runs once (`once`) or as several independent runs of one
prompt (`runs`: repeated judge runs, sent as one request with `n` where the endpoint takes it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel

from pipeline.failures import row_failure
from pipeline.llm.types import ChatLLM, LLMError, LLMResult, Messages, ask_samples


@dataclass(frozen=True)
class JudgeCall:
    messages: Messages
    schema: type[BaseModel] | None
    # the judgment's values from a reply, the judge model last; raises InvalidAnswer for a reply it refuses
    read: Callable[[LLMResult], tuple]

    async def once(self, llm: ChatLLM, **params: Any) -> tuple:
        return self.read(await llm.chat(self.messages, schema=self.schema, **params))

    async def runs(self, llm: ChatLLM, runs: int, **params: Any) -> list[tuple | Exception]:
        """Each run's judgment, in run order, or why the run has none: its LLMError (a reply `read`
        refuses included), or the exception `read` raised on a reply (a bug: logged, that run fails).
        Run 0 is exactly `once`'s call, so one run costs and caches what it always did."""
        results = await ask_samples(llm, self.messages, runs, schema=self.schema, **params)
        return [r if isinstance(r, LLMError) else self._read(r) for r in results]

    def _read(self, result: LLMResult) -> tuple | Exception:
        try:
            return self.read(result)
        except Exception as e:  # noqa: BLE001 - one run's failure (row_failure raises what stops the run)
            row_failure(e, "a judge reading its reply")
            return e
