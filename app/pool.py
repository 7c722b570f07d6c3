"""Replica state: health and outstanding requests, and the choice of replica.

Least outstanding requests first among healthy replicas; replicas marked down
are tried last (a health check may lag), so a request is never refused while
any replica might still answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from app.catalog import Backend, Catalog, Replica
from app.upstream import Upstream

log = logging.getLogger("joulegate.pool")


@dataclass
class ReplicaState:
    backend: Backend
    replica: Replica
    up: bool = True
    outstanding: int = 0
    failures: int = 0
    _order: int = field(default=0)


class ReplicaPool:
    def __init__(self, catalog: Catalog) -> None:
        self._states: dict[str, list[ReplicaState]] = {
            b.name: [ReplicaState(b, r, _order=i) for i, r in enumerate(b.replicas)]
            for b in catalog.backends
        }
        self._catalog = catalog

    def candidates(self, backend: str) -> list[ReplicaState]:
        return sorted(self._states[backend], key=lambda s: (not s.up, s.outstanding, s._order))

    def backend_up(self, backend: str) -> bool:
        return any(s.up for s in self._states[backend])

    def tier_up(self, tier: str) -> bool:
        return any(self.backend_up(b.name) for b in self._catalog.backends_of(tier))

    def healthy_backend(self, tier: str) -> Backend | None:
        """The first backend of the tier with a healthy replica (models.yaml order)."""
        backends = self._catalog.backends_of(tier)
        return next((b for b in backends if self.backend_up(b.name)), None)

    def outstanding(self) -> dict[str, int]:
        return {name: sum(s.outstanding for s in states) for name, states in self._states.items()}

    def all_states(self) -> list[ReplicaState]:
        return [s for states in self._states.values() for s in states]

    def mark(self, state: ReplicaState, up: bool) -> None:
        if state.up and not up:
            log.warning("replica %s of %s is down", state.replica.base, state.backend.name)
        state.up = up
        state.failures = 0 if up else state.failures + 1


class HealthChecker:
    """Probes every replica's /health periodically and updates the pool."""

    def __init__(
        self,
        pool: ReplicaPool,
        upstream: Upstream,
        interval_s: float,
        on_change: Callable[[str, bool], None],
    ) -> None:
        self._pool = pool
        self._upstream = upstream
        self._interval_s = interval_s
        self._on_change = on_change
        self._task: asyncio.Task[None] | None = None

    async def check_once(self) -> None:
        states = self._pool.all_states()
        timeout_s = min(2.0, self._interval_s)
        results = await asyncio.gather(
            *(self._upstream.probe(s.replica.base + "/health", timeout_s) for s in states)
        )
        for s, ok in zip(states, results, strict=True):
            self._pool.mark(s, ok)
        for name in {s.backend.name for s in states}:
            self._on_change(name, self._pool.backend_up(name))

    async def _run(self) -> None:
        while True:
            try:
                await self.check_once()
            except Exception:  # a probe bug must not stop health checking
                log.exception("health check failed")
            await asyncio.sleep(self._interval_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
