"""A replica's measured pace: seconds per answer token, by the batch a
request joined.

Packing requests onto one replica's batch saves joules and slows every
token of that batch; a backend's `max_seconds_per_token` bounds how far.
Each finished answer reports the pace it saw and the batch size it started
in (itself included); the pace at a size is a moving average of those
reports. Packing grows one size at a time: a size not measured yet borrows
the pace of the size just below it (a batch is not faster than a smaller
one, so this errs towards packing once more, and that request's own pace
is then measured), and a size further from what was measured counts as too
slow (`UNKNOWN`), so a cold burst spreads instead of filling one batch
blind. A measurement expires after `max_age_s`, so a slow spell is tried
again later rather than ruling a size out for good.
"""

from __future__ import annotations

import math

SMOOTHING = 0.3  # weight of a new report in the moving average
MAX_AGE_S = 120.0
UNKNOWN = math.inf  # a batch size too far above what was measured


class Pace:
    def __init__(self, max_age_s: float = MAX_AGE_S) -> None:
        self.max_age_s = max_age_s
        # batch size -> (seconds per token, when last reported)
        self._by_batch: dict[int, tuple[float, float]] = {}

    def observe(self, batch: int, s_per_token: float, now: float) -> None:
        old = self._by_batch.get(batch)
        if old is not None and now - old[1] <= self.max_age_s:
            s_per_token = old[0] + SMOOTHING * (s_per_token - old[0])
        self._by_batch[batch] = (s_per_token, now)

    def at(self, batch: int, now: float) -> float | None:
        """The expected seconds per token in a batch of `batch`: measured,
        borrowed from `batch - 1`, None for a first request (nothing to
        wait on), else UNKNOWN."""
        for n in (batch, batch - 1):
            got = self._by_batch.get(n)
            if got is not None and now - got[1] <= self.max_age_s:
                return got[0]
        return None if batch <= 1 else UNKNOWN
