"""joulegate's HTTP/1.1 client against raw servers that answer the ways workers
(and broken workers) do: chunked streams, lengths, answers ended by closing,
garbage, silence, large bodies, and idle connections."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import quote

import pytest
import uvloop

from app.upstream.client import Timeouts, Upstream, UpstreamError
from app.upstream.http1 import Http1Transport, split_url

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
QUICK = Timeouts(1.0, 1.0, 1.0)


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length")), 0)
    return head + await reader.readexactly(length)


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


STREAM_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
               b"transfer-encoding: chunked\r\n\r\n")


def serve(handler: Handler, test: Callable[[str, Upstream, list[int]], Awaitable[None]],
          transport: Http1Transport | None = None, timeouts: Timeouts = QUICK,
          loop: str = "asyncio") -> None:
    """Run `test(base_url, upstream, connections)` against a server whose
    connections are handled by `handler` (connections: one entry per accepted one)."""
    async def run() -> None:
        connections: list[int] = []

        async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections.append(1)
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                await handler(reader, writer)
            writer.close()

        server = await asyncio.start_server(counted, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        upstream = Upstream(transport or Http1Transport(1.0, 30, 16), timeouts)
        try:
            await test(f"http://127.0.0.1:{port}", upstream, connections)
        finally:
            await upstream.aclose()
            server.close()
    if loop == "uvloop":  # what the gateway runs on under uvicorn
        uvloop.run(run())
    else:
        asyncio.run(run())


def test_split_url_takes_host_port_and_target() -> None:
    address, target = split_url("http://worker:8080/v1/chat/completions?x=1")
    assert (address.host, address.port, address.tls, target) == (
        "worker", 8080, False, "/v1/chat/completions?x=1")
    assert split_url("https://w.example/")[0].port == 443
    with pytest.raises(UpstreamError) as exc:
        split_url("ftp://w/")
    assert exc.value.kind == "unavailable"


def test_an_http_unix_url_names_a_socket_path_and_a_request_goes_over_it(
        tmp_path: Path) -> None:
    path = str(tmp_path / "agent.sock")
    address, target = split_url("http+unix://" + quote(path, safe="") + "/v1/windows/batch")
    assert (address.socket_path, target) == (path, "/v1/windows/batch")

    async def run() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                while True:
                    request = await read_request(reader)
                    body = request.partition(b"\r\n\r\n")[2]
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s"
                                 % (len(body), body))

        server = await asyncio.start_unix_server(handler, path)
        upstream = Upstream(Http1Transport(1.0, 30, 4), QUICK)
        try:
            for n in range(3):  # on one kept-alive connection
                r = await upstream.post("http+unix://" + quote(path, safe="") + "/x", {"n": n})
                assert r.status == 200 and json.loads(await r.read()) == {"n": n}
                await r.aclose()
        finally:
            await upstream.aclose()
            server.close()
    uvloop.run(run())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_chunked_stream_arrives_in_order_and_the_connection_is_reused(loop: str) -> None:
    events = [b"data: {\"n\": %d}\n\n" % i for i in range(5)]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await read_request(reader)
            assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
            assert b"\r\nContent-Type: application/json\r\n" in request
            writer.write(STREAM_HEAD)
            for e in events:
                writer.write(b"%x\r\n%s\r\n" % (len(e), e))
                await writer.drain()
                await asyncio.sleep(0.01)
            writer.write(b"0\r\n\r\n")

    async def test(base: str, upstream: Upstream, connections: list[int]) -> None:
        for _ in range(3):
            r = await upstream.post(base + "/v1/chat/completions", {"model": "m"})
            got = [c async for c in r.chunks()]
            await r.aclose()
            assert r.status == 200 and b"".join(got) == b"".join(events)
            assert len(got) >= 2  # streamed as it came, not collected
        assert len(connections) == 1
    serve(handler, test, loop=loop)


def test_an_answer_ended_by_closing_is_whole_and_not_reused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: 1\n\n")
        await writer.drain()
        writer.close()

    async def test(base: str, upstream: Upstream, connections: list[int]) -> None:
        for _ in range(2):
            r = await upstream.post(base + "/x", b"{}")
            assert await r.read() == b"data: 1\n\n"
        assert len(connections) == 2
    serve(handler, test)


@pytest.mark.parametrize(("answer", "kind"), [
    (STREAM_HEAD + b"5\r\ndata:", "broken"),  # closed mid-chunk
    (b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort", "broken"),
    (b"hello, this is not HTTP\r\n\r\n", "broken"),
])
def test_a_broken_answer_is_broken(answer: bytes, kind: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer)
        await writer.drain()

    async def test(base: str, upstream: Upstream, connections: list[int]) -> None:
        with pytest.raises(UpstreamError) as exc:
            r = await upstream.post(base + "/x", b"{}")
            await r.read()
        assert exc.value.kind == kind
    serve(handler, test)


def test_silence_after_the_first_chunk_is_a_timeout() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(STREAM_HEAD + b"7\r\ndata: 1\r\n")
        await writer.drain()
        await asyncio.sleep(5)

    async def test(base: str, upstream: Upstream, connections: list[int]) -> None:
        r = await upstream.post(base + "/x", b"{}")
        it = r.chunks()
        assert await it.__anext__() == b"data: 1"
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(UpstreamError) as exc:
            await it.__anext__()
        assert exc.value.kind == "timeout" and 0.15 < loop.time() - start < 1.0
        await r.aclose()
    serve(handler, test, timeouts=Timeouts(1.0, 2.0, 0.2))


def test_a_large_body_read_slowly_arrives_whole() -> None:
    body = bytes(range(256)) * 8192  # 2 MiB: reading pauses and resumes

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        await reader.read()

    async def test(base: str, upstream: Upstream, connections: list[int]) -> None:
        r = await upstream.post(base + "/x", b"{}")
        got = bytearray()
        async for chunk in r.chunks():
            got += chunk
            await asyncio.sleep(0.001)
        assert bytes(got) == body
    serve(handler, test)


def test_closing_an_unfinished_answer_drops_the_connection() -> None:
    seen: list[str] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(STREAM_HEAD + b"7\r\ndata: 1\r\n")
        await writer.drain()
        assert await reader.read() == b""  # the gateway closed: the worker stops
        seen.append("eof")

    async def test(base: str, upstream: Upstream, connections: list[int]) -> None:
        r = await upstream.post(base + "/x", b"{}")
        assert await r.chunks().__anext__() == b"data: 1"
        await r.aclose()
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        assert seen == ["eof"]
    serve(handler, test)


def test_idle_connections_past_the_keepalive_are_not_reused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(STREAM_HEAD + chunked(b"data: 1\n\n"))
            await writer.drain()

    async def test(base: str, upstream: Upstream, connections: list[int]) -> None:
        for pause_s in (0.0, 0.0, 0.3):
            await asyncio.sleep(pause_s)
            r = await upstream.post(base + "/x", b"{}")
            assert await r.read() == b"data: 1\n\n"
        assert len(connections) == 2  # the third came after 0.3 s > 0.2 s idle
    serve(handler, test, transport=Http1Transport(1.0, 0.2, 16))


def test_requests_over_the_connection_limit_wait_their_turn() -> None:
    active: list[int] = [0, 0]  # now, most

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            active[0] += 1
            active[1] = max(active)
            await asyncio.sleep(0.05)
            active[0] -= 1
            writer.write(STREAM_HEAD + chunked(b"data: 1\n\n"))
            await writer.drain()

    async def test(base: str, upstream: Upstream, connections: list[int]) -> None:
        async def one() -> bytes:
            r = await upstream.post(base + "/x", b"{}")
            return await r.read()
        assert await asyncio.gather(*(one() for _ in range(6))) == [b"data: 1\n\n"] * 6
        assert active[1] == 2 and len(connections) == 2
    serve(handler, test, transport=Http1Transport(1.0, 30, 2))


def test_a_get_without_a_body_and_a_refused_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader)
        assert request.startswith(b"GET /health HTTP/1.1\r\n")
        assert b"content-length" not in request.lower()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()

    async def test(base: str, upstream: Upstream, connections: list[int]) -> None:
        assert await upstream.probe(base + "/health", 1.0)
        assert not await upstream.probe("http://127.0.0.1:1/health", 1.0)
    serve(handler, test)
