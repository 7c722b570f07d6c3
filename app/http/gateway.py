"""What every handler reads: the parts the app factory built, and admission."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from app.errors import over_share, overloaded
from app.forward.answer import Answer, Streamed
from app.forward.plan import Forward
from app.forward.planner import Planner
from app.forward.proxy import Proxy
from app.tenancy.keys import KeyRing
from app.tenancy.limits import RateLimits
from app.tenancy.share import FairShare
from app.tenancy.spend import SpendLedger
from router.curves import Curve
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
    share: FairShare = field(default_factory=FairShare)  # keys' shares of capacity
    curves: Mapping[str, Curve] = field(default_factory=dict)  # backend -> its curve

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

    async def answered(self, fw: Forward, answering: Callable[[], Awaitable[Answer]]
                       ) -> Answer:
        """The answer; with a key, refused when the key holds its share of the
        chosen backend while keys contend for it (app/tenancy/share.py), and
        counted in that share until it has ended (a stream: when its
        exchange ends)."""
        if fw.key is None:
            return await answering()
        backend, name, pool = fw.decision.backend, fw.key.id, self.planner.pool
        if self.share.over_share(backend, name, pool.backend_load(backend),
                                 pool.backend_limit(backend)):
            self.metrics.request(fw.decision.tier, backend, fw.route,
                                 fw.decision.category, "over_share")
            raise over_share(fw.key.name, self.share.held[(backend, name)])
        self.share.take(backend, name)
        try:
            out = await answering()
        except BaseException:
            self.share.give(backend, name)
            raise
        if not isinstance(out, Streamed):
            self.share.give(backend, name)
            return out
        end, given = out.end, False

        async def ended() -> Any:
            nonlocal given
            try:
                return await end()
            finally:
                if not given:
                    given = True
                    self.share.give(backend, name)
        out.end = ended
        return out


def gateway_of(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw
