"""Several gateways, one set of limits (issue 29): three `joulegate serve`
processes, and one `serve --workers 3`, sharing a real Redis and one ledger;
100 concurrent requests against a key with rpm 30; a 20-request burst
against a tight joule budget; Redis killed and restarted under load."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.tenancy.keys import KeyStore
from app.tools.embedded import free_port
from tests.integration.conftest import Workers, models_file, serve
from tests.redis_server import RedisServer
from workers.local import wait_healthy

pytestmark = pytest.mark.integration
MSG = [{"role": "user", "content": "Say hi."}]


@contextmanager
def gateways(workers: Workers, folder: Path, redis_url: str, database: str, count: int = 3,
             processes: int = 1, redis_timeout_ms: float = 1000) -> Iterator[list[str]]:
    """`count` gateways (`processes` each), their base URLs. This 2-core
    machine runs them, two workers and up to 100 client threads: a gateway's
    loop may take longer than the default 50 ms to read Redis's answer, and
    a request that waited that long is admitted by its gateway's own window
    (33 of 100 admitted instead of 30, measured with the default); the
    bursts below wait up to a second, the outage test runs the default."""
    models = models_file(workers, folder)
    args = ["--workers", str(processes)] if processes > 1 else []
    procs, urls = [], []
    try:
        for i in range(count):
            port = free_port()
            procs.append(serve(models, port, folder / f"state{i}", folder / f"log{i}", *args,
                               JOULEGATE_DATABASE_URL=database, JOULEGATE_REDIS_URL=redis_url,
                               JOULEGATE_REDIS_TIMEOUT_MS=str(redis_timeout_ms)))
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs, strict=True):
            wait_healthy(f"{url}/readyz", 90, proc)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


def chat(url: str, secret: str, max_tokens: int = 2) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", timeout=60,
                      headers={"authorization": f"Bearer {secret}"},
                      json={"model": "small", "messages": MSG, "max_tokens": max_tokens})


def burst(urls: list[str], secret: str, n: int, max_tokens: int = 2) -> list[httpx.Response]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda i: chat(urls[i % len(urls)], secret, max_tokens), range(n)))


def rpm_counts(out: list[httpx.Response]) -> tuple[int, int, list[int]]:
    limited = [r for r in out if r.status_code == 429
               and r.json()["error"]["code"] == "rpm_limit_exceeded"]
    assert all(int(r.headers["retry-after"]) >= 1 for r in limited)
    return (sum(r.status_code == 200 for r in out), len(limited),
            sorted({r.status_code for r in out}))


def decided_locally(urls: list[str], operation: str = "admit") -> int:
    """Requests the gateways decided alone (Redis slow to answer): each
    gateway's joulegate_shared_state_local_decisions_total, summed."""
    time.sleep(0.3)  # the processes' metric updates reach the scrape within 0.1 s
    pattern = ('^joulegate_shared_state_local_decisions_total'
               + re.escape('{operation="' + operation + '"}') + r' ([\d.e+-]+)$')
    total = 0.0
    for url in urls:
        m = re.search(pattern, httpx.get(f"{url}/metrics").text, re.M)
        assert m is not None, "the local-decision counter is exported with shared limits"
        total += float(m.group(1))
    return int(total)


def shared_up(url: str) -> float | None:
    m = re.search(r"^joulegate_shared_state_up(?:\{[^}]*\})? ([\d.e+-]+)$",
                  httpx.get(f"{url}/metrics").text, re.M)
    return None if m is None else float(m.group(1))


@pytest.fixture
def store(tmp_path: Path) -> tuple[str, KeyStore]:
    url = f"sqlite:///{tmp_path / 'joulegate.db'}"
    return url, KeyStore(url)


def test_three_gateways_admit_one_rpm_30(workers: Workers, tmp_path: Path, redis_url: str,
                                         store: tuple[str, KeyStore]) -> None:
    database, keys = store
    _, secret = keys.create("burst", rpm=30)
    with gateways(workers, tmp_path, redis_url, database) as urls:
        ok, limited, statuses = rpm_counts(burst(urls, secret, 100))
        alone = decided_locally(urls)
        (tmp_path / "counts.txt").write_text(f"{ok} {limited} {statuses} {alone}\n")
        # one limit of 30 across the three; a request whose Redis answer came
        # too late to a loaded gateway was decided by that gateway's window,
        # and counted as such (the bound is then looser by those)
        assert 29 <= ok <= 31 + alone and ok + limited == 100, (ok, limited, statuses, alone)
        assert alone < 50, alone  # Redis decided most: the limit was shared
        assert all(shared_up(u) == 1.0 for u in urls)


