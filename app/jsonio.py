"""JSON of worker events and of what the gateway writes: orjson where it can
(several times faster than the standard library), the standard library for
what orjson refuses (NaN and Infinity literals, lone surrogates, integers
beyond 64 bits when writing). orjson reads integers beyond 64 bits as floats:
`loads_exact` (client request bodies) gives such text to the standard library."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

# 19 digits in a row: perhaps an integer orjson would read as a float (or digits
# in a string, or a long fraction: those go to the standard library needlessly).
_LONG_DIGITS = re.compile(rb"\d{19}")


def loads(data: bytes | str) -> Any:
    """Like json.loads (same errors; integers beyond 64 bits become floats)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def loads_exact(data: bytes) -> Any:
    """Exactly json.loads's meaning and errors (big integers stay integers);
    orjson where it gives the same."""
    if _LONG_DIGITS.search(data) is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # NaN, lone surrogates, not JSON: the standard library's meaning or error
    return json.loads(data)


def dumps(obj: Any) -> bytes:
    """Compact JSON as UTF-8 bytes."""
    try:
        return orjson.dumps(obj)
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(obj, separators=(",", ":")).encode()
