"""The one adapter to workers over HTTP: aiohttp directly (httpx's API cost ~10%
of the request path, measured with py-spy), or an httpx client (tests' mock
transport, `upstream_transport: httpx`).

Every aiohttp and httpx exception is translated here, once, into
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
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import aiohttp
import httpx

UpstreamErrorKind = Literal["unavailable", "reset", "timeout", "broken"]
MAX_CONNECTIONS = 1024  # to all workers together
JSON_HEADERS = {"content-type": "application/json"}


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


class RawResponse(Protocol):
    status: int

    def chunks(self) -> AsyncIterator[bytes]: ...  # raises UpstreamError
    async def aclose(self) -> None: ...


class Transport(Protocol):
    async def send(self, method: str, url: str, body: bytes | None, fresh: bool
                   ) -> RawResponse: ...  # raises UpstreamError
    async def aclose(self) -> None: ...


def _detail(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


class _AiohttpResponse:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except aiohttp.ClientError as exc:
            raise UpstreamError("broken", _detail(exc)) from exc

    async def aclose(self) -> None:
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()


class AiohttpTransport:
    """aiohttp, translated truthfully: a connection the worker dropped before
    answering is a reset, not a connect failure. A `fresh` request goes over a
    new connection that is closed after."""

    def __init__(self, connect_s: float, keepalive_s: float,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_s,
                                              sock_connect=connect_s)
        self._keepalive_s = keepalive_s
        self._max = max_connections
        self._pooled: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None

    def _session(self, fresh: bool) -> aiohttp.ClientSession:
        # Made on first use: a ClientSession belongs to the running event loop.
        if fresh:
            if self._fresh is None:
                self._fresh = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(force_close=True, limit=0),
                    timeout=self._timeout, auto_decompress=False)
            return self._fresh
        if self._pooled is None:
            self._pooled = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                limit=self._max, keepalive_timeout=self._keepalive_s),
                timeout=self._timeout, auto_decompress=False)
        return self._pooled

    async def send(self, method: str, url: str, body: bytes | None, fresh: bool
                   ) -> RawResponse:
        try:
            response = await self._session(fresh).request(
                method, url, data=body, headers=JSON_HEADERS if body is not None else None,
                allow_redirects=False)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise UpstreamError("unavailable", _detail(exc)) from exc
        except aiohttp.ClientResponseError as exc:  # it answered, but not in HTTP
            raise UpstreamError("broken", _detail(exc)) from exc
        except aiohttp.ClientError as exc:  # disconnected, reset
            raise UpstreamError("reset", _detail(exc)) from exc
        return _AiohttpResponse(response)

    async def aclose(self) -> None:
        for session in (self._pooled, self._fresh):
            if session is not None:
                await session.close()


@contextlib.contextmanager
def _httpx_translated(began: bool) -> Iterator[None]:
    try:
        yield
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise UpstreamError("unavailable", _detail(exc)) from exc
    except httpx.TimeoutException as exc:
        raise UpstreamError("timeout", _detail(exc)) from exc
    except httpx.DecodingError as exc:  # an answer that is not HTTP: nothing to retry
        raise UpstreamError("broken", _detail(exc)) from exc
    except httpx.HTTPError as exc:
        raise UpstreamError("broken" if began else "reset", _detail(exc)) from exc


class _HttpxResponse:
    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status = response.status_code

    async def chunks(self) -> AsyncIterator[bytes]:
        with _httpx_translated(began=True):
            async for chunk in self._response.aiter_bytes():
                yield chunk

    async def aclose(self) -> None:
        await self._response.aclose()


class HttpxTransport:
    """An httpx client (its own pool; or a mock transport in tests)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def send(self, method: str, url: str, body: bytes | None, fresh: bool
                   ) -> RawResponse:
        request = self._client.build_request(
            method, url, content=body, headers=JSON_HEADERS if body is not None else None)
        with _httpx_translated(began=False):
            return _HttpxResponse(await self._client.send(request, stream=True))

    async def aclose(self) -> None:
        await self._client.aclose()


