"""Which stages a run picks: the selectors `mempipe run` and `mempipe plan` share (--only, --from,
--force, --until, --retry-failed), as one value that `Runner.select`, `Runner.run` and `make_plan`
take. Checked when made: the exclusive ones cannot be combined."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from pipeline.errors import PipelineError


@dataclass(frozen=True, init=False)
class Selection:
    only: tuple[str, ...] = ()  # just these stages (their upstream must be done)
    from_: str | None = None  # this stage and everything downstream, rebuilt
    force: tuple[str, ...] = ()  # rebuild these too
    until: str | None = None  # this stage and whatever it needs that is not done
    retry_failed: str | None = None  # as from_, re-asking only requests whose answers were all invalid

    def __init__(self, only: Iterable[str] | None = None, from_: str | None = None,
                 force: Iterable[str] | None = None, until: str | None = None,
                 retry_failed: str | None = None) -> None:
        # Lists (argparse's, the tests') become tuples: the value stays frozen and hashable.
        object.__setattr__(self, "only", tuple(only or ()))
        object.__setattr__(self, "from_", from_ or None)
        object.__setattr__(self, "force", tuple(force or ()))
        object.__setattr__(self, "until", until or None)
        object.__setattr__(self, "retry_failed", retry_failed or None)
        if sum(bool(x) for x in (self.only, self.from_, self.until, self.retry_failed)) > 1:
            raise PipelineError("use one of --only, --from, --until, --retry-failed")

    @classmethod
    def of(cls, selection: Selection | None = None, **selectors: Any) -> Selection:
        """`selection`, or one made of the selectors given by keyword (not both)."""
        if selection is None:
            return cls(**selectors)
        if selectors:
            raise TypeError(f"pass a Selection or selectors, not both ({sorted(selectors)})")
        return selection

    @property
    def rebuilt(self) -> str | None:
        """The stage --from or --retry-failed rebuilds with everything downstream (None: neither)."""
        return self.from_ or self.retry_failed

    def named(self) -> list[str]:
        """Every stage the selectors name, to check against the run's stages."""
        singles = (self.from_, self.until, self.retry_failed)
        return [*self.only, *self.force, *(n for n in singles if n)]
