"""The run's ledger: what every LLM call of a run cost, live; the budget it must keep; and whether
each endpoint is answering (the shared circuit breaker of pipeline.llm.breaker).

One ledger per `mempipe run`: `LedgerBook` is its state, in the driver's process for inline runs,
hosted in the job's service host for every worker otherwise (like the rate limiter); `RunLedger` is
what a client holds of it, either way, with the run's structured modes (pipeline.llm.modes).
Clients report each answered call (fresh or cached) so the driver can draw progress while shards
run, and, when a budget applies, reserve a fresh call's worst-case cost (prompt estimate +
max_tokens) before sending it: a reservation that would take the spend past the budget raises
`BudgetExceeded`, so the run stops before the call, never after. Spend is of fresh calls only (cached answers are free); `spent_before` is what earlier
invocations on the run directory paid (the runner keeps it: pipeline.engine.spend), so a rerun with a
higher budget continues from what was spent.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Protocol

from pipeline.errors import RunStopped
from pipeline.llm.breaker import Admission, EndpointHealth
from pipeline.llm.modes import ModeClaims, ModeRegistry

if TYPE_CHECKING:
    from pipeline.llm.service_host import InProcess, ServiceRef
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
    outstanding reservations, each endpoint's breaker. Owned by one thread or the job's host, which
    runs its calls one at a time."""

    def __init__(self, budget: Budget, spent_before: Mapping[str, float] | None = None) -> None:
        self.budget = budget
        self.spent_before = dict(spent_before or {})  # role -> USD of earlier invocations
        self.spent: dict[str, float] = {}  # role -> USD of this invocation's fresh calls
        self.reserved: dict[str, float] = {}  # role -> USD of calls sent and not yet answered
        self.counts: dict[str, dict[str, dict[str, float]]] = {}  # stage -> role -> counters
        self.health: dict[str, EndpointHealth] = {}  # endpoint -> its breaker

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

class Ledger(Protocol):
    """The run's ledger as a client uses it (`RunLedger`): budget, counts, endpoint health."""

    modes: ModeClaims  # the run's structured-mode decisions, beside the book

    async def reserve(self, role: str, worst_usd: float) -> None:
        """Hold a fresh call's worst case; BudgetExceeded when it does not fit."""

    async def settle(self, role: str, worst_usd: float, cost_usd: float) -> None: ...

    def record(self, deltas: list[tuple[str, str, dict[str, float]]]) -> None: ...

    async def admit(self, endpoint: str) -> Admission: ...

    async def report(self, endpoint: str, ok: bool, probe: bool = False) -> bool: ...

    async def is_down(self, endpoint: str) -> bool: ...

    def snapshot(self) -> dict[str, Any]: ...

    def applies_to(self, role: str) -> bool: ...


class RunLedger:
    """What the run's clients hold of its `LedgerBook` and `ModeRegistry`: in this process
    (`local`: inline runs, tests) or in the job's host for every worker (`start`; picklable then,
    its refs and the caps). The book's calls go as they are; a refused reservation is raised here."""

    def __init__(self, book: ServiceRef | InProcess, modes: ModeClaims, budget: Budget) -> None:
        self.book = book
        self.modes = modes
        self.budget = budget

    @classmethod
    def local(cls, book: LedgerBook) -> RunLedger:
        from pipeline.llm.service_host import InProcess

        return cls(InProcess(book), ModeClaims(InProcess(ModeRegistry())), book.budget)

    @classmethod
    def start(cls, book: LedgerBook, job_key: str) -> RunLedger:
        """The job's ledger, started in its host from `book`'s caps and earlier spend (the driver)."""
        from pipeline.llm.service_host import start_service

        hosted = start_service(f"mempipe-ledger-{job_key}", LedgerBook, book.budget, book.spent_before)
        return cls(hosted, ModeClaims(start_service(f"mempipe-modes-{job_key}", ModeRegistry)), book.budget)

    async def reserve(self, role: str, worst_usd: float) -> None:
        refusal = await self.book.reserve.remote(role, worst_usd)
        if refusal:
            raise BudgetExceeded(*refusal)

    async def settle(self, role: str, worst_usd: float, cost_usd: float) -> None:
        await self.book.settle.remote(role, worst_usd, cost_usd)

    def record(self, deltas: list[tuple[str, str, dict[str, float]]]) -> None:
        self.book.record.remote(deltas)  # fire and forget: counts for the progress line

    async def admit(self, endpoint: str) -> Admission:
        admission: Admission = await self.book.admit.remote(endpoint)
        return admission

    async def report(self, endpoint: str, ok: bool, probe: bool = False) -> bool:
        return bool(await self.book.report.remote(endpoint, ok, probe))

    async def is_down(self, endpoint: str) -> bool:
        return bool(await self.book.is_down.remote(endpoint))

    def snapshot(self) -> dict[str, Any]:
        snap: dict[str, Any] = self.book.sync("snapshot")
        return snap

    def applies_to(self, role: str) -> bool:
        return self.budget.applies_to(role)

    def close(self) -> None:
        """Stop the hosted book and registry (end of run); nothing for a local ledger."""
        self.book.stop()
        self.modes.ref.stop()


class Tally(Protocol):
    """A client's counts into the run's ledger (`StageTally`)."""

    ledger: Ledger
    role: str
    budgeted: bool  # the role's fresh calls reserve their worst case first

    def add(self, **delta: float) -> None: ...

    def flush(self) -> None: ...


class StageTally:
    """A client's view of the ledger: counts its calls under (stage, role). Every tally of a process
    that records to one ledger shares one batch (`_ProcessTally`), so a busy worker costs the ledger
    one message per half second, not one per call, nor one per shard running in it."""

    def __init__(self, ledger: Ledger, stage: str, role: str) -> None:
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

    _all: ClassVar[dict[str | int, "_ProcessTally"]] = {}
    _all_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._pending: dict[tuple[str, str], dict[str, float]] = {}
        self._last = time.monotonic()
        self._lock = threading.Lock()  # inline runs count from several threads

    @classmethod
    def of(cls, ledger: Ledger) -> "_ProcessTally":
        # One per ledger service (its name is the same in every process that unpickled it), else per object.
        key: str | int = getattr(getattr(ledger, "book", None), "name", None) or id(ledger)
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
