"""The gateway's view of energy metering: in-process ledgers or a remote agent.

Both implement `Meter`; the proxy does not know which one it has. A metering
failure never fails a request: it yields no figure, and the response says so.

A request's final figure comes a counter step or so after it ended. Nothing
waits for it per request: `when_final` leaves a callback, which the meter
calls once the figure is final (or with the provisional figure after a
timeout, when the counter stopped, say). The callbacks of the figures a
counter step makes final run a few at a time as requests end (`give_some`,
in each ending request's bookkeeping, after its response is out), not as a
burst in the middle of the requests in flight; those no ending request
took are given GIVE_AFTER_S later, a few per turn of the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

from telemetry.rates import TOKEN_COUNTS, TokenRates
from telemetry.timeline import EnergyFigure, Point

log = logging.getLogger("joulegate.meter")


Progress = Callable[[int], list[Point]]
Done = Callable[[EnergyFigure | None], None]  # given the final figure (or the last one)
SWEEP_S = 0.25  # how often windows past their timeout are looked for


class Meter(Protocol):
    async def open(self, device: str, progress: Progress | None = None,
                   rates: TokenRates = TOKEN_COUNTS) -> str | None: ...
    async def close(self, window: str | None, points: list[Point]) -> EnergyFigure | None: ...
    async def abandon(self, window: str | None) -> None: ...
    def when_final(self, window: str, done: Done) -> None: ...
    def give_some(self) -> None: ...
    async def result(self, window: str) -> EnergyFigure | None: ...
    async def drain(self, timeout_s: float) -> None: ...


async def final_figure(meter: Meter, window: str) -> EnergyFigure | None:
    """Wait for a window's final figure (or its last one, after the meter's timeout)."""
    waiter: asyncio.Future[EnergyFigure | None] = asyncio.get_running_loop().create_future()

    def done(figure: EnergyFigure | None) -> None:
        if not waiter.done():
            waiter.set_result(figure)

    meter.when_final(window, done)
    return await waiter


def split_window(window: str) -> tuple[str, str]:
    device, _, wid = window.partition("/")
    return device, wid


GIVE_CHUNK = 4  # final figures given per turn of the event loop
GIVE_PER_END = 2  # final figures given as each request ends (give_some)
GIVE_AFTER_S = 0.05  # those no ending request took by then: given GIVE_CHUNK per turn

FigureOf = Callable[[str], EnergyFigure | None]


class Waiting:
    """Windows whose final figure is awaited: the callback of each, and the
    loop time at which to stop waiting and give it the figure it has; and the
    windows whose figure is final, waiting for their callback's turn."""

    def __init__(self) -> None:
        self._by_window: dict[str, tuple[Done, float]] = {}
        self._final: deque[tuple[str, FigureOf]] = deque()
        self._flush: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._by_window)

    def __contains__(self, window: str) -> bool:
        return window in self._by_window

    def add(self, window: str, done: Done, until: float) -> None:
        self._by_window[window] = (done, until)

    def give(self, window: str, figure: EnergyFigure | None) -> None:
        """Call the window's callback with `figure`, once (later calls: nothing)."""
        entry = self._by_window.pop(window, None)
        if entry is not None:
            try:
                entry[0](figure)
            except Exception:  # one request's bookkeeping must not stop the others'
                log.exception("recording the final figure of %s", window)

    def give_spread(self, windows: list[str], figure_of: Callable[[str], EnergyFigure | None],
                    loop: asyncio.AbstractEventLoop) -> None:
        """Give `windows` their figures GIVE_CHUNK at a time, one turn of the
        loop per chunk: a counter step that settles hundreds of windows at
        once (their metrics, usage rows, holds) no longer stalls the requests
        in flight for milliseconds; they get the loop between chunks."""
        for window in windows[:GIVE_CHUNK]:
            self.give(window, figure_of(window))
        if len(windows) > GIVE_CHUNK:
            loop.call_soon(self.give_spread, windows[GIVE_CHUNK:], figure_of, loop)

    def ready(self, windows: list[str], figure_of: FigureOf,
              loop: asyncio.AbstractEventLoop) -> None:
        """Windows whose figures are final: given by `give_some` as requests
        end, or GIVE_AFTER_S from now, whichever comes first."""
        self._final.extend((w, figure_of) for w in windows)
        if self._flush is None and self._final:
            self._flush = loop.call_later(GIVE_AFTER_S, self._give_left, loop)

    def give_some(self, n: int = GIVE_PER_END) -> None:
        """Give the next `n` final figures (an ending request's share)."""
        final = self._final
        for _ in range(min(n, len(final))):
            window, figure_of = final.popleft()
            if window in self._by_window:
                self.give(window, figure_of(window))

    def _give_left(self, loop: asyncio.AbstractEventLoop) -> None:
        """The final figures no ending request took: GIVE_CHUNK per turn."""
        self._flush = None
        left = [(w, f) for w, f in self._final if w in self._by_window]
        self._final.clear()
        if left:
            figures = dict(left)
            self.give_spread([w for w, _ in left], lambda w: figures[w](w), loop)

    def windows(self) -> list[str]:
        return list(self._by_window)

    def due(self, now: float) -> list[str]:
        return [w for w, (_, until) in self._by_window.items() if now >= until]

    async def drain(self, timeout_s: float,
                    last: Callable[[str], EnergyFigure | None]) -> None:
        """Shutting down: wait up to `timeout_s` for the figures to come, then
        give each window still waiting `last(window)` (its usage row is written
        with what there is)."""
        loop = asyncio.get_running_loop()
        self.give_some(len(self._final))
        limit = loop.time() + timeout_s
        # Shutting down only: figures arrive from other threads' callbacks.
        while self._by_window and loop.time() < limit:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        for window in self.windows():
            self.give(window, last(window))
