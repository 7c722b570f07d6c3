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

Trust: window calls move joules between requests (a window that claims many
tokens takes a span's energy from the others), so with a `token` every POST
must carry `Authorization: Bearer <token>` (401 otherwise; GET /metrics and
/healthz stay open for scrapers). Each window belongs to the gateway that
opened it (the `X-Joulegate-Gateway` id a gateway process sends): another
gateway can neither close it nor claim its tokens. A gateway may hold at most
MAX_OPEN_WINDOWS open, and a close's token claims are checked (at most
MAX_WINDOW_TOKENS, answer tokens no faster than MAX_DECODE_TOKENS_PER_S since
the window opened, counts that never go down); a close that fails them closes
the window with no work and answers 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import re
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from telemetry.corewatts import CoreWatts, host_packages
from telemetry.devices import MeteredDevice
from telemetry.ledger import Ledger
from telemetry.metrics import CONTENT_TYPE, OWN_WATTS_PER_CORE, Metrics
from telemetry.protocol import (
    BATCH_PATH,
    CALL_PATH,
    CALLS,
    GATEWAY_HEADER,
    PENDING,
    batch_answer,
)
from telemetry.rates import TOKEN_COUNTS, TokenRates
from telemetry.timeline import EnergyFigure, Point

log = logging.getLogger("joulegate.agent")

MAX_WAIT_S = 10.0
MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024  # a batch of long answers' token points
JSON = "application/json"
Reply = tuple[int, bytes, str]
Answer = tuple[int, Any]  # status, JSON body
_WINDOW_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_CURVES = 256  # operating curves remembered (one per backend a gateway sends)
MAX_OPEN_WINDOWS = 16_384  # per gateway process (its requests in flight)
MAX_WINDOW_TOKENS = 1 << 21  # prompt or answer tokens one request may claim
MAX_DECODE_TOKENS_PER_S = 5_000.0  # one request's answer, since its window opened
CLAIM_SLACK_S = 1.0  # the gateway opens a window a little before the agent hears of it


def _json(status: int, obj: Any) -> Reply:
    return status, json.dumps(obj).encode(), JSON


def _error(status: int, message: str) -> Answer:
    return status, {"error": {"message": message, "type": "invalid_request_error",
                              "param": None, "code": None}}


def _dict(figure: EnergyFigure | None) -> dict[str, Any] | None:
    return None if figure is None else figure.as_dict()


def _figure(figure: EnergyFigure | None, wid: str) -> Answer:
    return _error(404, f"no window {wid}") if figure is None else (200, figure.as_dict())


def checked_points(raw: Any, elapsed_s: float) -> list[Point] | str:
    """A close's token timeline, or why it cannot be believed: points of
    [offset_s, prompt_tokens, decode_tokens], finite, counts that never go
    down, at most MAX_WINDOW_TOKENS, answer tokens no faster than
    MAX_DECODE_TOKENS_PER_S over the window's life."""
    if not isinstance(raw, list):
        return "points must be a list of [offset_s, prompt_tokens, decode_tokens]"
    points: list[Point] = []
    last = (0, 0)
    most_decode = MAX_DECODE_TOKENS_PER_S * (max(0.0, elapsed_s) + CLAIM_SLACK_S)
    for point in raw:
        try:
            t, p, d = point
            t = float(t)
            if not (math.isfinite(t) and type(p) is int and type(d) is int):
                raise ValueError
        except (TypeError, ValueError):
            return "points must be [offset_s, prompt_tokens, decode_tokens]: a finite " \
                   "number and two integers"
        if not (0 <= p <= MAX_WINDOW_TOKENS and 0 <= d <= MAX_WINDOW_TOKENS):
            return f"token counts must be between 0 and {MAX_WINDOW_TOKENS}"
        if p < last[0] or d < last[1]:
            return "token counts must not go down"
        if d > most_decode:
            return f"{d} answer tokens in a window open {elapsed_s:.1f} s"
        last = (p, d)
        points.append((t, p, d))
    return points


