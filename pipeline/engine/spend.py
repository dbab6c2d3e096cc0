"""The run directory's spend record (`_spend.json`): USD per role that the fresh LLM calls of every
`mempipe run` on it cost. The runner reads it when a run starts, so the ledger's budget counts what
earlier commands paid (a rerun with a higher budget continues), and writes it when the run ends."""

from __future__ import annotations

import json
from typing import Any, Mapping

from pipeline.artifacts import atomic_write_json, read_text
from pipeline.errors import PipelineError
from pipeline.storage import Location, join

SPEND_FILE = "_spend.json"


def load_spend(run_dir: Location) -> dict[str, float]:
    """USD per role spent by earlier invocations on this run directory ({} when none)."""
    path = join(run_dir, SPEND_FILE)
    try:
        data = json.loads(read_text(path))
        return {str(k): float(v) for k, v in data.get("roles", {}).items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, AttributeError) as e:
        raise PipelineError(f"{path}: unreadable spend record ({e}); move it aside to start the count at zero") from e


def save_spend(run_dir: Location, snapshot: Mapping[str, Any]) -> None:
    """Write the spend of a ledger's `snapshot()`: earlier invocations' plus this one's, per role."""
    roles = dict(snapshot.get("spent_before", {}))
    for role, usd in snapshot.get("spent", {}).items():
        roles[role] = roles.get(role, 0.0) + usd
    atomic_write_json(join(run_dir, SPEND_FILE),
                      {"total_usd": round(sum(roles.values()), 8), "roles": {k: round(v, 8) for k, v in roles.items()}})
