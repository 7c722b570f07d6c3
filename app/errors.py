"""Every error the gateway answers with: the one table from domain errors to
an HTTP status and the OpenAI envelope.

Foreign exceptions (httpx, httptools, pydantic, SQL drivers) are translated
once where they arise, into each package's own root; this module maps those
roots to `ApiError`, and app.http.handlers turns an `ApiError` into a response.
The tree:

- `ApiError` (here): status, message, type, param, code, headers.
- `app.upstream.client.UpstreamFault`: `UpstreamError` (kind unavailable,
  reset, timeout, broken), `pool.NoReplica`, `pool.Overloaded`
  -> `begin_failed`, `from_upstream`: 503, 429, 504, 502.
- a worker's own non-200 answer -> `upstream_rejected`: 400, 503, 502.
- `router.decision.Unroutable` -> the planner: 429 (all full) or 503.
- `app.tenancy.database.DatabaseError` (`Conflict`) -> `key_exists`: 409.
- `app.catalog.CatalogError`: at start-up only; the CLI prints its one line.
- `app.forward.watch.ClientLeft`: the client is gone, nobody to answer (499).
- `telemetry.reader.ReaderError`: never reaches a client; the energy
  figure says the counter failed.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
from typing import Any

from app.upstream.client import UpstreamError, UpstreamFault
from app.upstream.pool import NoReplica, Overloaded


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


def over_share(key: str, held: int) -> ApiError:
    return ApiError(
        429, f"Key '{key}' holds its share of the gateway's capacity ({held} requests) "
             "while other keys wait; retry shortly", "rate_limit_error", None,
        "key_over_share", _retry_after(1.0),
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


def begin_failed(exc: UpstreamFault, tier: str, backend: str, queued: int,
                 retry_after_s: float) -> ApiError:
    """A request that could not start on its backend."""
    if isinstance(exc, Overloaded):
        return overloaded(backend, queued)
    if isinstance(exc, NoReplica):
        return no_healthy_worker(tier, exc.retry_after_s)
    assert isinstance(exc, UpstreamError)
    if exc.kind == "unavailable":
        return no_healthy_worker(tier, retry_after_s)
    return from_upstream(backend, exc)


def begin_status(exc: UpstreamFault) -> str:
    """The `status` label of a request that could not start."""
    if isinstance(exc, Overloaded):
        return "overloaded"
    if isinstance(exc, NoReplica):
        return "no_worker"
    assert isinstance(exc, UpstreamError)
    return "no_worker" if exc.kind == "unavailable" else f"upstream_{exc.kind}"


def from_upstream(backend: str, exc: UpstreamError) -> ApiError:
    """A worker that failed after the request reached it."""
    if exc.kind == "timeout":
        return upstream_timeout(backend)
    return upstream_failed(backend, exc.detail)


def body_too_large(limit_bytes: int) -> ApiError:
    return ApiError(413, f"Request body is larger than {limit_bytes} bytes",
                    "invalid_request_error", None, "body_too_large")


def body_timeout(seconds: float) -> ApiError:
    return ApiError(408, f"The request body did not arrive within {seconds:g} s",
                    "invalid_request_error", None, "body_timeout", {"connection": "close"})


def head_timeout(seconds: float) -> ApiError:
    return ApiError(408, f"The request's head did not arrive within {seconds:g} s",
                    "invalid_request_error", None, "head_timeout", {"connection": "close"})


def too_many_connections(limit: int) -> ApiError:
    return ApiError(503, f"The gateway holds its most open connections ({limit}); retry "
                    "shortly", "service_unavailable", None, "too_many_connections",
                    {**_retry_after(1.0), "connection": "close"})


def too_many_client_connections(limit: int) -> ApiError:
    return ApiError(429, f"This client address holds its most open connections ({limit}); "
                    "reuse one, or close some", "rate_limit_error", None,
                    "too_many_connections_from_client",
                    {**_retry_after(1.0), "connection": "close"})


def malformed_http(detail: str) -> ApiError:
    return ApiError(400, f"Not an HTTP/1.1 request: {detail}", "invalid_request_error",
                    None, "malformed_http", {"connection": "close"})


def unsupported_media_type(content_type: str | None) -> ApiError:
    return ApiError(415, f"Content-Type must be application/json, not '{content_type or ''}'",
                    "invalid_request_error", None, "unsupported_media_type")


def energy_not_found(wid: str) -> ApiError:
    return ApiError(404, f"No energy record '{wid}'", "invalid_request_error", "id",
                    "energy_not_found")


def key_exists(message: str) -> ApiError:
    return ApiError(409, message, "invalid_request_error", "name", "key_exists")


def key_not_found(name: str) -> ApiError:
    return ApiError(404, f"No active key named '{name}'", "invalid_request_error", "name",
                    "key_not_found")


def internal(exc: Exception) -> ApiError:
    return ApiError(500, f"Internal error: {type(exc).__name__}", "server_error")


def framework(status: int, detail: str) -> ApiError:
    """The framework's own refusals (an unknown path, a wrong method)."""
    code = {404: "not_found", 405: "method_not_allowed"}.get(status)
    return ApiError(status, detail, "invalid_request_error", None, code)
