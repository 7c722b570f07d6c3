"""The host's watts per busy CPU core: what joulegate's own CPU time costs.

Where the host's RAPL counters are readable (every CPU package), the figure
is measured: the packages' power is regressed on the number of busy cores,
over windows of at least `window_s` (least squares on exponentially decayed
sums, half-life `half_life_s`), and the slope is the marginal watts of one
more busy core: what running the gateway adds, the packages' idle power
excluded. Until the load has varied enough to tell that slope from noise
(busy cores spread by MIN_SPREAD_CORES, a standard deviation), and wherever
RAPL is unreadable (most VMs and containers: `energy_uj` has been readable
by root only since 2020's PLATYPUS fix), the configured figure is used,
labelled `estimate`.

    P = idle + slope x busy_cores   (per window: joules / s vs core-seconds / s)
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from telemetry.estimate import proc_stat_busy
from telemetry.rapl import POWERCAP, RaplReader
from telemetry.reader import EnergyReader, ReaderError

MIN_SPREAD_CORES = 0.25  # busy cores' standard deviation before a slope is believed
SLOPE_BOUNDS_W = (0.1, 200.0)  # a busy core's watts outside these: a bad fit, not kept


def busy_core_seconds(path: Path = Path("/proc/stat")) -> float:
    """CPU seconds every core of the machine has spent busy since boot."""
    busy, _ = proc_stat_busy(path)
    return busy / os.sysconf("SC_CLK_TCK")


def host_packages(root: Path = POWERCAP) -> list[EnergyReader]:
    """A reader for each of the host's CPU packages, or none when any one of
    them cannot be read (a partial sum would understate the power)."""
    readers: list[EnergyReader] = []
    for zone in sorted(root.glob("intel-rapl:*")):
        parts = zone.name.split(":")
        if len(parts) != 2 or not parts[1].isdigit():
            continue  # a sub-zone (intel-rapl:0:0, the cores of package 0)
        try:
            readers.append(RaplReader(int(parts[1]), root))
        except ReaderError:
            for reader in readers:
                reader.close()
            return []
    return readers


class CoreWatts:
    """Watts per busy core, measured from RAPL where it can be (see above).
    `rate()` is cheap: it reads the counters at most once per `window_s`."""

    def __init__(self, configured_w: float, packages: Sequence[EnergyReader] = (),
                 busy_s: Callable[[], float] = busy_core_seconds,
                 clock: Callable[[], float] = time.monotonic,
                 window_s: float = 1.0, half_life_s: float = 300.0) -> None:
        self._packages = list(packages)
        self._busy_s = busy_s
        self._clock = clock
        self._window_s = window_s
        self._half_life_s = half_life_s
        self._current = (configured_w, "estimate")
        self._last: tuple[float, float, float] | None = None  # (t, joules, busy seconds)
        # decayed sums over windows: weight, x, y, xx, xy (x busy cores, y watts)
        self._sums = [0.0] * 5
        if self._packages:
            self._last = self._read()

    @property
    def measured(self) -> bool:
        """Whether the host's packages are read (RAPL) at all."""
        return bool(self._packages)

    def rate(self) -> tuple[float, str]:
        """(watts per busy core, source): `rapl` once measured, else `estimate`."""
        if self._last is None or self._clock() - self._last[0] < self._window_s:
            return self._current
        now = self._read()
        if now is None:
            return self._current
        (t0, e0, b0), (t1, e1, b1) = self._last, now
        self._last = now
        dt, de, db = t1 - t0, e1 - e0, b1 - b0
        if dt <= 0 or de < 0 or db < 0:  # a counter reset: that window is lost
            return self._current
        self._add(db / dt, de / dt, dt)
        slope = self._slope()
        if slope is not None:
            self._current = (slope, "rapl")
        return self._current

    def _read(self) -> tuple[float, float, float] | None:
        try:
            joules = sum(p.read().counter_j for p in self._packages)
            return self._clock(), joules, self._busy_s()
        except (ReaderError, OSError, ValueError):
            return None

    def _add(self, x: float, y: float, dt: float) -> None:
        decay = 0.5 ** (dt / self._half_life_s)
        s = self._sums
        for i, v in enumerate((1.0, x, y, x * x, x * y)):
            s[i] = s[i] * decay + v

    def _slope(self) -> float | None:
        n, sx, sy, sxx, sxy = self._sums
        if n < 3:
            return None
        var = sxx / n - (sx / n) ** 2
        if var <= 0 or math.sqrt(var) < MIN_SPREAD_CORES:
            return None
        slope = (sxy / n - (sx / n) * (sy / n)) / var
        lo, hi = SLOPE_BOUNDS_W
        return slope if lo <= slope <= hi else None
