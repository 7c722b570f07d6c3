"""Each backend's context, read from its workers when models.yaml does not
say: llama-server's `/props` (the context of one slot: `-c` divided by
`-np`), vLLM's `/v1/models` (`max_model_len`). The smallest any replica
reports is the backend's; a worker that does not answer leaves the default
(app.catalog.DEFAULT_CONTEXT_TOKENS), with a warning."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from app.catalog import Backend, Catalog
from app.upstream.client import Upstream, UpstreamError

log = logging.getLogger("joulegate.contexts")
PROBE_TIMEOUT_S = 3.0


def _reported(kind: str, data: Any) -> int | None:
    try:
        if kind == "vllm":
            return int(data["data"][0]["max_model_len"])
        return int(data["default_generation_settings"]["n_ctx"])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


async def _context_of(upstream: Upstream, b: Backend) -> int | None:
    path = "/v1/models" if b.kind == "vllm" else "/props"

    async def one(base: str) -> int | None:
        try:
            return _reported(b.kind, await upstream.get_json(base + path, PROBE_TIMEOUT_S))
        except (UpstreamError, ValueError):
            return None

    found = [n for n in await asyncio.gather(*(one(r.base) for r in b.replicas))
             if n is not None and n > 0]
    return min(found) if found else None


async def learned_contexts(catalog: Catalog, upstream: Upstream) -> Catalog:
    """The catalog with each unset `context_tokens` read from the workers."""
    unset = [b for b in catalog.backends if b.context_tokens is None]
    if not unset:
        return catalog
    found = await asyncio.gather(*(_context_of(upstream, b) for b in unset))
    learned = {b.name: n for b, n in zip(unset, found, strict=True) if n is not None}
    for b, n in zip(unset, found, strict=True):
        if n is None:
            log.warning("%s: its workers did not say their context; assuming %d tokens "
                        "(set context_tokens in the models file)", b.name, b.context_limit)
        else:
            log.info("%s: context %d tokens, as its workers say", b.name, n)
    backends = [b.model_copy(update={"context_tokens": learned[b.name]})
                if b.name in learned else b for b in catalog.backends]
    return catalog.with_backends(backends)
