"""Energy metering in this process: ledgers fed by this process's samplers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from app.metering.meter import SWEEP_S, Done, Progress, Waiting, split_window
from telemetry.ledger import Ledger
from telemetry.rates import TOKEN_COUNTS, TokenRates
from telemetry.timeline import EnergyFigure, Point

log = logging.getLogger("joulegate.meter")


class LocalMeter:
    """Ledgers in this process, fed by this process's samplers.

    Running requests report their token progress to the ledger as it happens,
    and a ledger says which figures a counter step made final (on its sampler
    thread): one hop to the event loop per step delivers them all.
    """

    def __init__(self, ledgers: dict[str, Ledger], settle_timeout_s: float = 4.0) -> None:
        self._ledgers = ledgers
        self._timeout_s = settle_timeout_s
        self._waiting = Waiting()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        for device, ledger in ledgers.items():
            ledger.on_final = self._final_callback(device)

    def _final_callback(self, device: str) -> Callable[[list[str]], None]:
        def on_final(finals: list[str]) -> None:  # on a sampler thread, or the loop's
            # A window added after this check finds its figure final itself.
            mine = [w for w in (f"{device}/{wid}" for wid in finals) if w in self._waiting]
            if mine and self._loop is not None:
                if _running_loop() is self._loop:  # settled by give_some, on the loop
                    self._give(mine)
                else:
                    self._loop.call_soon_threadsafe(self._give, mine)
        return on_final

    def _give(self, finals: list[str]) -> None:
        assert self._loop is not None
        self._waiting.ready(finals, self._result, self._loop)

    def give_some(self) -> None:
        """As a request ends: the counter step its sampler left to the loop
        (Ledger.settle_deferred), and a few final figures."""
        for ledger in self._ledgers.values():
            ledger.settle_deferred()
        self._waiting.give_some()

    async def open(self, device: str, progress: Progress | None = None,
                   rates: TokenRates = TOKEN_COUNTS) -> str | None:
        ledger = self._ledgers.get(device)
        return None if ledger is None else f"{device}/{ledger.open(progress, rates)}"

    async def close(self, window: str | None, points: list[Point]) -> EnergyFigure | None:
        if window is None:
            return None
        device, wid = split_window(window)
        return self._ledgers[device].close(wid, points)

    async def abandon(self, window: str | None) -> None:
        if window is not None:
            device, wid = split_window(window)
            self._ledgers[device].abandon(wid)

    def _result(self, window: str) -> EnergyFigure | None:
        device, wid = split_window(window)
        ledger = self._ledgers.get(device)
        return None if ledger is None else ledger.result(wid)

    async def result(self, window: str) -> EnergyFigure | None:
        return self._result(window)

    def when_final(self, window: str, done: Done) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._waiting.add(window, done, loop.time() + self._timeout_s)
        device, wid = split_window(window)
        ledger = self._ledgers.get(device)
        # After adding: a step may have finalized it since.
        if ledger is None or not ledger.waiting(wid):
            loop.call_soon(self._waiting.give, window, self._result(window))
        elif self._sweeper is None:
            self._sweeper = loop.call_later(SWEEP_S, self._sweep)

    def _sweep(self) -> None:
        """Give windows past their timeout the figure they have (provisional)."""
        assert self._loop is not None
        self._waiting.give_spread(self._waiting.due(self._loop.time()), self._result,
                                  self._loop)
        self._sweeper = self._loop.call_later(SWEEP_S, self._sweep) if self._waiting else None

    async def drain(self, timeout_s: float) -> None:
        await self._waiting.drain(timeout_s, self._result)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # a sampler thread
        return None