class AgentServer:
    """The agent's HTTP server: an asyncio loop on a thread of its own."""

    def __init__(self, devices: dict[str, MeteredDevice], metrics: Metrics,
                 new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop,
                 token: str | None = None, core_watts: CoreWatts | None = None) -> None:
        self.devices = devices
        self.metrics = metrics
        # the host's watts per busy core, for the agent's own joules
        self.core_watts = core_watts or CoreWatts(OWN_WATTS_PER_CORE)
        self.loop = new_loop()
        self._auth = None if token is None else f"Bearer {token}".encode()
        # (device, window) -> the gateway that opened it, while it is open; and
        # how many each gateway holds open.
        self._owners: dict[tuple[str, str], str] = {}
        self._held: Counter[str] = Counter()
        self._warned: set[str] = set()  # gateways whose claims were refused (logged once)
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
    async def answer(self, method: str, path: str, raw: bytes,
                     headers: dict[str, str] | None = None) -> Reply:
        headers = headers or {}
        if method == "GET":
            if path == "/metrics":  # with the agent's own CPU and joules so far
                self.metrics.own_cost(*self.core_watts.rate())
                return 200, self.metrics.render(), CONTENT_TYPE
            if path == "/healthz":
                return _json(200, {"status": "ok", "devices": sorted(self.devices)})
            return _json(*_error(404, f"no route {path}"))
        if method != "POST":
            return _json(*_error(405, f"{method} is not served"))
        if self._auth is not None and not hmac.compare_digest(
                headers.get("authorization", "").encode("latin-1"), self._auth):
            return _json(*_unauthorized())
        gateway = headers.get(GATEWAY_HEADER.lower(), "-")[:64]
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return _json(*_error(400, "body must be JSON"))
        if path == BATCH_PATH:
            return _json(*await self._batch(body, gateway))
        call = path.removeprefix(CALL_PATH)
        if call not in CALLS or call == path:
            return _json(*_error(404, f"no route {path}"))
        return _json(*await self.window_call(call, body, wait=True, gateway=gateway))

    async def window_call(self, call: str, body: Any, wait: bool,
                          gateway: str = "-") -> Answer:
        """One open, close or result call from `gateway`; `wait`: a result may
        be held (wait_s)."""
        try:
            name = body["device"]
            ledger = self.devices[name].ledger
        except (KeyError, TypeError):
            return _error(400, "body must be JSON with a known 'device'")
        if call == "open":
            return self._open(name, ledger, body, gateway)
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
            return self._close(name, ledger, wid, body.get("points", []), gateway)
        return _figure(await self.result(name, wid, body.get("wait_s") if wait else None), wid)

    def _open(self, device: str, ledger: Ledger, body: dict[str, Any],
              gateway: str) -> Answer:
        try:
            rates = self._curve_rates(body["curve"]) if "curve" in body else TOKEN_COUNTS
        except (TypeError, ValueError) as exc:
            return _error(400, f"curve: 7 coefficients expected ({exc})")
        names = body.get("windows")
        if names is None:
            names = [ledger.open(rates=rates)] if self._room(gateway, 1) else []
            if not names:
                return _error(429, f"{MAX_OPEN_WINDOWS} windows open already")
            self._own(device, names, gateway)
            return 200, {"window": names[0]}
        if not isinstance(names, list) or not all(
                isinstance(w, str) and _WINDOW_ID.fullmatch(w) for w in names):
            return _error(400, "windows must be a list of ids of 1-64 letters, digits, _ or -")
        # Named by the gateway, which does not wait for them: a name taken, or
        # past the gateway's open windows, is left out of the answer (its
        # request gets no figure).
        names = names[:self._room(gateway, len(names))]
        opened = [w for w in names if ledger.open_named(w, rates)]
        self._own(device, opened, gateway)
        return 200, {"windows": opened}

    def _room(self, gateway: str, wanted: int) -> int:
        """How many of `wanted` windows `gateway` may open now."""
        if self._held[gateway] + wanted > MAX_OPEN_WINDOWS:
            self._forget_closed(gateway)  # windows the ledgers expired (leaked)
        return max(0, min(wanted, MAX_OPEN_WINDOWS - self._held[gateway]))

    def _own(self, device: str, wids: list[str], gateway: str) -> None:
        for wid in wids:
            self._owners[(device, wid)] = gateway
        self._held[gateway] += len(wids)

    def _forget_closed(self, gateway: str) -> None:
        for key, owner in list(self._owners.items()):
            if owner == gateway and not self.devices[key[0]].ledger.is_open(key[1]):
                del self._owners[key]
                self._held[gateway] -= 1

    def _close(self, device: str, ledger: Ledger, wid: str, raw: Any,
               gateway: str) -> Answer:
        owner = self._owners.get((device, wid))
        if owner != gateway:
            return _error(404, f"no window {wid} open by this gateway")
        points = checked_points(raw, ledger.open_for_s(wid))
        del self._owners[(device, wid)]
        self._held[gateway] -= 1
        if isinstance(points, str):
            ledger.close(wid, [])  # no work: its claims are not believed
            if gateway not in self._warned:  # once per gateway: a bad one could flood the log
                self._warned.add(gateway)
                log.warning("gateway %s: window %s closed with no work: %s (later ones "
                            "are not logged)", gateway, wid, points)
            return _error(400, points)
        return _figure(ledger.close(wid, points), wid)

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

    async def _batch(self, body: Any, gateway: str) -> Answer:
        """Several window calls in one exchange, answered in order; none waits."""
        calls = body.get("calls") if isinstance(body, dict) else None
        if not isinstance(calls, list):
            return _error(400, "body must be {\"calls\": [...]}")
        results = []
        for c in calls:
            call = c.get("call") if isinstance(c, dict) else None
            results.append(await self.window_call(call, c, wait=False, gateway=gateway)
                           if call in CALLS
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
                method, path, length, close, headers = request
                raw = await reader.readexactly(length) if length else b""
                try:
                    reply = await self.answer(method, path, raw, headers)
                except Exception:
                    log.exception("%s %s", method, path)
                    reply = _json(*_error(500, "agent error"))
                await _send(writer, reply, close)
                if close:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        except asyncio.CancelledError:  # shutting down: this connection's task ends
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



def _parse_head(head: bytes) -> tuple[str, str, int, bool, dict[str, str]] | None:
    """(method, path, body length, close after, headers) of a request head, or None."""
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
    return method, path.split("?", 1)[0], length, close, headers


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed", 429: "Too Many Requests",
            431: "Request Header Fields Too Large", 500: "Internal Server Error"}


