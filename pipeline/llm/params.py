"""A chat request's sampling parameters: the role's settings with the call's overrides, less the
ones the endpoint refused (seed, n). A refusal is remembered per (endpoint, model) for every client
of the process, and in the call cache for later runs."""

from __future__ import annotations

import logging
from typing import Any

from pipeline.config import LLMConfig
from pipeline.llm.cache import CallCache, params_cache_key
from pipeline.llm.types import short
from pipeline.llm.usage import Usage

log = logging.getLogger(__name__)

_FLOAT_PARAMS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
# (endpoint, model) -> {parameter: why} the endpoint refused, for every client of the process.
_DROPPED_PARAMS: dict[tuple[str, str], dict[str, str]] = {}


def sampling_params(cfg: LLMConfig, sample: int, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(model, sampling parameters) of one call: the role's, `params` over them, the seed moved by
    the sample index, and None values left out."""
    p: dict[str, Any] = {"temperature": cfg.temperature, "top_p": cfg.top_p,
                         "max_tokens": cfg.max_tokens, "seed": cfg.seed}
    p.update(params)
    model = p.pop("model", None) or cfg.model
    if sample and p.get("seed") is not None:
        p["seed"] = int(p["seed"]) + sample
    for k in _FLOAT_PARAMS:  # 0 and 0.0 must give the same cache key
        if isinstance(p.get(k), int):
            p[k] = float(p[k])
    return model, {k: v for k, v in p.items() if v is not None}


class RefusedParams:
    """The parameters one endpoint refused, per model; `usage` says why a role goes without one."""

    def __init__(self, endpoint: str, cache: CallCache | None, usage: Usage) -> None:
        self.endpoint = endpoint
        self.cache = cache
        self.usage = usage
        self._read: set[str] = set()  # models whose refused parameters were read from the cache

    def known(self, model: str) -> dict[str, str]:
        """{parameter: why} refused for the model, as this process knows it (no cache read)."""
        return _DROPPED_PARAMS.get((self.endpoint, model), {})

    async def of(self, model: str) -> dict[str, str]:
        """{parameter: why} refused for the model, from this process or an earlier run (the call
        cache); read from the cache once per client and model."""
        key = (self.endpoint, model)
        if key not in _DROPPED_PARAMS and self.cache is not None and model not in self._read:
            self._read.add(model)
            found = await self.cache.get(params_cache_key(self.endpoint, model))
            if found and found.get("rejected_params"):
                _DROPPED_PARAMS.setdefault(key, {}).update(found["rejected_params"])
        return _DROPPED_PARAMS.get(key, {})

    async def drop(self, model: str, param: str, reason: str) -> None:
        """Leave `param` out of the model's requests from now on."""
        dropped = _DROPPED_PARAMS.setdefault((self.endpoint, model), {})
        if param in dropped:
            return
        why = f"the endpoint rejected {param}: {short(reason, 160)}"
        dropped[param] = why
        # `n` only costs more when gone (one request per sample), and the embedded server ignores it.
        log.log(logging.INFO if param == "n" else logging.WARNING,
                "%s rejected the parameter %r (%s); it is left out of this model's requests from now on",
                self.endpoint, param, short(reason, 160))
        self.usage.structured_fallbacks[f"without {param}"] = why
        if self.cache is not None:
            await self.cache.set(params_cache_key(self.endpoint, model), {"rejected_params": dict(dropped),
                                                                          "model": model})
