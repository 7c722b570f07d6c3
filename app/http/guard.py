"""What every request must pass before any handler: a Host this gateway
answers to, a path without encoded slashes, headers within bounds.

- Host: a web page can reach a gateway on a developer's loopback address
  through DNS rebinding (its own name resolving to 127.0.0.1) and use it,
  open as it is without keys. So a gateway serving a loopback address answers
  only to loopback names by default (JOULEGATE_ALLOWED_HOSTS overrides: a
  comma-separated list, `*` for any).
- `%2F` in a path is refused: decoded, `/v1/chat%2Fcompletions` would be
  served as `/v1/chat/completions`, past a path rule in front of the gateway.
- At most MAX_HEADERS headers of MAX_HEADER_BYTES together (431).
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from app.errors import ApiError
from app.settings import is_loopback

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})  # Host names answered
MAX_HEADERS = 100
MAX_HEADER_BYTES = 64 * 1024


def allowed_hosts(setting: str | None, serving_host: str) -> frozenset[str] | None:
    """The Host names answered (None: any): the setting, or loopback names when
    serving a loopback address."""
    if setting:
        names = {h.strip().lower() for h in setting.split(",") if h.strip()}
        return None if "*" in names else frozenset(names)
    return LOOPBACK_NAMES if is_loopback(serving_host) else None


def _host_name(value: bytes) -> str:
    host = value.decode("latin-1").strip().lower()
    if host.startswith("["):  # [::1]:8000
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


@dataclass
class Guard:
    hosts: frozenset[str] | None = None  # None: any Host
    _seen: dict[bytes, bool] = field(default_factory=dict)  # Host header -> allowed

    def refusal(self, scope: MutableMapping[str, Any]) -> ApiError | None:
        headers: Iterable[tuple[bytes, bytes]] = scope["headers"]
        if len(scope["headers"]) > MAX_HEADERS or \
                sum(len(k) + len(v) for k, v in headers) > MAX_HEADER_BYTES:
            return ApiError(431, f"At most {MAX_HEADERS} headers of {MAX_HEADER_BYTES} bytes "
                            "together", "invalid_request_error", None, "headers_too_large",
                            {"connection": "close"})
        raw = scope.get("raw_path") or b""
        if b"%2f" in raw.lower():
            return ApiError(404, "Encoded slashes (%2F) are not served in paths",
                            "invalid_request_error", None, "not_found")
        if self.hosts is not None and not self._allowed(scope):
            return ApiError(421, "This gateway does not answer to that Host (set "
                            "JOULEGATE_ALLOWED_HOSTS)", "invalid_request_error", None,
                            "host_not_allowed")
        return None

    def _allowed(self, scope: MutableMapping[str, Any]) -> bool:
        host = next((v for k, v in scope["headers"] if k == b"host"), b"")
        known = self._seen.get(host)
        if known is None:
            assert self.hosts is not None
            known = _host_name(host) in self.hosts
            if len(self._seen) < 1024:
                self._seen[host] = known
        return known
