"""Placement with real workers: two llama-server replicas of the small
backend; four requests at once pack three onto one replica's batch (max_batch
3) and wake the other for the fourth, where least outstanding spreads them
two and two; each response names its replica and why."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from app.catalog import Catalog
from app.tools.embedded import free_port, run_gateway
from tests.integration.conftest import Workers, catalog_for
from workers.local import WorkerSpec, start_worker, stop

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def second_small(llama_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    spec = WorkerSpec("small-2", "tiny-small", free_port())
    proc = start_worker(spec, Path(llama_bin), tmp_path_factory.mktemp("logs"))
    try:
        yield f"http://127.0.0.1:{spec.port}"
    finally:
        stop([proc])


def two_replicas(workers: Workers, second: str, placement: str) -> Catalog:
    c = catalog_for([workers.small, second], [workers.large])
    backends = [b.model_copy(update={"placement": placement, "max_batch": 3})
                if b.tier == "small" else b for b in c.backends]
    return c.model_copy(update={"backends": backends})


def burst(v1: str, n: int) -> list[httpx.Response]:
    """`n` requests at once (long enough to overlap: 400 tokens each)."""
    start = threading.Barrier(n)
    with httpx.Client(timeout=120, limits=httpx.Limits(max_connections=n)) as client:
        def one(_: int) -> httpx.Response:
            start.wait()
            return client.post(v1 + "/chat/completions", json={
                "model": "small", "messages": [{"role": "user", "content": "Count."}],
                "max_tokens": 400, "ignore_eos": True})
        with ThreadPoolExecutor(n) as pool:
            return list(pool.map(one, range(n)))


def replicas(out: list[httpx.Response]) -> Counter[str]:
    assert all(r.status_code == 200 for r in out), [r.text for r in out]
    return Counter(r.headers["x-joulegate-placement"].split(":")[0] for r in out)


def test_a_burst_packs_onto_one_batch_within_max_batch(workers: Workers,
                                                       second_small: str) -> None:
    with run_gateway(two_replicas(workers, second_small, "marginal_joules")) as gw:
        out = burst(gw.v1, 4)
        assert sorted(replicas(out).values()) == [1, 3]
        reasons = [r.headers["x-joulegate-placement"] for r in out]
        assert sum("joins a batch of" in r for r in reasons) == 2  # 1 idle + 2 joining, 1 woken
    with run_gateway(two_replicas(workers, second_small, "least_outstanding")) as gw:
        out = burst(gw.v1, 4)
        assert sorted(replicas(out).values()) == [2, 2]
        assert all("least outstanding" in r.headers["x-joulegate-placement"] for r in out)
