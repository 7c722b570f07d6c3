"""`joulegate agent`: samplers and ledgers next to the GPUs, served over HTTP.

Several gateway processes (or replicas) can send to the same GPU; attribution
needs every request on a device in one ledger, so the ledger lives here, one
per host, and gateways open and close their windows over HTTP:

    POST /v1/windows/open    {"device", "curve"?}            -> {"window"}
    POST /v1/windows/close   {"device", "window", "points"}  -> EnergyFigure
    POST /v1/windows/result  {"device", "window", "wait_s"?} -> EnergyFigure (held until
                                                                final, up to wait_s)
    GET  /metrics            device energy, power, idle (Prometheus)
    GET  /healthz

Standard library HTTP only: telemetry imports nothing but the stdlib, pynvml
and prometheus_client.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from telemetry.devices import MeteredDevice
from telemetry.metrics import CONTENT_TYPE, Metrics
from telemetry.rates import TOKEN_COUNTS, TokenRates
from telemetry.timeline import EnergyFigure

log = logging.getLogger("joulegate.agent")


class _Handler(BaseHTTPRequestHandler):
    server: AgentServer
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: with Nagle's algorithm the second
    # waits for the client's delayed ACK (~40 ms per call, measured).
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)

    def _reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._reply(status, json.dumps(obj).encode())

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": {"message": message, "type": "invalid_request_error",
                                      "param": None, "code": None}})

    def do_GET(self) -> None:
        if self.path == "/metrics":
            self._reply(200, self.server.metrics.render(), CONTENT_TYPE)
        elif self.path == "/healthz":
            self._json(200, {"status": "ok", "devices": sorted(self.server.devices)})
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        try:
            n = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(n) or b"{}")
            device = self.server.devices[body["device"]]
        except (ValueError, KeyError, TypeError):
            self._error(400, "body must be JSON with a known 'device'")
            return
        ledger = device.ledger
        if self.path == "/v1/windows/open":
            try:
                rates = TokenRates.from_curve(body["curve"]) if "curve" in body \
                    else TOKEN_COUNTS
            except (TypeError, ValueError) as exc:
                self._error(400, f"curve: 7 coefficients expected ({exc})")
                return
            self._json(200, {"window": ledger.open(rates=rates)})
            return
        if self.path not in ("/v1/windows/close", "/v1/windows/result"):
            self._error(404, f"no route {self.path}")
            return
        wid = str(body.get("window", ""))
        if self.path == "/v1/windows/close":
            try:
                points = [(float(t), int(p), int(d)) for t, p, d in body.get("points", [])]
            except (TypeError, ValueError):
                self._error(400, "points must be [offset_s, prompt_tokens, decode_tokens]")
                return
            figure = ledger.close(wid, points)
        else:
            figure = self.server.result(body["device"], wid, body.get("wait_s"))
        if figure is None:
            self._error(404, f"no window {wid}")
        else:
            self._json(200, asdict(figure))


MAX_WAIT_S = 10.0


class AgentServer(ThreadingHTTPServer):
    """The agent's HTTP server. A call waiting for a final figure sleeps on an
    event its window's settling sets (the ledger's `on_final`, on the sampler
    thread): no polling, however many requests wait."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], devices: dict[str, MeteredDevice],
                 metrics: Metrics) -> None:
        super().__init__(address, _Handler)
        self.devices = devices
        self.metrics = metrics
        self._lock = threading.Lock()
        self._waiting: dict[tuple[str, str], threading.Event] = {}
        for name, device in devices.items():
            device.ledger.on_final = self._final_callback(name)

    def _final_callback(self, device: str) -> Callable[[str, EnergyFigure], None]:
        def on_final(wid: str, figure: EnergyFigure) -> None:
            with self._lock:
                event = self._waiting.get((device, wid))
            if event is not None:
                event.set()
        return on_final

    def result(self, device: str, wid: str, wait_s: object) -> EnergyFigure | None:
        """The window's figure; with `wait_s`, held until it is final or that long
        has passed (one call instead of a gateway polling)."""
        ledger = self.devices[device].ledger
        figure = ledger.result(wid)
        if figure is None or figure.final or not isinstance(wait_s, int | float) \
                or wait_s <= 0:
            return figure
        event = threading.Event()
        with self._lock:
            self._waiting[(device, wid)] = event
        try:
            figure = ledger.result(wid)  # settled before the event was in place?
            if figure is not None and not figure.final:
                event.wait(min(float(wait_s), MAX_WAIT_S))
                figure = ledger.result(wid)
        finally:
            with self._lock:
                self._waiting.pop((device, wid), None)
        return figure


def start_agent(host: str, port: int, devices: dict[str, MeteredDevice],
                metrics: Metrics) -> tuple[AgentServer, threading.Thread]:
    """Serve in a background thread; `server.shutdown()` stops it."""
    metrics.watch_devices(lambda: [d.view() for d in devices.values()])
    server = AgentServer((host, port), devices, metrics)
    thread = threading.Thread(target=server.serve_forever, name="joulegate-agent", daemon=True)
    thread.start()
    return server, thread
