"""What every third-party library method's tests share (tests/test_*_library.py): the sockets a run
opens, one episode's failure, the answers' memories, the library's calls in the manifest, and the
settings that stop a run on its budget."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline.artifacts import StageDir

# A price no budget survives: the first call's cost passes max_cost_usd.
OVER_BUDGET = ["llm.max_cost_usd=0.000001", 'llm.prices={"SmolLM2-135M-Instruct": {"input": 100.0, "output": 100.0}}']
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def record_connections(monkeypatch: Any) -> list[Any]:
    """Every address a socket of this process connects to from now on (the list grows as they do)."""
    seen: list[Any] = []
    connect = socket.socket.connect

    def spy(self: socket.socket, address: Any) -> Any:
        seen.append(address)
        return connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", spy)
    return seen


def off_machine(seen: list[Any]) -> list[Any]:
    """The recorded addresses that are not this machine's loopback."""
    return [a for a in seen if isinstance(a, tuple) and a[0] not in LOOPBACK]


def assert_only_episode_failed(tables: dict[str, pa.Table], method: str, episode: str, message: str) -> None:
    """`episode`'s memory failed with `message` (and so its answers); every other episode's answers stand."""
    failures = tables[f"memory_{method}.build_failures"].to_pylist()
    assert [f["episode_id"] for f in failures] == [episode] and message in failures[0]["error"]
    answers = tables[f"respond_{method}.responses"].to_pylist()
    assert all(r["error"] is None for r in answers if r["episode_id"] != episode)
    assert any(r["error"] for r in answers if r["episode_id"] == episode)


def assert_answers_name_stored(answers: list[dict[str, Any]], known: set[str]) -> None:
    """Every answer stands and names the memories it read, each one the library stored."""
    assert answers and all(r["error"] is None and r["memory_ids"] for r in answers)
    assert all(set(r["memory_ids"]) <= known for r in answers)


def library_calls(run_dir: Path, method: str) -> int:
    """The requests the library made while building, from the memory stage's manifest, each billed
    to `method`."""
    usage = StageDir(run_dir, f"memory_{method}").manifest().llm_usage
    assert all(set(u.cost_by_method) == {method} for u in usage.values())
    return sum(u.requests for u in usage.values())
