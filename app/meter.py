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


AGENT_TIMEOUT_S = 10.0  # one batch exchange with an agent
SETTLE_POLL_S = 0.1  # final figures are asked for together this often (a counter step)


class AgentCalls:
    """Window calls to one agent, sent in batches: the calls made while a batch
    is on its way wait and go together in the next one. One request at a time
    costs one exchange, as before; under load, one exchange carries many."""

    def __init__(self, upstream: Upstream, base: str) -> None:
        self._upstream = upstream
        self._url = base.rstrip("/") + "/v1/windows/batch"
        self._queue: list[tuple[dict[str, Any], asyncio.Future[Any]]] = []
        self._sender: asyncio.Task[None] | None = None
        self.exchanges = 0  # batches sent (tests, benchmarks)

    async def call(self, call: dict[str, Any]) -> Any:
        """The call's answer body, or None when it failed (logged)."""
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((call, waiter))
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_all())
        return await waiter

    async def _send_all(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                answers = await self._exchange([c for c, _ in batch])
                for (call, waiter), answer in zip(batch, answers, strict=True):
                    if not waiter.done():
                        waiter.set_result(answer)
                    elif call["call"] == "open" and answer:  # its request was cancelled:
                        # close the window it will never close
                        self._queue.append(({"call": "close", "device": call["device"],
                                             "window": answer["window"], "points": []},
                                            asyncio.get_running_loop().create_future()))
        finally:
            self._sender = None

    async def _exchange(self, calls: list[dict[str, Any]]) -> list[Any]:
        """One batch; each call's body when it succeeded, else None."""
        none: list[Any] = [None] * len(calls)
        self.exchanges += 1
        try:
            async with asyncio.timeout(AGENT_TIMEOUT_S):
                raw, status = await self._post(json.dumps({"calls": calls}).encode())
        except (UpstreamError, TimeoutError) as exc:
            log.warning("agent %s: %s", self._url, exc or "no answer in time")
            return none
        if status != 200:
            log.warning("agent %s answered %d", self._url, status)
            return none
        try:
            results = json.loads(raw)["results"]
            assert isinstance(results, list) and len(results) == len(calls)
        except (ValueError, KeyError, TypeError, AssertionError):
            log.warning("agent %s: not a batch answer", self._url)
            return none
        return [r.get("body") if isinstance(r, dict) and r.get("status") == 200 else None
                for r in results]

    async def _post(self, payload: bytes) -> tuple[bytes, int]:
        try:
            r = await self._upstream.post(self._url, payload)
        except UpstreamError as exc:
            if exc.kind != "reset":
                raise
            # A kept-alive connection the agent had closed: nothing was answered.
            r = await self._upstream.post(self._url, payload, fresh=True)
        try:
            return await r.read(), r.status
        finally:
            await r.aclose()


class RemoteMeter:
    """Ledgers in `joulegate agent`s next to the GPUs, over HTTP: each device's
    calls go to the agent on its machine (`agents`: device name -> base URL),
    in batches (AgentCalls). Final figures are not waited for one by one: the
    windows waiting for one are asked about together every `poll_s`."""

    def __init__(self, upstream: Upstream, agents: dict[str, str],
                 settle_timeout_s: float = 3.0, poll_s: float = SETTLE_POLL_S) -> None:
        by_base: dict[str, AgentCalls] = {}
        self._agents = {device: by_base.setdefault(url.rstrip("/"), AgentCalls(upstream, url))
                        for device, url in agents.items()}
        self._timeout_s = settle_timeout_s
        self._poll_s = poll_s
        # window -> (its waiter, when to stop waiting for a final figure)
        self._settling: dict[str, tuple[asyncio.Future[EnergyFigure | None], float]] = {}
        self._poller: asyncio.Task[None] | None = None

    async def _call(self, call: str, device: str, **body: Any) -> Any:
        agent = self._agents.get(device)
        return None if agent is None else await agent.call(
            {"call": call, "device": device, **body})

    async def open(self, device: str, progress: Progress | None = None,
                   rates: TokenRates = TOKEN_COUNTS) -> str | None:
        # Progress stays here: the agent learns a request's tokens when it closes.
        extra: dict[str, Any] = {} if rates.coef is None else {"curve": list(rates.coef)}
        data = await self._call("open", device, **extra)
        return None if not data else f"{device}/{data['window']}"

    async def close(self, window: str | None, points: list[Point]) -> EnergyFigure | None:
        if window is None:
            return None
        device, wid = _split(window)
        return _figure(await self._call("close", device, window=wid, points=points))

    async def abandon(self, window: str | None) -> None:
        await self.close(window, [])

    async def result(self, window: str) -> EnergyFigure | None:
        device, wid = _split(window)
        return _figure(await self._call("result", device, window=wid))

    async def settle(self, window: str) -> EnergyFigure | None:
        """The final figure, or the last provisional one after the timeout."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[EnergyFigure | None] = loop.create_future()
        self._settling[window] = (waiter, loop.time() + self._timeout_s)
        if self._poller is None:
            self._poller = asyncio.create_task(self._poll())
        try:
            return await waiter
        finally:
            self._settling.pop(window, None)

    async def _poll(self) -> None:
        """Every poll_s while windows wait: one result call each, batched."""
        loop = asyncio.get_running_loop()
        try:
            while self._settling:
                await asyncio.sleep(self._poll_s)
                waiting = list(self._settling.items())
                figures = await asyncio.gather(*(self.result(w) for w, _ in waiting))
                now = loop.time()
                for (_, (waiter, until)), figure in zip(waiting, figures, strict=True):
                    if not waiter.done() and (figure is None or figure.final or now >= until):
                        waiter.set_result(figure)
        finally:
            self._poller = None


def _figure(data: Any) -> EnergyFigure | None:
    if not isinstance(data, dict) or data.get("net_j") is None:
        return None
    return EnergyFigure(**{k: data[k] for k in EnergyFigure.__dataclass_fields__ if k in data})