def make_transport(kind: Literal["aiohttp", "httpx"], connect_s: float,
                   keepalive_s: float = 4.0) -> Transport:
    """One pooled transport for all workers. Read deadlines are the Upstream's own.

    keepalive_s stays below llama-server's 5 s keep-alive so that the gateway,
    not the worker, usually closes an idle connection."""
    if kind == "aiohttp":
        return AiohttpTransport(connect_s, keepalive_s)
    limits = httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=256,
                          keepalive_expiry=keepalive_s)
    return HttpxTransport(httpx.AsyncClient(
        timeout=httpx.Timeout(connect=connect_s, read=None, write=None, pool=None),
        limits=limits))


class UpstreamResponse:
    """A worker's response whose headers have arrived; the body is read on demand,
    each read under the first-byte or between-chunks deadline."""

    def __init__(self, raw: RawResponse, timeouts: Timeouts) -> None:
        self._raw = raw
        self._timeouts = timeouts
        self.began = False  # a body byte has arrived

    @property
    def status(self) -> int:
        return self._raw.status

    async def chunks(self) -> AsyncIterator[bytes]:
        it = self._raw.chunks().__aiter__()
        while True:
            wait_s = (self._timeouts.between_chunks_s if self.began
                      else self._timeouts.first_byte_s)
            try:
                async with asyncio.timeout(wait_s):
                    chunk = await it.__anext__()
            except StopAsyncIteration:
                return
            except TimeoutError as exc:
                raise UpstreamError("timeout", "no data from the worker in time") from exc
            self.began = True
            yield chunk

    async def read(self) -> bytes:
        parts = [chunk async for chunk in self.chunks()]
        return b"".join(parts)

    async def aclose(self) -> None:
        # Closing an unfinished response drops the connection, which tells the
        # worker to stop generating: that is how a client disconnect cancels.
        with contextlib.suppress(UpstreamError, httpx.HTTPError, aiohttp.ClientError):
            await self._raw.aclose()


class Upstream:
    """Sends requests to worker URLs over the injected pooled transport."""

    def __init__(self, transport: Transport, timeouts: Timeouts = Timeouts()) -> None:
        self._transport = transport
        self.timeouts = timeouts

    async def _send(self, method: str, url: str, body: bytes | None, fresh: bool,
                    timeout_s: float) -> RawResponse:
        try:
            async with asyncio.timeout(timeout_s):
                return await self._transport.send(method, url, body, fresh)
        except TimeoutError as exc:
            raise UpstreamError("timeout", "no answer from the worker in time") from exc

    async def post(self, url: str, body: bytes | dict[str, Any],
                   fresh: bool = False) -> UpstreamResponse:
        """POST; returns when the response headers arrived (first-byte deadline)."""
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        raw = await self._send("POST", url, payload, fresh, self.timeouts.first_byte_s)
        return UpstreamResponse(raw, self.timeouts)

    async def _get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        async with asyncio.timeout(timeout_s):
            raw = await self._send("GET", url, None, False, timeout_s)
            try:
                return raw.status, b"".join([c async for c in raw.chunks()])
            finally:
                await raw.aclose()

    async def probe(self, url: str, timeout_s: float) -> bool:
        """True when GET url answers 200 within timeout_s."""
        try:
            status, _ = await self._get(url, timeout_s)
        except (UpstreamError, TimeoutError):
            return False
        return status == 200

    async def get_json(self, url: str, timeout_s: float) -> Any:
        try:
            status, raw = await self._get(url, timeout_s)
        except TimeoutError as exc:
            raise UpstreamError("timeout", "no answer in time") from exc
        if status != 200:
            raise UpstreamError("broken", f"answered {status}")
        return json.loads(raw)

    async def aclose(self) -> None:
        await self._transport.aclose()
