"""Placement with real workers: two llama-server replicas of the small
backend; four requests in flight together pack three onto one replica's
batch (max_batch 3) and wake the other for the fourth, where least
outstanding alternates; each response names its replica and why. With a
latency bound in seconds per token, a replica whose answers were measured
slower than it takes no more while the other has room, and a batch not
measured yet is not packed blind."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
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


def two_replicas(workers: Workers, second: str, placement: str,
                 max_seconds_per_token: float | None = None) -> Catalog:
    c = catalog_for([workers.small, second], [workers.large])
    backends = [b.model_copy(update={"placement": placement, "max_batch": 3,
                                     "max_seconds_per_token": max_seconds_per_token})
                if b.tier == "small" else b for b in c.backends]
    return c.model_copy(update={"backends": backends})


def held_open(v1: str, n: int) -> list[str]:
    """`n` streamed requests opened one after another, each still running
    when the next arrives (long answers, not read): their placements."""
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(httpx.Client(timeout=120))
        out = []
        for _ in range(n):
            r = stack.enter_context(client.stream("POST", v1 + "/chat/completions", json={
                "model": "small", "stream": True, "max_tokens": 1500, "ignore_eos": True,
                "messages": [{"role": "user", "content": "Count."}]}))
            assert r.status_code == 200
            out.append(r.headers["x-joulegate-placement"])
        return out


def test_a_burst_packs_onto_one_batch_within_max_batch(workers: Workers,
                                                       second_small: str) -> None:
    with run_gateway(two_replicas(workers, second_small, "marginal_joules")) as gw:
        packed = held_open(gw.v1, 4)
    assert [r.split(":")[0] for r in packed] == ["replica 0"] * 3 + ["replica 1"]
    assert "an idle replica" in packed[0] and "an idle replica" in packed[3]
    assert "joins a batch of 1" in packed[1] and "joins a batch of 2" in packed[2]
    with run_gateway(two_replicas(workers, second_small, "least_outstanding")) as gw:
        spread = held_open(gw.v1, 4)
    assert [r.split(":")[0] for r in spread] == ["replica 0", "replica 1"] * 2
    assert all("least outstanding" in r for r in spread)


def test_a_replica_slower_than_the_latency_bound_takes_no_more(workers: Workers,
                                                              second_small: str) -> None:
    # a bound no CPU worker meets: the first answer's measured pace rules its replica out
    bound = 1e-6
    with run_gateway(two_replicas(workers, second_small, "marginal_joules", bound)) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", timeout=120, json={
            "model": "small", "max_tokens": 200, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Count."}]})
        assert r.status_code == 200 and r.headers["x-joulegate-placement"].startswith("replica 0")
        placed = held_open(gw.v1, 2)
    assert placed[0].startswith("replica 1: an idle replica"), placed
    assert "replica 0 slower than 1e-06 s a token" in placed[0]
    # replica 1's batch of 2 is not measured yet and replica 0 is too slow:
    # least outstanding, said so
    assert placed[1].startswith("replica 0: least outstanding (0 running)"), placed
    assert "1e-06 s a token" in placed[1]


def test_a_long_answer_reports_its_pace_early(workers: Workers, second_small: str) -> None:
    """An answer still streaming tells its replica its pace 32 tokens in: a
    second request may then join that batch (a bound every CPU worker meets)
    instead of counting a batch of 2 as not measured yet and waking replica 1."""
    with run_gateway(two_replicas(workers, second_small, "marginal_joules", 10.0)) as gw, \
            httpx.Client(timeout=120) as client, \
            client.stream("POST", gw.v1 + "/chat/completions", json={
                "model": "small", "stream": True, "max_tokens": 1500, "ignore_eos": True,
                "messages": [{"role": "user", "content": "Count."}]}) as first:
        assert first.headers["x-joulegate-placement"].startswith("replica 0")
        events = 0
        for line in first.iter_lines():
            events += line.startswith("data: ")
            if events >= 40:  # past the early report
                break
        placed = held_open(gw.v1, 1)
    assert placed[0].startswith("replica 0") and "joins a batch of 1" in placed[0], placed
