"""The keys a settings model takes, for the message of an unknown key (a typo in a config or a paper
sheet): "unknown key; valid: a, b, c". A leaf: the config and the paper sheets both use it."""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Sequence, Union, get_args, get_origin

from pydantic import BaseModel


def _unwrapped(annotation: object) -> object:
    """The one model, dict or list an annotation stands for (`X | None` -> X; Annotated -> its type)."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, UnionType):
            arms = [a for a in get_args(annotation) if a is not type(None)]
            if len(arms) != 1:
                return annotation
            annotation = arms[0]
        else:
            return annotation


def valid_keys(model: type[BaseModel], loc: Sequence[str | int]) -> list[str] | None:
    """The keys the section holding `loc` takes (`loc`: a validation error's location, ending in the
    unknown key), sorted; None where the path cannot be followed (a union of models)."""
    node: object = model
    for part in loc[:-1]:
        node = _unwrapped(node)
        if isinstance(node, type) and issubclass(node, BaseModel):
            field = node.model_fields.get(str(part))
            if field is None:
                return None
            node = field.annotation
        elif get_origin(node) is dict and len(get_args(node)) == 2:
            node = get_args(node)[1]
        elif get_origin(node) is list and get_args(node):
            node = get_args(node)[0]
        else:
            return None
    node = _unwrapped(node)
    if isinstance(node, type) and issubclass(node, BaseModel):
        return sorted(f.alias or name for name, f in node.model_fields.items())
    return None


def unknown_key(model: type[BaseModel] | None, loc: Sequence[str | int]) -> str:
    """An unknown key's message: "unknown key", then the keys its section takes where they can be found."""
    keys = valid_keys(model, loc) if model is not None else None
    return f"unknown key; valid: {', '.join(keys)}" if keys else "unknown key"
