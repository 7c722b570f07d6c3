"""The one adapter to workers (and agents) over HTTP: joulegate's own HTTP/1.1
client (`app/upstream/http1.py`, the default), or an httpx client (tests' mock
transport, `upstream_transport: httpx`).

Every failure is translated, once, into `UpstreamError` with a kind the
exchange acts on:

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
a slow long answer is not cut off as long as tokens keep coming. Each
transport enforces them (`Timeouts` is passed with every request).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import httpx

UpstreamErrorKind = Literal["unavailable", "reset", "timeout", "broken"]
log = logging.getLogger("joulegate.upstream")

MAX_CONNECTIONS = 1024  # to all workers together
JSON_HEADERS = {"content-type": "application/json"}
Headers = Sequence[tuple[str, str]]  # extra request headers (an agent's token)


class UpstreamFault(Exception):
    """The root of what goes wrong between the gateway and a backend:
    `UpstreamError` (a worker or agent could not be reached or answered
    badly), `pool.NoReplica` (no replica may take requests), `pool.Overloaded`
    (every replica and the queue full). app.errors maps them to HTTP."""


class UpstreamError(UpstreamFault):
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

    def chunks(self) -> AsyncIterator[bytes]: ...  # raises UpstreamError (incl. timeouts)
    async def aclose(self) -> None: ...


class Transport(Protocol):
    """Sends a request and returns once its headers arrived, or raises
    UpstreamError; enforces `timeouts` for the headers and every chunk."""

    async def send(self, method: str, url: str, body: bytes | None, fresh: bool,
                   timeouts: Timeouts, headers: Headers = ()) -> RawResponse: ...
    async def aclose(self) -> None: ...


def _detail(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


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
    def __init__(self, response: httpx.Response, timeouts: Timeouts) -> None:
        self._response = response
        self._timeouts = timeouts
        self.status = response.status_code

    async def chunks(self) -> AsyncIterator[bytes]:
        it = self._response.aiter_bytes().__aiter__()
        began = False
        while True:
            wait_s = self._timeouts.between_chunks_s if began else self._timeouts.first_byte_s
            try:
                with _httpx_translated(began=True):
                    async with asyncio.timeout(wait_s):
                        chunk = await it.__anext__()
            except StopAsyncIteration:
                return
            except TimeoutError as exc:
                raise UpstreamError("timeout", "no data from the worker in time") from exc
            began = True
            yield chunk

    async def aclose(self) -> None:
        await self._response.aclose()


class HttpxTransport:
    """An httpx client (its own pool; or a mock transport in tests)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def send(self, method: str, url: str, body: bytes | None, fresh: bool,
                   timeouts: Timeouts, headers: Headers = ()) -> RawResponse:
        sent = [*(JSON_HEADERS.items() if body is not None else ()), *headers]
        request = self._client.build_request(method, url, content=body, headers=sent)
        try:
            with _httpx_translated(began=False):
                async with asyncio.timeout(timeouts.first_byte_s):
                    response = await self._client.send(request, stream=True)
        except TimeoutError as exc:
            raise UpstreamError("timeout", "no answer from the worker in time") from exc
        return _HttpxResponse(response, timeouts)

    async def aclose(self) -> None:
        await self._client.aclose()


def httpx_transport(connect_s: float, keepalive_s: float) -> HttpxTransport:
    limits = httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=256,
                          keepalive_expiry=keepalive_s)
    return HttpxTransport(httpx.AsyncClient(
        timeout=httpx.Timeout(connect=connect_s, read=None, write=None, pool=None),
        limits=limits))


class UpstreamResponse:
    """A worker's response whose headers have arrived; the body is read on
    demand (each chunk under the transport's deadlines)."""

    def __init__(self, raw: RawResponse) -> None:
        self._raw = raw
        self.status = raw.status

    def chunks(self) -> AsyncIterator[bytes]:
        return self._raw.chunks()

    async def read(self) -> bytes:
        parts = [chunk async for chunk in self._raw.chunks()]
        return b"".join(parts)

    async def aclose(self) -> None:
        # Closing an unfinished response drops the connection, which tells the
        # worker to stop generating: that is how a client disconnect cancels.
        with contextlib.suppress(UpstreamError, httpx.HTTPError):
            await self._raw.aclose()


class Upstream:
    """Sends requests to worker URLs over the injected pooled transport."""

    def __init__(self, transport: Transport, timeouts: Timeouts = Timeouts()) -> None:
        self._transport = transport
        self.timeouts = timeouts

    async def post(self, url: str, body: bytes | dict[str, Any],
                   fresh: bool = False) -> UpstreamResponse:
        """POST; returns when the response headers arrived (first-byte deadline).
        A pooled connection the peer had closed is a `reset`."""
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        raw = await self._transport.send("POST", url, payload, fresh, self.timeouts)
        return UpstreamResponse(raw)

    async def post_again_if_reset(self, url: str, body: bytes | dict[str, Any],
                                  headers: Headers = ()) -> UpstreamResponse:
        """POST, once more on a new connection when the pooled one was closed."""
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        raw = await self._send_again_if_reset("POST", url, payload, self.timeouts, headers)
        return UpstreamResponse(raw)

    async def _send_again_if_reset(self, method: str, url: str, payload: bytes | None,
                                   timeouts: Timeouts, headers: Headers = ()) -> RawResponse:
        try:
            return await self._transport.send(method, url, payload, False, timeouts, headers)
        except UpstreamError as exc:
            if exc.kind != "reset":
                raise
            # A kept-alive connection the peer had closed: nothing was answered,
            # and it says nothing about the peer's health.
            # A worker closing an idle keep-alive connection: normal traffic.
            log.debug("%s: connection dropped before the response (%s); asking again on a "
                     "new connection", url, exc.detail)
            return await self._transport.send(method, url, payload, True, timeouts, headers)

    async def _get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        deadlines = Timeouts(timeout_s, timeout_s, timeout_s)
        async with asyncio.timeout(timeout_s):
            raw = await self._send_again_if_reset("GET", url, None, deadlines)
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