def test_serve_workers_3_admits_one_rpm_30(workers: Workers, tmp_path: Path, redis_url: str,
                                           store: tuple[str, KeyStore]) -> None:
    database, keys = store
    _, secret = keys.create("burst", rpm=30)
    with gateways(workers, tmp_path, redis_url, database, count=1, processes=3) as urls:
        ok, limited, statuses = rpm_counts(burst(urls, secret, 100))
        alone = decided_locally(urls)  # the three processes' counters, merged
        assert 29 <= ok <= 31 + alone and ok + limited == 100, (ok, limited, statuses, alone)
        assert alone < 50, alone


def _spent(url: str, admin: str, name: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/v1/usage", params={"since": "1h"},
                  headers={"authorization": f"Bearer {admin}"})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_burst_overshoots_a_joule_budget_by_one_request_at_most(
        workers: Workers, tmp_path: Path, redis_url: str, store: tuple[str, KeyStore],
        one_utc_day: None) -> None:
    """Each request holds its price (x-joulegate-energy-held) while it runs: a
    20-request burst across three gateways is admitted while spent + held <
    budget, so what the admitted requests held exceeds the budget by at most
    one request's price. Their final figures are written down too: on this
    machine's estimate source a burst makes every request dearer (the whole
    machine is busy), which the price does not know."""
    database, keys = store
    _, probe = keys.create("probe")
    with gateways(workers, tmp_path, redis_url, database) as urls:
        one = max(float(chat(urls[0], probe, 8).json()["usage"]["energy_joules"])
                  for _ in range(3))
        budget = 6 * one
        _, secret = keys.create("tight", joule_budget=budget, budget_period="day")
        time.sleep(2.5)  # the gateways' key rings reload every 2 s
        out = burst(urls, secret, 20, 8)
        answered = [r for r in out if r.status_code == 200]
        refused = [r for r in out if r.status_code == 429
                   and r.json()["error"]["code"] == "joule_budget_exceeded"]
        assert len(answered) + len(refused) == 20, sorted(r.status_code for r in out)
        held = [float(r.headers["x-joulegate-energy-held"]) for r in answered]
        spent = sum(float(r.json()["usage"]["energy_joules"]) for r in answered)
        (tmp_path / "joules.txt").write_text(
            f"budget {budget:.3f} J; answered {len(answered)} of 20, held {sum(held):.3f} J "
            f"(one price <= {max(held):.3f} J); final {spent:.3f} J\n")
        assert refused and answered
        assert sum(held) < budget + max(held), (held, budget)
        assert chat(urls[1], secret, 2).status_code == 429  # and it stays spent


def test_redis_killed_and_restarted_under_load(workers: Workers, tmp_path: Path,
                                               store: tuple[str, KeyStore]) -> None:
    database, keys = store
    _, steady = keys.create("steady")
    server = RedisServer(tmp_path)
    server.start()
    try:
        with gateways(workers, tmp_path, server.url, database, redis_timeout_ms=50) as urls:
            seen: list[tuple[int, float]] = []

            def client(i: int) -> None:
                end = time.monotonic() + 6
                while time.monotonic() < end:
                    t0 = time.monotonic()
                    r = chat(urls[i % 3], steady, 1)
                    seen.append((r.status_code, time.monotonic() - t0))

            with ThreadPoolExecutor(6) as pool:
                running = [pool.submit(client, i) for i in range(6)]
                time.sleep(1.5)
                server.stop()
                time.sleep(1.5)
                down = [shared_up(u) for u in urls]
                server.start()
                for f in running:
                    f.result()
            assert seen and all(status == 200 for status, _ in seen), \
                sorted({s for s, _ in seen})
            assert max(s for _, s in seen) < 10
            assert 0.0 in down  # a gateway that asked Redis meanwhile says so
            deadline = time.monotonic() + 5
            while any(shared_up(u) != 1.0 for u in urls):
                assert time.monotonic() < deadline, [shared_up(u) for u in urls]
                time.sleep(0.1)
            _, secret = keys.create("after", rpm=6)
            time.sleep(2.5)
            before = decided_locally(urls)
            ok, limited, _ = rpm_counts(burst(urls, secret, 18))
            alone = decided_locally(urls) - before
            # shared again: 6 in all, not 6 per gateway; with this test's 50 ms
            # timeout a loaded gateway may read an answer late and decide that
            # request alone (a CI run admitted 8), and says so in its counter
            assert 6 <= ok <= 6 + alone and ok + limited == 18, (ok, limited, alone)
            assert alone < 9, alone  # Redis decided most: the limit was shared
    finally:
        server.stop()
