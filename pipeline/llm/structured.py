"""Structured outputs: how a schema is asked for in each mode, parsing and validating the answer,
and a client's chat calls (`StructuredCalls`), structured or not, over its `Sender`.

Parsing and validation sit above the call cache: every request is cached with its raw answer,
including the invalid ones that led to a re-ask, so a rerun replays the same conversation and never
pays twice. An invalid answer is re-asked with the error, then becomes `InvalidAnswer(reason,
raw=...)`. With `retry_samples=n` (`mempipe run --retry-failed`), a call whose re-asks all failed
is tried again with up to n new sample indexes.

Modes (`structured_mode`): json_schema (strict response_format), json_object (JSON mode, schema in
the prompt), prompt (schema in the prompt, first JSON object of the text), and auto: json_schema,
stepping down when the endpoint rejects the response_format. A rejection is recognised by what the
server says, whatever the status (a 400 or 422 naming the parameter, or llama-cpp-python's 500
validation error): it is never retried as sent and never counts as an outage. In auto mode the
first structured request of an (endpoint, model) is the scout: the others, in this process and in
every worker of the run (through the run's `ModeRegistry`, pipeline.llm.modes), wait for its answer
and then use the mode it decided, so an endpoint sees at most one rejected request per mode. The
mode decided is remembered in the call cache for (endpoint, model), so later runs start there.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import logging
import re
import weakref
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from pydantic import BaseModel, ValidationError

from pipeline.config import LLMConfig
from pipeline.llm.cache import mode_cache_key
from pipeline.llm.modes import ModeClaims
from pipeline.llm.params import sampling_params
from pipeline.llm.sender import Sender
from pipeline.llm.transport import RequestRejected, rejected_param
from pipeline.llm.types import InvalidAnswer, LLMError, LLMResult, Messages, short

log = logging.getLogger(__name__)

_FENCE = re.compile(r"```(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "contains")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def strict_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """pydantic's JSON schema adapted to OpenAI strict mode.

    Strict mode rejects objects without `additionalProperties: false` or with optional properties,
    `default`, and `$ref` with sibling keys. Every property becomes required (pydantic still applies
    defaults when validating). vLLM and the llama.cpp server accept the result too.
    """
    defs = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and len(node) > 1 and ref.startswith("#/$defs/"):
            node = {**copy.deepcopy(defs.get(ref.rsplit("/", 1)[-1], {})),
                    **{k: v for k, v in node.items() if k != "$ref"}}
        out: dict[str, Any] = {}
        for k, v in node.items():
            if k == "default":
                continue
            if k in _SCHEMA_MAPS and isinstance(v, dict):
                out[k] = {name: walk(s) for name, s in v.items()}
            elif k in _SCHEMA_ONE and isinstance(v, dict):
                out[k] = walk(v)
            elif k in _SCHEMA_LISTS and isinstance(v, list):
                out[k] = [walk(s) for s in v]
            else:
                out[k] = copy.deepcopy(v)
        if out.get("type") == "object" and isinstance(out.get("properties"), dict):
            out["additionalProperties"] = False
            out["required"] = list(out["properties"])
        return out

    return walk(schema)


# auto mode steps down this ladder when an endpoint rejects the response_format it was sent.
MODES_AFTER = {"json_schema": "json_object", "json_object": "prompt"}
SCHEMA_IN_PROMPT = "Reply with one JSON object that follows this JSON schema:\n```json\n{schema}\n```"


def response_format_for(schema: type[BaseModel]) -> dict[str, Any]:
    name = re.sub(r"[^a-zA-Z0-9_-]", "_", schema.__name__)[:64] or "answer"
    return {"type": "json_schema", "json_schema": {
        "name": name, "schema": strict_json_schema(schema.model_json_schema()), "strict": True}}


def request_format(schema: type[BaseModel], mode: str) -> dict[str, Any] | None:
    """The `response_format` a request carries in `mode` (none in prompt mode)."""
    if mode == "json_schema":
        return response_format_for(schema)
    if mode == "json_object":
        return {"type": "json_object"}
    return None


def with_schema_in_prompt(messages: list[dict[str, Any]], schema: type[BaseModel]) -> list[dict[str, Any]]:
    """The messages with the JSON schema spelled out at the end of the last one (json_object and
    prompt modes; JSON mode on OpenAI also requires the word JSON in the prompt)."""
    text = json.dumps(strict_json_schema(schema.model_json_schema()), indent=1, ensure_ascii=False)
    last = messages[-1]
    return [*messages[:-1], {**last, "content": f"{last.get('content') or ''}\n\n{SCHEMA_IN_PROMPT.format(schema=text)}"}]


def rejects_response_format(err: Any) -> bool:
    """The endpoint refused the request's response format (this structured mode)."""
    return getattr(err, "param", None) == "response_format" or (
        not isinstance(err, RequestRejected)
        and rejected_param(getattr(err, "status", None), None, str(getattr(err, "reason", err))) == "response_format")


