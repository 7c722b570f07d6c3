"""Fake llama.cpp workers behind httpx's MockTransport: the factory's client seam.

For fast tests of the gateway's own behaviour (errors, failover, admission);
the real-worker tests are under tests/integration.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from app.catalog import Catalog
from app.factory import Seams
from tests.integration.conftest import catalog_for

SMALL = "http://small.worker:8101"
LARGE = "http://large.worker:8102"
WORKER_MODEL = "/home/someone/models/tiny-small.gguf"

Behaviour = Callable[[httpx.Request], Awaitable[httpx.Response]]


def sse_answer(n: int = 3, model: str = WORKER_MODEL, error: str | None = None,
               prompt_tokens: int = 7) -> bytes:
    events: list[dict[str, Any]] = []
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": model}
    for i in range(n):
        events.append({**base, "choices": [{"index": 0, "delta": {"content": f"w{i} "},
                                            "finish_reason": None}]})
    if error is not None:
        events.append({"error": {"code": 500, "message": error, "type": "server_error"}})
    else:
        events.append({**base, "choices": [{"index": 0, "delta": {},
                                            "finish_reason": "length"}]})
        events.append({**base, "choices": [], "usage": {
            "prompt_tokens": prompt_tokens, "completion_tokens": n,
            "total_tokens": prompt_tokens + n}})
    out = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return out + b"data: [DONE]\n\n"


def recording(sent: list[dict[str, Any]], n: int = 3) -> Behaviour:
    """A worker that answers `n` tokens and keeps each body it was sent."""
    async def handle(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, content=sse_answer(n),
                              headers={"content-type": "text/event-stream"})
    return handle


async def answer(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    n = min(int(body.get("max_tokens") or 3), 8)
    return httpx.Response(200, content=sse_answer(n),
                          headers={"content-type": "text/event-stream"})


@dataclass
class FakeWorkers:
    """Per-worker behaviour, changeable while a test runs; every request is logged."""

    behaviour: dict[str, Behaviour] = field(default_factory=dict)
    seen: list[tuple[str, str]] = field(default_factory=list)
    down: set[str] = field(default_factory=set)
    hung: set[str] = field(default_factory=set)  # take connections, never answer

    async def handle(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        self.seen.append((base, request.url.path))
        if base in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if base in self.hung:
            await asyncio.sleep(60)
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        return await self.behaviour.get(base, answer)(request)

    def seams(self) -> Seams:
        return Seams(client=httpx.AsyncClient(transport=httpx.MockTransport(self.handle)))

    def posts_to(self, base: str) -> int:
        """Requests forwarded to `base` (not its health checks or the start-up
        question for its context)."""
        return sum(1 for b, p in self.seen if b == base and p not in ("/health", "/props"))


def fake_catalog(**defaults: Any) -> Catalog:
    return catalog_for([SMALL], [LARGE], **defaults)


async def hang(request: httpx.Request) -> httpx.Response:
    await asyncio.sleep(30)
    return httpx.Response(200)
