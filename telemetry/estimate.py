"""Estimated energy where no counter exists: configured watts x CPU utilisation.

It integrates idle_w + (max_w - idle_w) x utilisation over time into a
counter, so the sampler and ledger treat it exactly like a real one. Figures
from it are labelled `estimate` and are only as good as the two watt values.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from telemetry.reader import ReaderError, Reading


def proc_stat_busy(path: Path = Path("/proc/stat")) -> tuple[float, float]:
    """(busy, total) CPU jiffies from the first line of /proc/stat."""
    try:
        fields = [float(x) for x in path.read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError) as exc:
        raise ReaderError(f"{path}: {exc}") from exc
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    total = sum(fields[:8])
    return total - idle, total


class EstimateReader:
    source = "estimate"

    def __init__(
        self,
        idle_power_w: float,
        max_power_w: float,
        busy: Callable[[], tuple[float, float]] = proc_stat_busy,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = "estimate-cpu"
        self._idle_w = idle_power_w
        self._span_w = max(0.0, max_power_w - idle_power_w)
        self._busy = busy
        self._clock = clock
        self._last_t = clock()
        self._last_busy, self._last_total = busy()
        self._energy_j = 0.0
        self._power_w = idle_power_w

    def read(self) -> Reading:
        now = self._clock()
        b, t = self._busy()
        dt = now - self._last_t
        dtotal = t - self._last_total
        util = (b - self._last_busy) / dtotal if dtotal > 0 else 0.0
        util = min(1.0, max(0.0, util))
        if dt > 0 and dtotal > 0:
            self._power_w = self._idle_w + self._span_w * util
            self._energy_j += self._power_w * dt
            self._last_t, self._last_busy, self._last_total = now, b, t
        return Reading(counter_j=self._energy_j, power_w=self._power_w)

    def close(self) -> None:
        return None
