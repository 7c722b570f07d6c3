"""Placement by marginal joules: a burst packs onto a running batch up to
max_batch, an idle replica costs its weight reads, a device that powers
down costs its wake, least outstanding stays a policy."""

from __future__ import annotations

import asyncio
from pathlib import Path

from app.catalog import Catalog, parse_catalog
from app.routing import catalog_curves
from app.upstream.placement import Candidate, marginal_j, place
from app.upstream.pool import ReplicaPool
from router.curves import Curve

ROOT = Path(__file__).resolve().parents[3]
# a + s/n with a = 1 J of own work and s = 4 J of shared weight reads (per kilotoken
# of completion here: the features are in kilotokens)
CURVE = Curve("b", "gpu", "llamacpp", "m", "nvml", "today", (0, 0, 1, 0, 4, 0, 0))


def test_one_more_request_costs_its_own_work_in_a_batch_and_the_weights_alone() -> None:
    idle, busy = Candidate(0, 0, 0), Candidate(1, 3, 3)
    assert marginal_j(CURVE, idle) == CURVE.joules(512, 256, 1)  # a + s
    assert marginal_j(CURVE, busy) < marginal_j(CURVE, idle)
    assert abs(marginal_j(CURVE, busy) - 0.256) < 1e-9  # a only: 1 J/ktok x 0.256
    wake = Candidate(0, 0, 0, wake_j=50.0)
    assert marginal_j(CURVE, wake) == marginal_j(CURVE, idle) + 50.0
    assert marginal_j(CURVE, Candidate(0, 0, 2, wake_j=50.0)) == marginal_j(CURVE, idle)


def test_a_burst_packs_up_to_max_batch_then_wakes_the_next() -> None:
    running = [0, 0]
    chosen = []
    for _ in range(6):
        p = place([Candidate(i, n, sum(running)) for i, n in enumerate(running)], CURVE, 4)
        running[p.order] += 1
        chosen.append(p.order)
    assert chosen == [0, 0, 0, 0, 1, 1]
    p = place([Candidate(0, 4, 6), Candidate(1, 2, 6)], CURVE, 4)
    assert p.order == 1 and "joins a batch of 2" in p.reason
    # every replica at its bound: least outstanding, said so
    p = place([Candidate(0, 5, 9), Candidate(1, 4, 9)], CURVE, 4)
    assert p.order == 1 and p.marginal_j is None and "max_batch 4" in p.reason
    # ties between two running batches: the busier one (the other drains)
    assert place([Candidate(0, 1, 3), Candidate(1, 2, 3)], CURVE, 4).order == 1
    # no curve: least outstanding
    assert place([Candidate(0, 1, 1), Candidate(1, 0, 1)], None, 4).order == 1


def test_a_batch_profile_spreads_where_the_engine_batches_poorly() -> None:
    """An engine whose batches of 2-4 cost up to 3x the form (the 8B on an
    H100, docs/routing.md): a third request costs more on a replica running
    two than on an idle one, so it goes to the idle one; without the
    profile it packs."""
    from dataclasses import replace

    bumpy = replace(CURVE, batch_profile=((1.0, 1.0), (2.0, 2.0), (4.0, 3.0), (8.0, 1.0)))
    free = [Candidate(0, 2, 2), Candidate(1, 0, 2)]
    assert place(free, CURVE, 8).order == 0
    p = place(free, bumpy, 8)
    assert p.order == 1 and "an idle replica" in p.reason and "(joining the batch of 2:" in p.reason
    assert marginal_j(bumpy, free[0]) > marginal_j(bumpy, free[1])


def catalog(placement: str = "marginal_joules", power_down: bool = False) -> Catalog:
    return parse_catalog({
        "base_dir": str(ROOT), "tiers": ["small"],
        "devices": [{"name": "gpu0", "idle_power_w": 70, "power_down": power_down},
                    {"name": "gpu1", "idle_power_w": 70, "power_down": power_down}],
        "backends": [{
            "name": "small-llamacpp", "kind": "llamacpp", "tier": "small", "model": "m",
            "curves": "curves/cpu/small-llamacpp.json", "placement": placement,
            "max_batch": 3,
            "replicas": [{"url": f"http://127.0.0.1:{9000 + i}", "device": f"gpu{i}",
                          "max_concurrency": 8} for i in range(2)]}],
    })


def test_the_pool_packs_by_joules_or_spreads_by_policy() -> None:
    async def burst(c: Catalog, n: int) -> list[int]:
        pool = ReplicaPool(c, curves=catalog_curves(c))
        return [(await pool.acquire("small-llamacpp")).order for _ in range(n)]

    assert asyncio.run(burst(catalog(), 5)) == [0, 0, 0, 1, 1]
    assert asyncio.run(burst(catalog("least_outstanding"), 5)) == [0, 1, 0, 1, 0]


