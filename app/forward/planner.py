"""The one place a request's plan is made: which backend, what body, and,
when a backend cannot take it, the next plan without that backend.

The HTTP layer hands the planner an `Ask` (what the client asked for, read
and validated); the planner decides (the router for `auto`, the catalog for a
name), steers a key near its joule budget to the cheapest action, and returns
a `Forward`. `Proxy.begin` asks `replan` for the next forward when a backend
cannot take the request: failover between backends has this one owner.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Protocol

from app.catalog import Backend, Catalog
from app.errors import (
    ApiError,
    model_not_allowed,
    no_healthy_worker,
    not_found_model,
    overloaded,
)
from app.forward.plan import Ask, Forward, Needs
from app.forward.traffic import Traffic
from app.forward.turn import Turn
from app.tenancy.keys import ApiKey
from app.tenancy.spend import SpendLedger
from app.upstream.pool import ReplicaPool
from router.decision import Decision, Query, Unroutable
from router.thinking import CLOSING_TOKENS
from telemetry.metrics import Metrics


class RouterLike(Protocol):
    def decide(self, q: Query, explain: bool = True) -> Decision: ...


@dataclass
class Planner:
    catalog: Catalog
    pool: ReplicaPool
    router: RouterLike
    metrics: Metrics
    traffic: Traffic
    spend: SpendLedger | None = None
    # A key that has spent this share of its joule budget gets the cheapest action.
    budget_steer_at: float = 0.8
    # Category -> the worked examples a `fewshot` decision puts before the request.
    examples: Mapping[str, Sequence[Mapping[str, str]]] = field(default_factory=dict)
    # Routed requests planned in the current turn, per backend: load that the
    # pool does not count yet (their exchanges have not begun).
    _in_turn: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _turn: Turn[Forward] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._turn = Turn(after=self._in_turn.clear)

    async def plan_soon(self, ask: Ask) -> Forward:
        """`plan`. Under load, a routed request's is made with the others that
        reach the router in this turn of the event loop, one after another
        while the router's code and data are in the CPU's caches
        (app.forward.turn); each decision sees those made before it in the
        turn as running. An idle gateway's request is planned at once: there
        is nothing to plan it with, and waiting a turn costs its latency."""
        if ask.model not in ("auto", self.catalog.defaults.model) \
                or (not self._turn.pending and self.pool.load() == 0):
            return self.plan(ask)
        return await self._turn.run(partial(self._plan_in_turn, ask))

    def _plan_in_turn(self, ask: Ask) -> Forward:
        fw = self.plan(ask)
        backend = fw.decision.backend
        self._in_turn[backend] = self._in_turn.get(backend, 0) + 1
        return fw

    def plan(self, ask: Ask) -> Forward:
        """The forward for a request. A key near its joule budget is steered
        to the cheapest action (`auto` only)."""
        d, steered = self.decide_for(ask.key, ask.model, ask.query, ask.needs)
        if ask.key is not None and ask.key.models is not None \
                and ask.model not in ask.key.models:
            raise model_not_allowed(ask.model)
        backend = self.catalog.backend(d.backend)
        assert backend is not None
        d = fit_thinking(d, backend, ask.thinking_ceiling, ask.query.prompt_tokens)
        body = ask.body_for(d, backend)
        # The worker always streams, with usage: the gateway counts tokens as they
        # come, can stop a generation (loop guard, timeout, client gone), and
        # assembles one response for clients that did not ask to stream.
        body["stream"] = True
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        reroutable = d.routed or ask.model in self.catalog.tiers
        return Forward(ask.path, body, d, "auto" if d.routed else "forced", ask.stream,
                       ask.wants_usage, ask.query.prompt_tokens, ask.received_at,
                       model_name=backend.model, disconnected=ask.disconnected,
                       ask=ask if reroutable else None, key=ask.key, budget_used=steered,
                       reasoning=backend.reasoning, asked=ask.model)

    def replan(self, fw: Forward, excluded: frozenset[str]) -> Forward | None:
        """The next plan for `fw`'s request without the `excluded` backends (its
        joule hold goes with it), or None when none is left or it named its
        backend."""
        ask = fw.ask
        if ask is None:
            return None
        q = ask.query
        try:
            nxt = self.plan(replace(ask, query=replace(q, unavailable=q.unavailable | excluded)))
        except ApiError:
            return None
        return replace(nxt, hold=fw.hold)

    def decide_for(self, key: ApiKey | None, model: str, q: Query, needs: Needs,
                   arriving: bool = True) -> tuple[Decision, float | None]:
        """`decide`, for a key: one that has spent `budget_steer_at` of its joule
        budget gets the fewest expected joules under `auto` (the reason says so).
        Also the share of the budget used, when steered."""
        if key is None or key.joule_budget is None or self.spend is None \
                or model not in ("auto", self.catalog.defaults.model):
            return self.decide(model, q, needs, arriving), None
        used = self.spend.spent_j(key) / key.joule_budget
        if used < self.budget_steer_at:
            return self.decide(model, q, needs, arriving), None
        d = self.decide(model, replace(q, policy="min-energy"), needs, arriving)
        if arriving:
            return d, used
        return replace(d, reason=f"{d.reason}; key '{key.name}' has used {used:.0%} of its "
                                 "joule budget: steered to the fewest expected joules"), used

    def decide(self, model: str, q: Query, needs: Needs | None = None,
               arriving: bool = True) -> Decision:
        """The decision for a request; `q.unavailable` backends are avoided.
        `arriving`: the request will run; a dry run (/v1/route) does not, and
        gets the decision explained (reason, probabilities, candidates)."""
        needs = needs or Needs()
        if model in ("auto", self.catalog.defaults.model):
            return self._routed(q, needs, arriving)
        forced = self._forced(model, q, needs)
        if forced is None:
            raise not_found_model(model)
        return forced

    def _routed(self, q: Query, needs: Needs, arriving: bool) -> Decision:
        backends = self.catalog.backends
        fits = {b.name for b in needs.fitting(backends)}
        unfit = {b.name for b in backends} - fits
        down = {b.name for b in backends} - self.pool.accepting()
        start = time.perf_counter()
        try:
            outstanding = self.pool.outstanding()
            for name, n in self._in_turn.items():
                outstanding[name] = outstanding.get(name, 0) + n
            running = self.traffic.expect(outstanding, arriving)
            d = self.router.decide(q.under(running, q.unavailable | down | unfit),
                                   explain=not arriving)
        except Unroutable:
            saturated = {b.name for b in backends if self.pool.backend_saturated(b.name)}
            full = not down - saturated  # every backend is up but full
            self.metrics.request("none", "none", "auto", "none",
                                 "overloaded" if full else "no_worker")
            if full:
                raise overloaded("every backend", self.pool.load()) from None
            raise no_healthy_worker("any", min(
                self.pool.retry_after_s(b.name) for b in backends)) from None
        self.metrics.decision(d.tier, d.strategy, d.category, time.perf_counter() - start)
        if d.baseline_joules is not None and d.expected_joules is not None:
            self.metrics.saved(self.catalog.baseline, d.baseline_joules - d.expected_joules)
        return d

    def _forced(self, model: str, q: Query, needs: Needs) -> Decision | None:
        """A decision for a model named explicitly (tier, backend or upstream name).
        A tier takes the first of its backends that can take the request now."""
        backend: Backend | None
        if model in self.catalog.tiers:
            fits = needs.fitting(self.catalog.backends_of(model))
            backend = next((b for b in fits if b.name not in q.unavailable
                            and self.pool.accepts(b.name)), None)
            if backend is None:
                busy = next((b for b in fits if b.name not in q.unavailable), None)
                if busy is None:
                    raise no_healthy_worker(model, self.pool.retry_after_s(fits[0].name))
                backend = busy  # saturated or down: let admission say which (429 / 503)
        else:
            backend = self.catalog.backend(model) or next(
                (b for b in self.catalog.backends if b.model == model), None)
            if backend is not None and (unmet := needs.unmet_by(backend)) is not None:
                raise unmet
        if backend is None:
            return None
        return Decision(
            tier=backend.tier, backend=backend.name, strategy="direct",
            max_tokens=q.max_tokens or 0, thinking_budget=None, category="forced",
            policy=q.policy, reason=f"model '{model}' asked for by name", routed=False)


def fit_thinking(d: Decision, backend: Backend, ceiling: int | None,
                 prompt_tokens: int) -> Decision:
    """`d` with the thinking budget it is sent with: within the client's
    ceiling, then within the backend's context."""
    return within_context(within_ceiling(d, backend, ceiling), backend, prompt_tokens)


