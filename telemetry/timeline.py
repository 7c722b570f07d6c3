"""A request's token progress over time, relative to its window's opening.

Offsets (not clock times) travel to the ledger, so the gateway and a remote
agent need not share a clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

Point = tuple[float, int, int]  # (offset_s, prompt_tokens, decode_tokens)


@dataclass(frozen=True)
class EnergyFigure:
    """A request's energy: net of idle, gross with its share of idle, and its source."""

    net_j: float
    gross_j: float
    source: str
    final: bool
    prefill_j: float = 0.0
    decode_j: float = 0.0
    # What the request would have cost alone (gross), from its backend's
    # operating curve: an estimate, None without a curve.
    standalone_j: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """The fields by name (dataclasses.asdict without its deep copy)."""
        return dict(self.__dict__)


class TokenTimeline:
    """Records (offset, prompt tokens, decode tokens) points as a request progresses.

    Points closer than `min_gap_s` are merged (the last one wins) so a long
    stream keeps a few hundred points, not one per token.
    """

    def __init__(self, min_gap_s: float = 0.02) -> None:
        self._t0 = time.monotonic()
        self._points: list[Point] = [(0.0, 0, 0)]
        self._min_gap_s = min_gap_s
        self._first: tuple[float, int] | None = None  # the first answer token's mark

    def mark(self, prompt_tokens: int, decode_tokens: int, offset_s: float | None = None) -> None:
        t = time.monotonic() - self._t0 if offset_s is None else offset_s
        if self._first is None and decode_tokens > 0:  # kept apart: merging may revise it
            self._first = (t, decode_tokens)
        point = (t, prompt_tokens, decode_tokens)
        if len(self._points) > 1 and t - self._points[-2][0] < self._min_gap_s:
            self._points[-1] = point
        else:
            self._points.append(point)

    def elapsed_s(self) -> float:
        return time.monotonic() - self._t0

    def points(self) -> list[Point]:
        return list(self._points)

    def since(self, index: int) -> list[Point]:
        """The points from `index` on (read by a sampler thread while the request
        runs: a slice is taken atomically, and only the last point is revised)."""
        return self._points[index:]

    def scale_prompt(self, prompt_tokens: int) -> None:
        """Replace the estimated prompt size by the one the worker reported."""
        self._points = [
            (t, prompt_tokens if p else 0, d) for t, p, d in self._points
        ]

    def decode_s_per_token(self, min_tokens: int = 8) -> float | None:
        """Seconds per answer token after the first (the pace a client saw),
        or None with fewer than `min_tokens` answer tokens after the first
        (an answer that came whole has no pace)."""
        first = self._first
        if first is None:
            return None
        t, _, decoded = self._points[-1]
        if decoded - first[1] < min_tokens or t <= first[0]:
            return None
        return (t - first[0]) / (decoded - first[1])
