"""The HTTP surface: OpenAI endpoints plus joulegate's own."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from app.catalog import Backend, Catalog
from app.errors import (
    ApiError,
    admin_only,
    bad_request,
    invalid_api_key,
    joule_budget_exceeded,
    model_not_allowed,
    no_healthy_worker,
    not_found_model,
    overloaded,
    rate_limited,
)
from app.forward.exchange import Forward
from app.forward.proxy import Proxy
from app.forward.rewrite import rewrite_chat
from app.forward.splice import forward_spliced
from app.forward.traffic import Traffic
from app.http.openapi import ERROR_RESPONSES, OK_RESPONSE, TEXT_RESPONSE, request_body
from app.http.requests import (
    ChatRequest,
    CompletionRequest,
    NewKey,
    body_too_large,
    is_json_type,
    message_text,
    parse_json,
    part_kinds,
    unsupported_media_type,
    validate_chat,
    validate_completion,
    validate_new_key,
)
from app.tenancy.keys import ADMIN_ID, ApiKey, KeyRing, KeyStore
from app.tenancy.limits import RateLimits
from app.tenancy.spend import SpendLedger, parse_since, period_end
from app.upstream.pool import ReplicaPool
from router.decision import POLICIES, Decision, Policy, Query, Unroutable
from router.features import conversation_text, estimate_tokens
from telemetry.metrics import CONTENT_TYPE, Metrics

USAGE_ROWS = 1000  # GET /v1/usage lists the newest this many requests


class RouterLike(Protocol):
    def decide(self, q: Query, explain: bool = True) -> Decision: ...


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
    # A key that has spent this share of its joule budget gets the cheapest action.
    budget_steer_at: float = 0.8
    entering: int = 0  # requests being read and routed, not yet holding a slot
    keys: KeyRing | None = None  # None, or no active key: open (local development)
    limits: RateLimits = field(default_factory=RateLimits)
    spend: SpendLedger | None = None  # the usage ledger (budgets, GET /v1/usage)
    traffic: Traffic = field(default_factory=Traffic)

    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        """The cheapest refusal, before a request is read: when the backends'
        slots and queues, with the requests on their way to them, are full."""
        if self.pool.load() + self.entering >= self.pool.limit():
            self.metrics.request("none", "none", "unrouted", "none", "overloaded")
            raise overloaded("gateway", self.pool.load())
        self.entering += 1
        try:
            yield
        finally:
            self.entering -= 1


@dataclass(frozen=True)
class Needs:
    """What a request needs of a backend."""

    vision: bool = False
    tokens: int | None = None  # max_tokens asked for

    def unmet_by(self, b: Backend) -> ApiError | None:
        """The 400 for sending this request to `b`, or None when `b` can take it."""
        if self.vision and not b.vision:
            return bad_request(f"model '{b.name}' does not accept image input", "messages")
        if self.tokens is not None and self.tokens > b.context_tokens:
            return bad_request(f"max_tokens ({self.tokens}) exceeds the context of model "
                               f"'{b.name}' ({b.context_tokens} tokens)", "max_tokens")
        return None

    def fitting(self, backends: list[Backend]) -> list[Backend]:
        """The backends that can take the request; the last one's 400 when none can."""
        fits = [b for b in backends if self.unmet_by(b) is None]
        if not fits:
            refusal = self.unmet_by(backends[-1])
            assert refusal is not None
            raise refusal
        return fits


BodyFor = Callable[[Decision, Backend], dict[str, Any]]


def authorize(gw: Gateway, request: Request, generates: bool = True) -> ApiKey | None:
    """The request's API key (None when the gateway runs open); 401 without a
    valid one. For a request that `generates`: 429 with Retry-After when the
    key's energy budget is spent or it is over its rates."""
    if gw.keys is None or not gw.keys.active():
        return None
    scheme, _, secret = (_header(request, b"authorization") or "").partition(" ")
    key = gw.keys.find(secret.strip()) if scheme.lower() == "bearer" and secret else None
    if key is None:
        raise invalid_api_key()
    if not generates:
        return key
    if key.joule_budget is not None and gw.spend is not None \
            and gw.spend.spent_j(key) >= key.joule_budget:
        raise joule_budget_exceeded(key.joule_budget, key.budget_period,
                                    period_end(key.budget_period, time.time()))
    refusal = gw.limits.admit(key)
    if refusal is not None:
        raise rate_limited(refusal.limit, refusal.retry_after_s)
    return key


