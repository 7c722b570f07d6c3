"""The HTTP/1.1 connection under uvicorn: uvicorn's httptools protocol with a
deadline for each request's head, caps on open connections, and the error
envelope for bytes that are not HTTP.

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

A process keeps at most `max_connections` open, and at most
`max_connections_per_client` from one client address (0: no cap). A
connection beyond either is answered at once, 503 or 429 in the envelope
with Retry-After, whatever it sends is discarded, and it is closed once the
answer is out (after the client's end, or a second): the answer is what
its first request gets, so a client is told rather than reset.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.errors import (
    ApiError,
    head_timeout,
    malformed_http,
    too_many_client_connections,
    too_many_connections,
)
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
    max_connections: ClassVar[int] = 0
    max_connections_per_client: ClassVar[int] = 0
    # open connections by client address, this server's (uvicorn_options)
    by_client: ClassVar[Counter[str]] = Counter()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_began = False
        self._refused = False
        super().connection_made(transport)
        # counted by client address only where that is capped
        self._peer = (self.client[0] if self.client else "") \
            if self.max_connections_per_client else None
        if self._peer is not None:
            self.by_client[self._peer] += 1
        refusal = self._over_cap()
        if refusal is not None:
            self._refuse(refusal)
            return
        self._arm()

    def _over_cap(self) -> ApiError | None:
        if self.max_connections and len(self.connections) > self.max_connections:
            return too_many_connections(self.max_connections)
        per_client = self.max_connections_per_client
        if self._peer is not None and self.by_client[self._peer] > per_client:
            return too_many_client_connections(per_client)
        return None

    def _refuse(self, error: ApiError) -> None:
        """Answer now and close once the answer is out: the client's end of
        the stream, or a second, whichever comes first."""
        self._refused = True
        self.transport.write(raw_response(error))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(1.0, self.transport.close)

    def data_received(self, data: bytes) -> None:
        if not self._refused:  # a refused connection's requests are not served
            super().data_received(data)

    def eof_received(self) -> None:
        if self._refused:
            self.transport.close()
            return
        super().eof_received()

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
        peer = getattr(self, "_peer", None)  # None: not counted (or not made)
        if peer is not None:
            left = self.by_client[peer] - 1
            if left > 0:
                self.by_client[peer] = left
            else:
                del self.by_client[peer]
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


def uvicorn_options(head_timeout_s: float, max_connections: int = 0,
                    max_connections_per_client: int = 0) -> dict[str, Any]:
    """What every gateway's uvicorn runs with: the protocol above, no access
    log or server header, no X-Forwarded-* rewriting (the client address is
    the socket's peer)."""
    protocol = type("GatewayProtocol", (DeadlineProtocol,), {
        "head_timeout_s": head_timeout_s, "max_connections": max_connections,
        "max_connections_per_client": max_connections_per_client,
        "by_client": Counter()})
    return {"http": protocol, "access_log": False, "server_header": False,
            "proxy_headers": False}
