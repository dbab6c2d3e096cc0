"""LLM usage accounting: calls, cache hits, failures, retries, tokens and estimated cost.

Tokens and cost include calls served from the cache (the spec reports usage of cached calls too);
`cached_cost_usd` is the part of `cost_usd` that the cache saved, so money spent this run is
`cost_usd - cached_cost_usd`.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Awaitable, Iterator, Mapping, TypeVar


_WRITTEN_WHEN_SET = ("batch_calls", "requests", "sampled_requests", "sampled_choices", "cached_prompt_tokens",
                     "cost_by_method", "cached_cost_by_method", "truncated_calls")


@dataclass
class Usage:
    calls: int = 0  # answered calls, live or cached (one per text for embeddings)
    cached_calls: int = 0  # of `calls`, served from the cache
    failed_calls: int = 0  # calls that ended in LLMError
    # Outputs the endpoint cut at max_tokens (finish_reason "length"), live or cached, never sent
    # again for being cut: a plain answer is taken as it stands; a structured one counts too when
    # the cut left it invalid and it was re-asked (`reasks`), as any invalid answer is.
    truncated_calls: int = 0
    retries: int = 0  # transport retries (429, 5xx, timeouts, connection errors)
    reasks: int = 0  # structured-output re-asks after an invalid answer
    batch_calls: int = 0  # requests answered fresh through the Batch API (llm.batch)
    # Chat requests sent to the endpoint (fresh, each once however many samples it asked for); of
    # them, those asking several samples with `n`, and the samples (choices) those brought back.
    requests: int = 0
    sampled_requests: int = 0
    sampled_choices: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of prompt_tokens, those the endpoint reported as a cached prefix
    completion_tokens: int = 0
    cost_usd: float = 0.0
    cached_cost_usd: float = 0.0
    # cost_usd and cached_cost_usd split by the method a call was made for (memory, respond, and the
    # judges' calls about that method's output); calls made for no one method are under "".
    cost_by_method: dict[str, float] = field(default_factory=dict)
    cached_cost_by_method: dict[str, float] = field(default_factory=dict)
    # Structured conversations per mode they ended in, valid or not; of them, those all invalid;
    # and why a role is in a mode other than json_schema (mode -> reason), when it stepped down.
    structured_modes: dict[str, int] = field(default_factory=dict)
    structured_invalid: dict[str, int] = field(default_factory=dict)
    structured_fallbacks: dict[str, str] = field(default_factory=dict)

    def merge(self, other: Usage) -> Usage:
        """Add `other` into this one (in place) and return self."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, dict):
                for k, v in theirs.items():
                    mine[k] = v if isinstance(v, str) else mine.get(k, 0) + v
            else:
                setattr(self, f.name, mine + theirs)
        return self

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cost_usd"] = round(d["cost_usd"], 8)
        d["cached_cost_usd"] = round(d["cached_cost_usd"], 8)
        for k in ("cost_by_method", "cached_cost_by_method"):
            d[k] = {m: round(v, 8) for m, v in d[k].items()}
        # Written only when used (batch mode, n, prompt caching, any call at all): a manifest
        # written before these existed reads and writes back in its own layout.
        for k in _WRITTEN_WHEN_SET:
            if not d[k]:
                del d[k]
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Usage:
        # Unknown keys are ignored so manifests written by older versions still load.
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items() if k in known}
        return cls(**values)


def call_cost(prices: Mapping[str, Mapping[str, float]], model: str, prompt_tokens: int,
              completion_tokens: int, cached_prompt_tokens: int = 0) -> float:
    """USD for one call from per-1M-token prices; 0 for a model without a price. The prompt tokens
    the endpoint served from its prompt cache are billed at `cached_input` (else at `input`)."""
    p = prices.get(model)
    if not p:
        return 0.0
    return tokens_cost(p, prompt_tokens, completion_tokens, cached_prompt_tokens)


def tokens_cost(p: Mapping[str, float], prompt_tokens: float, completion_tokens: float,
                cached_prompt_tokens: float = 0) -> float:
    """USD for these tokens at one model's per-1M-token prices (`input`, `output`, `cached_input`)."""
    cached = min(cached_prompt_tokens, prompt_tokens)
    return ((prompt_tokens - cached) * p.get("input", 0.0) + cached * p.get("cached_input", p.get("input", 0.0))
            + completion_tokens * p.get("output", 0.0)) / 1_000_000


def describe_structured(u: Usage) -> str | None:
    """Which structured-output mode a role's answers came in and why, in a few words; None when
    it made no structured call. E.g. "json_object (the endpoint rejected json_schema: HTTP 400 ...);
    13 of 13 answers invalid"."""
    if not u.structured_modes:
        return None
    parts = []
    for mode, n in sorted(u.structured_modes.items(), key=lambda kv: -kv[1]):
        why = u.structured_fallbacks.get(mode)
        invalid = u.structured_invalid.get(mode, 0)
        text = f"{mode} x{n}" + (f" ({why})" if why else "")
        if invalid:
            text += f", {invalid} of {n} all invalid"
        parts.append(text)
    return "; ".join(parts)


# The method the calls of the current asyncio task are made for: a judge sets it per judged row, a
# method's memory and respond stages for the whole episode; the client adds each call's cost under
# it in `Usage.cost_by_method`. asyncio copies it into every task a gather creates.
BILLED_METHOD: ContextVar[str] = ContextVar("billed_method", default="")


@contextmanager
def billed_to(method: str) -> Iterator[None]:
    """Calls made inside are costed to `method` (see `Usage.cost_by_method`)."""
    token = BILLED_METHOD.set(method)
    try:
        yield
    finally:
        BILLED_METHOD.reset(token)


T = TypeVar("T")


async def costed_to(method: str, work: Awaitable[T]) -> T:
    """`work` with its calls costed to `method` (a task of its own, e.g. one row of a gather)."""
    with billed_to(method):
        return await work


# Who a (stage, role)'s cost is for, in `mempipe plan` and the report's cost_breakdown.
SHARED = "(shared)"  # the label of cost made for no one method (`Usage.cost_by_method`'s "" key)


def stage_kind(name: str, owner: str) -> str:
    """How the per-method cost view files a stage: memory | respond (the method's own stages,
    `memory_<owner>` / `respond_<owner>`), judge (`judge_*`) or other."""
    if owner and name in (f"memory_{owner}", f"respond_{owner}"):
        return name.split("_", 1)[0]
    return "judge" if name.startswith("judge_") else "other"


def method_shares(cost_by_method: Mapping[str, float] | None, owner: str) -> dict[str, float]:
    """A (stage, role)'s cost as fractions per method label (SHARED for ""): by `cost_by_method`
    where it holds any cost, else wholly the stage's `owner` (SHARED when it has none): older
    manifests and free models have no split to go by."""
    split = {m: c for m, c in (cost_by_method or {}).items() if c > 0}
    total = sum(split.values())
    if total <= 0:
        return {owner or SHARED: 1.0}
    return {m or SHARED: c / total for m, c in split.items()}
