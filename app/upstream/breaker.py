"""A replica's circuit breaker: pure state, driven by request and probe outcomes.

closed     requests flow; consecutive request failures (or failed health probes)
           are counted, and reaching the threshold opens the breaker.
open       no requests; after a cooldown (doubling on each failed trial, up to
           a limit) it becomes half-open, unless its health probes still fail
           (a hung worker stays out). A probe that answers ends the cooldown
           of a breaker its probes opened (the worker is back); one opened by
           failed requests waits its cooldown out (a worker that answers its
           health check but not requests, garbage say, stays out).
half_open  exactly one trial request is let through: success closes the
           breaker, failure opens it again.

One failure never opens it (a dropped keep-alive connection is not even a
failure: it is retried on a new connection and not reported here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

BreakerState = Literal["closed", "open", "half_open"]


@dataclass
class Breaker:
    threshold: int = 3  # consecutive request failures that open it
    probe_threshold: int = 2  # consecutive failed health probes that open it
    base_cooldown_s: float = 2.0
    max_cooldown_s: float = 30.0
    state: BreakerState = "closed"
    failures: int = 0
    probe_failures: int = 0
    opened_at: float = 0.0
    cooldown_s: float = 0.0
    trial: bool = False  # the half-open trial request is in flight
    opened_by_probes: bool = False

    def available(self, now: float) -> bool:
        """Whether a new request may be sent (does not take the trial)."""
        if (self.state == "open" and now - self.opened_at >= self.cooldown_s
                and self.probe_failures < self.probe_threshold):
            self.state = "half_open"  # never while its health probes fail (hung)
        if self.state == "half_open":
            return not self.trial
        return self.state == "closed"

    def take(self) -> None:
        """A request was sent; in half-open it is the trial."""
        if self.state == "half_open":
            self.trial = True

    def retry_after_s(self, now: float) -> float:
        if self.state != "open":
            return 1.0
        return max(1.0, self.opened_at + self.cooldown_s - now)

    def success(self) -> None:
        self.state, self.failures, self.trial, self.cooldown_s = "closed", 0, False, 0.0

    def failure(self, now: float) -> None:
        self.failures += 1
        if self.state == "half_open":
            self._open(now, min(self.max_cooldown_s, max(self.base_cooldown_s,
                                                         2 * self.cooldown_s)))
        elif self.state == "closed" and self.failures >= self.threshold:
            self._open(now, self.base_cooldown_s)
        self.trial = False

    def probe(self, ok: bool, now: float) -> None:
        """A health probe's outcome."""
        if ok:
            self.probe_failures = 0
            if self.state == "open" and self.opened_by_probes:  # back: one request tries it
                self.state, self.trial = "half_open", False
            return
        self.probe_failures += 1
        if self.probe_failures >= self.probe_threshold and self.state != "open":
            self._open(now, self.base_cooldown_s)
            self.opened_by_probes = True

    def _open(self, now: float, cooldown_s: float) -> None:
        self.state, self.opened_at, self.cooldown_s = "open", now, cooldown_s
        self.opened_by_probes = False
