"""Stopping a request's work when its client goes away.

Work still running after WATCH_AFTER_S gets a watcher task that asks whether
the client has gone every WATCH_EVERY_S and, when it has, cancels the
request's task: the exchange then ends and drops its worker connection,
which stops the generation. A quick answer (most non-streamed ones) costs no
task; Starlette's streaming response would start a task group per stream to
listen for the disconnect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")
WATCH_AFTER_S = 0.25
WATCH_EVERY_S = 0.25

Disconnected = Callable[[], Awaitable[bool]]


class ClientLeft(Exception):
    """The client went away before the work was done (the work was cancelled)."""


async def unless_left(work: Awaitable[T], disconnected: Disconnected | None) -> T:
    """`work`'s result; ClientLeft when the client went away first."""
    handler = asyncio.current_task()
    if disconnected is None or handler is None:
        return await work
    left = False
    watcher: asyncio.Task[None] | None = None

    async def watch() -> None:
        nonlocal left
        assert disconnected is not None and handler is not None
        # The server says a client left only when asked (Starlette's is_disconnected).
        while not await disconnected():  # noqa: ASYNC110
            await asyncio.sleep(WATCH_EVERY_S)
        left = True
        handler.cancel()

    def start_watching() -> None:
        nonlocal watcher
        watcher = asyncio.ensure_future(watch())

    timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, start_watching)
    try:
        result = await work
    except asyncio.CancelledError:
        if not left:
            raise
        handler.uncancel()  # the watcher's own cancellation: the client left
        raise ClientLeft() from None
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()
    if left:
        raise ClientLeft()
    return result


async def shielded(coro: Coroutine[Any, Any, T]) -> T:
    """`await coro`, run to its end even if the awaiting task is cancelled
    meanwhile (the cancellation is raised after), as under asyncio.shield; but
    a coroutine that ends without waiting (most request endings) costs no task."""
    try:
        first = coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    return await asyncio.shield(_resumed(coro, first))


async def _resumed(coro: Coroutine[Any, Any, T], waiting_on: Any) -> T:
    return await _Resume(coro, waiting_on)


class _Resume(Awaitable[T]):
    """A coroutine already started, continued from what it is waiting on."""

    def __init__(self, coro: Coroutine[Any, Any, T], waiting_on: Any) -> None:
        self._coro = coro
        self._waiting_on = waiting_on

    def __await__(self) -> Generator[Any, None, T]:
        step = self._waiting_on
        while True:
            try:
                try:
                    yield step  # the task waits on what the coroutine waits on
                except BaseException as exc:
                    step = self._coro.throw(exc)
                else:
                    step = self._coro.send(None)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
