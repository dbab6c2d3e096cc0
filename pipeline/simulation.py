"""Plan's dry run loads no model: while `models_simulated()` is on, local embeddings and
compression are simulated (`pipeline.embeddings.SimulatedEmbedder`, `pipeline.compression.simulate_line`).
A process-wide switch that only `pipeline.plan` turns on: the dry run runs inline, in the plan's own
process; a user's run never enters it."""

from __future__ import annotations

import contextlib
from typing import Iterator

_ON = [False]


@contextlib.contextmanager
def models_simulated() -> Iterator[None]:
    before, _ON[0] = _ON[0], True
    try:
        yield
    finally:
        _ON[0] = before


def simulating_models() -> bool:
    """Whether this process is inside `models_simulated()` (plan's dry run)."""
    return _ON[0]
