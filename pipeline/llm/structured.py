"""Structured outputs: the JSON schema sent with a request, and parsing + validating the answer."""

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


def response_format_for(schema: type[BaseModel]) -> dict[str, Any]:
    name = re.sub(r"[^a-zA-Z0-9_-]", "_", schema.__name__)[:64] or "answer"
    return {"type": "json_schema", "json_schema": {
        "name": name, "schema": strict_json_schema(schema.model_json_schema()), "strict": True}}


def extract_json(text: str) -> Any:
    """json.loads that tolerates ```json fences and prose around one JSON object."""
    s = text.strip()
    try:
        return json.loads(s)
    except json.JSONDecodeError as first:
        m = _FENCE.search(s)
        if m:
            return json.loads(m.group(1).strip())
        i, j = s.find("{"), s.rfind("}")
        if 0 <= i < j:
            try:
                return json.loads(s[i:j + 1])
            except json.JSONDecodeError:
                pass
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
