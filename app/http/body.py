"""Reading a request: headers by name, the JSON body within its limit, and
joulegate's own control headers."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request
from starlette.requests import ClientDisconnect

from app.errors import bad_request, body_timeout, body_too_large, unsupported_media_type
from app.http.requests import is_json_type, parse_json
from router.decision import POLICIES, Policy

BODY_TIMEOUT_S = 10.0


def header(request: Request, name: bytes) -> str | None:
    """A request header by its lower-case name (the first of that name), from
    an index of the request's headers built once (Starlette's `headers` scans
    them all, and raises inside for every header that is absent)."""
    scope = request.scope
    index: dict[bytes, bytes] | None = scope.get("joulegate.headers")
    if index is None:
        index = scope["joulegate.headers"] = dict(reversed(list(scope["headers"])))
    value = index.get(name)
    return None if value is None else value.decode("latin-1")


async def json_body(request: Request, limit: int, timeout_s: float = BODY_TIMEOUT_S
                    ) -> dict[str, Any]:
    """The JSON object of the body, read within `timeout_s` (a client that
    sends its body slowly, or less of it than its Content-Length, gets a 408
    and the connection closed: it holds nothing else meanwhile)."""
    content_type = header(request, b"content-type")
    if not is_json_type(content_type):
        raise unsupported_media_type(content_type)
    declared = header(request, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise body_too_large(limit)  # refused before reading the body
    try:
        async with asyncio.timeout(timeout_s):
            raw = await _read(request, limit)
    except TimeoutError:
        raise body_timeout(timeout_s) from None
    return parse_json(raw, limit)


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


def quality_target(request: Request) -> float | None:
    raw = header(request, b"x-joulegate-quality-target")
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


def policy(request: Request, default: Policy) -> tuple[Policy, float | None]:
    """The policy header (or `default`) and the joule cap header, checked."""
    raw = header(request, b"x-joulegate-policy")
    chosen: Policy = default
    if raw is not None:
        if raw not in POLICIES:
            raise bad_request(
                f"x-joulegate-policy must be one of {', '.join(POLICIES)}", "x-joulegate-policy")
        chosen = raw
    cap = header(request, b"x-joulegate-max-joules")
    max_j = None
    if cap is not None:
        try:
            max_j = float(cap)
        except ValueError:
            max_j = -1.0
        if not 0 < max_j < float("inf"):
            raise bad_request("x-joulegate-max-joules must be a positive number",
                              "x-joulegate-max-joules")
    return chosen, max_j
