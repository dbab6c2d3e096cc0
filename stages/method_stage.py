"""What the per-method stages (`memory_<method>`, `respond_<method>`) share: one method, its
settings under `method.<name>`, its LLM role, and its module's source in the fingerprint."""

from __future__ import annotations

import sys
from typing import Any

from pipeline.stage import EpisodeStage
from stages.methods import base
from stages.methods.base import Method


def memory_stage_name(method: str) -> str:
    return f"memory_{method}"


def respond_stage_name(method: str) -> str:
    return f"respond_{method}"


class MethodStage(EpisodeStage):
    def __init__(self, method: Method, name: str, inputs: tuple[str, ...], role: str) -> None:
        self.method = method
        self.name = name
        self.inputs = inputs
        self.roles = (role,)
        self.uses_embedder = method.uses_embedder
        self.code = (base, sys.modules[type(method).__module__], *method.code)
        self.prompts = dict(method.prompts)

    def settings_of(self, cfg: Any) -> Any:
        return getattr(cfg.method, self.method.name)

    def needed(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """The rows of the method's `needs`, as "<stage>.<table>"."""
        return {k: v for k, v in inputs.items() if k.split(".")[0] in self.method.needs}
