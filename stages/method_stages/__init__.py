"""The per-method stages: `memory_<method>` (`memory.py`) builds a method's memory session by
session, `respond_<method>` (`respond.py`) answers every probe from it. What they share: one
method, its settings under `method.<name>`, its LLM role, and its module (with everything that
module imports) in the fingerprint."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.engine.stage import EpisodeStage, StageContext
from stages.methods.base import Method, MethodContext, S

if TYPE_CHECKING:
    from pipeline.models_needed import ModelNeed


def memory_stage_name(method: str) -> str:
    return f"memory_{method}"


def respond_stage_name(method: str) -> str:
    return f"respond_{method}"


class MethodStage(EpisodeStage[S]):
    """A stage made for one method; its settings are the method's (`method.<name>`)."""

    def __init__(self, method: Method[S], name: str, inputs: tuple[str, ...], role: str) -> None:
        self.method = method
        self.name = name
        self.inputs = inputs
        self.roles = (role,)
        self.uses_embedder = method.uses_embedder
        self.billed_method = method.name
        self.prompts = dict(method.prompts)
        self.dry_run_estimates = method.library is None

    def code_roots(self) -> tuple[str, ...]:
        return (type(self).__module__, type(self.method).__module__)

    def settings_of(self, cfg: Any) -> S:
        return getattr(cfg.method, self.method.name)

    def method_context(self, ctx: StageContext[S]) -> MethodContext[S]:
        """What the method's `build` / `answer` get: its settings, the client of this stage's role and,
        when it embeds, an embedder that loads its model at the first call."""
        return MethodContext(settings=ctx.settings, llm=ctx.llm,
                             embed=ctx.lazy_embed() if self.method.uses_embedder else None)

    def check_inputs(self, cfg: Any) -> None:
        self.method.check_installed()  # a library method's extra, before Ray and the model servers start

    def models(self, cfg: Any) -> list["ModelNeed"]:
        """The embedder (when the method embeds) and the models the method loads itself."""
        return [*super().models(cfg), *self.method.models(self.settings_of(cfg))]

    def needed(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """The rows of the method's `needs`, as "<stage>.<table>"."""
        return {k: v for k, v in inputs.items() if k.split(".")[0] in self.method.needs}
