"""Server-sent events: split a byte stream into whole events, read their data."""

from __future__ import annotations

import json
from typing import Any

from app import jsonio

DONE = b"data: [DONE]\n\n"


class EventSplitter:
    """Cuts a byte stream at blank lines; events come out byte-for-byte unchanged."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buf += chunk
        events: list[bytes] = []
        while True:
            cut = _boundary(self._buf)
            if cut < 0:
                return events
            events.append(self._buf[:cut])
            self._buf = self._buf[cut:]

    def rest(self) -> bytes:
        rest, self._buf = self._buf, b""
        return rest


def _boundary(buf: bytes) -> int:
    ends = [(buf.find(sep), len(sep)) for sep in (b"\n\n", b"\r\n\r\n")]
    found = [i + n for i, n in ends if i >= 0]
    return min(found) if found else -1


def event_json(event: bytes) -> dict[str, Any] | None:
    """The JSON object in an event's data lines, or None ([DONE], comments, junk)."""
    lines = [ln[5:].strip() for ln in event.splitlines() if ln.startswith(b"data:")]
    data = b"".join(lines)
    if not data or data == b"[DONE]":
        return None
    try:
        obj = jsonio.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return obj if isinstance(obj, dict) else None


def is_passable(event: bytes) -> bool:
    """A non-JSON event worth passing on (a comment, a named event); not [DONE],
    not blank, not bytes that are no SSE at all."""
    head = event.lstrip()[:6]
    return bool(head) and not is_done(event) and head.startswith((b":", b"event:", b"id:",
                                                                   b"retry:", b"data:"))


def is_done(event: bytes) -> bool:
    return event.strip() == b"data: [DONE]"


def encode(obj: dict[str, Any]) -> bytes:
    return b"data: " + jsonio.dumps(obj) + b"\n\n"
