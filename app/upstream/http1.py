"""joulegate's own HTTP/1.1 client for workers and agents: one asyncio
protocol per connection, httptools' parser (llhttp, in C) and a keep-alive
pool per address.

aiohttp's request path (sessions, tracing, header objects, URL objects, a
payload object, a timer per read) was ~20% of a loaded gateway's samples for
what is, here, always the same thing: one POST of a JSON body to a worker we
configured, and a streamed answer read as it comes
(`python -m bench.profile_gateway`).

Errors are `UpstreamError`s with the kinds `upstream.py` defines:
`unavailable` (could not connect), `reset` (the connection ended before a byte
of the answer: a keep-alive connection the worker had closed), `timeout` (no
headers or first byte within `first_byte_s`, or a silence between chunks
longer than `between_chunks_s`), `broken` (not HTTP, or the connection ended
mid-answer). The deadlines are timers on the connection's wait, armed only
when the reader has to wait: an answer already received costs no timer.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import cast
from urllib.parse import unquote, urlsplit

import httptools

from app.upstream.client import Headers, Timeouts, UpstreamError

HIGH_WATER_BYTES = 256 * 1024  # stop reading a worker's socket while this much is unread


@dataclass(frozen=True)
class Address:
    host: str
    port: int
    tls: bool
    host_header: str
    socket_path: str = ""  # a Unix socket's (http+unix URLs), instead of host and port


@functools.lru_cache(maxsize=1024)
def split_url(url: str) -> tuple[Address, str]:
    """The address to connect to and the request target of `url`;
    `http+unix://<the socket's path, percent-encoded>/<target>` for a Unix socket."""
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if parts.scheme == "http+unix":
        path = unquote(parts.netloc)
        if not path:
            raise UpstreamError("unavailable", f"no socket path in {url!r}")
        return Address("localhost", 0, False, "localhost", path), target
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UpstreamError("unavailable", f"not an http(s) URL: {url!r}")
    tls = parts.scheme == "https"
    try:
        port = parts.port or (443 if tls else 80)
    except ValueError:
        raise UpstreamError("unavailable", f"bad port in {url!r}") from None
    return Address(parts.hostname, port, tls, parts.netloc.rpartition("@")[2]), target


class Connection(asyncio.Protocol):
    """One connection to a worker, carrying one request at a time."""

    def __init__(self, address: Address, on_lost: Callable[[Connection], None]) -> None:
        self.address = address
        self._on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._reset_response()

    def _reset_response(self) -> None:
        self.status = 0
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.framed = False  # a Content-Length or chunked body (else: until EOF)
        self.received = False  # a byte of this answer has arrived
        self.body: list[bytes] = []
        self.buffered = 0
        self.error: UpstreamError | None = None
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol -----------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError("broken", f"not an HTTP answer: {exc}"))
            self.close()
            return
        if self.buffered > HIGH_WATER_BYTES and not self._paused and self.transport:
            self._paused = True
            self.transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.complete and self.error is None:
            if self.headers_done and not self.framed:
                self.complete = True  # an answer delimited by the end of the connection
            elif self.received:
                self._fail(UpstreamError("broken", "the worker closed the connection "
                                                   "mid-answer"))
            else:
                self._fail(UpstreamError("reset", f"connection closed before an answer "
                                                  f"({exc or 'EOF'})"))
        self._wake()
        self._on_lost(self)

    # -- httptools callbacks --------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"content-length" or (lower == b"transfer-encoding"
                                          and b"chunked" in value.lower()):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.keep_alive = self._parser.should_keep_alive()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # -- the request ----------------------------------------------------------
    def start(self, head: bytes, body: bytes | None) -> None:
        """Send one request (the previous answer was read whole)."""
        assert self.transport is not None
        self._reset_response()
        self.transport.write(head + body if body else head)

    def take_body(self) -> bytes:
        data = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body.clear()
        self.buffered = 0
        if self._paused and self.transport is not None and not self.lost:
            self._paused = False
            self.transport.resume_reading()
        return data

    async def wait(self, timeout_s: float, what: str) -> None:
        """Until something arrives (or the connection ends); a timeout after `timeout_s`."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout_s, _expire, waiter, what)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    def close(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.close()


def _expire(waiter: asyncio.Future[None], what: str) -> None:
    if not waiter.done():
        waiter.set_exception(UpstreamError("timeout", what))


