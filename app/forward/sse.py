"""Server-sent events: split a byte stream into whole events, read their data."""

from __future__ import annotations

import json
from typing import Any

from app import jsonio

DONE = b"data: [DONE]\n\n"
MAX_EVENT_BYTES = 1024 * 1024  # an event (a token's chunk is ~200 bytes): beyond it, broken


class EventTooLarge(ValueError):
    """A worker sent more than MAX_EVENT_BYTES without ending an event."""


class EventSplitter:
    """Cuts a byte stream at blank lines; events come out byte-for-byte unchanged.
    An event longer than `max_bytes` raises EventTooLarge (its bytes are not
    kept: memory stays bounded whatever a worker sends)."""

    def __init__(self, max_bytes: int = MAX_EVENT_BYTES) -> None:
        self._buf = b""
        self._max = max_bytes

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buf += chunk
        events: list[bytes] = []
        while True:
            cut = _boundary(self._buf)
            if cut < 0:
                if len(self._buf) > self._max:
                    self._buf = b""
                    raise EventTooLarge(f"an event of more than {self._max} bytes")
                return events
            events.append(self._buf[:cut])
            self._buf = self._buf[cut:]

    def rest(self) -> bytes:
        rest, self._buf = self._buf, b""
        return rest


def _boundary(buf: bytes) -> int:
    """Where the first event ends (after its blank line), or -1."""
    lf = buf.find(b"\n\n")
    crlf = buf.find(b"\r\n\r\n")
    if lf < 0:
        return crlf + 4 if crlf >= 0 else -1
    return lf + 2 if crlf < 0 or lf + 2 <= crlf + 4 else crlf + 4


def event_json(event: bytes) -> dict[str, Any] | None:
    """The JSON object in an event's data lines, or None ([DONE], comments, junk)."""
    body = event.rstrip(b"\r\n")
    if body.startswith(b"data:") and b"\n" not in body and b"\r" not in body:
        data = body[5:].strip()  # one data line: how workers send their events
    else:
        data = b"".join(ln[5:].strip() for ln in event.splitlines() if ln.startswith(b"data:"))
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
