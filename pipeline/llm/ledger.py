"""The run's ledger: what every LLM call of a run cost, live; the budget it must keep; and whether
each endpoint is answering (the shared circuit breaker of pipeline.llm.breaker).

One ledger per `mempipe run`: in the driver's process for inline runs, a named Ray actor shared by
every worker otherwise (like the rate limiter). Clients report each answered call (fresh or cached)
so the driver can draw progress while shards run, and, when a budget applies, reserve a fresh
call's worst-case cost (prompt estimate + max_tokens) before sending it: a reservation that would
take the spend past the budget raises `BudgetExceeded`, so the run stops before the call, never
after. Spend is of fresh calls only (cached answers are free); `spent_before` is what earlier
invocations on the run directory paid (the runner keeps it: pipeline.spend), so a rerun with a
higher budget continues from what was spent.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from pipeline.errors import RunStopped
from pipeline.llm.breaker import Admission, EndpointHealth

# A structured-mode scout that has not published after this long (its worker died) loses its claim.
MODE_CLAIM_TIMEOUT_S = 600.0
MODE_POLL_S = (0.05, 0.5)  # a request waiting for another worker's scout asks again, doubling to this
_FLUSH_EVERY_S = 0.5  # a worker's counts reach the ledger at most this late


class BudgetExceeded(RunStopped):
    """The next call could take the run past `max_cost_usd`. Not an LLMError: no row catches it,
    the stage stops, finished shards are kept, and the CLI exits with EXIT_CODE."""

    EXIT_CODE = 3

    def __init__(self, key: str, cap: float, spent: float, this_run: float) -> None:
        self.key, self.cap, self.spent, self.this_run = key, cap, spent, this_run
        super().__init__(
            f"budget reached: {key} = ${cap:.4f}; ${spent:.4f} spent on this run directory (${this_run:.4f} by "
            f"this command), and the next call could pass it. Finished work is kept: raise it (--set {key}=...) "
            "and run the same command again to continue; no finished call is paid twice")

    def with_spend(self, spent: float, this_run: float) -> BudgetExceeded:
        """The same stop with the spend once the calls in flight landed (what the user paid)."""
        return BudgetExceeded(self.key, self.cap, spent, this_run)

    def __reduce__(self) -> tuple:
        return (type(self), (self.key, self.cap, self.spent, self.this_run))  # intact across Ray's pickling


@dataclass
class Budget:
    """Caps in USD: `total` for the whole run (llm.max_cost_usd), `roles` per role
    (roles.<name>.max_cost_usd)."""

    total: float | None = None
    roles: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, cfg: Any) -> Budget:
        roles = {name: over.max_cost_usd for name, over in cfg.roles.items() if over.max_cost_usd is not None}
        return cls(total=cfg.llm.max_cost_usd, roles=roles)

    def applies_to(self, role: str) -> bool:
        return self.total is not None or role in self.roles


def _zero() -> dict[str, float]:
    return {"calls": 0, "cached_calls": 0, "failed_calls": 0, "prompt_tokens": 0, "completion_tokens": 0,
            "cost_usd": 0.0}


class LedgerBook:
    """The ledger's state and rules (no I/O, no Ray): counts per (stage, role), spend per role,
    outstanding reservations. Owned by one thread or actor."""

    def __init__(self, budget: Budget, spent_before: Mapping[str, float] | None = None) -> None:
        self.budget = budget
        self.spent_before = dict(spent_before or {})  # role -> USD of earlier invocations
        self.spent: dict[str, float] = {}  # role -> USD of this invocation's fresh calls
        self.reserved: dict[str, float] = {}  # role -> USD of calls sent and not yet answered
        self.counts: dict[str, dict[str, dict[str, float]]] = {}  # stage -> role -> counters
        self.health: dict[str, EndpointHealth] = {}  # endpoint -> its breaker
        self.modes: dict[str, tuple[str, str]] = {}  # "endpoint model" -> (structured mode, why) decided
        self.mode_claims: dict[str, float] = {}  # "endpoint model" -> when its scout claimed the decision

    def _role_spend(self, role: str) -> float:
        return self.spent_before.get(role, 0.0) + self.spent.get(role, 0.0)

    def total_spend(self) -> float:
        return sum(self.spent_before.values()) + sum(self.spent.values())

    def reserve(self, role: str, worst_usd: float) -> tuple | None:
        """Hold `worst_usd` for one call of `role`; None when it fits every cap, else the
        arguments of the `BudgetExceeded` that says which cap."""
        if worst_usd <= 0:
            return None
        held = sum(self.reserved.values())
        total_cap = self.budget.total
        if total_cap is not None and self.total_spend() + held + worst_usd > total_cap:
            return ("llm.max_cost_usd", total_cap, self.total_spend(), sum(self.spent.values()))
        role_cap = self.budget.roles.get(role)
        if role_cap is not None and self._role_spend(role) + self.reserved.get(role, 0.0) + worst_usd > role_cap:
            return (f"roles.{role}.max_cost_usd", role_cap, self._role_spend(role), self.spent.get(role, 0.0))
        self.reserved[role] = self.reserved.get(role, 0.0) + worst_usd
        return None

    def settle(self, role: str, worst_usd: float, cost_usd: float) -> None:
        """A reserved call is over: release its hold and add what it really cost."""
        if worst_usd > 0:
            self.reserved[role] = max(0.0, self.reserved.get(role, 0.0) - worst_usd)
        self.spent[role] = self.spent.get(role, 0.0) + cost_usd

    def record(self, deltas: list[tuple[str, str, dict[str, float]]]) -> None:
        """Add answered calls' counts: (stage, role, {calls, cached_calls, ..., cost_usd})."""
        for stage, role, delta in deltas:
            row = self.counts.setdefault(stage, {}).setdefault(role, _zero())
            for k, v in delta.items():
                row[k] = row.get(k, 0) + v
            # A budgeted role's spend arrives exactly, call by call, through `settle`.
            if not self.budget.applies_to(role):
                self.spent[role] = self.spent.get(role, 0.0) + delta.get("cost_usd", 0.0)

    def admit(self, endpoint: str) -> Admission:
        return self.health.setdefault(endpoint, EndpointHealth()).admit(time.time())

    def report(self, endpoint: str, ok: bool, probe: bool = False) -> bool:
        """One request's outcome for the endpoint's breaker; whether the endpoint is down now."""
        return self.health.setdefault(endpoint, EndpointHealth()).report(ok, time.time(), probe)

    def is_down(self, endpoint: str) -> bool:
        return endpoint in self.health and self.health[endpoint].check(time.time())

    def claim_mode(self, key: str) -> tuple[str, str, str]:
        """The structured mode of `key` (endpoint and model): ("decided", mode, why) once published;
        ("scout", "", "") when nobody is deciding it (the caller now is: it sends json_schema and
        publishes what the endpoint took); ("wait", "", "") while another request decides it."""
        if key in self.modes:
            return ("decided", *self.modes[key])
        now = time.time()
        claimed = self.mode_claims.get(key)
        if claimed is not None and now - claimed < MODE_CLAIM_TIMEOUT_S:
            return ("wait", "", "")
        self.mode_claims[key] = now
        return ("scout", "", "")

    def publish_mode(self, key: str, mode: str, why: str) -> None:
        self.modes[key] = (mode, why)
        self.mode_claims.pop(key, None)

    def release_mode(self, key: str) -> None:
        """The scout gave up (its request failed in transport): the next to ask decides."""
        self.mode_claims.pop(key, None)

    def snapshot(self) -> dict[str, Any]:
        return {"counts": self.counts, "spent": dict(self.spent), "spent_before": dict(self.spent_before),
                "total_usd": self.total_spend(),
                "down": {e: h.down_since for e, h in self.health.items() if h.down_since is not None},
                "outages": {e: list(h.outages) for e, h in self.health.items() if h.outages}}