def decide_for(gw: Gateway, key: ApiKey | None, model: str, q: Query, needs: Needs,
               arriving: bool = True) -> tuple[Decision, float | None]:
    """`decide`, for a key: one that has spent `budget_steer_at` of its joule
    budget gets the fewest expected joules under `auto` (the reason says so).
    Also the share of the budget used, when steered."""
    if key is None or key.joule_budget is None or gw.spend is None \
            or model not in ("auto", gw.catalog.defaults.model):
        return decide(gw, model, q, needs, arriving), None
    used = gw.spend.spent_j(key) / key.joule_budget
    if used < gw.budget_steer_at:
        return decide(gw, model, q, needs, arriving), None
    d = decide(gw, model, replace(q, policy="min-energy"), needs, arriving)
    if arriving:
        return d, used
    return replace(d, reason=f"{d.reason}; key '{key.name}' has used {used:.0%} of its "
                             "joule budget: steered to the fewest expected joules"), used


def _usage(spend: SpendLedger, key_id: str | None, since: float) -> dict[str, Any]:
    return {**spend.totals(key_id, since), "data": spend.rows(key_id, since, USAGE_ROWS)}


def _admin_store(request: Request) -> KeyStore:
    gw = _gw(request)
    key = authorize(gw, request, generates=False)
    if key is None or key.id != ADMIN_ID or gw.keys is None:
        raise admin_only()
    return gw.keys.store


def _header(request: Request, name: bytes) -> str | None:
    """A request header by its lower-case name (the first of that name), from
    an index of the request's headers built once (Starlette's `headers` scans
    them all, and raises inside for every header that is absent)."""
    scope = request.scope
    index: dict[bytes, bytes] | None = scope.get("joulegate.headers")
    if index is None:
        index = scope["joulegate.headers"] = dict(reversed(list(scope["headers"])))
    value = index.get(name)
    return None if value is None else value.decode("latin-1")


