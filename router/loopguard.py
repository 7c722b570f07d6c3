"""Detects a generation that has started repeating itself.

Small models sometimes loop forever on a phrase (seen in the seed
experiments); every looped token costs energy and adds nothing. The stream is
checked for a tail made of one unit repeated: a unit of 1..`max_period`
characters, repeated at least `min_repeats` times and covering at least
`min_chars` characters.
"""

from __future__ import annotations


class LoopGuard:
    def __init__(self, min_chars: int = 200, min_repeats: int = 4, max_period: int = 200,
                 check_every: int = 8, window: int = 2048) -> None:
        self._min_chars = min_chars
        self._min_repeats = min_repeats
        self._max_period = max_period
        self._check_every = check_every
        self._window = window
        self._tail = ""
        self._pieces = 0
        self.period: int | None = None

    def feed(self, text: str) -> bool:
        """Add generated text; True once the tail is a loop."""
        if not text or self.period is not None:
            return self.period is not None
        self._tail = (self._tail + text)[-self._window:]
        self._pieces += 1
        if self._pieces % self._check_every == 0:
            self.period = find_loop(self._tail, self._min_chars, self._min_repeats,
                                    self._max_period)
        return self.period is not None


def find_loop(text: str, min_chars: int, min_repeats: int, max_period: int) -> int | None:
    """The shortest period p such that text ends with a unit of length p repeated
    enough times, or None."""
    n = len(text)
    for p in range(1, min(max_period, n // min_repeats) + 1):
        span = max(min_chars, p * min_repeats)
        if span > n:
            continue
        tail = text[n - span:]
        if tail[p:] == tail[:-p]:  # periodic with period p over the whole span
            return p
    return None