def stage_counts(snapshot: Mapping[str, Any], stage: str) -> dict[str, float]:
    """One stage's counters summed over its roles."""
    out = _zero()
    for row in snapshot.get("counts", {}).get(stage, {}).values():
        for k, v in row.items():
            out[k] = out.get(k, 0) + v
    return out


# ---------------------------------------------------------------- what a client holds

class LocalLedger:
    """The ledger in this process (inline runs, tests)."""

    def __init__(self, book: LedgerBook) -> None:
        self.book = book

    async def reserve(self, role: str, worst_usd: float) -> None:
        refusal = self.book.reserve(role, worst_usd)
        if refusal:
            raise BudgetExceeded(*refusal)

    async def settle(self, role: str, worst_usd: float, cost_usd: float) -> None:
        self.book.settle(role, worst_usd, cost_usd)

    def record(self, deltas: list[tuple[str, str, dict[str, float]]]) -> None:
        self.book.record(deltas)

    async def admit(self, endpoint: str) -> Admission:
        return self.book.admit(endpoint)

    async def report(self, endpoint: str, ok: bool, probe: bool = False) -> bool:
        return self.book.report(endpoint, ok, probe)

    async def is_down(self, endpoint: str) -> bool:
        return self.book.is_down(endpoint)

    async def claim_mode(self, key: str) -> tuple[str, str, str]:
        return self.book.claim_mode(key)

    async def publish_mode(self, key: str, mode: str, why: str) -> None:
        self.book.publish_mode(key, mode, why)

    def release_mode(self, key: str) -> None:
        self.book.release_mode(key)

    def snapshot(self) -> dict[str, Any]:
        return self.book.snapshot()

    def applies_to(self, role: str) -> bool:
        return self.book.budget.applies_to(role)


