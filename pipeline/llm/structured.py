"""Structured outputs: how a schema is asked for in each mode, and parsing + validating the answer."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from pydantic import BaseModel, ValidationError

from pipeline.llm.types import LLMError

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


# Parameters an endpoint may refuse that a role can do without: response_format steps the role's
# structured mode down, seed is dropped from the role's requests, n sends a prompt's samples one by one.
STEP_DOWN_PARAMS = ("response_format", "seed", "n")
_FORMAT_WORDS = ("response_format", "json_schema", "json_object", "response format")
# pydantic / FastAPI validation errors, as JSON (`"loc": ["body", "seed"]`) or as Python's repr in
# llama-cpp-python's 500 text (`'loc': ('body', 'response_format', 'type')`).
_LOC = re.compile(r"""["']loc["']\s*:\s*[\[(]\s*["']body["']\s*,\s*["']([A-Za-z_][A-Za-z0-9_]*)["']""")
_VALIDATION_WORDS = ("validation error", "input should be", "extra inputs are not permitted", "unsupported parameter",
                     "not supported", "unrecognized request argument")


class RequestRejected(LLMError):
    """The endpoint refused a parameter of the request (whatever the HTTP status: 400, 422, or
    llama-cpp-python's 500 validation error): not an outage and never retried as sent. `param`
    names it (response_format, seed, n, ...)."""

    def __init__(self, reason: str, raw: str | None = None, status: int | None = None, param: str = "") -> None:
        super().__init__(reason, raw, status)
        self.param = param

    def __reduce__(self) -> tuple:
        return (type(self), (self.reason, self.raw, self.status, self.param))


def _body_params(body: Any) -> list[str]:
    """Parameters a JSON error body names: OpenAI's {"error": {"param": ...}}, FastAPI's
    {"detail": [{"loc": ["body", param, ...]}]} (also nested under "error")."""
    out: list[str] = []
    if not isinstance(body, dict):
        return out
    err = body.get("error")
    if isinstance(err, dict):
        if isinstance(err.get("param"), str):
            out.append(err["param"].split(".")[0].split("[")[0])
        out += _body_params(err)
    detail = body.get("detail")
    if isinstance(detail, list):
        for d in detail:
            loc = d.get("loc") if isinstance(d, dict) else None
            if isinstance(loc, list) and len(loc) >= 2 and loc[0] == "body" and isinstance(loc[1], str):
                out.append(loc[1])
    return out


def rejected_param(status: int | None, body: Any, text: str) -> str | None:
    """The request parameter an error response says the endpoint refuses, or None when the
    response is no such rejection (an outage, a rate limit, some other bad request).

    A 400 or 422 naming a parameter (or, for 400, mentioning the response format at all, as older
    OpenAI models word it) is a rejection; a 500 is one only with a validation body naming it
    (llama-cpp-python's own server answers an unsupported `response_format` so). `body`: the parsed
    JSON error body, if any; `text`: the error's text.
    """
    if status not in (400, 422, 500):
        return None
    named = _body_params(body) + _LOC.findall(text or "")
    lowered = (text or "").lower()
    if status == 500:
        # Only a validation error names what it refuses; a bare 500 that mentions a parameter in
        # passing (a traceback, a grammar failure) is an outage like any other.
        if not _LOC.search(text or "") and not (isinstance(body, dict) and isinstance(body.get("detail"), list)) \
                and not any(w in lowered for w in _VALIDATION_WORDS):
            return None
    for p in named:
        if p in STEP_DOWN_PARAMS:
            return p
    if status != 500 or any(w in lowered for w in _VALIDATION_WORDS):
        for p in STEP_DOWN_PARAMS:  # the message names it in words ("'seed' is not supported")
            if p == "response_format" and any(w in lowered for w in _FORMAT_WORDS):
                return p
            if p != "response_format" and re.search(rf"['\"`]{p}['\"`]", lowered):
                return p
    if status != 500 and named:
        return named[0]  # some other parameter: still a rejection, still not an outage
    return None


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
