"""Per-key request and token rates over a sliding minute.

`admit` is asked before a request is read further: a key over its requests or
tokens per minute is refused with the seconds until its oldest counted entry
leaves the window (Retry-After). Tokens (prompt + completion, from the
worker's usage) are counted when a request ends. In-process: with several
gateway processes each keeps its own window.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from app.tenancy.keys import ApiKey

WINDOW_S = 60.0


@dataclass(frozen=True)
class Refusal:
    limit: str  # "rpm" | "tpm"
    retry_after_s: int


class RateLimits:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._requests: dict[str, deque[float]] = {}
        self._tokens: dict[str, deque[tuple[float, int]]] = {}
        self._token_sum: dict[str, int] = {}

    def _trim(self, key_id: str, now: float) -> None:
        start = now - WINDOW_S
        reqs = self._requests.get(key_id)
        while reqs and reqs[0] <= start:
            reqs.popleft()
        toks = self._tokens.get(key_id)
        while toks and toks[0][0] <= start:
            self._token_sum[key_id] -= toks.popleft()[1]

    def admit(self, key: ApiKey) -> Refusal | None:
        """Count the request if the key is within its limits; else why not."""
        now = self._clock()
        self._trim(key.id, now)
        reqs = self._requests.setdefault(key.id, deque())
        if key.rpm is not None and len(reqs) >= key.rpm:
            return Refusal("rpm", _wait(reqs[0], now))
        toks = self._tokens.get(key.id)
        if key.tpm is not None and toks and self._token_sum.get(key.id, 0) >= key.tpm:
            return Refusal("tpm", _wait(toks[0][0], now))
        reqs.append(now)
        return None

    def spent(self, key_id: str, tokens: int) -> None:
        if tokens <= 0:
            return
        self._tokens.setdefault(key_id, deque()).append((self._clock(), tokens))
        self._token_sum[key_id] = self._token_sum.get(key_id, 0) + tokens


def _wait(oldest: float, now: float) -> int:
    return max(1, math.ceil(oldest + WINDOW_S - now))
