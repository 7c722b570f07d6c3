"""Admission: slots per replica, a bounded queue, fast refusals, breakers."""

from __future__ import annotations

import asyncio

import pytest

from app.catalog import Catalog, parse_catalog
from app.upstream.pool import NoReplica, Overloaded, ReplicaPool


def catalog(replicas: int = 1, max_concurrency: int = 2, max_queue: int = 2) -> Catalog:
    return parse_catalog({
        "tiers": ["small"],
        "devices": [{"name": "cpu"}],
        "backends": [{
            "name": "b", "kind": "llamacpp", "tier": "small", "model": "m",
            "max_queue": max_queue,
            "replicas": [{"url": f"http://127.0.0.1:{9000 + i}", "device": "cpu",
                          "max_concurrency": max_concurrency} for i in range(replicas)],
        }],
    })


def test_full_replicas_queue_then_refuse() -> None:
    async def run() -> None:
        pool = ReplicaPool(catalog(), queue_timeout_s=5)
        held = [await pool.acquire("b"), await pool.acquire("b")]
        waiting = [asyncio.create_task(pool.acquire("b")) for _ in range(2)]
        await asyncio.sleep(0)
        assert pool.queued("b") == 2 and pool.backend_saturated("b")
        with pytest.raises(Overloaded):
            await pool.acquire("b")  # queue full: refused at once
        pool.release(held[0])
        got = await waiting[0]  # FIFO: the first waiter gets the slot
        assert got.outstanding == 2 and not waiting[1].done()
        pool.release(held[1])
        await waiting[1]
    asyncio.run(run())


def test_queue_wait_is_bounded() -> None:
    async def run() -> None:
        pool = ReplicaPool(catalog(max_concurrency=1), queue_timeout_s=0.05)
        await pool.acquire("b")
        with pytest.raises(Overloaded):
            await pool.acquire("b")
        assert pool.queued("b") == 0
    asyncio.run(run())


def test_cancelled_waiter_leaks_no_slot() -> None:
    async def run() -> None:
        pool = ReplicaPool(catalog(max_concurrency=1), queue_timeout_s=5)
        held = await pool.acquire("b")
        waiter = asyncio.create_task(pool.acquire("b"))
        await asyncio.sleep(0)
        waiter.cancel()
        pool.release(held)  # hands the slot to the cancelled waiter, which gives it back
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert pool.outstanding()["b"] == 0
        again = await pool.acquire("b")
        assert again.outstanding == 1
    asyncio.run(run())


def test_least_loaded_replica_and_open_breakers() -> None:
    async def run() -> None:
        pool = ReplicaPool(catalog(replicas=2), queue_timeout_s=5)
        a = await pool.acquire("b")
        b = await pool.acquire("b")
        assert a.order != b.order  # spread
        for _ in range(3):
            pool.report(a, ok=False)
        assert a.breaker.state == "open"
        c = await pool.acquire("b")
        assert c.order == b.order  # the open replica is skipped
        for _ in range(3):
            pool.report(b, ok=False)
        with pytest.raises(NoReplica) as exc:
            await pool.acquire("b")
        assert exc.value.retry_after_s >= 1
        assert not pool.backend_up("b") and "b" not in pool.accepting()
    asyncio.run(run())
