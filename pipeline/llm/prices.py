"""What an LLM call costs: USD per 1M tokens by model, a default table the config overrides.

`prices_for(role_cfg)` is the table a role is priced with: `DEFAULT_PRICES`, then the config's
`llm.prices` / `roles.<name>.prices` over it (the config wins, model by model), and a model served
by the embedded server (`provider: local`) at 0 unless the config prices it. `input` is the price
of prompt tokens, `output` of completion tokens (embeddings: `input` only), `cached_input` of the
prompt tokens an endpoint reports as served from its automatic prompt cache
(`usage.prompt_tokens_details.cached_tokens`; a model without it bills them at `input`).

    llm:
      prices:
        gpt-4o-mini: {input: 0.15, cached_input: 0.075, output: 0.6}

A role with `batch: true` goes through OpenAI's Batch API, billed at `BATCH_DISCOUNT` of the
list price; `role_prices` applies it. The default table holds OpenAI's list prices (standard tier,
as known when it was written) for the models the configs in `configs/` name and their close
relatives; prices change, so override them in the config rather than trusting the table for a bill.
"""

from __future__ import annotations

from typing import Any, Mapping

from pipeline.llm.usage import tokens_cost

BATCH_DISCOUNT = 0.5  # OpenAI bills Batch API calls at half the list price

# USD per 1M tokens: {"input": prompt tokens, "output": completion tokens}.
DEFAULT_PRICES: dict[str, dict[str, float]] = {
    "gpt-4": {"input": 30.0, "output": 60.0},
    "gpt-4-0613": {"input": 30.0, "output": 60.0},
    "gpt-4-0125-preview": {"input": 10.0, "output": 30.0},
    "gpt-4-1106-preview": {"input": 10.0, "output": 30.0},
    "gpt-4-turbo": {"input": 10.0, "output": 30.0},
    "gpt-4-turbo-2024-04-09": {"input": 10.0, "output": 30.0},
    # Prompt caching (cached_input) is OpenAI's on gpt-4o and later models, at half the input price
    # (a quarter for the gpt-4.1 family); the older models above have none.
    "gpt-4o": {"input": 2.5, "cached_input": 1.25, "output": 10.0},
    "gpt-4o-2024-08-06": {"input": 2.5, "cached_input": 1.25, "output": 10.0},
    "gpt-4o-2024-11-20": {"input": 2.5, "cached_input": 1.25, "output": 10.0},
    "gpt-4o-mini": {"input": 0.15, "cached_input": 0.075, "output": 0.6},
    "gpt-4o-mini-2024-07-18": {"input": 0.15, "cached_input": 0.075, "output": 0.6},
    "gpt-4.1": {"input": 2.0, "cached_input": 0.5, "output": 8.0},
    "gpt-4.1-mini": {"input": 0.4, "cached_input": 0.1, "output": 1.6},
    "gpt-4.1-nano": {"input": 0.1, "cached_input": 0.025, "output": 0.4},
    "gpt-3.5-turbo": {"input": 0.5, "output": 1.5},
    "gpt-3.5-turbo-0125": {"input": 0.5, "output": 1.5},
    "gpt-3.5-turbo-1106": {"input": 1.0, "output": 2.0},
    "text-embedding-3-small": {"input": 0.02, "output": 0.0},
    "text-embedding-3-large": {"input": 0.13, "output": 0.0},
    "text-embedding-ada-002": {"input": 0.1, "output": 0.0},
    # The embedded model (llama.cpp on this machine) costs nothing per token.
    "SmolLM2-135M-Instruct": {"input": 0.0, "output": 0.0},
    "SmolLM2-360M-Instruct": {"input": 0.0, "output": 0.0},
}


def prices_for(cfg: Any) -> dict[str, dict[str, float]]:
    """The price table of a role (an `LLMConfig`: `cfg.role(name)`): the default table with the
    config's `prices` merged over it, model by model (a model the config prices takes the config's
    `input` / `output`, a key it leaves out keeps the table's). A local role's model is free unless
    the config prices it."""
    table = {model: dict(p) for model, p in DEFAULT_PRICES.items()}
    if getattr(cfg, "provider", None) == "local" and getattr(cfg, "model", None):
        table[cfg.model] = {"input": 0.0, "output": 0.0}
    for model, p in (getattr(cfg, "prices", None) or {}).items():
        merged = {**table.get(model, {}), **{k: float(v) for k, v in p.items()}}
        if "input" in p and "cached_input" not in p:
            merged.pop("cached_input", None)  # the table's discount was for its own input price
        table[model] = merged
    return table


def role_prices(cfg: Any) -> dict[str, float] | None:
    """USD per 1M tokens this role pays for its own model, batch discount applied; None when
    neither the table nor the config prices the model."""
    p = prices_for(cfg).get(cfg.model)
    if p is None:
        return None
    factor = BATCH_DISCOUNT if getattr(cfg, "batch", False) else 1.0
    out = {"input": p.get("input", 0.0) * factor, "output": p.get("output", 0.0) * factor}
    if "cached_input" in p:  # else cached prompt tokens are billed at `input`
        out["cached_input"] = p["cached_input"] * factor
    return out


def cost_usd(prices: Mapping[str, float] | None, prompt_tokens: float, completion_tokens: float,
             cached_prompt_tokens: float = 0) -> float:
    """USD for these tokens at `prices` (from `role_prices`); 0 without a price. `cached_prompt_tokens`
    (of `prompt_tokens`) are billed at `cached_input`."""
    if not prices:
        return 0.0
    return tokens_cost(prices, prompt_tokens, completion_tokens, cached_prompt_tokens)
