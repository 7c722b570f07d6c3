"""The upstream adapter over joulegate's own HTTP/1.1 transport, against a raw server
that drops keep-alive connections the way a worker's idle timeout does."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from app.upstream.client import Timeouts, Upstream, UpstreamError
from app.upstream.http1 import Http1Transport

ANSWER = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 14\r\n"
          b"connection: keep-alive\r\n\r\ndata: {}\n\n\n\n\n\n")


async def one_answer_per_connection(connections: list[int], silent: bool = False
                                    ) -> asyncio.Server:
    """Answers the first request on a connection; a second request on the same
    connection is met by closing it, unanswered (a stale keep-alive)."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length")), 0)
        await reader.readexactly(length)
        if silent:
            await asyncio.sleep(30)
        writer.write(ANSWER)
        await writer.drain()
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await reader.readuntil(b"\r\n\r\n")  # the next request: dropped
        writer.close()
    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_stale_keepalive_is_a_reset_and_a_fresh_connection_works() -> None:
    async def run() -> None:
        connections: list[int] = []
        server = await one_answer_per_connection(connections)
        port = server.sockets[0].getsockname()[1]
        upstream = Upstream(Http1Transport(1.0, 30, 16))
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        try:
            first = await upstream.post(url, b"{}")
            assert first.status == 200 and await first.read()
            with pytest.raises(UpstreamError) as exc:
                await upstream.post(url, b"{}")  # reuses the pooled connection
            assert exc.value.kind == "reset"
            again = await upstream.post(url, b"{}", fresh=True)
            assert again.status == 200 and await again.read()
            assert len(connections) == 2
            retried = await upstream.post_again_if_reset(url, b"{}")  # stale, then new
            assert retried.status == 200 and await retried.read()
            assert len(connections) == 3
        finally:
            await upstream.aclose()
            server.close()
    asyncio.run(run())


def test_refused_connection_is_unavailable_and_silence_a_timeout() -> None:
    async def run() -> None:
        connections: list[int] = []
        server = await one_answer_per_connection(connections, silent=True)
        port = server.sockets[0].getsockname()[1]
        upstream = Upstream(Http1Transport(1.0, 4, 16), Timeouts(1.0, 0.2, 0.2))
        try:
            with pytest.raises(UpstreamError) as exc:
                await upstream.post(f"http://127.0.0.1:{port}/x", b"{}")
            assert exc.value.kind == "timeout"
            server.close()
            await server.wait_closed()
            with pytest.raises(UpstreamError) as exc:
                await upstream.post(f"http://127.0.0.1:{port}/x", b"{}")
            assert exc.value.kind == "unavailable"
        finally:
            await upstream.aclose()
    asyncio.run(run())


def test_a_probe_over_a_stale_keepalive_still_sees_a_healthy_worker() -> None:
    """A health probe that meets a connection the worker closed asks again on
    a new one: a false 'down' opened the breaker and cost 503s (found under
    load against llama-server)."""
    async def run() -> None:
        connections: list[int] = []
        server = await one_answer_per_connection(connections)
        port = server.sockets[0].getsockname()[1]
        upstream = Upstream(Http1Transport(1.0, 30, 16))
        try:
            for _ in range(3):
                assert await upstream.probe(f"http://127.0.0.1:{port}/health", 1.0)
            assert len(connections) == 3
        finally:
            await upstream.aclose()
            server.close()
    asyncio.run(run())
