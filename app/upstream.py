"""The one adapter to workers over HTTP (httpx API, aiohttp or httpx transport).

Every httpx exception is translated here, once, into `UpstreamError` with a
kind the proxy acts on: `unavailable` (could not connect: try another
replica), `timeout` (504) or `broken` (the connection failed mid-way: 502).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import httpx

UpstreamErrorKind = Literal["unavailable", "timeout", "broken"]


class UpstreamError(Exception):
    def __init__(self, kind: UpstreamErrorKind, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind: UpstreamErrorKind = kind
        self.detail = detail


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise UpstreamError("unavailable", str(exc) or type(exc).__name__) from exc
    except httpx.TimeoutException as exc:
        raise UpstreamError("timeout", str(exc) or type(exc).__name__) from exc
    except httpx.HTTPError as exc:
        raise UpstreamError("broken", str(exc) or type(exc).__name__) from exc


def make_client(
    transport: Literal["aiohttp", "httpx"], connect_s: float, read_s: float
) -> httpx.AsyncClient:
    """One pooled client for all workers; aiohttp's transport is ~5x faster (DESIGN.md)."""
    timeout = httpx.Timeout(connect=connect_s, read=read_s, write=read_s, pool=connect_s)
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=128)
    if transport == "aiohttp":
        from httpx_aiohttp import AiohttpTransport

        return httpx.AsyncClient(
            transport=AiohttpTransport(limits=limits), timeout=timeout, limits=limits
        )
    return httpx.AsyncClient(timeout=timeout, limits=limits)


@dataclass
class UpstreamResponse:
    """A worker's response whose headers have arrived; the body is read on demand."""

    _response: httpx.Response

    @property
    def status(self) -> int:
        return self._response.status_code

    async def chunks(self) -> AsyncIterator[bytes]:
        with _translated():
            async for chunk in self._response.aiter_raw():
                yield chunk

    async def read(self) -> bytes:
        with _translated():
            return await self._response.aread()

    async def aclose(self) -> None:
        # Closing an unfinished response drops the connection, which tells the
        # worker to stop generating: that is how a client disconnect cancels.
        with contextlib.suppress(httpx.HTTPError):
            await self._response.aclose()


class Upstream:
    """Sends requests to worker URLs with the injected pooled client."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def post(self, url: str, body: dict[str, Any]) -> UpstreamResponse:
        request = self._client.build_request("POST", url, json=body)
        with _translated():
            response = await self._client.send(request, stream=True)
        return UpstreamResponse(response)

    async def probe(self, url: str, timeout_s: float) -> bool:
        """True when GET url answers 200 within timeout_s."""
        try:
            with _translated():
                r = await self._client.get(url, timeout=timeout_s)
                return r.status_code == 200
        except UpstreamError:
            return False

    async def get_json(self, url: str, timeout_s: float) -> Any:
        with _translated():
            r = await self._client.get(url, timeout=timeout_s)
            r.raise_for_status()
            return r.json()

    async def aclose(self) -> None:
        await self._client.aclose()
