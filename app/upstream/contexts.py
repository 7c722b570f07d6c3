"""What each backend's workers say about themselves at start-up.

Its context, when models.yaml does not say: llama-server's `/props` (the
context of one slot: `-c` divided by `-np`), vLLM's `/v1/models`
(`max_model_len`). The smallest any replica reports is the backend's; a
worker that does not answer leaves the default
(app.catalog.DEFAULT_CONTEXT_TOKENS), with a warning. And the weights' type
and engine build llama-server reports (`model_ftype`, `build_info`), which
the gateway compares with what the backend's curve was measured on."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from app.catalog import Backend, Catalog
from app.upstream.client import Upstream, UpstreamError

log = logging.getLogger("joulegate.contexts")
PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class WorkerSays:
    """What a backend's first answering replica reported (None: not said)."""

    context: int | None = None
    weights: str | None = None
    build: str | None = None


def _said(kind: str, data: Any) -> WorkerSays:
    if kind == "vllm" or not isinstance(data, dict):
        return WorkerSays(_reported(kind, data))
    weights, build = data.get("model_ftype"), data.get("build_info")
    if not isinstance(build, str) or build.startswith("b0-"):
        build = None  # built outside a git checkout: llama.cpp says b0-unknown
    return WorkerSays(_reported(kind, data), weights if isinstance(weights, str) else None,
                      build)


def _reported(kind: str, data: Any) -> int | None:
    try:
        if kind == "vllm":
            return int(data["data"][0]["max_model_len"])
        return int(data["default_generation_settings"]["n_ctx"])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


async def worker_says(upstream: Upstream, b: Backend) -> WorkerSays:
    """What the backend's replicas say: the smallest context any reports,
    the weights and build of the first that answers."""
    path = "/v1/models" if b.kind == "vllm" else "/props"

    async def one(base: str) -> WorkerSays | None:
        try:
            return _said(b.kind, await upstream.get_json(base + path, PROBE_TIMEOUT_S))
        except (UpstreamError, ValueError):
            return None

    said = [s for s in await asyncio.gather(*(one(r.base) for r in b.replicas))
            if s is not None]
    contexts = [s.context for s in said if s.context is not None and s.context > 0]
    first = next((s for s in said if s.weights or s.build), WorkerSays())
    return WorkerSays(min(contexts) if contexts else None, first.weights, first.build)


async def learned_contexts(catalog: Catalog, upstream: Upstream
                           ) -> tuple[Catalog, dict[str, WorkerSays]]:
    """The catalog with each unset `context_tokens` read from the workers, and
    what each backend's workers said."""
    said = dict(zip([b.name for b in catalog.backends], await asyncio.gather(
        *(worker_says(upstream, b) for b in catalog.backends)), strict=True))
    unset = [b for b in catalog.backends if b.context_tokens is None]
    if not unset:
        return catalog, said
    found = [said[b.name].context for b in unset]
    learned = {b.name: n for b, n in zip(unset, found, strict=True) if n is not None}
    for b, n in zip(unset, found, strict=True):
        if n is None:
            log.warning("%s: its workers did not say their context; assuming %d tokens "
                        "(set context_tokens in the models file)", b.name, b.context_limit)
        else:
            log.info("%s: context %d tokens, as its workers say", b.name, n)
    backends = [b.model_copy(update={"context_tokens": learned[b.name]})
                if b.name in learned else b for b in catalog.backends]
    return catalog.with_backends(backends), said
