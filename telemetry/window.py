"""One request's energy window on a device (what the ledger attributes to), and
the unguessable names windows get."""

from __future__ import annotations

import bisect
import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from telemetry.rates import TOKEN_COUNTS, TokenRates
from telemetry.timeline import EnergyFigure, Point


@dataclass(slots=True)
class Window:
    wid: str
    opened_at: float
    closed_at: float | None = None
    times: list[float] = field(default_factory=list)
    prompt: list[float] = field(default_factory=list)  # cumulative prompt tokens
    decode: list[float] = field(default_factory=list)  # cumulative answer tokens
    rates: TokenRates = TOKEN_COUNTS
    net_j: float = 0.0
    idle_share_j: float = 0.0
    prefill_j: float = 0.0
    decode_j: float = 0.0
    settled_until: float = float("-inf")
    # While open: the request's token points from an index on (read live).
    progress: Callable[[int], list[Point]] | None = None
    synced: int = 0  # progress points copied so far
    mark_len: int = 0
    standalone: float | None = None  # kept when the timeline is dropped (compact)
    # Set at its close: the last time another request ran beside it (inf: one
    # still did). Alone after this, the energy of its unsettled stretch is its own.
    others_until: float = float("inf")
    lost: bool = False  # overlapped a stretch the counter never covered: never final
    figure: EnergyFigure | None = None  # a lost one's, kept when its timeline is dropped

    def add_points(self, points: list[Point], until: float) -> None:
        """Append (offset, prompt, decode) points, as absolute times up to `until`."""
        for off, prompt, decode in points:
            t = self.opened_at + (off if off > 0.0 else 0.0)
            if t > until:
                t = until
            if self.times and t <= self.times[-1]:
                t = self.times[-1]
                self.times[-1], self.prompt[-1], self.decode[-1] = t, prompt, decode
            else:
                self.times.append(t)
                self.prompt.append(prompt)
                self.decode.append(decode)

    def sync(self, now: float) -> None:
        """Copy the progress reported since the last sync. Only a timeline's last
        point is ever revised, so the copy restarts from the previous last point
        (`mark_len`: the arrays' length before it was added)."""
        if self.progress is None or self.closed_at is not None:
            return
        start = max(0, self.synced - 1)
        points = self.progress(start)
        if not points:
            return
        del self.times[self.mark_len:], self.prompt[self.mark_len:], self.decode[self.mark_len:]
        self.add_points(points[:-1], now)
        self.mark_len = len(self.times)
        self.add_points(points[-1:], now)
        self.synced = start + len(points)

    def overlaps(self, a: float, b: float) -> bool:
        return self.opened_at < b and (self.closed_at is None or self.closed_at > a)

    def overlap_s(self, a: float, b: float) -> float:
        end = b if self.closed_at is None else min(b, self.closed_at)
        return max(0.0, end - max(a, self.opened_at))

    def tokens_at(self, t: float) -> tuple[float, float]:
        """(prompt tokens, answer tokens) processed by time t, linearly interpolated."""
        ts = self.times
        if not ts or t <= ts[0]:
            return 0.0, 0.0
        if t >= ts[-1]:
            return self.prompt[-1], self.decode[-1]
        i = bisect.bisect_right(ts, t)
        t0, t1 = ts[i - 1], ts[i]
        f = (t - t0) / (t1 - t0) if t1 > t0 else 1.0
        p = self.prompt[i - 1] + f * (self.prompt[i] - self.prompt[i - 1])
        d = self.decode[i - 1] + f * (self.decode[i] - self.decode[i - 1])
        return p, d

    def standalone_j(self) -> float | None:
        if not self.times:
            return self.standalone
        return self.rates.standalone_joules(self.prompt[-1], self.decode[-1])

    def compact(self) -> None:
        """Final: no span will need the timeline again; keep only the figures."""
        self.standalone = self.standalone_j()
        self.times, self.prompt, self.decode = [], [], []
        self.progress = None

    @property
    def final(self) -> bool:
        return not self.lost and self.closed_at is not None and self.settled_until >= self.closed_at


class WindowNames:
    """Window ids: a keyed hash (BLAKE2b, 128 bits, a random key per namer) of
    a count, so they cannot be guessed from one another."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)
        self._count = 0

    def next(self) -> str:
        self._count += 1
        return hashlib.blake2b(self._count.to_bytes(8, "little"), key=self._key,
                               digest_size=16).hexdigest()


def span_tokens(w: Window, a: float, b: float) -> tuple[float, float, float]:
    """(prompt tokens, answer tokens) processed in [a, b], and the prompt by b.
    A span before the timeline's first point or after its last, the usual
    case for most of the windows a counter step scans, is answered without
    interpolating (the same values)."""
    ts = w.times
    if not ts or b <= ts[0]:
        return 0.0, 0.0, 0.0
    if a >= ts[-1]:
        return 0.0, 0.0, w.prompt[-1]
    pa, da = w.tokens_at(a)
    pb, db = w.tokens_at(b)
    dp, dd = pb - pa, db - da  # max(0.0, x) without the call: the same value, NaN too
    return dp if dp > 0.0 else 0.0, dd if dd > 0.0 else 0.0, pb


def covered_s(wins: list[Window], a: float, b: float) -> float:
    """Seconds of [a, b] that at least one of the windows covers."""
    spans = sorted((max(a, w.opened_at), b if w.closed_at is None else min(b, w.closed_at))
                   for w in wins)
    total, end = 0.0, a
    for start, stop in spans:
        start = max(start, end)
        if stop > start:
            total += stop - start
            end = stop
    return total
