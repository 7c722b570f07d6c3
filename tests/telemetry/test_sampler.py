"""The sampler thread survives reader errors, keeps a bounded ring, and
reads faster while the device and the interpreter are quiet."""

from __future__ import annotations

import itertools
import statistics
import threading
import time

from telemetry.devices import wait_for_readings
from telemetry.ledger import Ledger
from telemetry.sampler import QUIET_OPEN, Sampler
from tests.telemetry.fakes import SteppingCounter


def test_sampler_survives_reader_errors_and_recovers() -> None:
    counter = SteppingCounter(lambda t: 150.0, time.monotonic, step_s=0.02,
                              start_t=time.monotonic())  # start stepping now
    ledger = Ledger("nvml", idle_power_w=100.0)
    sampler = Sampler(counter, ledger, hz=100, ring=16)
    sampler.start()
    try:
        time.sleep(0.3)
        counter.fail = True
        time.sleep(0.2)
        errors = sampler.errors
        counter.fail = False
        time.sleep(0.3)
    finally:
        sampler.stop()
    assert errors > 5
    assert len(sampler.samples) == 16  # bounded
    assert ledger.totals().measured_j > 0
    assert sampler.samples[-1].t > time.monotonic() - 0.2  # still sampling after errors


def _reads_per_s(sampler: Sampler, seconds: float) -> float:
    before = sampler.reads
    time.sleep(seconds)
    return (sampler.reads - before) / seconds


def test_reads_fast_while_quiet_and_slow_with_many_requests_running() -> None:
    counter = SteppingCounter(lambda t: 150.0, time.monotonic, step_s=0.02,
                              start_t=time.monotonic())
    ledger = Ledger("nvml", idle_power_w=100.0)
    sampler = Sampler(counter, ledger, hz=10, quiet_hz=100)
    sampler.start()
    try:
        time.sleep(0.1)
        # the best of three: this VM stalls threads now and then, which reads
        # as a busy interpreter and slows the sampler for a moment (by design)
        quiet = max(_reads_per_s(sampler, 0.3) for _ in range(3))
        windows = [ledger.open() for _ in range(QUIET_OPEN + 1)]
        time.sleep(0.15)
        busy = _reads_per_s(sampler, 0.6)
        for w in windows:
            ledger.abandon(w)
        time.sleep(0.15)
        again = max(_reads_per_s(sampler, 0.3) for _ in range(3))
    finally:
        sampler.stop()
    assert quiet > 50 and again > 50  # ~100 a second
    assert busy < 20  # ~10 a second


def test_reads_slowly_while_the_interpreter_is_held() -> None:
    """A thread that keeps the interpreter (as a loaded event loop does) makes
    the sampler wake late: it falls back to `hz`, few requests running or not."""
    counter = SteppingCounter(lambda t: 150.0, time.monotonic, step_s=0.02,
                              start_t=time.monotonic())
    sampler = Sampler(counter, Ledger("nvml", idle_power_w=100.0), hz=10, quiet_hz=100)
    stop = threading.Event()

    def spin() -> None:  # pure Python: gives the interpreter up only when made to
        x = 0
        while not stop.is_set():
            x += 1

    spinner = threading.Thread(target=spin)
    sampler.start()
    try:
        time.sleep(0.1)
        spinner.start()
        time.sleep(0.3)
        assert not sampler.quiet()
    finally:
        stop.set()
        spinner.join()
        sampler.stop()


def test_quiet_rate_held_to_cheap_reads() -> None:
    """Reading at the quiet rate pays only where a read is cheap: reads of
    ~3 ms (an NVML energy read takes ~4) keep the sampler at `hz`, few
    requests running or not."""
    counter = SteppingCounter(lambda t: 150.0, time.monotonic, step_s=0.005, read_s=0.003,
                              start_t=time.monotonic())
    sampler = Sampler(counter, Ledger("nvml", idle_power_w=100.0), hz=10, quiet_hz=100)
    sampler.start()
    try:
        time.sleep(0.3)
        assert sampler.quiet()
        rate = _reads_per_s(sampler, 1.0)
    finally:
        sampler.stop()
    assert rate < 15  # hz: 10 a second (was ~100)
    first = Sampler(counter, Ledger("nvml", idle_power_w=100.0), hz=10, quiet_hz=100)
    first.sample_once()
    assert first.quiet_period_s() == 0.1  # from the first read on, not after a few fast ones


def test_a_dear_counter_is_read_on_its_beat() -> None:
    """Reads of ~3 ms against a counter that steps every 100 ms: the sampler
    learns the beat (telemetry/cadence.py) and reads about once a step, each
    change seen a few milliseconds after it, where its 20 Hz timer would read
    20 times a second and see a change 0-50 ms late; and dated at its step."""
    t0 = time.monotonic() + 0.037
    counter = SteppingCounter(lambda t: 150.0, time.monotonic, step_s=0.1, read_s=0.003,
                              start_t=t0)
    sampler = Sampler(counter, Ledger("nvml", idle_power_w=100.0), hz=20, quiet_hz=100)
    sampler.start()
    try:
        time.sleep(1.5)
        before = len(sampler.samples)
        rate = _reads_per_s(sampler, 2.0)
    finally:
        sampler.stop()
    assert sampler.cadence.state == "locked"
    assert sampler.cadence.beat_s is not None and abs(sampler.cadence.beat_s - 0.1) < 0.005
    assert rate < 16
    samples = list(sampler.samples)[before - 1:]
    changes = [b for a, b in itertools.pairwise(samples) if b.counter_j != a.counter_j]
    lags = [b.read_t - (t0 + (b.read_t - t0) // 0.1 * 0.1) for b in changes]
    assert len(lags) >= 15
    assert statistics.median(lags) < 0.02
    # each change dated at its step (the span ends the ledger splits by), not at the read
    errors = [abs(b.t - (t0 + round((b.t - t0) / 0.1) * 0.1)) for b in changes]
    assert statistics.median(errors) < 0.006


def _stepping_now(first_read_s: float = 0.0) -> SteppingCounter:
    return SteppingCounter(lambda t: 150.0, time.monotonic, step_s=0.02,
                           first_read_s=first_read_s, start_t=time.monotonic())


def test_waits_for_each_counters_first_reading_and_names_those_without() -> None:
    slow = Sampler(_stepping_now(0.3), Ledger("nvml"), hz=50)
    broken_counter = _stepping_now()
    broken_counter.fail = True
    broken = Sampler(broken_counter, Ledger("nvml"), hz=50)
    for s in (slow, broken):
        s.start()
    try:
        began = time.monotonic()
        assert wait_for_readings([slow], timeout_s=5) == []
        assert 0.25 <= time.monotonic() - began < 3
        assert slow.ledger.last_counter_j is not None
        began = time.monotonic()
        assert wait_for_readings([slow, broken], timeout_s=0.2) == [broken_counter.name]
        assert 0.2 <= time.monotonic() - began < 1
    finally:
        for s in (slow, broken):
            s.stop()