def extract_json(text: str) -> Any:
    """The answer's JSON: the whole text, else a ```json fence, else the first JSON object in it."""
    s = text.strip()
    try:
        return json.loads(s)
    except json.JSONDecodeError as first:
        m = _FENCE.search(s)
        if m:
            try:
                return json.loads(m.group(1).strip())
            except json.JSONDecodeError:
                pass
        decoder = json.JSONDecoder()
        for i, ch in enumerate(s):
            if ch == "{":
                try:
                    return decoder.raw_decode(s, i)[0]
                except json.JSONDecodeError:
                    continue
        raise first


def parse_structured(text: str, schema: type[BaseModel]) -> BaseModel:
    """Parse and validate; raises ValueError (JSONDecodeError / ValidationError) on a bad answer."""
    return schema.model_validate(extract_json(text))


def describe_error(err: Exception) -> str:
    """A short message the model can act on (pydantic's default text carries URLs and inputs)."""
    if isinstance(err, ValidationError):
        errs = err.errors()
        parts = [f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in errs[:8]]
        return "; ".join(parts) + (f" (and {len(errs) - 8} more)" if len(errs) > 8 else "")
    if isinstance(err, json.JSONDecodeError):
        return f"not valid JSON ({err.msg} at line {err.lineno} column {err.colno})"
    return str(err) or type(err).__name__


# ---------------------------------------------------------------- a client's structured calls

REASK = ("Your previous answer was invalid: {error}\n"
         "Answer again with only a JSON object that matches the required schema.")

@dataclass(frozen=True)
class StructuredAsk:
    """One structured call as asked: the same in whichever mode it goes."""

    model: str
    messages: Messages
    sampling: dict[str, Any]
    sample: int
    schema: type[BaseModel]
    validate: Callable[[Any], None] | None


@dataclass
class _ModeDecision:
    """The structured mode of one (endpoint, model) on one loop: `lock` is held by the scout (the
    request that decides it) and by whoever is asking the run's registry; `mode` once decided."""

    lock: asyncio.Lock
    mode: str | None = None
    why: str = ""


# Per loop (asyncio locks belong to one): (endpoint, model) -> its mode decision, shared by clients.
_MODE_DECISIONS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str], _ModeDecision]] = \
    weakref.WeakKeyDictionary()


class _Scout:
    """The request deciding an (endpoint, model)'s structured mode: holds the decision's lock (and
    the run's claim, `run`) until it publishes the mode or gives up (a transport failure: another
    request becomes the scout)."""

    def __init__(self, calls: StructuredCalls, model: str, decision: _ModeDecision, run: ModeClaims | None) -> None:
        self.calls, self.model, self.decision, self.run = calls, model, decision, run
        self.done = False

    async def publish(self, mode: str, why: str) -> None:
        if self.done:
            return
        self.done = True
        try:
            self.decision.mode, self.decision.why = mode, why
            await self.calls.remember_mode(self.model, mode, why)
            if self.run is not None:
                await self.run.publish(self.calls.mode_key(self.model), mode, why)
        finally:
            self.decision.lock.release()

    def release(self) -> None:
        if self.done:
            return
        self.done = True
        if self.run is not None:
            self.run.release(self.calls.mode_key(self.model))
        self.decision.lock.release()


