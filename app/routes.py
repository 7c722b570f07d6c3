"""The HTTP surface: OpenAI endpoints plus joulegate's own."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from app.catalog import Backend, Catalog
from app.errors import ApiError, bad_request, no_healthy_worker, not_found_model
from app.pool import ReplicaPool
from app.proxy import Forward, Proxy
from app.requests import (
    ChatRequest,
    body_too_large,
    message_text,
    parse_json,
    validate_chat,
    validate_completion,
)
from router.decision import POLICIES, Decision, Policy, Query
from router.rewrite import rewrite_chat
from telemetry.metrics import CONTENT_TYPE, Metrics


class RouterLike(Protocol):
    def decide(self, q: Query) -> Decision: ...


@dataclass
class Gateway:
    """Everything a handler needs, built once by the app factory."""

    catalog: Catalog
    pool: ReplicaPool
    proxy: Proxy
    router: RouterLike
    metrics: Metrics
    max_body_bytes: int
    default_policy: Policy


def _gw(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


def conversation_text(messages: list[Any]) -> str:
    """The conversation as the router reads it: the last user turn, repeated
    twice so it weighs most, after the earlier turns."""
    texts = [message_text(m.content) for m in messages]
    last_user = next(
        (message_text(m.content) for m in reversed(messages) if m.role == "user"), "")
    return "\n".join([*texts, last_user, last_user])


def estimate_tokens(text: str) -> int:
    # ~4 characters a token for English with Llama-3 tokenizers; corrected
    # from the worker's usage when the request ends.
    return max(1, len(text) // 4)


def _policy(request: Request, default: Policy) -> tuple[Policy, float | None]:
    raw = request.headers.get("x-joulegate-policy")
    policy: Policy = default
    if raw is not None:
        if raw not in POLICIES:
            raise bad_request(
                f"x-joulegate-policy must be one of {', '.join(POLICIES)}", "x-joulegate-policy")
        policy = raw
    cap = request.headers.get("x-joulegate-max-joules")
    max_j = None
    if cap is not None:
        try:
            max_j = float(cap)
        except ValueError:
            max_j = -1.0
        if not max_j > 0:
            raise bad_request("x-joulegate-max-joules must be a positive number",
                              "x-joulegate-max-joules")
    return policy, max_j


def _forced(gw: Gateway, model: str, q: Query) -> Decision | None:
    """A decision for a model named explicitly (tier, backend or upstream name)."""
    backend: Backend | None
    if model in gw.catalog.tiers:
        backend = gw.pool.healthy_backend(model)
        if backend is None:
            raise no_healthy_worker(model)
    else:
        backend = gw.catalog.backend(model) or next(
            (b for b in gw.catalog.backends if b.model == model), None)
    if backend is None:
        return None
    return Decision(
        tier=backend.tier, backend=backend.name, strategy="direct",
        max_tokens=q.max_tokens or 0, thinking_budget=None, category="forced",
        policy=q.policy, reason=f"model '{model}' asked for by name", routed=False)


def decide(gw: Gateway, model: str, q: Query) -> Decision:
    if model in ("auto", gw.catalog.defaults.model):
        start = time.perf_counter()
        d = gw.router.decide(replace(q, concurrency=gw.pool.outstanding()))
        gw.metrics.decision(d.tier, d.strategy, d.category, time.perf_counter() - start)
        if d.baseline_joules is not None and d.expected_joules is not None:
            gw.metrics.saved(gw.catalog.baseline, d.baseline_joules - d.expected_joules)
        return d
    forced = _forced(gw, model, q)
    if forced is None:
        raise not_found_model(model)
    return forced


async def _body(request: Request, limit: int) -> dict[str, Any]:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise body_too_large(limit)  # refused before reading the body
    return parse_json(await request.body(), limit)


async def _chat_query(request: Request, gw: Gateway
                      ) -> tuple[dict[str, Any], ChatRequest, Query]:
    """The body, its validated view and the router's query, for chat and /v1/route."""
    body = await _body(request, gw.max_body_bytes)
    req = validate_chat(body)
    policy, max_j = _policy(request, gw.default_policy)
    text = conversation_text(req.messages)
    limit = req.max_completion_tokens or req.max_tokens
    return body, req, Query(text, estimate_tokens(text), limit, policy, max_j)


