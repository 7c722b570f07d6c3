"""Faults with real llama-server workers: stale keep-alive connections under
concurrency, a worker killed and restarted, a hung (SIGSTOP) worker, garbage."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.tools.embedded import free_port
from tests.integration.conftest import RunningGateway, Workers, catalog_for, run_gateway
from workers.local import WorkerSpec, start_worker, stop

pytestmark = pytest.mark.integration

MSG = [{"role": "user", "content": "hello there"}]
CHEAP = {"x-joulegate-policy": "min-energy"}  # `auto` picks the small tier for MSG


async def _hammer(url: str, model: str, concurrency: int, total: int) -> Counter[int]:
    statuses: Counter[int] = Counter()
    body = {"model": model, "messages": MSG, "max_tokens": 1}
    left = iter(range(total))
    async with httpx.AsyncClient(timeout=60) as client:
        async def one_client() -> None:
            for _ in left:
                r = await client.post(url, json=body)
                statuses[r.status_code] += 1
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
    return statuses


def test_no_false_503s_at_concurrency_2_to_8(gateway: RunningGateway) -> None:
    # The worker (cpp-httplib) closes idle keep-alive connections: requests that
    # met one used to mark the replica down and get 503s.
    url = gateway.v1 + "/chat/completions"
    seen: Counter[int] = Counter()
    for concurrency in (2, 4, 8):
        seen += asyncio.run(_hammer(url, "small", concurrency, 340))
    assert seen == Counter({200: 1020})
    pool = gateway.app.state.gateway.planner.pool
    assert all(s.breaker.state == "closed" for s in pool.all_states())


@pytest.fixture
def own_small(llama_bin: str, tmp_path: Path) -> Iterator[tuple[WorkerSpec, list[object]]]:
    """A small worker of this test's own, to kill, stop and restart."""
    spec = WorkerSpec("own-small", "tiny-small", free_port(), parallel=2)
    procs = [start_worker(spec, Path(llama_bin), tmp_path)]
    try:
        yield spec, procs  # type: ignore[misc]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGCONT)  # type: ignore[attr-defined]
        stop(procs)  # type: ignore[arg-type]


def _until(cond: object, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def test_killed_worker_auto_fails_over_then_returns(
        own_small: tuple[WorkerSpec, list[object]], workers: Workers, llama_bin: str,
        tmp_path: Path) -> None:
    spec, procs = own_small
    small = f"http://127.0.0.1:{spec.port}"
    with run_gateway(catalog_for([small], [workers.large])) as gw:
        chat = gw.v1 + "/chat/completions"
        r = httpx.post(chat, json={"model": "auto", "messages": MSG}, headers=CHEAP, timeout=30)
        assert r.headers["x-joulegate-tier"] == "small"
        stop(procs)  # type: ignore[arg-type]
        for _ in range(10):
            r = httpx.post(chat, json={"model": "auto", "messages": MSG, "max_tokens": 2},
                           headers=CHEAP, timeout=30)
            assert r.status_code == 200 and r.headers["x-joulegate-tier"] == "large"
        assert _until(lambda: httpx.get(gw.url + "/readyz").json()["degraded"] == ["small"], 5)
        d = httpx.post(gw.v1 + "/route", json={"model": "auto", "messages": MSG},
                       headers=CHEAP).json()
        assert d["tier"] == "large"
        forced = httpx.post(chat, json={"model": "small", "messages": MSG})
        assert forced.status_code == 503 and int(forced.headers["retry-after"]) >= 1
        procs.append(start_worker(spec, Path(llama_bin), tmp_path))
        assert _until(lambda: httpx.post(chat, json={"model": "small", "messages": MSG,
                                                      "max_tokens": 2}).status_code == 200, 10)
        assert httpx.get(gw.url + "/readyz").json()["degraded"] == []


def test_hung_worker_is_ejected(own_small: tuple[WorkerSpec, list[object]],
                                workers: Workers) -> None:
    spec, procs = own_small
    small = f"http://127.0.0.1:{spec.port}"
    with run_gateway(catalog_for([small], [workers.large]), health_interval_seconds=0.5,
                     first_byte_timeout_seconds=5) as gw:
        chat = gw.v1 + "/chat/completions"
        os.killpg(procs[0].pid, signal.SIGSTOP)  # type: ignore[attr-defined]
        # Two failed probes (0.5 s apart, 0.5 s timeout each) eject it.
        assert _until(lambda: httpx.get(gw.url + "/readyz").json()["degraded"] == ["small"], 5)
        for _ in range(5):
            t0 = time.perf_counter()
            r = httpx.post(chat, json={"model": "auto", "messages": MSG, "max_tokens": 2},
                           headers=CHEAP, timeout=30)
            assert r.status_code == 200 and r.headers["x-joulegate-tier"] == "large"
            assert time.perf_counter() - t0 < 2
        forced = httpx.post(chat, json={"model": "small", "messages": MSG}, timeout=30)
        assert forced.status_code == 503
        os.killpg(procs[0].pid, signal.SIGCONT)  # type: ignore[attr-defined]
        assert _until(lambda: httpx.post(chat, json={"model": "small", "messages": MSG,
                                                      "max_tokens": 2}).status_code == 200, 10)


HEALTHY = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"


def _garbage_server(reply: bytes) -> tuple[str, socket.socket]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                request = conn.recv(65536)
                conn.sendall(HEALTHY if request.startswith(b"GET /health") else reply)
    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}", sock


@pytest.mark.parametrize("reply", [
    b"\x00\x01garbage that is no HTTP at all\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 18\r\n\r\n"
    b"no events in here\n",
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 24\r\n\r\n"
    b"data: {not json at all\n\n",
])
def test_garbage_replies_are_502(workers: Workers, reply: bytes) -> None:
    url, sock = _garbage_server(reply)
    try:
        with run_gateway(catalog_for([url], [workers.large]),
                         health_interval_seconds=60) as gw:
            r = httpx.post(gw.v1 + "/chat/completions",
                           json={"model": "small", "messages": MSG}, timeout=30)
            assert r.status_code == 502, r.text
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    finally:
        sock.close()
