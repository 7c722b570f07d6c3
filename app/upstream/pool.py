"""Replicas: their health (a circuit breaker each), their load, and admission.

A request takes a slot on one replica of a backend whose breaker lets
requests through and which has fewer than its `max_concurrency` requests in
flight: the one where it adds the fewest joules within the backend's
`max_batch` (app/upstream/placement.py), or the least loaded one. When
every such replica is full the request waits in the backend's bounded FIFO
queue; a full queue, or a wait longer than the queue timeout, is refused at
once (`Overloaded`: 429 with Retry-After). No replica that may take
requests at all is `NoReplica` (503).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from types import TracebackType

from app.catalog import Backend, Catalog, Replica
from app.upstream.breaker import Breaker
from app.upstream.client import Upstream, UpstreamError, UpstreamFault
from app.upstream.pace import Pace
from app.upstream.placement import Candidate, least_outstanding, place
from router.curves import Curve

DEFAULT_MAX_BATCH = 8  # requests per replica before packing wakes another (the H200
# curves were measured up to concurrency 8; llama-server's -np 8 in deploy/)

log = logging.getLogger("joulegate.pool")


class NoReplica(UpstreamFault):
    """No replica of the backend may take requests now (down, ejected)."""

    def __init__(self, backend: str, retry_after_s: float) -> None:
        super().__init__(backend)
        self.backend = backend
        self.retry_after_s = retry_after_s


class Overloaded(UpstreamFault):
    """Every replica is full and the backend's queue is full (or the wait too long)."""

    def __init__(self, backend: str) -> None:
        super().__init__(backend)
        self.backend = backend


class Ejected(UpstreamError):
    """The replica's breaker opened while a request waited on it for its
    first byte (a hung worker): nothing was answered, so it may go elsewhere."""


@dataclass
class ReplicaState:
    backend: Backend
    replica: Replica
    breaker: Breaker = field(default_factory=Breaker)
    outstanding: int = 0
    order: int = 0
    pace: Pace = field(default_factory=Pace)  # measured seconds per token by batch
    # The waits (for a first byte) that end when the breaker opens.
    watches: set[asyncio.Timeout] = field(default_factory=set)

    @property
    def capacity(self) -> int:
        return self.replica.max_concurrency

    def unless_ejected(self) -> EjectionWatch:
        return EjectionWatch(self)


class EjectionWatch:
    """`async with state.unless_ejected():` the wait inside raises Ejected as
    soon as the replica's breaker opens (its health probes failing while the
    worker hangs), instead of waiting out the first-byte timeout. An asyncio
    timeout with no deadline, brought forward by the pool: no task, and
    asyncio's own cancellation bookkeeping."""

    __slots__ = ("_state", "_timeout")

    def __init__(self, state: ReplicaState) -> None:
        self._state = state
        self._timeout = asyncio.timeout(None)

    async def __aenter__(self) -> None:
        await self._timeout.__aenter__()
        self._state.watches.add(self._timeout)

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._state.watches.discard(self._timeout)
        try:
            await self._timeout.__aexit__(kind, exc, tb)
        except TimeoutError:
            raise Ejected("unavailable", f"{self._state.replica.base} was ejected (its "
                          "health checks fail) while the request waited for it") from None


