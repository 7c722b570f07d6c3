"""Each key's share of a backend's capacity while keys contend for it.

A key alone may use all of it. Once a backend is half full (`contended_at`),
a key that holds at least its fair share of it (its slots and queue / the
keys active on it now) is refused more until it holds less; a key is active
on a backend while it holds requests there and for `active_s` after it last
asked for it, so a key that was just refused because another filled the
backend is counted, and the one filling it is held to its share as its
requests end. Without this, one tenant sending long requests as fast as
slots free keeps every other tenant at 429.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable


class FairShare:
    def __init__(self, active_s: float = 10.0, contended_at: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._active_s = active_s
        self._contended_at = contended_at
        self._clock = clock
        self.held: Counter[tuple[str, str]] = Counter()  # (backend, key) -> requests
        self._asked: dict[tuple[str, str], float] = {}
        self._pruned_at = float("-inf")

    def over_share(self, backend: str, key: str, load: int, limit: int) -> bool:
        """Whether `key` (asking for `backend` now) holds its share of it
        already, the backend holding `load` of `limit` requests."""
        now = self._clock()
        self._asked[(backend, key)] = now
        if load < limit * self._contended_at:
            return False
        if now - self._pruned_at > self._active_s:
            self._prune(now)
        active = sum(1 for (b, k), t in self._asked.items() if b == backend
                     and (self.held[(b, k)] > 0 or now - t <= self._active_s))
        return self.held[(backend, key)] >= math.ceil(limit / max(1, active))

    def take(self, backend: str, key: str) -> None:
        self.held[(backend, key)] += 1

    def give(self, backend: str, key: str) -> None:
        self.held[(backend, key)] -= 1
        if self.held[(backend, key)] <= 0:
            del self.held[(backend, key)]

    def _prune(self, now: float) -> None:
        self._pruned_at = now
        for k in [k for k, t in self._asked.items()
                  if now - t > self._active_s and self.held[k] <= 0]:
            del self._asked[k]
