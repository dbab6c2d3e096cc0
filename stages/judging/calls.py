"""A judge's call as data: its prompt, the schema its reply must fit and how a reply becomes the
judgment's values, so the same judge runs once (`once`) or as several independent runs of one
prompt (`runs`: repeated judge runs, sent as one request with `n` where the endpoint takes it, or
as one request per run: `RunRequests`).

Repeated runs and a judge's own samples (G-Eval's N samples of one prompt, averaged or voted inside
one judgment) are two things: a run repeats the whole judgment, samples included. Run r of a
judgment made of k samples asks sample indexes r*k .. r*k+k-1 (`run_samples`), so run 0 asks exactly
what one run always did and no two runs share a sample index, hence never a cache key."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

from pydantic import BaseModel

from pipeline.failures import row_failure
from pipeline.llm.types import ChatLLM, LLMError, LLMResult, Messages, ask_samples

# samples: every run of one prompt as samples of it (one request with `n` where the endpoint takes
# it); requests: each run its own request (a run's own samples, if any, still together)
RunRequests = Literal["samples", "requests"]


def run_samples(run: int, samples: int = 1) -> tuple[int, ...]:
    """The sample indexes judge run `run` asks of a prompt it samples `samples` times: run 0 the
    first `samples` (what a single run always asked), each later run the next block."""
    return tuple(range(run * samples, (run + 1) * samples))


@dataclass(frozen=True)
class RunSamples:
    """The samples of one prompt to ask, grouped by judge run (`groups`, in run order), and how the
    runs go out (`mode`)."""

    groups: tuple[tuple[int, ...], ...]
    mode: RunRequests = "samples"

    @classmethod
    def of(cls, runs: int, samples: int = 1, mode: RunRequests = "samples") -> "RunSamples":
        """Every run's samples, `samples` per run (`run_samples`)."""
        return cls(tuple(run_samples(r, samples) for r in range(runs)), mode)

    def indexes(self) -> list[int]:
        return [i for group in self.groups for i in group]


async def ask_runs(llm: ChatLLM, messages: Messages, samples: int | Sequence[int] | RunSamples,
                   **kwargs: Any) -> list[LLMResult | LLMError]:
    """The samples of one prompt, in order (every run's, run after run, for a RunSamples); a sample
    that failed is its LLMError. `samples` mode, a plain count or indexes: `ask_samples` (one request
    with `n` where the endpoint takes it); `requests` mode: one `ask_samples` per run, at once (a run
    of one sample is one plain request, under the same cache key as in `samples` mode)."""
    if not isinstance(samples, RunSamples):
        return await ask_samples(llm, messages, samples, **kwargs)
    if samples.mode == "samples":
        return await ask_samples(llm, messages, samples.indexes(), **kwargs)
    parts = await asyncio.gather(*(ask_samples(llm, messages, list(g), **kwargs) for g in samples.groups if g),
                                 return_exceptions=True)
    for part in parts:
        if isinstance(part, BaseException):
            raise part  # a budget stop, an outage or a cancellation ends the call, as in `gather_samples`
    return [r for part in parts for r in part]  # type: ignore[union-attr]


@dataclass(frozen=True)
class JudgeCall:
    messages: Messages
    schema: type[BaseModel] | None
    # the judgment's values from a reply, the judge model last; raises InvalidAnswer for a reply it refuses
    read: Callable[[LLMResult], tuple]

    async def once(self, llm: ChatLLM, **params: Any) -> tuple:
        return self.read(await llm.chat(self.messages, schema=self.schema, **params))

    async def runs(self, llm: ChatLLM, runs: int, mode: RunRequests = "samples",
                   **params: Any) -> list[tuple | Exception]:
        """Each run's judgment, in run order, or why the run has none: its LLMError (a reply `read`
        refuses included), or the exception `read` raised on a reply (a bug: logged, that run fails).
        `mode`: the runs as samples of one request with `n`, or one request each (`RunRequests`).
        Run 0 is exactly `once`'s call, so one run costs and caches what it always did."""
        results = await ask_runs(llm, self.messages, RunSamples.of(runs, 1, mode), schema=self.schema, **params)
        return [r if isinstance(r, LLMError) else self._read(r) for r in results]

    def _read(self, result: LLMResult) -> tuple | Exception:
        try:
            return self.read(result)
        except Exception as e:  # noqa: BLE001 - one run's failure (row_failure raises what stops the run)
            row_failure(e, "a judge reading its reply")
            return e
