"""The one adapter to workers over HTTP (the httpx API over an aiohttp transport).

Every httpx and aiohttp exception is translated here, once, into
`UpstreamError` with a kind the exchange acts on:

- `unavailable`: could not connect (refused, connect timeout): try another
  replica; a failure for the replica's circuit breaker.
- `reset`: the connection dropped before the response began, typically a
  keep-alive connection the worker had already closed. Nothing was answered,
  so the exchange retries once on a new connection; it says nothing about
  the replica's health.
- `timeout`: no first byte, or too long a silence between two chunks (504).
- `broken`: the connection failed after the response began, or the worker
  answered something that is not HTTP (502).

Timeouts are the gateway's own: connect, first byte (headers and the first
body chunk: the worker's queue wait and prefill) and between chunks (the
longest silence while tokens stream). A hung worker is found by the first two;
a slow long answer is not cut off as long as tokens keep coming.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import httpx

UpstreamErrorKind = Literal["unavailable", "reset", "timeout", "broken"]
MAX_CONNECTIONS = 1024  # to all workers together
FRESH = "joulegate.fresh"  # request extension: use a new connection, not a pooled one


class UpstreamError(Exception):
    def __init__(self, kind: UpstreamErrorKind, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind: UpstreamErrorKind = kind
        self.detail = detail


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = 5.0
    first_byte_s: float = 120.0
    between_chunks_s: float = 30.0


@contextlib.contextmanager
def _translated(began: bool) -> Iterator[None]:
    """httpx errors as UpstreamErrors; `began`: the response had already started."""
    try:
        yield
    except TimeoutError as exc:  # our own first-byte / between-chunks deadline
        raise UpstreamError("timeout", "no data from the worker in time") from exc
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise UpstreamError("unavailable", str(exc) or type(exc).__name__) from exc
    except httpx.TimeoutException as exc:
        raise UpstreamError("timeout", str(exc) or type(exc).__name__) from exc
    except httpx.DecodingError as exc:  # an answer that is not HTTP: nothing to retry
        raise UpstreamError("broken", str(exc) or type(exc).__name__) from exc
    except httpx.HTTPError as exc:
        raise UpstreamError("broken" if began else "reset",
                            str(exc) or type(exc).__name__) from exc


class _AiohttpStream(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except aiohttp.ClientError as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__) from exc
        except TimeoutError as exc:
            raise httpx.ReadTimeout(str(exc) or "read timeout") from exc

    async def aclose(self) -> None:
        self._response.release() if self._response.content.at_eof() else self._response.close()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """httpx transport over aiohttp (~5x faster than httpx's own, DESIGN.md).

    Its own (not httpx-aiohttp's) so that errors map truthfully: a connection
    the worker dropped before answering is not a connect failure. A request
    with the FRESH extension goes over a new connection that is closed after.
    """

    def __init__(self, max_connections: int, keepalive_s: float) -> None:
        self._max = max_connections
        self._keepalive_s = keepalive_s
        self._pooled: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None

    def _session(self, fresh: bool) -> aiohttp.ClientSession:
        # Made on first use: a ClientSession belongs to the running event loop.
        if fresh:
            if self._fresh is None:
                self._fresh = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(force_close=True, limit=0))
            return self._fresh
        if self._pooled is None:
            self._pooled = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                limit=self._max, keepalive_timeout=self._keepalive_s))
        return self._pooled

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {})
        connect_s = timeout.get("connect")
        session = self._session(bool(request.extensions.get(FRESH)))
        try:
            response = await session.request(
                request.method, str(request.url),
                headers=[(k, v) for k, v in request.headers.items()
                         if k not in ("content-length", "transfer-encoding")],
                data=request.content or None, allow_redirects=False, auto_decompress=False,
                compress=False,
                timeout=aiohttp.ClientTimeout(total=None, connect=connect_s,
                                              sock_connect=connect_s,
                                              sock_read=timeout.get("read")),
            ).__aenter__()
        except aiohttp.ClientConnectorError as exc:
            raise httpx.ConnectError(str(exc)) from exc
        except aiohttp.ConnectionTimeoutError as exc:
            raise httpx.ConnectTimeout(str(exc) or "connect timeout") from exc
        except aiohttp.ClientResponseError as exc:  # it answered, but not in HTTP
            raise httpx.DecodingError(str(exc) or type(exc).__name__) from exc
        except aiohttp.ClientError as exc:  # disconnected, reset
            raise httpx.RemoteProtocolError(str(exc) or type(exc).__name__) from exc
        except TimeoutError as exc:
            raise httpx.ReadTimeout(str(exc) or "read timeout") from exc
        return httpx.Response(status_code=response.status, headers=response.raw_headers,
                              stream=_AiohttpStream(response), request=request)

    async def aclose(self) -> None:
        for session in (self._pooled, self._fresh):
            if session is not None:
                await session.close()


def make_client(transport: Literal["aiohttp", "httpx"], connect_s: float,
                keepalive_s: float = 4.0) -> httpx.AsyncClient:
    """One pooled client for all workers. Read deadlines are the Upstream's own.

    keepalive_s stays below llama-server's 5 s keep-alive so that the gateway,
    not the worker, usually closes an idle connection."""
    timeout = httpx.Timeout(connect=connect_s, read=None, write=None, pool=None)
    if transport == "aiohttp":
        return httpx.AsyncClient(transport=AiohttpTransport(MAX_CONNECTIONS, keepalive_s),
                                 timeout=timeout)
    limits = httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=256,
                          keepalive_expiry=keepalive_s)
    return httpx.AsyncClient(timeout=timeout, limits=limits)


class UpstreamResponse:
    """A worker's response whose headers have arrived; the body is read on demand,
    each read under the first-byte or between-chunks deadline."""

    def __init__(self, response: httpx.Response, timeouts: Timeouts) -> None:
        self._response = response
        self._timeouts = timeouts
        self.began = False  # a body byte has arrived

    @property
    def status(self) -> int:
        return self._response.status_code

    async def chunks(self) -> AsyncIterator[bytes]:
        it = self._response.aiter_bytes().__aiter__()
        while True:
            wait_s = (self._timeouts.between_chunks_s if self.began
                      else self._timeouts.first_byte_s)
            with _translated(began=True):
                try:
                    async with asyncio.timeout(wait_s):
                        chunk = await it.__anext__()
                except StopAsyncIteration:
                    return
            self.began = True
            yield chunk

    async def read(self) -> bytes:
        parts = [chunk async for chunk in self.chunks()]
        return b"".join(parts)

    async def aclose(self) -> None:
        # Closing an unfinished response drops the connection, which tells the
        # worker to stop generating: that is how a client disconnect cancels.
        with contextlib.suppress(httpx.HTTPError, aiohttp.ClientError):
            await self._response.aclose()


class Upstream:
    """Sends requests to worker URLs with the injected pooled client."""

    def __init__(self, client: httpx.AsyncClient, timeouts: Timeouts = Timeouts()) -> None:
        self._client = client
        self.timeouts = timeouts

    async def post(self, url: str, body: bytes | dict[str, Any],
                   fresh: bool = False) -> UpstreamResponse:
        """POST; returns when the response headers arrived (first-byte deadline)."""
        extensions = {FRESH: True} if fresh else None
        if isinstance(body, bytes):
            request = self._client.build_request(
                "POST", url, content=body, headers={"content-type": "application/json"},
                extensions=extensions)
        else:
            request = self._client.build_request("POST", url, json=body, extensions=extensions)
        with _translated(began=False):
            async with asyncio.timeout(self.timeouts.first_byte_s):
                response = await self._client.send(request, stream=True)
        return UpstreamResponse(response, self.timeouts)

    async def probe(self, url: str, timeout_s: float) -> bool:
        """True when GET url answers 200 within timeout_s."""
        try:
            with _translated(began=False):
                async with asyncio.timeout(timeout_s):
                    r = await self._client.get(url)
                    return r.status_code == 200
        except UpstreamError:
            return False

    async def get_json(self, url: str, timeout_s: float) -> Any:
        with _translated(began=False):
            async with asyncio.timeout(timeout_s):
                r = await self._client.get(url)
                r.raise_for_status()
                return r.json()

    async def aclose(self) -> None:
        await self._client.aclose()