def test_released_slots_and_placement_reasons() -> None:
    async def run() -> None:
        c = catalog()
        pool = ReplicaPool(c, curves=catalog_curves(c))
        a, why_a = await pool.acquire_placed("small-llamacpp")
        assert why_a.startswith("replica 0: an idle replica")
        b, why_b = await pool.acquire_placed("small-llamacpp")
        assert b.order == 0 and "joins a batch of 1" in why_b
        pool.release(a)
        pool.release(b)
        assert (await pool.acquire("small-llamacpp")).order == 0
    asyncio.run(run())


def test_a_queued_request_keeps_its_own_placement_reason() -> None:
    """A slot given to a waiting request keeps the reason it was taken with,
    though another request takes the same replica for another reason before
    the waiter runs again (stop 37's stale header)."""
    async def run() -> None:
        c = catalog()
        c = c.model_copy(update={"backends": [b.model_copy(update={"replicas": [
            r.model_copy(update={"max_concurrency": 3}) for r in b.replicas]})
            for b in c.backends]})
        pool = ReplicaPool(c, curves=catalog_curves(c))
        held = [await pool.acquire("small-llamacpp") for _ in range(6)]  # 0,0,0,1,1,1
        on_0 = [s for s in held if s.order == 0]
        waiter = asyncio.create_task(pool.acquire_placed("small-llamacpp"))
        await asyncio.sleep(0)  # queued: every slot is taken
        pool.release(on_0[0])  # the waiter gets replica 0, joining a batch of 2
        pool.release(on_0[1])
        pool.release(on_0[2])
        now, why_now = await pool.acquire_placed("small-llamacpp")  # before the waiter runs
        assert now.order == 0 and "joins a batch of 1" in why_now
        s, why = await waiter
        assert s.order == 0 and "joins a batch of 2" in why, why
    asyncio.run(run())


def test_a_replica_slower_than_the_bound_is_not_packed() -> None:
    """`max_seconds_per_token`: a batch measured slower than the bound takes no
    more; an unmeasured one is within it; every replica too slow (or full)
    spreads by least outstanding, and the reason says so."""
    # replica 0 runs 2 and a batch of 3 there is measured at 0.08 s a token
    slow, idle = Candidate(0, 2, 2, pace_s=0.08), Candidate(1, 0, 2)
    assert place([slow, idle], CURVE, 8).order == 0  # no bound: it joins the batch
    p = place([slow, idle], CURVE, 8, 0.05)
    assert p.order == 1 and "an idle replica" in p.reason
    assert "replica 0 slower than 0.05 s a token" in p.reason
    assert place([Candidate(0, 2, 2, pace_s=0.04), idle], CURVE, 8, 0.05).order == 0
    assert place([Candidate(0, 2, 2), idle], CURVE, 8, 0.05).order == 0  # not measured
    p = place([slow, Candidate(1, 1, 3, pace_s=0.09)], CURVE, 8, 0.05)
    assert p.order == 1 and p.marginal_j is None
    assert "every replica at its max_batch 8 or 0.05 s a token" in p.reason


def test_the_pool_measures_each_replicas_pace_and_packs_within_it() -> None:
    async def run() -> None:
        now = [0.0]
        c = catalog()
        c = c.model_copy(update={"backends": [b.model_copy(update={
            "max_seconds_per_token": 0.05}) for b in c.backends]})
        pool = ReplicaPool(c, curves=catalog_curves(c), clock=lambda: now[0])

        async def burst(n: int) -> list[int]:
            return [(await pool.acquire("small-llamacpp")).order for _ in range(n)]

        def release_all() -> None:
            for s in pool.all_states():
                while s.outstanding:
                    pool.release(s)

        # cold: no pace known beyond a first request, so a burst spreads
        assert await burst(4) == [0, 1, 0, 1]
        release_all()
        s0 = pool.all_states()[0]
        pool.paced(s0, 1, 0.02)  # replica 0 answered alone at 0.02 s a token
        assert await burst(3) == [0, 0, 1]  # a batch of 2 borrows 1's pace; 3 is unknown
        pool.paced(s0, 2, 0.03)
        release_all()
        assert await burst(4) == [0, 0, 0, 1]  # 3 borrows 2's (0.03); 3 = max_batch
        pool.paced(s0, 3, 0.09)  # ... and is measured over the bound
        release_all()
        assert await burst(2) == [0, 0]
        _, why = await pool.acquire_placed("small-llamacpp")  # a batch of 3 on 0: 0.09
        assert why.startswith("replica 1") and "replica 0 slower than 0.05" in why, why
        release_all()
        now[0] = 200.0  # every report expired: cold again
        assert await burst(2) == [0, 1]
    asyncio.run(run())
