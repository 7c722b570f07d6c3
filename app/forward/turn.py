"""Work that arrives during one turn of the event loop, done together at the
start of the next.

A routed decision costs ~3x more in a loaded gateway than in a loop of its
own: `auto` took 0.28 ms more CPU per request than a forced tier at c=50
(`bench/results/gateways.json` at d771036), against ~0.1 ms for a decision
in a warm loop (`python -m bench.route_latency`, route.json): between two
requests' decisions the rest of the gateway's work evicts the router's code
and data from the CPU's caches. Made one after another, the decisions of
the requests that reached the router in the same turn find them warm: after
a cache sweep, different prompts decided four in a row cost 0.22 ms each
against 0.33 ms for one (route.json). A call waits one turn of the loop, so
the planner uses a turn only when the gateway is busy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Turn(Generic[T]):
    """Calls queued while a turn of the loop runs, made in order at the start
    of the next; `after` runs once they are all made."""

    def __init__(self, after: Callable[[], None] = lambda: None) -> None:
        self._after = after
        self._waiting: list[tuple[Callable[[], T], asyncio.Future[T]]] = []
        self.turns = 0  # turns that made calls (tests, benchmarks)
        self.calls = 0

    @property
    def pending(self) -> bool:
        """Calls are waiting for the next turn."""
        return bool(self._waiting)

    async def run(self, call: Callable[[], T]) -> T:
        """`call()`'s result (or its exception), made with the others queued
        in this turn."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        if not self._waiting:
            loop.call_soon(self._run_all)
        self._waiting.append((call, done))
        return await done

    def _run_all(self) -> None:
        waiting, self._waiting = self._waiting, []
        self.turns += 1
        try:
            for call, done in waiting:
                if done.cancelled():  # its request was cancelled meanwhile
                    continue
                self.calls += 1
                try:
                    done.set_result(call())
                except Exception as exc:  # the caller's, raised where it awaits
                    done.set_exception(exc)
        finally:
            self._after()
