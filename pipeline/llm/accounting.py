"""One client's books: what a call costs at the role's prices, the run's budget held and settled
around each fresh call, and the calls and tokens counted into the client's `Usage` and the run's
tally (the live progress line)."""

from __future__ import annotations

from typing import Mapping

from pipeline.llm.ledger import Tally
from pipeline.llm.prices import BATCH_DISCOUNT
from pipeline.llm.types import LLMResult
from pipeline.llm.usage import BILLED_METHOD, Usage, call_cost


class Accounting:
    """Costs and counts for one client. `tally`: the run ledger's StageTally (progress, budget);
    None outside a run."""

    def __init__(self, prices: Mapping[str, Mapping[str, float]], usage: Usage, tally: Tally | None) -> None:
        self.prices = prices
        self.usage = usage
        self.tally = tally

    def cost(self, model: str, prompt: int, completion: int, batch: bool = False, cached_prompt: int = 0) -> float:
        """USD of one request at the role's prices (pipeline.llm.prices), its prompt-cached tokens at
        `cached_input`; `batch`: answered through the Batch API now, billed at its discount. A cached
        replay (batch made or not) is costed at the normal price: the cache value does not say how
        its answer was made."""
        cost = call_cost(self.prices, model, prompt, completion, cached_prompt)
        return cost * BATCH_DISCOUNT if batch else cost

    def add_tokens(self, model: str, prompt: int, completion: int, cached: bool, batch: bool = False,
                   cached_prompt: int = 0) -> None:
        u = self.usage
        u.prompt_tokens += prompt
        u.cached_prompt_tokens += cached_prompt
        u.completion_tokens += completion
        cost = self.cost(model, prompt, completion, batch, cached_prompt)
        u.cost_usd += cost
        method = BILLED_METHOD.get()
        u.cost_by_method[method] = u.cost_by_method.get(method, 0.0) + cost
        if cached:
            u.cached_cost_usd += cost
            u.cached_cost_by_method[method] = u.cached_cost_by_method.get(method, 0.0) + cost
        if self.tally is not None:
            self.tally.add(prompt_tokens=prompt, completion_tokens=completion, cost_usd=0.0 if cached else cost)

    def count_call(self, result: LLMResult | None) -> None:
        """One answered (or failed) chat call, for the usage and the live progress line."""
        if result is None:
            self.usage.failed_calls += 1
        else:
            self.usage.calls += 1
            self.usage.cached_calls += int(result.cached)
            self.usage.truncated_calls += int(result.finish_reason == "length")
        if self.tally is not None:
            self.tally.add(calls=int(result is not None), cached_calls=int(bool(result and result.cached)),
                           failed_calls=int(result is None))

    def count_texts(self, n: int, cached: bool) -> None:
        """`n` embedded texts (a call each), counted at once: thousands of texts per call."""
        self.usage.calls += n
        self.usage.cached_calls += n if cached else 0
        if self.tally is not None:
            self.tally.add(calls=n, cached_calls=n if cached else 0)

    def count_failed_texts(self, n: int) -> None:
        self.usage.failed_calls += n

    async def reserve(self, model: str, est_prompt_tokens: int, max_completion: int, batch: bool = False) -> float:
        """Hold a fresh call's worst-case cost in the run's budget (BudgetExceeded when it does not
        fit); returns the amount held, for `settle`."""
        tally = self.tally
        if tally is None or not tally.budgeted:
            return 0.0
        worst = self.cost(model, est_prompt_tokens, max_completion, batch)
        await tally.ledger.reserve(tally.role, worst)
        return worst

    async def settle(self, held: float, model: str, prompt: int, completion: int, batch: bool = False,
                     cached_prompt: int = 0) -> None:
        tally = self.tally
        if tally is not None and tally.budgeted:
            await tally.ledger.settle(tally.role, held, self.cost(model, prompt, completion, batch, cached_prompt))


def split_tokens(total: int, weights: list[int]) -> list[int]:
    """Split a batch's token count over its texts in proportion to length; sums to total."""
    w = sum(weights) or len(weights) or 1
    shares = [total * x // w for x in weights]
    if shares:
        shares[-1] += total - sum(shares)
    return shares
