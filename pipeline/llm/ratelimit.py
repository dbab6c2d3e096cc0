"""Request and token pacing.

`PacingSchedule` is the pure core: callers reserve a send time and are told how long to wait.
Requests are spaced evenly (60/rpm apart, no burst) so that any 60 s window holds at most rpm + 1
requests, whichever workers send them; a full-minute burst followed by a stall (what a plain
per-minute counter allows) would exceed the limit in windows that straddle two minutes.
Tokens use GCRA with a small burst tolerance, because the per-request estimate is coarse.

`LocalRateLimiter` paces one process; the job's service host keeps one schedule for every worker
of a job (pipeline.llm.shared.ActorRateLimiter asks it, on the host's own clock).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Callable, Protocol


class RateLimiter(Protocol):
    async def acquire(self, tokens: int) -> None:
        """Wait until a request estimated at `tokens` tokens may be sent."""
        ...

    async def pause(self, seconds: float) -> None:
        """Hold every request for `seconds` (the server said Retry-After)."""
        ...


def estimate_tokens(messages: list[dict[str, str]], max_tokens: int | None) -> int:
    """Rough prompt + completion tokens for pacing: 4 characters per token plus max_tokens."""
    chars = sum(len(str(m.get("content") or "")) for m in messages)
    return chars // 4 + (max_tokens or 0)


class PacingSchedule:
    """Hands out send times. Not thread-safe: one owner (a limiter, or the job's host, which runs its
    calls one at a time) calls it. `now` defaults to this process's monotonic clock."""

    def __init__(self, rpm: int | None = None, tpm: int | None = None, token_burst_s: float = 1.0) -> None:
        if rpm is not None and rpm <= 0:
            raise ValueError("rpm must be positive")
        if tpm is not None and tpm <= 0:
            raise ValueError("tpm must be positive")
        self.request_interval = 60.0 / rpm if rpm else 0.0
        self.token_interval = 60.0 / tpm if tpm else 0.0  # seconds per token
        self.token_burst_s = token_burst_s
        self._request_tat = -math.inf  # theoretical arrival time of the next request
        self._token_tat = -math.inf
        self._paused_until = -math.inf

    def reserve(self, tokens: int, now: float | None = None) -> float:
        """Reserve the earliest allowed slot; returns the delay from `now` until it."""
        now = time.monotonic() if now is None else now
        start = max(now, self._paused_until, self._request_tat)
        if self.token_interval:
            start = max(start, self._token_tat - self.token_burst_s)
            self._token_tat = max(self._token_tat, start) + max(tokens, 0) * self.token_interval
        if self.request_interval:
            self._request_tat = start + self.request_interval
        return start - now

    def reserve_shared(self, tokens: int) -> tuple[float, float]:
        """`reserve` for a worker of the job: (delay, the same slot as wall-clock time, which a
        worker's own clock can compare; see ActorRateLimiter.acquire)."""
        delay = self.reserve(tokens)
        return delay, time.time() + delay

    def pause(self, seconds: float, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._paused_until = max(self._paused_until, now + max(seconds, 0.0))

    def paused_for(self, now: float | None = None) -> float:
        """Seconds of pause left; a caller that slept to its slot re-reserves if this is > 0."""
        return max(self._paused_until - (time.monotonic() if now is None else now), 0.0)


class LocalRateLimiter:
    """In-process limiter; also the fallback that only shares Retry-After pauses within a worker."""

    def __init__(self, rpm: int | None = None, tpm: int | None = None, *, token_burst_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.schedule = PacingSchedule(rpm, tpm, token_burst_s)
        self._clock = clock

    async def acquire(self, tokens: int) -> None:
        while True:
            delay = self.schedule.reserve(tokens, self._clock())
            if delay <= 0:
                return
            await asyncio.sleep(delay)
            # A Retry-After pause that arrived while we slept voids the slot we were given.
            if self.schedule.paused_for(self._clock()) <= 0:
                return

    async def pause(self, seconds: float) -> None:
        self.schedule.pause(seconds, self._clock())

    def __repr__(self) -> str:
        s = self.schedule
        rpm = round(60 / s.request_interval) if s.request_interval else None
        tpm = round(60 / s.token_interval) if s.token_interval else None
        return f"LocalRateLimiter(rpm={rpm}, tpm={tpm})"
