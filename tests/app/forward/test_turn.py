"""Routed decisions made together, once per turn of the event loop: in order,
each seeing the ones before it as load; errors and cancellations stay each
request's own."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from app.catalog import Catalog, parse_catalog
from app.errors import ApiError
from app.forward.plan import Ask, Needs
from app.forward.planner import Planner
from app.forward.traffic import Traffic
from app.forward.turn import Turn
from app.upstream.pool import ReplicaPool
from router.decision import Decision, Query
from telemetry.metrics import Metrics


def test_calls_of_one_turn_are_made_together_in_order() -> None:
    async def run() -> None:
        made: list[int] = []
        ends: list[list[int]] = []
        turn: Turn[int] = Turn(after=lambda: ends.append(list(made)))

        def call(i: int) -> int:
            made.append(i)
            return i * 10

        first = await asyncio.gather(*(turn.run(lambda i=i: call(i)) for i in range(5)))
        assert first == [0, 10, 20, 30, 40]
        assert (turn.turns, turn.calls) == (1, 5) and ends == [[0, 1, 2, 3, 4]]
        assert await turn.run(lambda: call(9)) == 90  # alone: a turn of its own
        assert turn.turns == 2 and ends[-1][-1] == 9
    asyncio.run(run())


def test_an_error_is_raised_where_its_call_waits_and_the_others_go_on() -> None:
    async def run() -> None:
        turn: Turn[int] = Turn()

        def bad() -> int:
            raise ValueError("no")

        results = await asyncio.gather(turn.run(lambda: 1), turn.run(bad), turn.run(lambda: 3),
                                       return_exceptions=True)
        assert results[0] == 1 and isinstance(results[1], ValueError) and results[2] == 3
    asyncio.run(run())


def test_a_cancelled_waiter_is_skipped() -> None:
    async def run() -> None:
        made: list[str] = []
        turn: Turn[str] = Turn()
        gone = asyncio.ensure_future(turn.run(lambda: made.append("gone") or "gone"))
        kept = asyncio.ensure_future(turn.run(lambda: made.append("kept") or "kept"))
        await asyncio.sleep(0)  # both queued; the turn's calls not made yet
        gone.cancel()
        assert await kept == "kept"
        assert made == ["kept"] and gone.cancelled()
    asyncio.run(run())


class Recorder:
    """A router that sends every request to `large` and notes the load it saw."""

    def __init__(self) -> None:
        self.seen: list[dict[str, int]] = []

    def decide(self, q: Query, explain: bool = True) -> Decision:
        self.seen.append(dict(q.concurrency))
        if q.text == "refuse":
            raise ApiError(400, "refused", "invalid_request_error")
        return Decision(tier="large", backend="large-b", strategy="direct", max_tokens=64,
                        thinking_budget=None, category="chat", policy=q.policy)


def _catalog() -> Catalog:
    return parse_catalog({
        "tiers": ["small", "large"],
        "devices": [{"name": "cpu"}],
        "backends": [{"name": f"{t}-b", "kind": "llamacpp", "tier": t, "model": t,
                      "replicas": [{"url": f"http://127.0.0.1:{9100 + i}", "device": "cpu",
                                    "max_concurrency": 8}]}
                     for i, t in enumerate(("small", "large"))],
    })


def _ask(model: str, text: str) -> Ask:
    def body_for(d: Decision, b: Any) -> dict[str, Any]:
        return {"model": b.model, "messages": [{"role": "user", "content": text}]}

    return Ask(model, Query(text, 8), Needs(), "/v1/chat/completions", body_for, False, False,
               0.0)


def test_decisions_in_one_turn_see_the_earlier_ones_as_running() -> None:
    async def run() -> None:
        catalog = _catalog()
        router = Recorder()
        pool = ReplicaPool(catalog, 1.0)
        planner = Planner(catalog, pool, router, Metrics(CollectorRegistry()), Traffic())
        held = await pool.acquire("small-b")  # a request running: the gateway is busy
        fws = await asyncio.gather(*(planner.plan_soon(_ask("auto", f"q{i}")) for i in range(3)))
        assert [f.decision.backend for f in fws] == ["large-b"] * 3
        assert [s.get("large-b", 0) for s in router.seen] == [0, 1, 2]
        assert all(s["small-b"] == 1 for s in router.seen)
        turns = planner._turn.turns
        # the next turn starts from the pool's own count (the exchanges begin it)
        await planner.plan_soon(_ask("auto", "later"))
        assert router.seen[-1].get("large-b", 0) == 0 and planner._turn.turns == turns + 1
        # a refusal is its request's own; a model named is planned at once
        with pytest.raises(ApiError):
            await planner.plan_soon(_ask("auto", "refuse"))
        named = await planner.plan_soon(_ask("small", "hi"))
        assert named.decision.backend == "small-b" and len(router.seen) == 5
        # an idle gateway plans at once, without a turn
        pool.release(held)
        turns = planner._turn.turns
        await planner.plan_soon(_ask("auto", "alone"))
        assert planner._turn.turns == turns and len(router.seen) == 6
    asyncio.run(run())
