"""The gateway's view of energy metering: in-process ledgers or a remote agent.

Both implement `Meter`; the proxy does not know which one it has. A metering
failure never fails a request: it yields no figure, and the response says so.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any, Protocol

from app.upstream import Upstream, UpstreamError
from telemetry.ledger import Ledger
from telemetry.rates import TOKEN_COUNTS, TokenRates
from telemetry.timeline import EnergyFigure, Point

log = logging.getLogger("joulegate.meter")


Progress = Callable[[int], list[Point]]


class Meter(Protocol):
    async def open(self, device: str, progress: Progress | None = None,
                   rates: TokenRates = TOKEN_COUNTS) -> str | None: ...
    async def close(self, window: str | None, points: list[Point]) -> EnergyFigure | None: ...
    async def abandon(self, window: str | None) -> None: ...
    async def settle(self, window: str) -> EnergyFigure | None: ...
    async def result(self, window: str) -> EnergyFigure | None: ...


def _split(window: str) -> tuple[str, str]:
    device, _, wid = window.partition("/")
    return device, wid


class LocalMeter:
    """Ledgers in this process, fed by this process's samplers.

    Running requests report their token progress to the ledger as it happens,
    and a ledger says when a figure becomes final (on its sampler thread), so
    waiting for a final figure costs no polling.
    """

    def __init__(self, ledgers: dict[str, Ledger], settle_timeout_s: float = 4.0) -> None:
        self._ledgers = ledgers
        self._timeout_s = settle_timeout_s
        self._waiters: dict[str, asyncio.Future[EnergyFigure]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        for device, ledger in ledgers.items():
            ledger.on_final = self._final_callback(device)

    def _final_callback(self, device: str) -> Callable[[str, EnergyFigure], None]:
        def on_final(wid: str, figure: EnergyFigure) -> None:  # on a sampler thread
            window = f"{device}/{wid}"
            if window in self._waiters and self._loop is not None:
                self._loop.call_soon_threadsafe(self._resolve, window, figure)
        return on_final

    def _resolve(self, window: str, figure: EnergyFigure) -> None:
        waiter = self._waiters.get(window)
        if waiter is not None and not waiter.done():
            waiter.set_result(figure)

    async def open(self, device: str, progress: Progress | None = None,
                   rates: TokenRates = TOKEN_COUNTS) -> str | None:
        ledger = self._ledgers.get(device)
        return None if ledger is None else f"{device}/{ledger.open(progress, rates)}"

    async def close(self, window: str | None, points: list[Point]) -> EnergyFigure | None:
        if window is None:
            return None
        device, wid = _split(window)
        return self._ledgers[device].close(wid, points)

    async def abandon(self, window: str | None) -> None:
        if window is not None:
            device, wid = _split(window)
            self._ledgers[device].abandon(wid)

    async def result(self, window: str) -> EnergyFigure | None:
        device, wid = _split(window)
        ledger = self._ledgers.get(device)
        return None if ledger is None else ledger.result(wid)

    async def settle(self, window: str) -> EnergyFigure | None:
        """The final figure once the ledger has it, or the provisional one after
        the timeout (the counter stopped, say)."""
        self._loop = asyncio.get_running_loop()
        waiter = self._loop.create_future()
        self._waiters[window] = waiter
        try:
            figure = await self.result(window)
            if figure is None or figure.final:
                return figure
            try:
                async with asyncio.timeout(self._timeout_s):
                    final: EnergyFigure = await waiter
                    return final
            except TimeoutError:
                return await self.result(window)
        finally:
            self._waiters.pop(window, None)


class RemoteMeter:
    """Ledgers in `joulegate agent`s next to the GPUs, over HTTP: each device's
    calls go to the agent on its machine (`agents`: device name -> base URL)."""

    def __init__(self, upstream: Upstream, agents: dict[str, str],
                 settle_timeout_s: float = 3.0) -> None:
        self._upstream = upstream
        self._bases = {device: url.rstrip("/") for device, url in agents.items()}
        self._timeout_s = settle_timeout_s

    async def _call(self, path: str, body: dict[str, Any]) -> Any:
        base = self._bases.get(body["device"])
        if base is None:
            return None
        try:
            r = await self._upstream.post(base + path, body)
            try:
                raw = await r.read()
            finally:
                await r.aclose()
        except UpstreamError as exc:
            log.warning("agent %s: %s", path, exc)
            return None
        if r.status != 200:
            log.warning("agent %s answered %d", path, r.status)
            return None
        return json.loads(raw)

    async def open(self, device: str, progress: Progress | None = None,
                   rates: TokenRates = TOKEN_COUNTS) -> str | None:
        # Progress stays here: the agent learns a request's tokens when it closes.
        body: dict[str, Any] = {"device": device}
        if rates.coef is not None:
            body["curve"] = list(rates.coef)
        data = await self._call("/v1/windows/open", body)
        return None if not data else f"{device}/{data['window']}"

    async def close(self, window: str | None, points: list[Point]) -> EnergyFigure | None:
        if window is None:
            return None
        device, wid = _split(window)
        data = await self._call(
            "/v1/windows/close", {"device": device, "window": wid, "points": points})
        return _figure(data)

    async def abandon(self, window: str | None) -> None:
        await self.close(window, [])

    async def result(self, window: str) -> EnergyFigure | None:
        device, wid = _split(window)
        return _figure(await self._call(
            "/v1/windows/result", {"device": device, "window": wid}))

    async def settle(self, window: str) -> EnergyFigure | None:
        """One call the agent holds until the figure is final (or the timeout)."""
        device, wid = _split(window)
        return _figure(await self._call(
            "/v1/windows/result", {"device": device, "window": wid,
                                   "wait_s": self._timeout_s}))


def _figure(data: Any) -> EnergyFigure | None:
    if not isinstance(data, dict) or data.get("net_j") is None:
        return None
    return EnergyFigure(**{k: data[k] for k in EnergyFigure.__dataclass_fields__ if k in data})