def within_ceiling(d: Decision, backend: Backend, ceiling: int | None) -> Decision:
    """`d` with its thinking budget no larger than the client's ceiling (a
    reasoning backend asked by name gets the ceiling as its budget)."""
    if not backend.reasoning or ceiling is None:
        return d
    old = d.thinking_budget
    budget = ceiling if old is None else min(old, ceiling)
    return d if budget == old else _rebudget(d, budget)


def within_context(d: Decision, backend: Backend, prompt_tokens: int) -> Decision:
    """`d` with a thinking budget that leaves the prompt and the answer room in
    the backend's context (the unbounded rung, or a client's large ceiling on a
    model asked for by name, ask for the most)."""
    budget = d.thinking_budget
    if not budget or not backend.reasoning:
        return d
    if not d.routed:  # max_tokens: what the client asked for the answer (0: none)
        room = backend.context_limit - prompt_tokens - d.max_tokens - CLOSING_TOKENS
        return d if budget <= room else _rebudget(d, max(0, room))
    over = prompt_tokens + d.max_tokens - backend.context_limit
    return d if over <= 0 else _rebudget(d, max(0, budget - over))


def _rebudget(d: Decision, budget: int) -> Decision:
    """`d` with another thinking budget. A routed decision's max_tokens holds
    budget, closing line and answer: the answer's share stays as it was."""
    if not d.routed:
        return replace(d, thinking_budget=budget)
    old = d.thinking_budget
    answer = d.max_tokens - (old + CLOSING_TOKENS if old else 0)
    return replace(d, thinking_budget=budget,
                   max_tokens=answer + (budget + CLOSING_TOKENS if budget else 0))
