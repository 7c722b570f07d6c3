"""The gateway's ASGI application: FastAPI, with a direct path for the two
routes that carry the traffic.

A POST to /v1/chat/completions or /v1/completions goes straight to its
endpoint (the same function FastAPI routes to), skipping FastAPI's
per-request telemetry check, middleware stack, route matching and dependency
solving: about a fifth of a loaded gateway's samples
(`python -m bench.profile_gateway`). Errors are answered by the same handlers
as on FastAPI's path. A streamed answer is sent with its disconnect watched
by app.forward.watch (Starlette's streaming response would start a task group per
stream). Everything else (other methods and paths, lifespan, the schema) is
FastAPI's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute, APIRouter
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from app.errors import ApiError
from app.forward.watch import ClientLeft, unless_left
from app.http.guard import Guard
from app.http.handlers import on_api_error, on_unexpected

log = logging.getLogger("joulegate.app")

DIRECT = ("/v1/chat/completions", "/v1/completions")
Endpoint = Callable[[Request], Awaitable[Response]]


class GatewayApp(FastAPI):
    def __init__(self, **kwargs: Any) -> None:
        # FastAPI's OpenTelemetry bridge checks for providers on every request;
        # joulegate's metrics are Prometheus's.
        super().__init__(telemetry={"tracing": False, "metrics": False, "logs": False},
                         **kwargs)
        self.direct: dict[str, Endpoint] = {}
        self.guard = Guard()

    def route_directly(self, router: APIRouter) -> None:
        """Take the endpoints of the DIRECT paths from `router` (included in
        this app); both must be there."""
        self.direct = {r.path: r.endpoint for r in router.routes
                       if isinstance(r, APIRoute) and r.path in DIRECT
                       and "POST" in (r.methods or ())}
        assert set(self.direct) == set(DIRECT), sorted(self.direct)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.guard.refusal(scope)
            if refusal is not None:
                await JSONResponse(refusal.body(), status_code=refusal.status,
                                   headers=refusal.headers)(scope, receive, send)
                return
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.direct.get(scope["path"])
            if endpoint is not None:
                scope["app"] = self
                request = Request(scope, receive)
                try:
                    response = await endpoint(request)
                except ClientDisconnect:
                    return  # gone while its body was being read: nobody to answer
                except ApiError as exc:
                    response = await on_api_error(request, exc)
                except Exception as exc:
                    log.exception("%s %s", scope["method"], scope["path"])
                    response = await on_unexpected(request, exc)
                if isinstance(response, StreamingResponse):
                    await _stream(response, request, send)
                else:
                    await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


async def _stream(response: StreamingResponse, request: Request, send: Send) -> None:
    """Starlette's streaming response (ASGI 2.3 servers: uvicorn), with the
    disconnect watched by app.forward.watch instead of a task group per stream."""
    with contextlib.suppress(ClientLeft):
        await unless_left(response.stream_response(send), request.is_disconnected)
    if response.background is not None:
        await response.background()