class StructuredCalls:
    """One client's chat calls over its exact requests (`sender`), and the structured mode its
    (endpoint, model)s take them in; `modes`: the run's decisions across workers (None outside a
    run)."""

    def __init__(self, cfg: LLMConfig, sender: Sender, modes: ModeClaims | None, retry_samples: int = 0) -> None:
        self.cfg = cfg
        self.sender = sender
        self.endpoint = sender.endpoint
        self.cache = sender.cache
        self.usage = sender.usage
        self.modes = modes
        self.retry_samples = retry_samples
        self._modes: dict[str, str] = {}  # model -> structured mode found in auto mode

    async def chat(self, messages: Messages, *, schema: type[BaseModel] | None = None,
                   validate: Callable[[Any], None] | None = None, sample: int = 0, **params: Any) -> LLMResult:
        """`ChatLLM.chat`: without a schema one exact request, else the structured call; counted in
        the client's accounts either way."""
        try:
            if schema is None:
                model, sampling = sampling_params(self.cfg, sample, params)
                reply = await self.sender.request(model, messages, sampling, None, sample)
                result = LLMResult(text=reply.text, prompt_tokens=reply.prompt_tokens,
                                   completion_tokens=reply.completion_tokens, model=reply.model, cached=reply.cached,
                                   finish_reason=reply.finish_reason, latency_s=reply.latency_s)
            else:
                result = await self.call(messages, schema, validate, sample, params)
        except LLMError:
            self.sender.accounts.count_call(None)
            raise
        self.sender.accounts.count_call(result)
        return result

    async def call(self, messages: Messages, schema: type[BaseModel], validate: Callable[[Any], None] | None,
                   sample: int, params: dict[str, Any]) -> LLMResult:
        """The structured call; in retry mode, new sample indexes after an all-invalid conversation."""
        invalid: InvalidAnswer | None = None
        for s in range(sample, sample + 1 + self.retry_samples):
            model, sampling = sampling_params(self.cfg, s, params)
            try:
                return await self._in_mode(StructuredAsk(model, messages, sampling, s, schema, validate))
            except InvalidAnswer as e:
                invalid = e
        assert invalid is not None
        raise invalid

    async def _in_mode(self, ask: StructuredAsk) -> LLMResult:
        """The conversation in the model's mode, stepping down (auto mode) when the endpoint
        rejects the response format."""
        mode, scout = await self._mode(ask.model)
        try:
            while True:
                answered = None
                if scout is not None and mode != "prompt":
                    # The scout's first answered request settles the mode for everyone waiting.
                    answered = functools.partial(scout.publish, mode, self.usage.structured_fallbacks.get(mode, ""))
                try:
                    result = await self._ask_valid(ask, mode, answered)
                except InvalidAnswer:
                    # Counted too: a role whose every answer failed still says which mode it was in.
                    _bump(self.usage.structured_modes, mode)
                    _bump(self.usage.structured_invalid, mode)
                    raise
                except LLMError as e:
                    if self.cfg.structured_mode != "auto" or not rejects_response_format(e) or mode not in MODES_AFTER:
                        raise
                    rejected, mode = mode, MODES_AFTER[mode]
                    log.info("%s rejected the response format (%s); structured mode is now %s", self.endpoint,
                             e.reason, mode)
                    why = f"the endpoint rejected {rejected}: {short(e.reason, 160)}"
                    self.usage.structured_fallbacks[mode] = why
                    self._modes[ask.model] = mode
                    if scout is not None and mode == "prompt":
                        await scout.publish(mode, why)  # prompt mode cannot be refused
                    elif scout is None:
                        # Sent before the decision reached this client (an older remembered mode).
                        await self.remember_mode(ask.model, mode, why)
                    continue
                _bump(self.usage.structured_modes, mode)
                return result
        finally:
            if scout is not None:
                scout.release()  # no-op once published; else another request decides

    async def _ask_valid(self, ask: StructuredAsk, mode: str,
                         answered: Callable[[], Awaitable[None]] | None = None) -> LLMResult:
        """One structured conversation: ask, validate, re-ask with the error; each request cached.
        `answered` is awaited once the first request got an answer (the endpoint took the mode)."""
        conversation = list(ask.messages) if mode == "json_schema" else with_schema_in_prompt(ask.messages, ask.schema)
        response_format = request_format(ask.schema, mode)
        attempts = 1 + self.cfg.structured_retries
        prompt_tokens = completion_tokens = 0
        latency: float | None = None
        cached = True
        last_text, last_error = "", ""
        last_cut = False
        for i in range(attempts):
            if i:
                self.usage.reasks += 1
            reply = await self.sender.request(ask.model, conversation, ask.sampling, response_format, ask.sample)
            if answered is not None:
                await answered()
                answered = None
            prompt_tokens += reply.prompt_tokens
            completion_tokens += reply.completion_tokens
            if reply.latency_s is not None:
                latency = (latency or 0.0) + reply.latency_s
            cached = cached and reply.cached
            try:
                parsed = parse_structured(reply.text, ask.schema)
                if ask.validate is not None:
                    ask.validate(parsed)
            except ValueError as e:
                # A cut answer left invalid is re-asked as any invalid one; the answer taken is
                # counted by count_call, so this counts the others.
                last_cut = reply.finish_reason == "length"
                self.usage.truncated_calls += int(last_cut)
                last_text, last_error = reply.text, describe_error(e)
                conversation = conversation + [{"role": "assistant", "content": reply.text},
                                               {"role": "user", "content": REASK.format(error=last_error)}]
                continue
            return LLMResult(text=reply.text, parsed=parsed, prompt_tokens=prompt_tokens,
                             completion_tokens=completion_tokens, model=reply.model, cached=cached,
                             finish_reason=reply.finish_reason, latency_s=latency)
        cut_note = " (the last answer was cut at max_tokens)" if last_cut else ""
        raise InvalidAnswer(f"invalid structured output after {attempts} attempts: {last_error}{cut_note}",
                            raw=last_text)

    # ------------------------------------------------------------ the mode of an (endpoint, model)

    def known_mode(self, model: str) -> str | None:
        """The structured mode requests of `model` go in, when already decided (no waiting)."""
        if self.cfg.structured_mode != "auto":
            return self.cfg.structured_mode
        if model in self._modes:
            return self._modes[model]
        decision = _MODE_DECISIONS.get(asyncio.get_running_loop(), {}).get((self.endpoint, model))
        return self._learn_mode(model, decision.mode, decision.why) if decision and decision.mode else None

    def mode_key(self, model: str) -> str:
        """The run's name for this (endpoint, model)'s structured-mode decision (pipeline.llm.modes)."""
        return f"{self.endpoint} {model}"

    def _learn_mode(self, model: str, mode: str, why: str) -> str:
        self._modes[model] = mode
        if mode != "json_schema":  # decided by another request or an earlier run: say why, as it did
            self.usage.structured_fallbacks.setdefault(mode, why or "found earlier")
        return mode

    async def _mode(self, model: str) -> tuple[str, _Scout | None]:
        """The mode for this request, and the scout token when this request is the one deciding it
        (auto mode, nothing decided yet): it sends json_schema and publishes what the endpoint took.
        Every other request waits here until the mode is decided, in this process on the
        decision's lock, across workers through the run's registry."""
        if self.cfg.structured_mode != "auto":
            return self.cfg.structured_mode, None
        if model in self._modes:
            return self._modes[model], None
        decisions = _MODE_DECISIONS.setdefault(asyncio.get_running_loop(), {})
        decision = decisions.setdefault((self.endpoint, model), _ModeDecision(asyncio.Lock()))
        if decision.mode is not None:
            return self._learn_mode(model, decision.mode, decision.why), None
        await decision.lock.acquire()
        try:
            if decision.mode is None:
                found = await self.cache.get(mode_cache_key(self.endpoint, model)) if self.cache is not None else None
                if found and found.get("structured_mode"):
                    decision.mode, decision.why = found["structured_mode"], found.get("why") or ""
            if decision.mode is None and self.cfg.batch:
                # A Batch API request answers in minutes to hours: no one waits for a scout there;
                # each queued request learns from its own rejection.
                decision.mode = "json_schema"
            claimed: ModeClaims | None = None
            if decision.mode is None and self.modes is not None:
                found_run = await self.modes.decided(self.mode_key(model))  # None: this request is the run's scout
                if found_run is not None:
                    decision.mode, decision.why = found_run
                else:
                    claimed = self.modes
            if decision.mode is None:
                return "json_schema", _Scout(self, model, decision, claimed)  # the lock stays held
        except BaseException:
            decision.lock.release()
            raise
        decision.lock.release()
        return self._learn_mode(model, decision.mode, decision.why), None

    async def remember_mode(self, model: str, mode: str, why: str) -> None:
        self._modes[model] = mode
        if self.cache is not None:
            await self.cache.set(mode_cache_key(self.endpoint, model), {"structured_mode": mode, "model": model,
                                                                         "why": why})


def _bump(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1