class Http1Response:
    def __init__(self, transport: Http1Transport, conn: Connection, reusable: bool,
                 timeouts: Timeouts) -> None:
        self._transport = transport
        self._conn = conn
        self._reusable = reusable
        self._timeouts = timeouts
        self._closed = False
        self.status = conn.status

    async def chunks(self) -> AsyncIterator[bytes]:
        conn, began = self._conn, False
        while True:
            if conn.body:
                began = True
                yield conn.take_body()
            elif conn.complete:
                await self.aclose()  # read whole: the connection goes back to the pool
                return
            elif conn.error is not None:
                raise conn.error
            elif began:
                await conn.wait(self._timeouts.between_chunks_s,
                                "no data from the worker in time")
            else:
                await conn.wait(self._timeouts.first_byte_s, "no data from the worker in time")

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        conn = self._conn
        if self._reusable and conn.complete and not conn.body and conn.keep_alive \
                and conn.error is None and not conn.lost:
            self._transport.pool(conn)
        else:  # unfinished: dropping the connection tells the worker to stop
            conn.close()
        self._transport.released()


class Http1Transport:
    """Keep-alive connections per address, most recently used first; at most
    `max_connections` requests in flight (a request over it waits). An idle
    connection older than `keepalive_s` is closed rather than reused (below the
    worker's own idle timeout, so that the gateway, not the worker, usually
    closes it). A `fresh` request gets a new connection, closed after."""

    def __init__(self, connect_s: float, keepalive_s: float, max_connections: int) -> None:
        self._connect_s = connect_s
        self._keepalive_s = keepalive_s
        self._idle: dict[Address, list[Connection]] = {}
        self._slots = asyncio.Semaphore(max_connections)
        self._tls: ssl.SSLContext | None = None
        self._all: set[Connection] = set()

    async def send(self, method: str, url: str, body: bytes | None, fresh: bool,
                   timeouts: Timeouts, headers: Headers = ()) -> Http1Response:
        address, target = split_url(url)
        await self._slots.acquire()
        conn: Connection | None = None
        try:
            conn = None if fresh else self._reuse(address)
            if conn is None:
                conn = await self._connect(address)
            conn.start(_head(method, target, address, body, fresh, headers), body)
            while not conn.headers_done:
                if conn.error is not None:
                    raise conn.error
                await conn.wait(timeouts.first_byte_s, "no answer from the worker in time")
        except BaseException:
            self._slots.release()
            if conn is not None:
                conn.close()
            raise
        return Http1Response(self, conn, not fresh, timeouts)

    def _reuse(self, address: Address) -> Connection | None:
        idle = self._idle.get(address)
        oldest_ok = time.monotonic() - self._keepalive_s
        while idle:
            conn = idle.pop()
            if not conn.lost and conn.idle_since >= oldest_ok:
                return conn
            conn.close()
        return None

    async def _connect(self, address: Address) -> Connection:
        loop = asyncio.get_running_loop()
        tls: ssl.SSLContext | None = None
        if address.tls:
            tls = self._tls = self._tls or ssl.create_default_context()
        try:
            async with asyncio.timeout(self._connect_s):
                if address.socket_path:
                    _, conn = await loop.create_unix_connection(
                        lambda: Connection(address, self._lost), address.socket_path)
                else:
                    _, conn = await loop.create_connection(
                        lambda: Connection(address, self._lost), address.host,
                        address.port, ssl=tls)
        except TimeoutError:
            raise UpstreamError("unavailable", f"connect to {address.host_header} timed "
                                               "out") from None
        except OSError as exc:
            raise UpstreamError("unavailable", f"cannot connect to {address.host_header}: "
                                               f"{exc.strerror or exc}") from None
        self._all.add(conn)
        return conn

    def pool(self, conn: Connection) -> None:
        conn.idle_since = time.monotonic()
        idle = self._idle.setdefault(conn.address, [])
        idle.append(conn)
        while idle and idle[0].idle_since < conn.idle_since - self._keepalive_s:
            idle.pop(0).close()  # the least recently used, too old to reuse

    def released(self) -> None:
        self._slots.release()

    def _lost(self, conn: Connection) -> None:
        self._all.discard(conn)
        idle = self._idle.get(conn.address)
        if idle and conn in idle:
            idle.remove(conn)

    async def aclose(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._idle.clear()


def _head(method: str, target: str, address: Address, body: bytes | None,
          close: bool, headers: Headers = ()) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {address.host_header}"]
    lines += [f"{name}: {value}" for name, value in headers]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