def build_routes() -> APIRouter:
    api = APIRouter()

    @api.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        received = time.perf_counter()
        gw = _gw(request)
        body, req, q = await _chat_query(request, gw)
        d = decide(gw, req.model, q)
        backend = gw.catalog.backend(d.backend)
        assert backend is not None
        out = rewrite_chat(body, d, backend.model, backend.reasoning, backend.thinking_mode)
        fw = _forward("/v1/chat/completions", out, d, req.stream, req.stream_options, q,
                      received, request.is_disconnected)
        if backend.reasoning and d.thinking_budget is not None:
            gw.metrics.thinking(d.tier, d.backend)
            if backend.thinking_mode == "splice":
                return await gw.proxy.forward_spliced(fw, d.thinking_budget)
        return await gw.proxy.forward(fw)

    @api.post("/v1/completions")
    async def completions(request: Request) -> Response:
        received = time.perf_counter()
        gw = _gw(request)
        body = await _body(request, gw.max_body_bytes)
        req = validate_completion(body)
        policy, max_j = _policy(request, gw.default_policy)
        text = req.prompt if isinstance(req.prompt, str) else " ".join(map(str, req.prompt))
        tokens = len(req.prompt) if req.prompt and isinstance(req.prompt[0], int) else None
        q = Query(text, tokens or estimate_tokens(text), req.max_tokens, policy, max_j)
        d = decide(gw, req.model, q)
        backend = gw.catalog.backend(d.backend)
        assert backend is not None
        out = dict(body, model=backend.model)
        if d.routed and "max_tokens" not in body:
            out["max_tokens"] = d.max_tokens
        return await gw.proxy.forward(_forward(
            "/v1/completions", out, d, req.stream, req.stream_options, q, received,
            request.is_disconnected))

    @api.post("/v1/route")
    async def route(request: Request) -> Response:
        gw = _gw(request)
        _, req, q = await _chat_query(request, gw)
        return JSONResponse(decide(gw, req.model, q).as_json())

    @api.get("/v1/models")
    async def models(request: Request) -> Response:
        gw = _gw(request)
        now = int(time.time())
        data: list[dict[str, Any]] = [
            {"id": "auto", "object": "model", "created": now, "owned_by": "joulegate",
             "joulegate": {"kind": "router"}}]
        for tier in gw.catalog.tiers:
            data.append({"id": tier, "object": "model", "created": now, "owned_by": "joulegate",
                         "joulegate": {"kind": "tier", "up": gw.pool.tier_up(tier)}})
        for b in gw.catalog.backends:
            data.append({"id": b.name, "object": "model", "created": now,
                         "owned_by": "joulegate",
                         "joulegate": {"kind": "backend", "engine": b.kind, "tier": b.tier,
                                       "upstream_model": b.model,
                                       "replicas": len(b.replicas),
                                       "up": gw.pool.backend_up(b.name)}})
        return JSONResponse({"object": "list", "data": data})

    @api.get("/v1/energy/{device}/{wid}")
    async def energy(request: Request, device: str, wid: str) -> Response:
        figure = await _gw(request).proxy.energy(f"{device}/{wid}")
        if figure is None:
            raise ApiError(404, f"No energy record '{device}/{wid}'", "invalid_request_error",
                           "id", "energy_not_found")
        return JSONResponse({"id": f"{device}/{wid}", **asdict(figure)})

    @api.get("/healthz")
    async def healthz() -> Response:
        return JSONResponse({"status": "ok"})

    @api.get("/readyz")
    async def readyz(request: Request) -> Response:
        gw = _gw(request)
        tiers = {t: gw.pool.tier_up(t) for t in gw.catalog.tiers}
        ok = all(tiers.values())
        return JSONResponse({"ready": ok, "tiers": tiers}, status_code=200 if ok else 503)

    @api.get("/metrics")
    async def metrics(request: Request) -> Response:
        return Response(_gw(request).metrics.render(), media_type=CONTENT_TYPE)

    return api


def _forward(path: str, body: dict[str, Any], d: Decision, stream: bool,
             stream_options: Any, q: Query, received: float,
             disconnected: Callable[[], Awaitable[bool]] | None = None) -> Forward:
    wants_usage = bool(stream_options and stream_options.include_usage)
    # The worker always streams, with usage: the gateway counts tokens as they
    # come, can stop a generation (loop guard, timeout, client gone), and
    # assembles one response for clients that did not ask to stream.
    body["stream"] = True
    body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return Forward(path, body, d, "auto" if d.routed else "forced", stream, wants_usage,
                   q.prompt_tokens, received, disconnected=disconnected)