class ReplicaPool:
    def __init__(self, catalog: Catalog, queue_timeout_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic,
                 curves: Mapping[str, Curve] | None = None) -> None:
        self._states: dict[str, list[ReplicaState]] = {
            b.name: [ReplicaState(b, r, order=i) for i, r in enumerate(b.replicas)]
            for b in catalog.backends
        }
        self._queues: dict[str, deque[asyncio.Future[tuple[ReplicaState, str]]]] = {
            b.name: deque() for b in catalog.backends}
        self._catalog = catalog
        self._queue_timeout_s = queue_timeout_s
        self._clock = clock
        self._all = [s for states in self._states.values() for s in states]
        self._held = 0  # slots held over all replicas
        self._limit = sum(s.capacity for s in self._all) + sum(
            b.max_queue for b in catalog.backends)
        curves = curves or {}
        # Backends placed by marginal joules (those with a curve); the rest by load.
        self._curves = {b.name: curves[b.name] for b in catalog.backends
                        if b.placement == "marginal_joules" and b.name in curves}
        devices = {d.name: d for d in catalog.devices}
        self._wake_j = {name: (d.idle_power_w or 0.0) * d.wake_s if d.power_down else 0.0
                        for name, d in devices.items()}

    # -- admission --------------------------------------------------------
    def _pick(self, backend: str, exclude: Collection[int]) -> tuple[ReplicaState, str] | None:
        """A free replica and why it was chosen ("" where there was no choice)."""
        now = self._clock()
        states = self._states[backend]
        free = [s for s in states if s.order not in exclude
                and s.outstanding < s.capacity and s.breaker.available(now)]
        if not free:
            return None
        if len(free) == 1 and len(states) == 1:
            return free[0], ""  # one replica: nothing to choose
        on_device: Counter[str] = Counter()  # every backend's requests, by device
        for s in self._all:
            on_device[s.replica.device] += s.outstanding
        b = states[0].backend
        bound = b.max_seconds_per_token
        candidates = [Candidate(s.order, s.outstanding, on_device[s.replica.device],
                                self._wake_j.get(s.replica.device, 0.0),
                                s.pace.at(s.outstanding + 1, now) if bound else None)
                      for s in free]
        curve = self._curves.get(b.name)
        chosen = place(candidates, curve, b.max_batch or DEFAULT_MAX_BATCH, bound) if curve \
            else least_outstanding(candidates)
        return states[chosen.order], chosen.reason

    def _take(self, s: ReplicaState) -> ReplicaState:
        s.outstanding += 1
        self._held += 1
        s.breaker.take()
        return s

    async def acquire(self, backend: str, exclude: Collection[int] = ()) -> ReplicaState:
        """A slot on a replica (not one of `exclude`, by order); may wait in the queue."""
        return (await self.acquire_placed(backend, exclude))[0]

    async def acquire_placed(self, backend: str, exclude: Collection[int] = ()
                             ) -> tuple[ReplicaState, str]:
        """acquire(), and why that replica: the reason given when this slot was
        taken (a queued request's own, not a later request's)."""
        picked = self._pick(backend, exclude)
        if picked is not None:
            return self._take(picked[0]), picked[1]
        if not self.backend_up(backend, exclude):
            raise NoReplica(backend, self.retry_after_s(backend))
        queue = self._queues[backend]
        if len(queue) >= self._states[backend][0].backend.max_queue:
            raise Overloaded(backend)
        waiter: asyncio.Future[tuple[ReplicaState, str]] = \
            asyncio.get_running_loop().create_future()
        queue.append(waiter)
        try:
            async with asyncio.timeout(self._queue_timeout_s):
                return await waiter
        except TimeoutError:
            raise Overloaded(backend) from None
        except asyncio.CancelledError:
            # Given a slot in the same instant it was cancelled: hand it back.
            if waiter.done() and not waiter.cancelled():
                self.release(waiter.result()[0])
            raise
        finally:
            with contextlib.suppress(ValueError):
                queue.remove(waiter)

    def release(self, s: ReplicaState) -> None:
        """Give a slot back (report the outcome first: this ends a half-open trial
        whose outcome was not reported, e.g. a departed client's)."""
        s.outstanding -= 1
        self._held -= 1
        s.breaker.trial = False
        self._wake(s.backend.name)

    def _wake(self, backend: str) -> None:
        queue = self._queues[backend]
        while queue:
            if queue[0].done():  # timed out or cancelled
                queue.popleft()
                continue
            picked = self._pick(backend, ())
            if picked is None:
                return
            queue.popleft().set_result((self._take(picked[0]), picked[1]))

    def paced(self, s: ReplicaState, batch: int, s_per_token: float) -> None:
        """The pace an answer saw on `s`, in a batch of `batch` (itself included)."""
        s.pace.observe(batch, s_per_token, self._clock())

    def report(self, s: ReplicaState, ok: bool) -> None:
        """A request's outcome for the replica's breaker."""
        was = s.breaker.state
        if ok:
            s.breaker.success()
        else:
            s.breaker.failure(self._clock())
        self._log_change(s, was)
        if s.breaker.state != "open":
            self._wake(s.backend.name)

    def probed(self, s: ReplicaState, ok: bool) -> None:
        was = s.breaker.state
        s.breaker.probe(ok, self._clock())
        self._log_change(s, was)
        if ok:
            self._wake(s.backend.name)

    def _log_change(self, s: ReplicaState, was: str) -> None:
        if s.breaker.state != was:
            log.warning("replica %s of %s: %s -> %s", s.replica.base, s.backend.name, was,
                        s.breaker.state)
            if s.breaker.state == "open" and s.watches:
                log.warning("replica %s: %d requests waiting on it go elsewhere",
                            s.replica.base, len(s.watches))
                for waiting in list(s.watches):
                    waiting.reschedule(-1.0)  # ends the wait now: Ejected

    # -- views ------------------------------------------------------------
    def backend_up(self, backend: str, exclude: Collection[int] = ()) -> bool:
        """Some replica (not one of `exclude`) whose breaker lets requests
        through, full or not."""
        now = self._clock()
        return any(s.breaker.available(now) or s.breaker.trial
                   for s in self._states[backend] if s.order not in exclude)

    def backend_saturated(self, backend: str) -> bool:
        """Every replica full and the queue full: a new request would be refused."""
        states = self._states[backend]
        full = all(s.outstanding >= s.capacity for s in states)
        return full and len(self._queues[backend]) >= states[0].backend.max_queue

    def load(self) -> int:
        """Requests holding or waiting for a slot, over all backends."""
        return self._held + sum(len(q) for q in self._queues.values())

    def limit(self) -> int:
        """The most requests the backends hold and queue together."""
        return self._limit

    def backend_load(self, backend: str) -> int:
        """Requests holding or waiting for a slot of `backend`."""
        return sum(s.outstanding for s in self._states[backend]) + len(self._queues[backend])

    def backend_limit(self, backend: str) -> int:
        """The most requests `backend` holds and queues."""
        states = self._states[backend]
        return sum(s.capacity for s in states) + states[0].backend.max_queue

    def accepts(self, backend: str) -> bool:
        """Whether a new request can be sent to `backend` now (up and not saturated)."""
        return self.backend_up(backend) and not self.backend_saturated(backend)

    def accepting(self) -> frozenset[str]:
        """Backends a new request can be sent to now."""
        return frozenset(name for name in self._states if self.accepts(name))

    def retry_after_s(self, backend: str) -> float:
        now = self._clock()
        return min(s.breaker.retry_after_s(now) for s in self._states[backend])

    def tier_up(self, tier: str) -> bool:
        return any(self.backend_up(b.name) for b in self._catalog.backends_of(tier))

    def outstanding(self) -> dict[str, int]:
        return {name: sum(s.outstanding for s in states) for name, states in self._states.items()}

    def queued(self, backend: str) -> int:
        return len(self._queues[backend])

    def all_states(self) -> list[ReplicaState]:
        return self._all


class HealthChecker:
    """Probes every replica's /health periodically and feeds the breakers."""

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
            self._pool.probed(s, ok)
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
