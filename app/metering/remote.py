"""Energy metering through a telemetry agent next to the GPUs (`joulegate agent`),
over its batched window protocol."""

from __future__ import annotations

import asyncio
import logging
import secrets
from functools import partial
from typing import Any

from app.jsonio import dumps, loads
from app.metering.meter import Done, Progress, Waiting, split_window
from app.outage import Outage
from app.upstream.client import Headers, Upstream, UpstreamError
from telemetry import protocol
from telemetry.rates import TOKEN_COUNTS, TokenRates
from telemetry.timeline import EnergyFigure, Point
from telemetry.window import WindowNames

log = logging.getLogger("joulegate.meter")

AGENT_TIMEOUT_S = 10.0  # one batch exchange with an agent
MAX_BATCH_BYTES = 4 * 1024 * 1024  # a batch's calls, encoded (the agent takes 16 MiB)
SETTLE_POLL_S = 0.1  # final figures are asked for together this often (a counter step)
CLOSE_WAIT_S = 0.25  # the longest an answer waits for its window's provisional figure
WARN_EVERY_S = 30.0  # while an agent fails, how often the log says so again
DOWN_POLL_S = 1.0  # while an agent fails, the final figures are asked for at most this
# often; while few wait (FEW_WAITING), first after one poll, then at twice the
# last pause, so a blip in a quiet hour costs a figure a poll or two, not a
# second (under load the next request's exchange finds the agent back at once)
FEW_WAITING = 64

Curve = tuple[float, ...] | None  # an operating curve's coefficients (None: token counts)


class AgentCalls:
    """Window calls to one agent, sent in batches: the calls made while a batch
    is on its way wait and go together in the next one. One request at a time
    costs one exchange, as before; under load, one exchange carries many.

    Windows are named here and their openings waited for by nobody: the
    openings made meanwhile go first in the next batch (before any call about
    them), one call per device and curve."""

    def __init__(self, upstream: Upstream, base: str, headers: Headers = ()) -> None:
        self._upstream = upstream
        self._url = base.rstrip("/") + protocol.BATCH_PATH
        self._headers = headers
        self._queue: list[tuple[dict[str, Any], asyncio.Future[Any]]] = []
        self._opening: dict[tuple[str, Curve], list[str]] = {}
        self._sender: asyncio.Task[None] | None = None
        self.exchanges = 0  # batches sent (tests, benchmarks)
        self._outage = Outage(log, f"agent {self._url}",
                              "requests go on without energy figures until it answers",
                              WARN_EVERY_S)

    async def call(self, call: dict[str, Any]) -> Any:
        """The call's answer body, or None when it failed (logged)."""
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((call, waiter))
        self._send_soon()
        return await waiter

    def open(self, device: str, curve: Curve, wid: str) -> None:
        """Open the window `wid` with the next batch; nothing waits for it."""
        self._opening.setdefault((device, curve), []).append(wid)
        self._send_soon()

    def _send_soon(self) -> None:
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_all())

    def _take_openings(self) -> None:
        """The openings waiting, as calls at the head of the queue."""
        if not self._opening:
            return
        loop = asyncio.get_running_loop()
        calls = []
        for (device, curve), wids in self._opening.items():
            call = protocol.open_call(device, wids, curve)
            opened: asyncio.Future[Any] = loop.create_future()
            opened.add_done_callback(partial(self._check_opened, len(wids)))
            calls.append((call, opened))
        self._opening = {}
        self._queue[:0] = calls

    def _check_opened(self, asked: int, opened: asyncio.Future[Any]) -> None:
        answer = opened.result()
        got = protocol.opened(answer)
        if answer is not None and (got is None or len(got) != asked):
            log.warning("agent %s opened %s of %d windows (an agent older than the "
                        "gateway does not take named windows: upgrade it)", self._url,
                        len(got) if got is not None else "none", asked)

    async def _send_all(self) -> None:
        try:
            while self._queue or self._opening:
                self._take_openings()
                batch, payload = self._next_batch()
                try:
                    answers = await self._exchange(payload, len(batch))
                except BaseException:  # cancelled (shutting down): no call waits forever
                    answers = [None] * len(batch)
                    raise
                finally:
                    self._answer(batch, answers)
        finally:
            self._sender = None
            self._take_openings()
            left, self._queue = self._queue, []
            self._answer(left, [None] * len(left))

    def _next_batch(self) -> tuple[list[tuple[dict[str, Any], asyncio.Future[Any]]], bytes]:
        """The calls waiting, up to MAX_BATCH_BYTES of them (one at least), encoded."""
        parts: list[bytes] = []
        size = 0
        for call, _ in self._queue:
            part = dumps(call)
            if parts and size + len(part) > MAX_BATCH_BYTES:
                break
            parts.append(part)
            size += len(part) + 1
        batch, self._queue = self._queue[:len(parts)], self._queue[len(parts):]
        return batch, b'{"calls":[' + b",".join(parts) + b"]}"

    def _answer(self, batch: list[tuple[dict[str, Any], asyncio.Future[Any]]],
                answers: list[Any]) -> None:
        for (_, waiter), answer in zip(batch, answers, strict=True):
            if not waiter.done():
                waiter.set_result(answer)

    async def _exchange(self, payload: bytes, calls: int) -> list[Any]:
        """One batch of `calls` calls; each one's body when it succeeded, else None."""
        none: list[Any] = [None] * calls
        self.exchanges += 1
        try:
            async with asyncio.timeout(AGENT_TIMEOUT_S):
                raw, status = await self._post(payload)
        except (UpstreamError, TimeoutError) as exc:
            self._outage.fail(str(exc) or "no answer in time")
            return none
        if status != 200:
            self._outage.fail(f"answered {status}" + (
                " (set JOULEGATE_AGENT_TOKEN to the agent's token)" if status == 401 else ""))
            return none
        try:
            bodies = protocol.batch_bodies(loads(raw), calls)
        except ValueError:
            bodies = None
        if bodies is None:
            self._outage.fail("not a batch answer")
            return none
        self._outage.answered()
        return bodies

    @property
    def down(self) -> bool:
        """Whether the last exchange got no answer (the agent is failing)."""
        return self._outage.down

    @property
    def failed(self) -> int:
        """Exchanges that got no batch answer."""
        return self._outage.failures

    async def _post(self, payload: bytes) -> tuple[bytes, int]:
        r = await self._upstream.post_again_if_reset(self._url, payload, self._headers)
        try:
            return await r.read(), r.status
        finally:
            await r.aclose()


class RemoteMeter:
    """Ledgers in `joulegate agent`s next to the GPUs, over HTTP: each device's
    calls go to the agent on its machine (`agents`: device name -> base URL),
    in batches (AgentCalls). The windows waiting for a final figure are asked
    about together every `poll_s`: one `results` call per device. Every call
    carries the agent's `token` and this gateway's id (the agent lets only
    the gateway that opened a window close it)."""

    def __init__(self, upstream: Upstream, agents: dict[str, str],
                 settle_timeout_s: float = 3.0, poll_s: float = SETTLE_POLL_S,
                 token: str | None = None) -> None:
        headers = [(protocol.GATEWAY_HEADER, secrets.token_hex(8))]
        if token:
            headers.append(("Authorization", f"Bearer {token}"))
        by_base: dict[str, AgentCalls] = {}
        self._agents = {device: by_base.setdefault(url.rstrip("/"),
                                                   AgentCalls(upstream, url, headers))
                        for device, url in agents.items()}
        self._timeout_s = settle_timeout_s
        self._poll_s = poll_s
        self._waiting = Waiting()
        self._poller: asyncio.Task[None] | None = None
        self._names = WindowNames()
        self._closing: set[asyncio.Future[Any]] = set()  # closes that outlived their wait
        # failing agent -> (its last poll, the pause before the next)
        self._asked_down: dict[AgentCalls, tuple[float, float]] = {}

    async def _call(self, device: str, call: dict[str, Any]) -> Any:
        agent = self._agents.get(device)
        return None if agent is None else await agent.call(call)

    def _skip(self, device: str, now: float, waiting: int = 1) -> bool:
        """Whether this poll leaves the device's agent out: it is failing and
        was asked less than its pause ago (DOWN_POLL_S; doubling up to it
        while at most FEW_WAITING windows wait for it)."""
        agent = self._agents.get(device)
        if agent is None or not agent.down:
            if agent is not None:
                self._asked_down.pop(agent, None)
            return False
        last, pause = self._asked_down.get(agent, (float("-inf"), self._poll_s / 2))
        if now == last:  # its other devices, in the same poll
            return False
        if now - last < pause:
            return True
        self._asked_down[agent] = (now, min(2 * pause, DOWN_POLL_S)
                                   if waiting <= FEW_WAITING else DOWN_POLL_S)
        return False

    async def open(self, device: str, progress: Progress | None = None,
                   rates: TokenRates = TOKEN_COUNTS) -> str | None:
        """A window named here and opened with the next batch: the request goes
        to its worker without waiting for the agent. (Progress stays here: the
        agent learns a request's tokens when it closes.)"""
        agent = self._agents.get(device)
        if agent is None:
            return None
        wid = self._names.next()
        agent.open(device, rates.coef, wid)
        return f"{device}/{wid}"

    async def close(self, window: str | None, points: list[Point]) -> EnergyFigure | None:
        """Close the window; its provisional figure if the agent answers within
        CLOSE_WAIT_S. A slow or hung agent never delays the answer: the close
        goes on without the request, the response says no figure, and the
        final figure follows (when_final) once the agent answers."""
        if window is None:
            return None
        device, wid = split_window(window)
        closing = asyncio.ensure_future(
            self._call(device, protocol.close_call(device, wid, points)))
        # asyncio.wait, not asyncio.timeout: an exchange's end may run partly in
        # another task (app.forward.watch.shielded), which a timeout would cancel.
        done, _ = await asyncio.wait({closing}, timeout=CLOSE_WAIT_S)
        if closing in done:
            return protocol.as_figure(closing.result())
        self._closing.add(closing)  # kept until it ends
        closing.add_done_callback(self._closing.discard)
        return None

    async def abandon(self, window: str | None) -> None:
        await self.close(window, [])

    async def result(self, window: str) -> EnergyFigure | None:
        device, wid = split_window(window)
        return protocol.as_figure(await self._call(device, protocol.result_call(device, wid)))

    def when_final(self, window: str, done: Done) -> None:
        loop = asyncio.get_running_loop()
        self._waiting.add(window, done, loop.time() + self._timeout_s)
        if self._poller is None:
            self._poller = asyncio.create_task(self._poll())

    def give_some(self) -> None:
        self._waiting.give_some()

    async def _poll(self) -> None:
        """Every poll_s while windows wait: the figures of each device's
        waiting windows, in one call per device."""
        loop = asyncio.get_running_loop()
        try:
            while self._waiting:
                await asyncio.sleep(self._poll_s)
                # Per device, one call for the windows waiting (final figures
                # only) and one for those past their timeout (whatever figure
                # they have).
                due = set(self._waiting.due(loop.time()))
                asks: dict[tuple[str, bool], list[str]] = {}
                for window in self._waiting.windows():
                    device, wid = split_window(window)
                    asks.setdefault((device, window in due), []).append(wid)
                # A failing agent is asked at most once every DOWN_POLL_S (at
                # shorter, doubling pauses while few windows wait: `_skip`), not
                # every poll: asking about thousands of windows ten times a
                # second, for no answer, only costs the requests in flight.
                now = loop.time()
                waiting: dict[str, int] = {}
                for (device, _), wids in asks.items():
                    waiting[device] = waiting.get(device, 0) + len(wids)
                skip = {device for device, n in waiting.items() if self._skip(device, now, n)}
                asks = {k: wids for k, wids in asks.items() if k[0] not in skip or k[1]}
                answers = await asyncio.gather(*(
                    _none() if device in skip
                    else self._call(device, protocol.results_call(device, wids,
                                                                  final_only=not past))
                    for (device, past), wids in asks.items()))
                ready: dict[str, EnergyFigure | None] = {}
                for ((device, _), wids), answer in zip(asks.items(), answers, strict=True):
                    figures = protocol.figures(answer, len(wids))
                    if figures is None:
                        # No answer: ask again next time; the windows past
                        # their timeout get none.
                        ready.update((w, None) for w in (f"{device}/{wid}" for wid in wids)
                                     if w in due)
                        continue
                    for wid, data in zip(wids, figures, strict=True):
                        if data == protocol.PENDING:
                            continue  # not final yet (and not past its timeout)
                        window, figure = f"{device}/{wid}", protocol.as_figure(data)
                        if figure is None or figure.final or window in due:
                            ready[window] = figure
                self._waiting.ready(list(ready), ready.__getitem__, loop)
        finally:
            self._poller = None

    async def drain(self, timeout_s: float) -> None:
        await self._waiting.drain(timeout_s, lambda window: None)  # the agent may be gone


async def _none() -> None:
    """The answer of an agent that is not asked."""
    return None
