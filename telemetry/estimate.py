"""Estimated energy where no counter exists: configured watts x CPU utilisation.

It integrates idle_w + (max_w - idle_w) x utilisation over time into a
counter, so the sampler and ledger treat it exactly like a real one. Figures
from it are labelled `estimate` and are only as good as the two watt values.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from telemetry.kernelfile import KernelFile
from telemetry.reader import ReaderError, Reading

PROC_STAT = Path("/proc/stat")
HEAD_BYTES = 1024  # /proc/stat's first line: "cpu" and ten counters, ~250 bytes at most


def busy_total(head: bytes) -> tuple[float, float]:
    """(busy, total) CPU jiffies from the first line of /proc/stat's text;
    ValueError when it is not there."""
    line, newline, _ = head.partition(b"\n")
    fields = line.split()
    if not newline or len(fields) < 6 or fields[0] != b"cpu":
        raise ValueError(f"no cpu line in {head[:80]!r}")
    counts = [float(x) for x in fields[1:9]]
    idle = counts[3] + counts[4]
    total = sum(counts)
    return total - idle, total


class ProcStat:
    """The machine's (busy, total) CPU jiffies now, from /proc/stat kept open
    (telemetry.kernelfile); ReaderError when it cannot be read."""

    def __init__(self, path: Path = PROC_STAT) -> None:
        self._file = KernelFile(path, HEAD_BYTES)

    def __call__(self) -> tuple[float, float]:
        try:
            return busy_total(self._file.head())
        except (OSError, ValueError) as exc:
            raise ReaderError(f"{self._file.path}: {exc}") from exc

    def close(self) -> None:
        self._file.close()


def proc_stat_busy(path: Path = PROC_STAT) -> tuple[float, float]:
    """(busy, total) CPU jiffies, read once (the file is not kept open)."""
    stat = ProcStat(path)
    try:
        return stat()
    finally:
        stat.close()


class EstimateReader:
    source = "estimate"

    def __init__(
        self,
        idle_power_w: float,
        max_power_w: float,
        busy: Callable[[], tuple[float, float]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = "estimate-cpu"
        self._idle_w = idle_power_w
        self._span_w = max(0.0, max_power_w - idle_power_w)
        self._stat: ProcStat | None = None  # ours to close
        if busy is None:
            busy = self._stat = ProcStat()
        self._busy = busy
        self._clock = clock
        self._last_t = clock()
        self._last_busy, self._last_total = self._busy()
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
        if self._stat is not None:
            self._stat.close()
