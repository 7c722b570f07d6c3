"""What forwarding hands back to the HTTP layer: plain data, no framework.

`Whole` is a response with its body (a collected answer, a worker's error in
the envelope, a departed client's 499); `Streamed` is a stream of
server-sent events with `end`, the exchange's single exit, which the HTTP
layer runs after the stream however it ended (even if never iterated).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Whole:
    status: int
    body: bytes
    headers: dict[str, str]
    media_type: str | None = "application/json"


@dataclass
class Streamed:
    headers: dict[str, str]
    events: AsyncIterator[bytes]
    end: Callable[[], Awaitable[Any]]


Answer = Whole | Streamed
