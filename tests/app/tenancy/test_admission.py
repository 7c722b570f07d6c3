"""Rates and joule holds, in one gateway and shared by several through a real
Redis: one limit for all, holds that a burst cannot overshoot, and Redis
going away and coming back without holding a request."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from app.tenancy import shared as shared_mod
from app.tenancy.admission import Admission
from app.tenancy.keys import ApiKey
from app.tenancy.shared import SharedState
from tests.redis_server import RedisServer


def key(**limits: object) -> ApiKey:
    return ApiKey("k1", "team", "h", 0.0, **limits)  # type: ignore[arg-type]


def test_local_holds_stop_a_burst_at_the_budget() -> None:
    async def go() -> None:
        adm, k = Admission(), key(joule_budget=10.0)
        holds = [await adm.reserve(k, 3.0, spent_j=0.0) for _ in range(6)]
        assert [h is not None for h in holds] == [True] * 4 + [False] * 2  # 0, 3, 6, 9 < 10
        assert adm.held_j("k1") == 12.0
        adm.settle(holds[0], 2.5)
        adm.settle(holds[0], 1.0)  # a second figure for the same request: nothing to release
        assert adm.held_j("k1") == 9.0
        assert await adm.reserve(k, 3.0, spent_j=2.5) is None  # 2.5 + 9 >= 10
        for h in holds[1:4]:
            adm.settle(h, 0.0)
        assert adm.held_j("k1") == 0.0 and await adm.reserve(k, 3.0, spent_j=2.5)
    asyncio.run(go())


def _gateways(url: str, n: int, ups: list[bool] | None = None) -> list[Admission]:
    """`n` gateways' admissions on one Redis. They wait up to a second for it:
    these tests are about what is shared (a slow answer admits locally, which
    a loaded test machine must not turn into a flaky count)."""
    return [Admission(shared=SharedState(url, 1.0, (ups.append if ups is not None
                                                      else lambda up: None)))
            for _ in range(n)]


async def _start(gws: list[Admission]) -> None:
    for g in gws:
        assert g.shared is not None
        await g.shared.start()


async def _close(gws: list[Admission]) -> None:
    for g in gws:
        assert g.shared is not None
        await g.shared.close()


def test_three_gateways_enforce_one_rpm_and_tpm(redis_url: str) -> None:
    async def go() -> None:
        gws = _gateways(redis_url, 3)
        await _start(gws)
        try:
            k = key(rpm=30)
            out = await asyncio.gather(*(gws[i % 3].admit(k) for i in range(100)))
            refused = [r for r in out if r is not None]
            assert len(refused) == 70
            assert all(r.limit == "rpm" and 1 <= r.retry_after_s <= 60 for r in refused)
            t = ApiKey("k2", "t", "h", 0.0, tpm=100)
            assert await gws[0].admit(t) is None
            gws[0].tokens("k2", 60)
            gws[1].tokens("k2", 50)
            await asyncio.sleep(0.1)  # the counts go in the background
            refusal = await gws[2].admit(t)
            assert refusal is not None and refusal.limit == "tpm"
        finally:
            await _close(gws)
    asyncio.run(go())


def test_holds_are_shared_and_settled_with_what_requests_cost(redis_url: str,
                                                              one_utc_day: None) -> None:
    async def go() -> None:
        gws = _gateways(redis_url, 3)
        await _start(gws)
        try:
            k = key(joule_budget=100.0, budget_period="day")
            holds = await asyncio.gather(*(gws[i % 3].reserve(k, 10.0, 0.0) for i in range(20)))
            made = [h for h in holds if h is not None]
            assert len(made) == 10  # 0..90 held < 100: ten; the burst stops at the budget
            for i, h in enumerate(made[:5]):
                gws[i % 3].settle(h, 12.0)  # each cost a little more than expected
            await asyncio.sleep(0.1)
            # spent 60 (shared counter, the ledgers know nothing yet) + 50 held
            assert await gws[0].reserve(k, 1.0, spent_j=0.0) is None
            for i, h in enumerate(made[5:]):
                gws[i % 3].settle(h, 0.0)  # failed before they ran
            await asyncio.sleep(0.1)
            again = await gws[1].reserve(k, 10.0, spent_j=0.0)
            assert again is not None  # 60 spent, nothing held
        finally:
            await _close(gws)
    asyncio.run(go())


def test_a_hold_whose_gateway_died_lapses(redis_url: str, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    monkeypatch.setattr(shared_mod, "HOLD_TTL_S", 1)

    async def go() -> None:
        gws = _gateways(redis_url, 2)
        await _start(gws)
        try:
            k = key(joule_budget=10.0)
            assert await gws[0].reserve(k, 20.0, 0.0) is not None  # never settled
            assert await gws[1].reserve(k, 1.0, 0.0) is None
            await asyncio.sleep(1.2)
            assert await gws[1].reserve(k, 1.0, 0.0) is not None
        finally:
            await _close(gws)
    asyncio.run(go())


def test_redis_down_costs_milliseconds_and_limits_come_back(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()

    async def go() -> None:
        ups: list[bool] = []
        gws = _gateways(server.url, 2, ups)
        await _start(gws)
        try:
            k = key(rpm=4)
            assert [await gws[i % 2].admit(k) is None for i in range(6)] == [True] * 4 + [False] * 2
            server.stop()
            waits = []
            for i in range(20):  # each gateway's own window now: 4 each, new ones
                t0 = time.perf_counter()
                await gws[i % 2].admit(key(rpm=4, joule_budget=None))
                waits.append(time.perf_counter() - t0)
            assert max(waits) < 0.2 and sorted(waits)[10] < 0.005
            assert ups[-1] is False and all(not g.shared.up for g in gws)  # type: ignore[union-attr]
            server.start()
            deadline = time.monotonic() + 5
            while not all(g.shared.up for g in gws):  # type: ignore[union-attr]
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            assert ups[-1] is True
            k2 = ApiKey("k3", "x", "h", 0.0, rpm=3)
            out = [await gws[i % 2].admit(k2) is None for i in range(5)]
            assert out == [True] * 3 + [False] * 2  # shared again: 3 in all, not 3 each
        finally:
            await _close(gws)
            server.stop()
    asyncio.run(go())


def test_holds_learn_what_a_backend_really_costs_against_its_price() -> None:
    async def go() -> None:
        adm, k = Admission(), key(joule_budget=100.0)
        first = await adm.reserve(k, 2.0, 0.0, "b")
        assert first is not None and first.joules == 2.0  # nothing learned: the price
        adm.settle(first, 6.0)  # cost three times its price
        second = await adm.reserve(k, 2.0, 0.0, "b")
        assert second is not None and second.joules == pytest.approx(6.0)
        assert (await adm.reserve(k, 2.0, 0.0, "other")).joules == 2.0  # type: ignore[union-attr]
        adm.settle(second, 1.0)  # cheaper than its price: the average falls, not below 1x
        third = await adm.reserve(k, 2.0, 0.0, "b")
        assert third is not None and 2.0 <= third.joules < 6.0
        for _ in range(30):
            h = await adm.reserve(k, 2.0, 0.0, "b")
            adm.settle(h, 0.5)
        assert (await adm.reserve(k, 2.0, 0.0, "b")).joules == 2.0  # type: ignore[union-attr]
    asyncio.run(go())


def test_a_hung_redis_costs_a_request_its_timeout_then_nothing(tmp_path: Path) -> None:
    """Redis stopped (SIGSTOP: connections open, no answers): a request waits
    at most the timeout and is admitted locally; a PING unanswered for a
    second sends the gateway local, after which requests do not wait at all;
    SIGCONT, and the probe brings the shared limits back. Each request
    decided locally is told (the gateway's counter of them)."""
    import os
    import signal

    server = RedisServer(tmp_path)
    server.start()
    assert server.proc is not None

    async def go() -> None:
        ups: list[bool] = []
        alone: list[str] = []
        adm = Admission(shared=SharedState(server.url, 0.02, ups.append), on_local=alone.append)
        assert adm.shared is not None
        await adm.shared.start()
        k = key(rpm=100)
        assert await adm.admit(k) is None and alone == []  # Redis decided
        os.kill(server.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
        try:
            t0 = time.perf_counter()
            assert await adm.admit(k) is None  # admitted by the local window
            assert time.perf_counter() - t0 < 0.1 and alone == ["admit"]
            deadline = time.monotonic() + 5
            while adm.shared.up:  # the PING check gives up after a second
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            waits = []
            for _ in range(20):
                t0 = time.perf_counter()
                await adm.admit(k)
                waits.append(time.perf_counter() - t0)
            assert sorted(waits)[10] < 0.001 and max(waits) < 0.02 and ups[-1] is False
            assert alone == ["admit"] * 21
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
        deadline = time.monotonic() + 5
        while not adm.shared.up:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert ups[-1] is True
        await adm.shared.close()
    try:
        asyncio.run(go())
    finally:
        server.stop()


def test_closing_beside_a_hung_redis_takes_at_most_its_check(tmp_path: Path) -> None:
    """A gateway stopping while Redis hangs (SIGSTOP), with a call of its own
    still waiting for an answer: closing the shared state's connections is
    bounded (CHECK_S), so Redis cannot hold up a shutdown."""
    import os
    import signal

    server = RedisServer(tmp_path)
    server.start()
    assert server.proc is not None

    async def go() -> None:
        state = SharedState(server.url, 0.02)
        await state.start()
        assert state.up
        os.kill(server.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
        try:
            assert await state.admit("k1", 100, None) is None  # unanswered: local
            t0 = time.perf_counter()
            await state.close()
            assert time.perf_counter() - t0 < shared_mod.CHECK_S + 0.5
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
    try:
        asyncio.run(asyncio.wait_for(go(), 30))
    finally:
        server.stop()


def test_settles_made_while_redis_is_away_are_sent_when_it_answers(
        tmp_path: Path, one_utc_day: None) -> None:
    """A partition Redis survives (SIGSTOP, then SIGCONT): holds settled while
    it did not answer are kept and sent when it answers again, so the key's
    budget is not held for HOLD_TTL_S (15 min) by requests long finished."""
    import os
    import signal

    server = RedisServer(tmp_path)
    server.start()
    assert server.proc is not None

    async def go() -> None:
        a, b = _gateways(server.url, 2)
        a.shared = SharedState(server.url, 0.02)  # notices a silent Redis quickly
        await _start([a, b])
        k = key(joule_budget=100.0, budget_period="day")
        holds = [await a.reserve(k, 40.0, 0.0) for _ in range(2)]
        assert all(h is not None for h in holds)  # 80 of 100 held in Redis
        os.kill(server.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
        try:
            await a.reserve(k, 1.0, 0.0)  # slow: the PING check finds Redis silent
            deadline = time.monotonic() + 5
            while a.shared.up:  # type: ignore[union-attr]
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            for h in holds:
                a.settle(h, 5.0)  # the requests ended while Redis did not answer
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
        deadline = time.monotonic() + 5
        while a.shared._unsent:  # type: ignore[union-attr]  # probe, then sent
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        # The other gateway sees 10 J spent and nothing held (the 1 J reserved
        # in the silence may have landed): nine holds of 10 J fit under 100
        # (admitted while spent + held < budget). Had the settles been lost,
        # 80 J would still be held: one.
        made = [await b.reserve(k, 10.0, spent_j=0.0) for _ in range(12)]
        assert sum(h is not None for h in made) == 9
        await _close([a, b])
    try:
        asyncio.run(go())
    finally:
        server.stop()
