"""JSON of worker events and of what the gateway writes: orjson where it can
(several times faster than the standard library), the standard library for
what orjson refuses (NaN and Infinity literals, lone surrogates, integers
beyond 64 bits when writing). orjson reads integers beyond 64 bits as floats,
so client request bodies are read by the standard library (app.requests)."""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(data: bytes | str) -> Any:
    """Like json.loads (same errors; integers beyond 64 bits become floats)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def dumps(obj: Any) -> bytes:
    """Compact JSON as UTF-8 bytes."""
    try:
        return orjson.dumps(obj)
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(obj, separators=(",", ":")).encode()
