"""One sampling thread per device, off the event loop.

It reads the device's counter at `hz` (10-20 Hz sees every ~100 ms NVML step),
keeps a bounded ring of (time, counter, power) samples, feeds the ledger, and
survives reader errors: a failing counter never fails a request, it shows up
as `errors` and as requests whose figure stays provisional.

While at most QUIET_OPEN requests run on the device and the interpreter is
free (the thread wakes on time), it reads at `quiet_hz` instead: each
counter step then settles the few requests answered since the last one, a
short hold of the interpreter rather than one that stalls the request in
flight for milliseconds. Under load (many requests running, or an event
loop that keeps the interpreter busy) each extra step costs the requests
CPU, so it reads at `hz`. With `defer_settling` (a gateway metering in its
own process) a quiet step is settled by the event loop as the next request
ends, after its response is out, instead of on this thread while a request
runs (or with the next step, when no request ended since).

Reading faster pays only where reads are cheap: the quiet rate is held to
reads that take at most QUIET_READ_SHARE of the time. An NVML energy read
takes ~4 ms of CPU (../shared/bench: H200), so on a GPU the quiet rate comes
to `hz`: 100 reads a second there would cost ~40% of a core, and settle no
fewer requests per step (the counter changes every ~100 ms). The CPU
estimate and RAPL (microseconds a read) keep it; a cheap read of a counter
that has not moved costs nothing but the read.

A counter whose reads are that dear is read on its own beat instead of the
timer (telemetry/cadence.py): one read just after each step it expects and
one more before it every few beats, ~12 reads a second against NVML's
100 ms steps rather than 20, each change seen milliseconds after it happened
rather than up to a period late. Such a counter's changes reach the ledger
dated at their steps (the cadence's estimate), not at the reads that found
them: the counter's value is the energy up to its step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from telemetry.cadence import PROBE_EVERY, Cadence
from telemetry.ledger import Ledger
from telemetry.reader import EnergyReader, ReaderError

log = logging.getLogger("joulegate.sampler")


@dataclass(frozen=True)
class Sample:
    t: float  # when the counter reached this value (a dear counter's step, estimated)
    counter_j: float
    power_w: float | None
    read_t: float  # when the read that found it ended


QUIET_OPEN = 4  # requests running on the device, at most, to read at quiet_hz
BUSY_LATE_S = 0.001  # woken this late on average: the interpreter is busy
LATE_WEIGHT = 0.2  # of the newest wake in that average
QUIET_READ_SHARE = 0.02  # of the time spent reading, at most, at the quiet rate
READ_WEIGHT = 0.1  # of the newest read's time in its average


class Sampler:
    def __init__(
        self, reader: EnergyReader, ledger: Ledger, hz: float = 20.0, ring: int = 4096,
        quiet_hz: float | None = None, on_beat: bool = True, defer_settling: bool = False,
    ) -> None:
        self.reader = reader
        self.ledger = ledger
        self._period_s = 1.0 / hz
        self._quiet_period_s = 1.0 / max(hz, quiet_hz or hz)
        self._late_s = 0.0  # how late the thread wakes, averaged
        self._read_s = 0.0  # how long a read takes, averaged
        self.samples: deque[Sample] = deque(maxlen=ring)
        self.errors = 0
        self.reads = 0
        self.read_seconds = 0.0
        self._on_beat = on_beat  # False: the timer always (a benchmark's baseline)
        # While quiet, a counter step's settling is left to the event loop, as a
        # request ends (Ledger.settle_deferred): not on this thread in the middle
        # of the request in flight, holding the interpreter it needs.
        self._defer = defer_settling
        # read on the beat only where that costs no more reads than the timer
        self.cadence = Cadence(min_beat_s=self._period_s * (1 + 1 / PROBE_EVERY))
        self._last_counter_j: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample_once(self) -> Sample | None:
        start = time.monotonic()
        try:
            r = self.reader.read()
        except ReaderError as exc:
            self.errors += 1
            if self.errors in (1, 10, 100) or self.errors % 1000 == 0:
                log.warning("%s reader failed (%d so far): %s", self.reader.name, self.errors, exc)
            return None
        finally:
            end = time.monotonic()
            took = end - start
            # the first read sets the average: a slow counter is never read fast
            self._read_s += (READ_WEIGHT if self.reads else 1.0) * (took - self._read_s)
            self.read_seconds += took
            self.reads += 1
        reached = end  # a cheap counter's value is the read's
        if self.slow():
            changed = self._last_counter_j is not None and r.counter_j != self._last_counter_j
            reached = self.cadence.observe(start, end, changed)
        self._last_counter_j = r.counter_j
        now = self.ledger.clock()
        s = Sample(now - (end - reached), r.counter_j, r.power_w, now)
        self.samples.append(s)
        self.ledger.ingest(s.t, s.counter_j, s.power_w, now=now,
                           defer=self._defer and self.quiet())
        return s

    def quiet_period_s(self) -> float:
        """The period while quiet: `quiet_hz`'s, no shorter than reads that
        take QUIET_READ_SHARE of the time allow, never longer than `hz`'s."""
        return min(self._period_s, max(self._quiet_period_s, self._read_s / QUIET_READ_SHARE))

    def slow(self) -> bool:
        """Whether reads cost too much to read faster than `hz` (NVML): then the
        counter's beat, not the timer, says when (telemetry/cadence.py)."""
        return self._on_beat and self._read_s > QUIET_READ_SHARE * self._period_s

    def quiet(self) -> bool:
        """Whether to read at `quiet_hz` next: few requests run on the device and
        the interpreter has been free (this thread woke on time)."""
        return self._late_s < BUSY_LATE_S and self.ledger.open_windows <= QUIET_OPEN

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            # How late this thread woke: mostly the wait for the interpreter, which
            # a busy event loop holds (up to the 5 ms switch interval at a time).
            late = max(0.0, time.monotonic() - next_t)
            self._late_s += LATE_WEIGHT * (late - self._late_s)
            quiet = read = False
            try:
                read = self.sample_once() is not None
                quiet = self.quiet()
            except Exception:  # never let the thread die; the ledger must keep going
                self.errors += 1
                log.exception("sampler error")
            next_t += self.quiet_period_s() if quiet else self._period_s
            if self.slow() and read:  # a failing counter is retried on the timer
                next_t = self.cadence.next_read(time.monotonic(), next_t)
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind (slow reads): skip, don't burst
                next_t = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="joulegate-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.reader.close()
