"""What every handler reads: the parts the app factory built, and admission."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import Request

from app.errors import joule_budget_exceeded, over_share, overloaded
from app.forward.answer import Answer, Streamed
from app.forward.plan import Forward
from app.forward.planner import Planner
from app.forward.proxy import Proxy
from app.tenancy.admission import Admission, Hold
from app.tenancy.keys import KeyRing
from app.tenancy.share import FairShare
from app.tenancy.spend import SpendLedger, period_end
from router.curves import Curve
from router.decision import Policy
from telemetry.metrics import DeviceView, Metrics


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
    admission: Admission = field(default_factory=Admission)  # rates, joule holds
    spend: SpendLedger | None = None  # the usage ledger (budgets, GET /v1/usage)
    share: FairShare = field(default_factory=FairShare)  # keys' shares of capacity
    curves: Mapping[str, Curve] = field(default_factory=dict)  # backend -> its curve
    # the devices this process meters (none where an agent does): their totals
    devices: Callable[[], list[DeviceView]] = list

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

    async def answered(self, fw: Forward,
                       answering: Callable[[Forward], Awaitable[Answer]]) -> Answer:
        """The answer; with a key, refused when the key holds its share of the
        chosen backend while keys contend for it (app/tenancy/share.py), and
        counted in that share until it has ended (a stream: when its
        exchange ends). A key with a joule budget holds the request's
        expected joules until its final figure settles them."""
        if fw.key is None:
            return await answering(fw)
        backend, name, pool = fw.decision.backend, fw.key.id, self.planner.pool
        if self.share.over_share(backend, name, pool.backend_load(backend),
                                 pool.backend_limit(backend)):
            self.metrics.request(fw.decision.tier, backend, fw.route,
                                 fw.decision.category, "over_share")
            raise over_share(fw.key.name, self.share.held[(backend, name)])
        hold = await self._hold(fw)
        if hold is not None:
            fw = replace(fw, hold=hold)
        self.share.take(backend, name)
        try:
            out = await answering(fw)
        except BaseException:
            self.share.give(backend, name)
            self.admission.settle(hold, 0.0)  # never ran, or its row settles it too
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

    async def _hold(self, fw: Forward) -> Hold | None:
        """A reservation of the request's expected joules against its key's
        budget (429 when the key's spent and held joules reach it)."""
        key = fw.key
        if key is None or key.joule_budget is None or self.spend is None:
            return None
        hold = await self.admission.reserve(key, self.expected_j(fw), self.spend.spent_j(key),
                                            fw.decision.backend)
        if hold is None:
            self.metrics.request(fw.decision.tier, fw.decision.backend, fw.route,
                                 fw.decision.category, "joule_budget")
            raise joule_budget_exceeded(key.joule_budget, key.budget_period,
                                        period_end(key.budget_period, time.time()))
        return hold

    def expected_j(self, fw: Forward) -> float:
        """The router's price of the request; for a model asked by name, its
        backend's curve at the prompt and the answer's allowance (0 without a
        curve: such requests are held to their spent joules only)."""
        d = fw.decision
        if d.expected_joules is not None:
            return d.expected_joules
        curve = self.curves.get(d.backend)
        answer = d.max_tokens or self.planner.catalog.defaults.max_tokens
        return curve.joules(fw.prompt_tokens_estimate, answer) if curve is not None else 0.0


def gateway_of(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw
