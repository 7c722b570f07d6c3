"""`joulegate agent`: samplers and ledgers next to the GPUs, served over HTTP.

Several gateway processes (or replicas) can send to the same GPU; attribution
needs every request on a device in one ledger, so the ledger lives here, one
per host, and gateways open and close their windows over HTTP with the
messages of telemetry/protocol.py (a batch of window calls, or one call on a
path of its own); also GET /metrics (device energy, power, idle) and
GET /healthz.

Every request a gateway forwards opens and closes a window and asks for its
final figure, so these must cost little. A gateway sends them in batches
(app/metering/remote.py: the calls its requests make while a batch is on its way go in
the next one, the windows it opened meanwhile in one `open` call per device
and curve, named by the gateway so that no request waits for its opening,
and the final figures of all its waiting windows are asked for in one
`results` call every 100 ms), and
one asyncio loop on its own thread serves them over keep-alive HTTP/1.1 (the
standard library's threaded `http.server` cost ~1 ms of CPU a call, with a
thread per connection). A single `result` call with `wait_s` waits on a
future its window's settling resolves (the ledger's `on_final`, on the
sampler thread). Standard library only: telemetry imports nothing but the
stdlib, pynvml and prometheus_client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

from telemetry.devices import MeteredDevice
from telemetry.ledger import Ledger
from telemetry.metrics import CONTENT_TYPE, Metrics
from telemetry.protocol import BATCH_PATH, CALL_PATH, CALLS, PENDING, batch_answer
from telemetry.rates import TOKEN_COUNTS, TokenRates
from telemetry.timeline import EnergyFigure

log = logging.getLogger("joulegate.agent")

MAX_WAIT_S = 10.0
MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024  # a batch of long answers' token points
JSON = "application/json"
Reply = tuple[int, bytes, str]
Answer = tuple[int, Any]  # status, JSON body
_WINDOW_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_CURVES = 256  # operating curves remembered (one per backend a gateway sends)


def _json(status: int, obj: Any) -> Reply:
    return status, json.dumps(obj).encode(), JSON


def _error(status: int, message: str) -> Answer:
    return status, {"error": {"message": message, "type": "invalid_request_error",
                              "param": None, "code": None}}


def _dict(figure: EnergyFigure | None) -> dict[str, Any] | None:
    return None if figure is None else figure.as_dict()


def _figure(figure: EnergyFigure | None, wid: str) -> Answer:
    return _error(404, f"no window {wid}") if figure is None else (200, figure.as_dict())


class AgentServer:
    """The agent's HTTP server: an asyncio loop on a thread of its own."""

    def __init__(self, devices: dict[str, MeteredDevice], metrics: Metrics,
                 new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
                 ) -> None:
        self.devices = devices
        self.metrics = metrics
        self.loop = new_loop()
        self._server: asyncio.Server | None = None
        self._waiting: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._rates: dict[tuple[float, ...], TokenRates] = {}
        for name, device in devices.items():
            device.ledger.on_final = self._final_callback(name)

    # -- final figures -----------------------------------------------------
    def _final_callback(self, device: str) -> Callable[[list[str]], None]:
        def on_final(finals: list[str]) -> None:  # on a sampler thread
            waited = [wid for wid in finals if (device, wid) in self._waiting]
            if waited:
                self.loop.call_soon_threadsafe(self._settled, device, waited)
        return on_final

    def _settled(self, device: str, wids: list[str]) -> None:
        for wid in wids:
            waiter = self._waiting.get((device, wid))
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def result(self, device: str, wid: str, wait_s: object) -> EnergyFigure | None:
        """The window's figure; with `wait_s`, held until it is final or that long
        has passed (one call instead of a gateway polling)."""
        ledger = self.devices[device].ledger
        figure = ledger.result(wid)
        if figure is None or figure.final or not isinstance(wait_s, int | float) \
                or wait_s <= 0:
            return figure
        waiter = self._waiting[(device, wid)] = self.loop.create_future()
        try:
            figure = ledger.result(wid)  # settled before the waiter was in place?
            if figure is not None and not figure.final:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(float(wait_s), MAX_WAIT_S)):
                        await waiter
                figure = ledger.result(wid)
        finally:
            self._waiting.pop((device, wid), None)
        return figure

    # -- the API -----------------------------------------------------------
    async def answer(self, method: str, path: str, raw: bytes) -> Reply:
        if method == "GET":
            if path == "/metrics":
                return 200, self.metrics.render(), CONTENT_TYPE
            if path == "/healthz":
                return _json(200, {"status": "ok", "devices": sorted(self.devices)})
            return _json(*_error(404, f"no route {path}"))
        if method != "POST":
            return _json(*_error(405, f"{method} is not served"))
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return _json(*_error(400, "body must be JSON"))
        if path == BATCH_PATH:
            return _json(*await self._batch(body))
        call = path.removeprefix(CALL_PATH)
        if call not in CALLS or call == path:
            return _json(*_error(404, f"no route {path}"))
        return _json(*await self.window_call(call, body, wait=True))

    async def window_call(self, call: str, body: Any, wait: bool) -> Answer:
        """One open, close or result call; `wait`: a result may be held (wait_s)."""
        try:
            name = body["device"]
            ledger = self.devices[name].ledger
        except (KeyError, TypeError):
            return _error(400, "body must be JSON with a known 'device'")
        if call == "open":
            return self._open(ledger, body)
        if call == "results":
            wids = body.get("windows")
            if not isinstance(wids, list):
                return _error(400, "windows must be a list of window ids")
            if body.get("final_only") is True:  # no provisional figures: not asked for
                return 200, {"figures": [PENDING if ledger.waiting(w) else _dict(ledger.result(w))
                                         for w in map(str, wids)]}
            return 200, {"figures": [_dict(ledger.result(w)) for w in map(str, wids)]}
        wid = str(body.get("window", ""))
        if call == "close":
            try:
                points = [(float(t), int(p), int(d)) for t, p, d in body.get("points", [])]
            except (TypeError, ValueError):
                return _error(400, "points must be [offset_s, prompt_tokens, decode_tokens]")
            return _figure(ledger.close(wid, points), wid)
        return _figure(await self.result(name, wid, body.get("wait_s") if wait else None), wid)

    def _open(self, ledger: Ledger, body: dict[str, Any]) -> Answer:
        try:
            rates = self._curve_rates(body["curve"]) if "curve" in body else TOKEN_COUNTS
        except (TypeError, ValueError) as exc:
            return _error(400, f"curve: 7 coefficients expected ({exc})")
        names = body.get("windows")
        if names is None:
            return 200, {"window": ledger.open(rates=rates)}
        if not isinstance(names, list) or not all(
                isinstance(w, str) and _WINDOW_ID.fullmatch(w) for w in names):
            return _error(400, "windows must be a list of ids of 1-64 letters, digits, _ or -")
        # Named by the gateway, which does not wait for them: a name taken is
        # left out of the answer (its request gets no figure).
        return 200, {"windows": [w for w in names if ledger.open_named(w, rates)]}

    def _curve_rates(self, curve: Any) -> TokenRates:
        """The token rates of a curve's coefficients, remembered: every request
        of a backend sends the same curve."""
        key = tuple(curve)
        rates = self._rates.get(key)
        if rates is None:
            rates = TokenRates.from_curve(curve)
            if len(self._rates) >= MAX_CURVES:
                self._rates.clear()
            self._rates[key] = rates
        return rates

    async def _batch(self, body: Any) -> Answer:
        """Several window calls in one exchange, answered in order; none waits."""
        calls = body.get("calls") if isinstance(body, dict) else None
        if not isinstance(calls, list):
            return _error(400, "body must be {\"calls\": [...]}")
        results = []
        for c in calls:
            call = c.get("call") if isinstance(c, dict) else None
            results.append(await self.window_call(call, c, wait=False) if call in CALLS
                           else _error(400, f"call must be one of {CALLS}"))
        return 200, batch_answer(results)

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        """Keep-alive HTTP/1.1: requests with a Content-Length body, one at a time."""
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the client closed
                except asyncio.LimitOverrunError:
                    await _send(writer, _json(*_error(431, "request head too large")),
                                close=True)
                    return
                request = _parse_head(head)
                if request is None:
                    await _send(writer, _json(*_error(400, "not an HTTP/1.1 request with a "
                                                           "Content-Length")), close=True)
                    return
                method, path, length, close = request
                raw = await reader.readexactly(length) if length else b""
                try:
                    reply = await self.answer(method, path, raw)
                except Exception:
                    log.exception("%s %s", method, path)
                    reply = _json(*_error(500, "agent error"))
                await _send(writer, reply, close)
                if close:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    # -- running ---------------------------------------------------------
    def start(self, host: str, port: int, socket_path: str | None = None) -> threading.Thread:
        """Serve on host:port, or on the Unix socket `socket_path` (gateway
        processes on the same machine: cheaper than TCP)."""
        started = threading.Event()
        failed: list[OSError] = []

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            try:
                self._server = self.loop.run_until_complete(
                    asyncio.start_unix_server(self._connection, socket_path,
                                              limit=MAX_HEAD_BYTES)
                    if socket_path else
                    asyncio.start_server(self._connection, host, port, limit=MAX_HEAD_BYTES))
            except OSError as exc:
                failed.append(exc)
                return
            finally:
                started.set()
            self.loop.run_forever()
            self.loop.close()

        thread = threading.Thread(target=run, name="joulegate-agent", daemon=True)
        thread.start()
        started.wait()
        if failed:
            where = socket_path or f"{host}:{port}"
            raise RuntimeError(f"agent could not listen on {where}: {failed[0]}")
        return thread

    def shutdown(self) -> None:
        """Stop listening, end open connections and the loop's thread."""
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)
        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)
            self.loop.call_soon_threadsafe(self.loop.stop)



def _parse_head(head: bytes) -> tuple[str, str, int, bool] | None:
    """(method, path, body length, close after) of a request head, or None."""
    try:
        line, *fields = head.decode("latin-1").split("\r\n")
        method, path, version = line.split(" ")
        headers = {k.strip().lower(): v.strip() for k, _, v in
                   (f.partition(":") for f in fields if f)}
        length = int(headers.get("content-length", "0"))
    except ValueError:
        return None
    if not version.startswith("HTTP/1.") or "chunked" in headers.get("transfer-encoding", "") \
            or not 0 <= length <= MAX_BODY_BYTES:
        return None
    close = headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"
    return method, path.split("?", 1)[0], length, close


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 500: "Internal Server Error"}


async def _send(writer: asyncio.StreamWriter, reply: Reply, close: bool) -> None:
    status, body, content_type = reply
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            f"content-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
            + ("connection: close\r\n" if close else "") + "\r\n")
    writer.write(head.encode("latin-1") + body)
    await writer.drain()


def start_agent(host: str, port: int, devices: dict[str, MeteredDevice], metrics: Metrics,
                new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop,
                socket_path: str | None = None) -> tuple[AgentServer, threading.Thread]:
    """Serve in a background thread; `server.shutdown()` stops it. `new_loop`:
    the event loop's maker (the CLI gives uvloop's where it is installed);
    `socket_path`: a Unix socket to serve on instead of host:port."""
    metrics.watch_devices(lambda: [d.view() for d in devices.values()])
    server = AgentServer(devices, metrics, new_loop)
    return server, server.start(host, port, socket_path)