class StageTally:
    """A client's view of the ledger: counts its calls under (stage, role). Every tally of a process
    that records to one ledger shares one batch (`_ProcessTally`), so a busy worker costs the ledger
    one message per half second, not one per call, nor one per shard running in it."""

    def __init__(self, ledger: Any, stage: str, role: str) -> None:
        self.ledger = ledger
        self.stage = stage
        self.role = role
        self.budgeted = ledger.applies_to(role)
        self._shared = _ProcessTally.of(ledger)

    def add(self, **delta: float) -> None:
        self._shared.add((self.stage, self.role), delta)

    def flush(self) -> None:
        """Send what this process counted so far (a client's close: its counts are in before its
        shard is done)."""
        self._shared.flush()


class _ProcessTally:
    """The counts of every StageTally of this process for one ledger, sent together."""

    _all: ClassVar[dict[Any, "_ProcessTally"]] = {}
    _all_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger
        self._pending: dict[tuple[str, str], dict[str, float]] = {}
        self._last = time.monotonic()
        self._lock = threading.Lock()  # inline runs count from several threads

    @classmethod
    def of(cls, ledger: Any) -> "_ProcessTally":
        # One per ledger service (its name is the same in every process that unpickled it), else per object.
        key = getattr(getattr(ledger, "handle", None), "name", None) or id(ledger)
        with cls._all_lock:
            tally = cls._all.get(key)
            if tally is None:
                tally = cls._all[key] = cls(ledger)
            tally.ledger = ledger  # the latest run's handle to a service of the same name
            return tally

    def add(self, key: tuple[str, str], delta: Mapping[str, float]) -> None:
        with self._lock:
            pending = self._pending.setdefault(key, _zero())
            for k, v in delta.items():
                pending[k] = pending.get(k, 0) + v
            due = time.monotonic() - self._last >= _FLUSH_EVERY_S
        if due:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, {}
            self._last = time.monotonic()
        if batch:
            self.ledger.record([(stage, role, counts) for (stage, role), counts in batch.items()])
