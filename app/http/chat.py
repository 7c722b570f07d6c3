"""The generation endpoints: read and validate, then hand the request to the
planner and the proxy (the forwarding code owns it from there), and the dry
run that returns the decision alone."""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from app.catalog import Backend
from app.errors import bad_request, model_not_allowed
from app.forward.plan import Ask, Needs
from app.forward.planner import fit_thinking
from app.forward.rewrite import capped, default_cap, rewrite_chat
from app.forward.splice import answer
from app.http.auth import authorize
from app.http.body import json_body, policy, quality_target
from app.http.gateway import Gateway, gateway_of
from app.http.requests import (
    ChatRequest,
    message_text,
    part_kinds,
    validate_chat,
    validate_completion,
)
from app.http.respond import response
from app.tenancy.keys import ApiKey
from router.decision import Decision, Query
from router.features import conversation_text, estimate_tokens


async def _arrived(request: Request) -> tuple[float, Gateway, ApiKey | None, dict[str, Any]]:
    """When it arrived, the gateway, the key (checked), the body (read before
    the request is counted against admission: a slow body holds nothing)."""
    received = time.perf_counter()
    gw = gateway_of(request)
    key = await authorize(gw, request)
    gw.refuse_if_full()
    return received, gw, key, await json_body(request, gw.max_body_bytes, gw.body_timeout_s)


async def chat(request: Request) -> Response:
    received, gw, key, raw = await _arrived(request)
    with gw.admitted():
        body, req, q, needs = _chat_query(request, gw, raw)

        default_max = gw.planner.catalog.defaults.max_tokens

        message = gw.planner.catalog.routing.budget_message
        shots = gw.planner.examples

        def body_for(d: Decision, b: Backend) -> dict[str, Any]:
            return rewrite_chat(body, d, b, default_max, req.token_limit,
                                req.limit_includes_thinking, message,
                                shots.get(d.category, ()))

        fw = await gw.planner.plan_soon(Ask(
            req.model, q, needs, "/v1/chat/completions", body_for, req.stream,
            _wants_usage(req.stream_options), received, key, request.is_disconnected,
            req.thinking_ceiling))
    return response(await gw.answered(fw, lambda f: answer(gw.proxy, f)))


async def completions(request: Request) -> Response:
    received, gw, key, body = await _arrived(request)
    with gw.admitted():
        req = validate_completion(body)
        chosen, max_j = policy(request, gw.default_policy)
        text = req.prompt if isinstance(req.prompt, str) else " ".join(map(str, req.prompt))
        tokens = len(req.prompt) if req.prompt and isinstance(req.prompt[0], int) else None
        q = Query(text, tokens or estimate_tokens(text), req.token_limit, chosen, max_j,
                  quality_target=quality_target(request), rewritable=False)

        default_max = gw.planner.catalog.defaults.max_tokens

        def body_for(d: Decision, b: Backend) -> dict[str, Any]:
            out = dict(body, model=b.model)
            capped(out, req.token_limit, default_cap(d, default_max, thinks=False))
            return out

        fw = await gw.planner.plan_soon(Ask(
            req.model, q, Needs(tokens=req.token_limit), "/v1/completions", body_for,
            req.stream, _wants_usage(req.stream_options), received, key,
            request.is_disconnected))
    return response(await gw.answered(fw, gw.proxy.forward))


async def route(request: Request) -> Response:
    """A dry run: the decision for a chat body, explained; nothing is forwarded.
    Under the key's rules: its models, and its request rate (a dry run runs
    the router, so it counts as a request)."""
    gw = gateway_of(request)
    key = await authorize(gw, request, generates=False, rated=True)
    raw = await json_body(request, gw.max_body_bytes, gw.body_timeout_s)
    _, req, q, needs = _chat_query(request, gw, raw)
    if key is not None and key.models is not None and req.model not in key.models:
        raise model_not_allowed(req.model)  # as the request itself would be
    d, _ = gw.planner.decide_for(key, req.model, q, needs, arriving=False)
    backend = gw.planner.catalog.backend(d.backend)
    if backend is not None:  # the budget the request would be sent with
        d = fit_thinking(d, backend, req.thinking_ceiling, q.prompt_tokens)
    return JSONResponse(d.as_json())


def _wants_usage(options: Any) -> bool:
    return bool(options and options.include_usage)


def _chat_query(request: Request, gw: Gateway, body: dict[str, Any]
                ) -> tuple[dict[str, Any], ChatRequest, Query, Needs]:
    """The body, its validated view, the router's query and what it needs."""
    req = validate_chat(body)
    kinds = part_kinds(req.messages)
    if kinds - {"image_url"}:
        kind = sorted(kinds - {"image_url"})[0]
        raise bad_request(f"Content parts of type '{kind}' are not supported by any worker",
                          "messages", "unsupported_content")
    chosen, max_j = policy(request, gw.default_policy)
    text = conversation_text([(m.role, message_text(m.content)) for m in req.messages])
    limit = req.token_limit
    needs = Needs(vision="image_url" in kinds, tokens=limit)
    q = Query(text, estimate_tokens(text), limit, chosen, max_j,
              quality_target=quality_target(request), thinking_ceiling=req.effort_ceiling,
              limit_includes_thinking=req.limit_includes_thinking)
    return body, req, q, needs
