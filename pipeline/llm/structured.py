"""Structured outputs: how a schema is asked for in each mode, and parsing + validating the answer."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from pydantic import BaseModel, ValidationError

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
    """A 400 that names the response format: the endpoint does not support this mode."""
    reason = str(getattr(err, "reason", err)).lower()
    return getattr(err, "status", None) == 400 and any(
        w in reason for w in ("response_format", "json_schema", "json_object", "response format"))


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
