"""Errors the gateway answers with, in the OpenAI envelope, mapped to HTTP once.

Foreign exceptions (httpx, pydantic) are translated where they arise (the
upstream adapter, the request parser) into `ApiError`; this module turns an
`ApiError` into a response.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


class ApiError(Exception):
    """An error with an HTTP status and the OpenAI error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def sse_event(self) -> bytes:
        """The error as a server-sent event, for streams that already began."""
        return b"data: " + json.dumps(self.body()).encode() + b"\n\n"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", param, code)


def not_found_model(model: str) -> ApiError:
    return ApiError(
        404, f"The model '{model}' does not exist", "invalid_request_error", "model",
        "model_not_found",
    )


def _retry_after(seconds: float) -> dict[str, str]:
    return {"retry-after": str(max(1, math.ceil(seconds)))}


def no_healthy_worker(tier: str, retry_after_s: float = 1.0) -> ApiError:
    return ApiError(
        503, f"No healthy worker for tier '{tier}'", "service_unavailable", None,
        "no_healthy_worker", _retry_after(retry_after_s),
    )


def overloaded(backend: str, queued: int) -> ApiError:
    return ApiError(
        429, f"'{backend}' is at capacity ({queued} requests queued); retry shortly",
        "rate_limit_error", None, "overloaded", _retry_after(1.0),
    )


def invalid_api_key() -> ApiError:
    return ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                    "invalid_request_error", None, "invalid_api_key",
                    {"www-authenticate": "Bearer"})


def admin_only() -> ApiError:
    return ApiError(403, "Only the admin key (JOULEGATE_ADMIN_KEY) may do this",
                    "invalid_request_error", None, "admin_only")


def model_not_allowed(model: str) -> ApiError:
    return ApiError(403, f"This key may not use the model '{model}'", "invalid_request_error",
                    "model", "model_not_allowed")


def joule_budget_exceeded(budget_j: float, period: str, reset_at: float) -> ApiError:
    when = dt.datetime.fromtimestamp(reset_at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    retry = max(1, math.ceil(reset_at - time.time()))
    return ApiError(429, f"This key's energy budget of {budget_j:g} J per {period} is spent; "
                    f"it resets at {when}", "rate_limit_error", None, "joule_budget_exceeded",
                    {"retry-after": str(retry), "x-joulegate-budget-reset": when})


def rate_limited(limit: str, retry_after_s: int) -> ApiError:
    what = {"rpm": "requests", "tpm": "tokens"}.get(limit, limit)
    return ApiError(429, f"This key's {what} per minute limit is reached; retry in "
                    f"{retry_after_s} s", "rate_limit_error", None, f"{limit}_limit_exceeded",
                    {"retry-after": str(retry_after_s)})


def upstream_rejected(backend: str, status: int, message: str) -> ApiError:
    """A worker's own error answer: its 4xx are the request's fault (400), 503 is
    a busy or loading worker (503), other 5xx the worker's (502)."""
    if 400 <= status < 500:
        return ApiError(400, f"Worker of '{backend}' rejected the request: {message}",
                        "invalid_request_error", None, "upstream_rejected")
    if status == 503:
        return ApiError(503, f"Worker of '{backend}' is not ready: {message}",
                        "service_unavailable", None, "upstream_unavailable", _retry_after(1.0))
    return ApiError(502, f"Worker of '{backend}' failed ({status}): {message}",
                    "upstream_error", None, "upstream_error")


def upstream_timeout(backend: str) -> ApiError:
    return ApiError(504, f"Worker of '{backend}' timed out", "timeout", None, "upstream_timeout")


def upstream_failed(backend: str, detail: str) -> ApiError:
    return ApiError(
        502, f"Worker of '{backend}' failed: {detail}", "upstream_error", None, "upstream_error"
    )


async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    hook = getattr(request.app.state, "on_error", None)  # set by the app's lifespan
    if hook is not None:
        hook(exc.status, exc.code)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
    err = ApiError(500, f"Internal error: {type(exc).__name__}", "server_error")
    return JSONResponse(err.body(), status_code=500)


def install_handlers(app: FastAPI) -> None:
    """Answer every error, ours or the framework's, in the OpenAI envelope."""

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        err = ApiError(exc.status_code, str(exc.detail), "invalid_request_error", None, code)
        hook = getattr(request.app.state, "on_error", None)
        if hook is not None:
            hook(exc.status_code, code)
        # Starlette's headers (405's Allow) are kept.
        return JSONResponse(err.body(), status_code=exc.status_code, headers=exc.headers)

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
