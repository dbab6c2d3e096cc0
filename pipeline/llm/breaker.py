"""A circuit breaker per endpoint, shared by every worker of a run (through the run's ledger).

When a handful of requests in a row fail (5xx, timeouts, connection errors), the endpoint is down:
rather than let each row burn its retries and fail, every call waits, and one request at a time
is let through as a probe, with growing pauses between probes. The first probe that is answered
closes the breaker and every call resumes. An outage longer than
`llm.max_outage_s` stops the run cleanly (`EndpointDown`): finished work is kept, a rerun resumes.
A 429 is not an outage (the rate limiter and Retry-After handle it), nor is a 4xx, nor a 500 that
is a validation error naming a parameter (pipeline.llm.transport.rejected_param): only failures
that a plain request would also meet count.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import RunStopped

# Down when this many requests in a row failed, across every worker of the run (any answer in
# between resets the count). No minimum span: an endpoint that fails at once (an instant 503) would
# otherwise take hundreds of requests in the span. Opening on a few unlucky faults is cheap (the
# clients that failed wait for one probe, about a second); a rejected parameter is never a failure.
# At most a lone request's own attempts (llm.max_retries + 1), so that one request in flight still
# opens it before its retries run out.
OPEN_AFTER_FAILURES = 3
OPEN_AFTER_S = 0.0
# A request whose retries ran out on outage-like failures waits until this long after its first
# failure for the breaker to decide, so it does not fail just before the breaker would open.
DECIDE_S = 3.0
PROBE_FIRST_S = 1.0  # pause before the first probe, doubling up to PROBE_MAX_S
PROBE_MAX_S = 10.0  # a long outage costs one request per 10 s and ends at most 10 s late
PROBE_TIMEOUT_S = 300.0  # a probe that never reports back frees its slot after this long


class EndpointDown(RunStopped):
    """The endpoint has not answered for longer than `llm.max_outage_s`. Not an LLMError: no row
    catches it; the stage stops with its finished shards kept."""

    EXIT_CODE = 4

    def __init__(self, endpoint: str, down_s: float, limit_s: float) -> None:
        self.endpoint, self.down_s, self.limit_s = endpoint, down_s, limit_s
        super().__init__(
            f"endpoint {endpoint} has answered no request for {down_s:.0f} s (llm.max_outage_s = {limit_s:g}); "
            "finished work is kept: run the same command again when it is back, and no finished call is paid twice")

    def __reduce__(self) -> tuple:
        return (type(self), (self.endpoint, self.down_s, self.limit_s))


@dataclass
class Admission:
    wait_s: float = 0.0  # > 0: come back after this long
    probe: bool = False  # this request is the probe of a down endpoint
    down_for_s: float | None = None  # > max_outage_s: the caller stops the run


class EndpointHealth:
    """The breaker of one endpoint: pure state over a clock the owner passes in (no I/O)."""

    def __init__(self) -> None:
        self.failures = 0  # consecutive, since the last success
        self.first_failure: float | None = None  # wall time of the first of them
        self.down_since: float | None = None  # set while the breaker is open
        self.probe_at = 0.0  # when the next probe may go
        self.probe_pause = PROBE_FIRST_S
        self.probe_out: float | None = None  # when the probe in flight left
        self.outages: list[tuple[float, float]] = []  # (down since, up again) of past outages

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def report(self, ok: bool, now: float, probe: bool = False) -> bool:
        """Record one request's outcome; returns whether the endpoint is down now."""
        if probe:
            self.probe_out = None
        if ok:
            if self.down_since is not None:
                self.outages.append((self.down_since, now))
            self.failures, self.first_failure, self.down_since = 0, None, None
            self.probe_pause = PROBE_FIRST_S
            return False
        self.failures += 1
        if self.first_failure is None:
            self.first_failure = now
        if self.down_since is None:
            self.check(now)
        elif probe:
            self.probe_pause = min(self.probe_pause * 2, PROBE_MAX_S)
            self.probe_at = now + self.probe_pause
        return self.down

    def check(self, now: float) -> bool:
        """Open when enough requests in a row failed over long enough, also when no new failure
        arrives to say so (every request of the run may be waiting out its last retry); returns
        whether the endpoint is down."""
        if (self.down_since is None and self.failures >= OPEN_AFTER_FAILURES and self.first_failure is not None
                and now - self.first_failure >= OPEN_AFTER_S):
            self.down_since = self.first_failure
            self.probe_at = now + self.probe_pause
        return self.down

    def admit(self, now: float) -> Admission:
        """May a request go now? Always while up; while down, one probe at a time when its pause
        is over, the others wait."""
        if self.down_since is None:
            return Admission()
        if self.probe_out is not None and now - self.probe_out > PROBE_TIMEOUT_S:
            self.probe_out = None  # its worker died: let another probe go
        if self.probe_out is None and now >= self.probe_at:
            self.probe_out = now
            return Admission(probe=True, down_for_s=now - self.down_since)
        wait = max(self.probe_at - now, 0.0) if self.probe_out is None else 1.0
        return Admission(wait_s=min(max(wait, 0.05), 1.0), down_for_s=now - self.down_since)
