"""What every handler reads: the parts the app factory built, and admission."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from fastapi import Request

from app.errors import overloaded
from app.forward.planner import Planner
from app.forward.proxy import Proxy
from app.tenancy.keys import KeyRing
from app.tenancy.limits import RateLimits
from app.tenancy.spend import SpendLedger
from router.decision import Policy
from telemetry.metrics import Metrics


@dataclass
class Gateway:
    """Everything a handler needs, built once by the app factory."""

    planner: Planner
    proxy: Proxy
    metrics: Metrics
    max_body_bytes: int
    default_policy: Policy
    body_timeout_s: float = 10.0  # the longest a request's body may take to arrive
    entering: int = 0  # requests being routed, not yet holding a slot
    keys: KeyRing | None = None  # None, or no active key: open (local development)
    limits: RateLimits = field(default_factory=RateLimits)
    spend: SpendLedger | None = None  # the usage ledger (budgets, GET /v1/usage)

    def refuse_if_full(self) -> None:
        """The cheapest refusal, before a request is read: when the backends'
        slots and queues, with the requests on their way to them, are full."""
        pool = self.planner.pool
        if pool.load() + self.entering >= pool.limit():
            self.metrics.request("none", "none", "unrouted", "none", "overloaded")
            raise overloaded("gateway", pool.load())

    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        """A request whose body is read, while it is routed: counted against
        the backends' capacity (a body still arriving holds none: slow bodies
        cannot lock anyone out)."""
        self.refuse_if_full()
        self.entering += 1
        try:
            yield
        finally:
            self.entering -= 1


def gateway_of(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw
