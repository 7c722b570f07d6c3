"""Whether a key may send a request now: its request and token rates, and a
reservation of the request's expected joules against its energy budget.

A reservation is made once the router has priced the request: admitted while
the key's spent joules plus its in-flight reservations are under its budget,
so a concurrent burst can overshoot the budget by at most one request's
joules (the last one admitted), as far as the hold is right. A hold is the
price scaled by what the backend's requests have really cost against their
price lately (a moving average of final / price, never below 1): a backend
whose requests cost twice their price under load holds twice the price. The
reservation is settled with the request's final figure (or released when the
request fails before it ran). With `SharedState` (Redis), windows and
reservations are shared by every gateway; without it, or while Redis does not
answer, each gateway enforces its own (app/tenancy/limits.py), which always
counts too, so a gateway falling back knows its own recent requests.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from app.tenancy.keys import ApiKey
from app.tenancy.limits import RateLimits, Refusal
from app.tenancy.shared import SharedRefusal, SharedState
from app.tenancy.spend import period_end, period_start

ALPHA = 0.2  # the moving average's weight of the newest final / price
MAX_RATIO = 20.0  # a hold is at most this many times its price


@dataclass
class Hold:
    """A request's reservation of joules against its key's budget."""

    key_id: str
    id: str
    joules: float  # held: the price, scaled by the backend's recent final / price
    period: int  # the budget period's start (Unix seconds)
    spent_ttl_s: int  # how long the period's shared counter must live
    backend: str = ""
    price_j: float = 0.0  # the router's price of the request
    held: bool = True  # not settled or released yet


@dataclass
class Admission:
    rates: RateLimits = field(default_factory=RateLimits)
    shared: SharedState | None = None
    clock: Callable[[], float] = time.time
    # key id -> hold id -> joules reserved in this gateway (the local view)
    _held: dict[str, dict[str, float]] = field(default_factory=dict)
    # backend -> moving average of a request's final figure over its price
    _cost_ratio: dict[str, float] = field(default_factory=dict)
    # told of each decision made locally although limits are shared ("admit",
    # "reserve"): Redis did not answer in time, or was down
    on_local: Callable[[str], None] = lambda operation: None

    async def admit(self, key: ApiKey) -> Refusal | None:
        """Count the request if the key is within its rates; else why not."""
        local = self.rates.admit(key)
        if self.shared is None or (key.rpm is None and key.tpm is None):
            return local
        out = await self.shared.admit(key.id, key.rpm, key.tpm)
        if out is None:  # Redis did not answer: this gateway's windows decide
            self.on_local("admit")
            return local
        if isinstance(out, SharedRefusal):
            return Refusal(out.limit, out.retry_after_s)
        return None

    def tokens(self, key_id: str, tokens: int) -> None:
        """A finished request's tokens, counted against the key's tpm."""
        if tokens <= 0:
            return
        self.rates.spent(key_id, tokens)
        if self.shared is not None:
            self.shared.tokens(key_id, tokens)

    async def reserve(self, key: ApiKey, price_j: float, spent_j: float,
                      backend: str = "") -> Hold | None:
        """A hold on the request's price (scaled: `held_for`) against the key's
        budget; None when its spent and held joules already reach the budget
        (the request is refused)."""
        assert key.joule_budget is not None
        now = self.clock()
        price = max(0.0, price_j)
        hold = Hold(key.id, secrets.token_hex(8), self.held_for(backend, price),
                    int(period_start(key.budget_period, now)),
                    int(period_end(key.budget_period, now) - now) + 3600, backend, price)
        ok = None
        if self.shared is not None:
            ok = await self.shared.reserve(key.id, hold.id, hold.joules, spent_j,
                                           key.joule_budget, hold.period, hold.spent_ttl_s)
        if ok is None:  # local: this gateway's own holds
            if self.shared is not None:
                self.on_local("reserve")
            ok = spent_j + self.held_j(key.id) < key.joule_budget
        if not ok:
            return None  # (a refused key leaves no empty entry behind)
        self._held.setdefault(key.id, {})[hold.id] = hold.joules
        return hold

    def settle(self, hold: Hold | None, net_j: float | None) -> None:
        """The request's joules are known (or it failed: 0): release the hold,
        once, and count what it cost in the shared counter. Called again for
        the same hold (a request that failed over), adds the joules only."""
        if hold is None:
            return
        was_held = hold.held
        if was_held and hold.price_j > 0 and net_j is not None and net_j > 0:
            self._learn(hold.backend, net_j / hold.price_j)
        if was_held:
            hold.held = False
            mine = self._held.get(hold.key_id)
            if mine is not None:
                mine.pop(hold.id, None)
                if not mine:
                    del self._held[hold.key_id]
        if self.shared is not None and (was_held or (net_j or 0.0) > 0):
            self.shared.settle(hold.key_id, hold.id, max(0.0, net_j or 0.0), hold.period,
                               hold.spent_ttl_s)

    def held_for(self, backend: str, price_j: float) -> float:
        """What a request priced at `price_j` holds on `backend`."""
        return price_j * min(MAX_RATIO, max(1.0, self._cost_ratio.get(backend, 1.0)))

    def _learn(self, backend: str, ratio: float) -> None:
        old = self._cost_ratio.get(backend)
        ratio = min(MAX_RATIO, ratio)
        self._cost_ratio[backend] = ratio if old is None else old + ALPHA * (ratio - old)

    def held_j(self, key_id: str) -> float:
        """Joules this gateway holds for the key now."""
        return sum(self._held.get(key_id, {}).values())
