"""The sampler thread survives reader errors and keeps a bounded ring."""

from __future__ import annotations

import time

from telemetry.ledger import Ledger
from telemetry.sampler import Sampler
from tests.telemetry.fakes import SteppingCounter


def test_sampler_survives_reader_errors_and_recovers() -> None:
    counter = SteppingCounter(lambda t: 150.0, time.monotonic, step_s=0.02)
    ledger = Ledger("nvml", idle_power_w=100.0)
    sampler = Sampler(counter, ledger, hz=100, ring=16)
    counter._next_step = time.monotonic()  # start stepping now
    counter._t = time.monotonic()
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