def _gw(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


def _quality_target(request: Request) -> float | None:
    raw = _header(request, b"x-joulegate-quality-target")
    if raw is None:
        return None
    try:
        target = float(raw)
    except ValueError:
        target = -1.0
    if not 0 < target <= 1:
        raise bad_request("x-joulegate-quality-target must be a number in (0, 1]",
                          "x-joulegate-quality-target")
    return target


def _policy(request: Request, default: Policy) -> tuple[Policy, float | None]:
    raw = _header(request, b"x-joulegate-policy")
    policy: Policy = default
    if raw is not None:
        if raw not in POLICIES:
            raise bad_request(
                f"x-joulegate-policy must be one of {', '.join(POLICIES)}", "x-joulegate-policy")
        policy = raw
    cap = _header(request, b"x-joulegate-max-joules")
    max_j = None
    if cap is not None:
        try:
            max_j = float(cap)
        except ValueError:
            max_j = -1.0
        if not 0 < max_j < float("inf"):
            raise bad_request("x-joulegate-max-joules must be a positive number",
                              "x-joulegate-max-joules")
    return policy, max_j


def _forced(gw: Gateway, model: str, q: Query, needs: Needs) -> Decision | None:
    """A decision for a model named explicitly (tier, backend or upstream name).
    A tier takes the first of its backends that can take the request now."""
    backend: Backend | None
    if model in gw.catalog.tiers:
        fits = needs.fitting(gw.catalog.backends_of(model))
        backend = next((b for b in fits
                        if b.name not in q.unavailable and gw.pool.accepts(b.name)), None)
        if backend is None:
            busy = next((b for b in fits if b.name not in q.unavailable), None)
            if busy is None:
                raise no_healthy_worker(model, gw.pool.retry_after_s(fits[0].name))
            backend = busy  # saturated or down: let admission say which (429 / 503)
    else:
        backend = gw.catalog.backend(model) or next(
            (b for b in gw.catalog.backends if b.model == model), None)
        if backend is not None and (unmet := needs.unmet_by(backend)) is not None:
            raise unmet
    if backend is None:
        return None
    return Decision(
        tier=backend.tier, backend=backend.name, strategy="direct",
        max_tokens=q.max_tokens or 0, thinking_budget=None, category="forced",
        policy=q.policy, reason=f"model '{model}' asked for by name", routed=False)


def decide(gw: Gateway, model: str, q: Query, needs: Needs = Needs(),
           arriving: bool = True) -> Decision:
    """The decision for a request; `q.unavailable` backends are avoided.
    `arriving`: the request will run; a dry run (/v1/route) does not, and
    gets the decision explained (reason, probabilities, candidates)."""
    if model in ("auto", gw.catalog.defaults.model):
        fits = {b.name for b in needs.fitting(gw.catalog.backends)}
        unfit = {b.name for b in gw.catalog.backends} - fits
        down = {b.name for b in gw.catalog.backends} - gw.pool.accepting()
        start = time.perf_counter()
        try:
            running = gw.traffic.expect(gw.pool.outstanding(), arriving)
            d = gw.router.decide(replace(q, concurrency=running,
                                         unavailable=q.unavailable | down | unfit),
                                 explain=not arriving)
        except Unroutable:
            full = not down - saturated(gw)  # every backend is up but full
            gw.metrics.request("none", "none", "auto", "none",
                               "overloaded" if full else "no_worker")
            if full:
                raise overloaded("every backend", gw.pool.load()) from None
            raise no_healthy_worker("any", min(
                gw.pool.retry_after_s(b.name) for b in gw.catalog.backends)) from None
        gw.metrics.decision(d.tier, d.strategy, d.category, time.perf_counter() - start)
        if d.baseline_joules is not None and d.expected_joules is not None:
            gw.metrics.saved(gw.catalog.baseline, d.baseline_joules - d.expected_joules)
        return d
    forced = _forced(gw, model, q, needs)
    if forced is None:
        raise not_found_model(model)
    return forced


def saturated(gw: Gateway) -> set[str]:
    return {b.name for b in gw.catalog.backends if gw.pool.backend_saturated(b.name)}


def plan(gw: Gateway, request: Request, model: str, q: Query, needs: Needs, path: str,
         body_for: BodyFor, stream: bool, wants_usage: bool, received: float,
         key: ApiKey | None = None) -> Forward:
    """The forward for a request; for `auto` and tiers, with a fallback that
    plans again without the backends that could not take it. A key near its
    joule budget is steered to the cheapest action (`auto` only)."""
    d, steered = decide_for(gw, key, model, q, needs)
    backend = gw.catalog.backend(d.backend)
    assert backend is not None
    body = body_for(d, backend)
    # The worker always streams, with usage: the gateway counts tokens as they
    # come, can stop a generation (loop guard, timeout, client gone), and
    # assembles one response for clients that did not ask to stream.
    body["stream"] = True
    body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    reroutable = d.routed or model in gw.catalog.tiers

    def fallback(excluded: frozenset[str]) -> Forward | None:
        try:
            return plan(gw, request, model, replace(q, unavailable=q.unavailable | excluded),
                        needs, path, body_for, stream, wants_usage, received, key)
        except ApiError:
            return None

    if key is not None and key.models is not None and model not in key.models:
        raise model_not_allowed(model)
    return Forward(path, body, d, "auto" if d.routed else "forced", stream, wants_usage,
                   q.prompt_tokens, received, model_name=backend.model,
                   disconnected=request.is_disconnected,
                   fallback=fallback if reroutable else None,
                   key=key, budget_used=steered)


async def _body(request: Request, limit: int) -> dict[str, Any]:
    content_type = _header(request, b"content-type")
    if not is_json_type(content_type):
        raise unsupported_media_type(content_type)
    declared = _header(request, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise body_too_large(limit)  # refused before reading the body
    return parse_json(await _read(request, limit), limit)


async def _read(request: Request, limit: int) -> bytes:
    """The body from the server's messages (what Starlette's `body()` does,
    without its async generator), refused as soon as it is past `limit`."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await request.receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _chat_query(request: Request, gw: Gateway
                      ) -> tuple[dict[str, Any], ChatRequest, Query, Needs]:
    """The body, its validated view, the router's query and what it needs."""
    body = await _body(request, gw.max_body_bytes)
    req = validate_chat(body)
    kinds = part_kinds(req.messages)
    if kinds - {"image_url"}:
        kind = sorted(kinds - {"image_url"})[0]
        raise bad_request(f"Content parts of type '{kind}' are not supported by any worker",
                          "messages", "unsupported_content")
    policy, max_j = _policy(request, gw.default_policy)
    text = conversation_text([(m.role, message_text(m.content)) for m in req.messages])
    limit = req.token_limit
    needs = Needs(vision="image_url" in kinds, tokens=limit)
    q = Query(text, estimate_tokens(text), limit, policy, max_j,
              quality_target=_quality_target(request))
    return body, req, q, needs


def build_routes() -> APIRouter:
    api = APIRouter()

    @api.post("/v1/chat/completions", openapi_extra=request_body(ChatRequest),
              responses={**OK_RESPONSE, **ERROR_RESPONSES})
    async def chat(request: Request) -> Response:
        received = time.perf_counter()
        gw = _gw(request)
        key = authorize(gw, request)
        with gw.admitted():
            body, req, q, needs = await _chat_query(request, gw)

            def body_for(d: Decision, b: Backend) -> dict[str, Any]:
                return rewrite_chat(body, d, b.model, b.reasoning, b.thinking_mode)

            wants_usage = bool(req.stream_options and req.stream_options.include_usage)
            fw = plan(gw, request, req.model, q, needs, "/v1/chat/completions", body_for,
                      req.stream, wants_usage, received, key)
        d = fw.decision
        backend = gw.catalog.backend(d.backend)
        assert backend is not None
        if backend.reasoning and d.thinking_budget is not None:
            gw.metrics.thinking(d.tier, d.backend)
            if backend.thinking_mode == "splice":
                return await forward_spliced(gw.proxy, fw, d.thinking_budget)
        return await gw.proxy.forward(fw)

    @api.post("/v1/completions", openapi_extra=request_body(CompletionRequest),
              responses={**OK_RESPONSE, **ERROR_RESPONSES})
    async def completions(request: Request) -> Response:
        received = time.perf_counter()
        gw = _gw(request)
        key = authorize(gw, request)
        with gw.admitted():
            body = await _body(request, gw.max_body_bytes)
            req = validate_completion(body)
            policy, max_j = _policy(request, gw.default_policy)
            text = req.prompt if isinstance(req.prompt, str) else " ".join(map(str, req.prompt))
            tokens = len(req.prompt) if req.prompt and isinstance(req.prompt[0], int) else None
            q = Query(text, tokens or estimate_tokens(text), req.max_tokens, policy, max_j,
                      quality_target=_quality_target(request))

            def body_for(d: Decision, b: Backend) -> dict[str, Any]:
                out = dict(body, model=b.model)
                if d.routed and "max_tokens" not in body:
                    out["max_tokens"] = d.max_tokens
                return out

            wants_usage = bool(req.stream_options and req.stream_options.include_usage)
            fw = plan(gw, request, req.model, q, Needs(tokens=req.max_tokens),
                      "/v1/completions", body_for, req.stream, wants_usage, received, key)
        return await gw.proxy.forward(fw)

    @api.post("/v1/route", openapi_extra=request_body(ChatRequest), responses=ERROR_RESPONSES)
    async def route(request: Request) -> Response:
        gw = _gw(request)
        key = authorize(gw, request, generates=False)
        _, req, q, needs = await _chat_query(request, gw)
        d, _ = decide_for(gw, key, req.model, q, needs, arriving=False)
        return JSONResponse(d.as_json())

    @api.get("/v1/models")
    async def models(request: Request) -> Response:
        gw = _gw(request)
        authorize(gw, request, generates=False)
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

    @api.get("/v1/energy/{device}/{wid}", responses=ERROR_RESPONSES)
    async def energy(request: Request, device: str, wid: str) -> Response:
        gw = _gw(request)
        key = authorize(gw, request, generates=False)
        owner = gw.proxy.parts.owners.get(f"{device}/{wid}")
        if key is not None and key.id != ADMIN_ID and owner != key.id:  # as if unknown
            raise ApiError(404, f"No energy record '{device}/{wid}'", "invalid_request_error",
                           "id", "energy_not_found")
        figure = await gw.proxy.energy(f"{device}/{wid}")
        if figure is None:
            raise ApiError(404, f"No energy record '{device}/{wid}'", "invalid_request_error",
                           "id", "energy_not_found")
        return JSONResponse({"id": f"{device}/{wid}", **asdict(figure)})

    @api.get("/v1/usage", responses=ERROR_RESPONSES)
    async def usage(request: Request, since: str = "7d") -> Response:
        """Finished requests since `since` (e.g. 24h, 7d): a key sees its own
        (an open gateway: all), with totals by day and by model."""
        gw = _gw(request)
        key = authorize(gw, request, generates=False)
        seconds = parse_since(since)
        if seconds is None:
            raise bad_request("since: a number and a unit, e.g. 24h or 7d", "since",
                              "invalid_since")
        mine = key.id if key is not None and key.id != ADMIN_ID else None
        if gw.spend is None:
            found: dict[str, Any] = {"totals": {}, "by_day": {}, "by_model": {}, "data": []}
        else:  # off the event loop: a database round trip or two
            found = await anyio.to_thread.run_sync(_usage, gw.spend, mine,
                                                   time.time() - seconds)
        return JSONResponse({"object": "list", "since": since, **found})

    @api.get("/v1/admin/keys", responses=ERROR_RESPONSES)
    async def admin_list(request: Request) -> Response:
        store = _admin_store(request)
        return JSONResponse({"object": "list", "data": [k.public() for k in store.all()]})

    @api.post("/v1/admin/keys", openapi_extra=request_body(NewKey),
              responses={201: {"description": "The new key, shown once"}, **ERROR_RESPONSES})
    async def admin_create(request: Request) -> Response:
        store = _admin_store(request)
        spec = validate_new_key(await _body(request, 64 * 1024))
        try:
            key, secret = store.create(spec.name, spec.rpm, spec.tpm, spec.joule_budget,
                                       spec.budget_period, spec.models)
        except ValueError as exc:
            raise ApiError(409, str(exc), "invalid_request_error", "name",
                           "key_exists") from None
        return JSONResponse({**key.public(), "key": secret}, status_code=201)

    @api.post("/v1/admin/keys/{name}/revoke", responses=ERROR_RESPONSES)
    async def admin_revoke(request: Request, name: str) -> Response:
        if not _admin_store(request).revoke(name):
            raise ApiError(404, f"No active key named '{name}'", "invalid_request_error",
                           "name", "key_not_found")
        return JSONResponse({"name": name, "revoked": True})

    @api.get("/healthz")
    async def healthz() -> Response:
        return JSONResponse({"status": "ok"})

    @api.get("/readyz")
    async def readyz(request: Request) -> Response:
        """Ready while some tier can serve; `degraded` names the tiers that cannot."""
        gw = _gw(request)
        tiers = {t: gw.pool.tier_up(t) for t in gw.catalog.tiers}
        degraded = [t for t, up in tiers.items() if not up]
        ok = len(degraded) < len(tiers)
        return JSONResponse({"ready": ok, "tiers": tiers, "degraded": degraded},
                            status_code=200 if ok else 503)

    @api.get("/metrics", responses=TEXT_RESPONSE)
    async def metrics(request: Request) -> Response:
        return Response(_gw(request).metrics.render(), media_type=CONTENT_TYPE)

    return api
