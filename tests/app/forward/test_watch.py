"""app.forward.watch.shielded: a request's ending runs whole, even when cancelled."""

from __future__ import annotations

import asyncio

import pytest

from app.forward.watch import shielded


async def _quick() -> int:
    return 7


def test_an_ending_that_never_waits_starts_no_task() -> None:
    async def main() -> tuple[int, int, int]:
        before = len(asyncio.all_tasks())
        value = await shielded(_quick())
        return value, before, len(asyncio.all_tasks())

    value, before, after = asyncio.run(main())
    assert value == 7 and before == after


def test_an_ending_that_waits_finishes_although_its_task_is_cancelled() -> None:
    steps: list[str] = []

    async def ending() -> str:
        steps.append("begun")
        await asyncio.sleep(0.05)
        steps.append("waited")
        await asyncio.sleep(0)
        steps.append("ended")
        return "done"

    async def main() -> None:
        task = asyncio.create_task(shielded(ending()))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.1)

    asyncio.run(main())
    assert steps == ["begun", "waited", "ended"]


def test_an_ending_gives_its_value_and_its_error() -> None:
    async def waits_then(value: int | None) -> int:
        await asyncio.sleep(0)
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, fut.set_result, value)
        got = await fut
        if got is None:
            raise ValueError("no value")
        return int(got)

    async def main() -> None:
        assert await shielded(waits_then(3)) == 3
        with pytest.raises(ValueError, match="no value"):
            await shielded(waits_then(None))

    asyncio.run(main())
