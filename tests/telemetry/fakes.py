"""A fake GPU at the EnergyReader seam: an energy counter that steps every 100 ms.

It integrates a power function exactly and publishes the total only at step
boundaries, like NVML on the H200 (../shared/bench/h200-nvml-steps.txt).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from telemetry.reader import ReaderError, Reading


class SteppingCounter:
    source = "nvml"
    name = "fake-gpu"

    def __init__(self, power_w: Callable[[float], float], clock: Callable[[], float],
                 step_s: float = 0.1, dt_s: float = 0.001, read_s: float = 0.0,
                 first_read_s: float = 0.0, start_t: float | None = None) -> None:
        self._power_w = power_w
        self._clock = clock
        self._step_s = step_s
        self._dt_s = dt_s
        self._read_s = read_s  # each read takes this long (NVML's take ~4 ms), 0: instant
        self._first_read_s = first_read_s  # the first read's extra time (a driver waking up)
        self._t = 0.0
        self._energy_j = 0.0
        self._published_j = 0.0
        self._next_step = step_s
        if start_t is not None:  # integrating from `start_t`, a step there (a real clock's now)
            self._t = self._next_step = start_t
        self.fail = False
        self.offset_j = 0.0

    def true_energy(self, a: float, b: float) -> float:
        n = max(1, round((b - a) / self._dt_s))
        h = (b - a) / n
        return sum(self._power_w(a + (i + 0.5) * h) * h for i in range(n))

    def _advance(self, now: float) -> None:
        while self._next_step <= now:
            self._energy_j += self.true_energy(self._t, self._next_step)
            self._t = self._next_step
            self._published_j = self._energy_j
            self._next_step += self._step_s

    def read(self) -> Reading:
        if self.fail:
            raise ReaderError("fake failure")
        if self._first_read_s:
            time.sleep(self._first_read_s)
            self._first_read_s = 0.0
        if self._read_s:
            time.sleep(self._read_s)
        now = self._clock()
        self._advance(now)
        return Reading(self._published_j + self.offset_j, self._power_w(now))

    def close(self) -> None:
        return None


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t
