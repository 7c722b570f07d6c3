"""A backend's context read from its workers when the models file does not set it."""

from __future__ import annotations

import asyncio
import json

import httpx

from app.upstream.client import HttpxTransport, Upstream
from app.upstream.contexts import learned_contexts
from tests.app.fake_workers import LARGE, SMALL, fake_catalog


def test_contexts_come_from_the_workers_unless_configured() -> None:
    async def worker(request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if base == SMALL and request.url.path == "/props":
            return httpx.Response(200, content=json.dumps(
                {"default_generation_settings": {"n_ctx": 2048}}))
        return httpx.Response(404)

    async def learn() -> tuple[int | None, int | None, int]:
        upstream = Upstream(HttpxTransport(httpx.AsyncClient(
            transport=httpx.MockTransport(worker))))
        try:
            catalog = await learned_contexts(fake_catalog(), upstream)
        finally:
            await upstream.aclose()
        small, large = catalog.backend("small-llamacpp"), catalog.backend("large-llamacpp")
        assert small is not None and large is not None
        return small.context_tokens, large.context_tokens, large.context_limit

    small, large, large_limit = asyncio.run(learn())
    assert small == 2048  # one slot's context, as the worker says
    assert large is None and large_limit == 4096  # no answer: the default
    assert LARGE != SMALL
