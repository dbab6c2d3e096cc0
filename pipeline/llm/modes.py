"""The structured mode of each (endpoint, model) of a run, decided once for all its workers.

In auto mode the first structured request of an (endpoint, model) is its scout
(pipeline.llm.structured): it claims the decision here, sends json_schema, and publishes the mode
the endpoint took; every other worker's request waits until then. `ModeRegistry` is the state (no
I/O, no Ray), hosted beside the run's ledger (pipeline.llm.ledger.RunLedger); `ModeClaims` is what
a client holds of it.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.llm.service_host import InProcess, ServiceRef

# A scout that has not published after this long (its worker died) loses its claim.
MODE_CLAIM_TIMEOUT_S = 600.0
MODE_POLL_S = (0.05, 0.5)  # a request waiting for another worker's scout asks again, doubling to this


class ModeRegistry:
    """The run's decided modes and open claims, by key ("endpoint model"). One owner calls it."""

    def __init__(self) -> None:
        self.decided: dict[str, tuple[str, str]] = {}  # key -> (structured mode, why)
        self.claims: dict[str, float] = {}  # key -> when its scout claimed the decision

    def claim(self, key: str) -> tuple[str, str, str]:
        """("decided", mode, why) once published; ("scout", "", "") when nobody is deciding it (the
        caller now is: it sends json_schema and publishes what the endpoint took); ("wait", "", "")
        while another request decides it."""
        if key in self.decided:
            return ("decided", *self.decided[key])
        now = time.time()
        claimed = self.claims.get(key)
        if claimed is not None and now - claimed < MODE_CLAIM_TIMEOUT_S:
            return ("wait", "", "")
        self.claims[key] = now
        return ("scout", "", "")

    def publish(self, key: str, mode: str, why: str) -> None:
        self.decided[key] = (mode, why)
        self.claims.pop(key, None)

    def release(self, key: str) -> None:
        """The scout gave up (its request failed in transport): the next to ask decides."""
        self.claims.pop(key, None)


class ModeClaims:
    """A client's side of the run's `ModeRegistry`, in this process or the job's host (picklable
    then: the ref)."""

    def __init__(self, ref: ServiceRef | InProcess) -> None:
        self.ref = ref

    async def claim(self, key: str) -> tuple[str, str, str]:
        state, mode, why = await self.ref.claim.remote(key)
        return state, mode, why

    async def decided(self, key: str) -> tuple[str, str] | None:
        """(mode, why) another request's scout decided, waiting while one is out; None when the
        caller is the run's scout now (it must `publish` or `release`)."""
        pause = MODE_POLL_S[0]
        while True:
            state, mode, why = await self.claim(key)
            if state == "decided":
                return mode, why
            if state == "scout":
                return None
            await asyncio.sleep(pause)  # another worker's scout is out: ask again soon
            pause = min(pause * 2, MODE_POLL_S[1])

    async def publish(self, key: str, mode: str, why: str) -> None:
        await self.ref.publish.remote(key, mode, why)

    def release(self, key: str) -> None:
        self.ref.release.remote(key)  # fire and forget: also called while being cancelled
