"""The HTTP/1.1 connection under uvicorn: uvicorn's httptools protocol with a
deadline for each request's head, and the error envelope for bytes that are
not HTTP.

uvicorn has no head deadline: its keep-alive timer runs only between
requests and stops at the first byte, so a client that sends a header byte
every few seconds holds its connection (and a file descriptor, and a place
under any connection limit) for as long as it likes. Here a request's head
(request line and headers) must be complete within `head_timeout_s` of its
first byte, or of the connection's opening; otherwise the connection is
closed, after a 408 in the OpenAI error envelope if part of a request had
arrived (a connection that never sent a byte is just closed: a client may
be sending its request on it at that very moment, and must not read a 408
as that request's answer). The body has its own
deadline, read by the gateway (app/http/body.py).
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.errors import ApiError, head_timeout, malformed_http
from app.jsonio import dumps

_REASONS = {400: b"Bad Request", 408: b"Request Timeout"}


def raw_response(error: ApiError) -> bytes:
    """A whole HTTP/1.1 response for `error`, written before any ASGI app runs."""
    body = dumps(error.body())
    head = [b"HTTP/1.1 %d %s" % (error.status, _REASONS.get(error.status, b"Error")),
            b"content-type: application/json", b"content-length: %d" % len(body),
            *(f"{k}: {v}".encode("latin-1") for k, v in error.headers.items())]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class DeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a request-head deadline."""

    head_timeout_s: ClassVar[float] = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_began = False
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_began = True
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        self._head_began = False
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        self._disarm()
        self.transport.write(raw_response(malformed_http(msg.rstrip("."))))
        self.transport.close()

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._head_began:
            self.transport.write(raw_response(head_timeout(self.head_timeout_s)))
        self.transport.close()


def uvicorn_options(head_timeout_s: float) -> dict[str, Any]:
    """What every gateway's uvicorn runs with: the protocol above, no access
    log or server header, no X-Forwarded-* rewriting (no client address is
    read)."""
    protocol = type("GatewayProtocol", (DeadlineProtocol,), {"head_timeout_s": head_timeout_s})
    return {"http": protocol, "access_log": False, "server_header": False,
            "proxy_headers": False}
