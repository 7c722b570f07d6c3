"""What an arriving request can expect to run beside: the in-flight counts that
recent arrivals met.

The router prices an action by what each backend runs (router.pricing). The
instant count misses a burst's first requests: the GPU is idle for a moment,
so the first request is priced as if alone, goes to the small model, and the
large model's batch then forms beside it (measured on the H200: two such
requests per 200 at concurrency 8 cost +6% against always-8B). What arrivals
met recently is the better forecast: a closed loop of one client always meets
0 (so it stays priced alone), one of eight meets ~7, and that memory fades
with `tau_s` of quiet.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping


class Traffic:
    def __init__(self, weight: float = 0.1, tau_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._weight = weight  # of the newest arrival (~ the last 1/weight arrivals)
        self._tau_s = tau_s
        self._clock = clock
        self._met: dict[str, float] = {}
        self._last: float | None = None

    def expect(self, running: Mapping[str, int], arriving: bool = True) -> dict[str, int]:
        """The counts to price with: per backend the larger of what runs now and
        what arrivals have been meeting. `arriving`: a request that will run
        (recorded); a dry run (/v1/route) only asks."""
        now = self._clock()
        fade = 1.0 if self._last is None else math.exp(-(now - self._last) / self._tau_s)
        met = {name: self._met.get(name, 0.0) * fade for name in set(self._met) | set(running)}
        if arriving:
            self._last = now
            for name, before in met.items():
                met[name] = before + self._weight * (running.get(name, 0) - before)
            self._met = met
        return {name: max(running.get(name, 0), math.floor(m + 1e-9))
                for name, m in met.items()}