def _unauthorized() -> Answer:
    return 401, {"error": {"message": "the agent's token is required (Authorization: "
                                      "Bearer, JOULEGATE_AGENT_TOKEN)",
                           "type": "authentication_error", "param": None,
                           "code": "invalid_api_key"}}


async def _send(writer: asyncio.StreamWriter, reply: Reply, close: bool) -> None:
    status, body, content_type = reply
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            f"content-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
            + ("connection: close\r\n" if close else "") + "\r\n")
    writer.write(head.encode("latin-1") + body)
    await writer.drain()


def start_agent(host: str, port: int, devices: dict[str, MeteredDevice], metrics: Metrics,
                new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop,
                socket_path: str | None = None, token: str | None = None
                ) -> tuple[AgentServer, threading.Thread]:
    """Serve in a background thread; `server.shutdown()` stops it. `new_loop`:
    the event loop's maker (the CLI gives uvloop's where it is installed);
    `socket_path`: a Unix socket to serve on instead of host:port; `token`:
    required of every window call."""
    metrics.watch_devices(lambda: [d.view() for d in devices.values()])
    server = AgentServer(devices, metrics, new_loop, token,
                         CoreWatts(OWN_WATTS_PER_CORE, host_packages()))
    return server, server.start(host, port, socket_path)
