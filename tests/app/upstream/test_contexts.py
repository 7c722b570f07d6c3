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
            catalog, _ = await learned_contexts(fake_catalog(), upstream)
        finally:
            await upstream.aclose()
        small, large = catalog.backend("small-llamacpp"), catalog.backend("large-llamacpp")
        assert small is not None and large is not None
        return small.context_tokens, large.context_tokens, large.context_limit

    small, large, large_limit = asyncio.run(learn())
    assert small == 2048  # one slot's context, as the worker says
    assert large is None and large_limit == 4096  # no answer: the default
    assert LARGE != SMALL


def test_a_curve_measured_on_other_weights_is_named_at_start() -> None:
    """The GPU compose profile downloads Q4_K_M files; the shipped curves were
    measured on F16 weights: the gateway says so (and how to measure)."""
    from app.artifacts import curve_warnings
    from app.upstream.contexts import WorkerSays, _said
    from router.curves import weights_key

    said = _said("llamacpp", {"model_ftype": "Q4_K - Medium", "build_info": "b9246-6a1f",
                              "default_generation_settings": {"n_ctx": 4096}})
    assert said == WorkerSays(4096, "Q4_K - Medium", "b9246-6a1f")
    assert weights_key("Q4_K - Medium") == weights_key("Q4_K_M") != weights_key("F16")
    catalog = fake_catalog()
    lines = curve_warnings(catalog, {"small-llamacpp": (said.weights, said.build),
                                     "large-llamacpp": ("F16", "b1-0c1e570")})
    assert len(lines) == 1 and lines[0].startswith("small-llamacpp: serves weights "
                                                   "Q4_K - Medium (the curve: F16)")
    assert "engine build b9246-6a1f" in lines[0] and "joulegate calibrate" in lines[0]
    # a backend that declares its weights (vLLM does not report them)
    declared = catalog.with_backends([b.model_copy(update={"weights": "BF16"})
                                      for b in catalog.backends])
    assert len(curve_warnings(declared, {})) == 2
