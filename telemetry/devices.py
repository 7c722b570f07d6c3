"""Choosing an energy source for a device and running its sampler and ledger."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from telemetry.estimate import EstimateReader
from telemetry.ledger import Ledger
from telemetry.metrics import DeviceView
from telemetry.nvml import NvmlReader
from telemetry.rapl import RaplReader
from telemetry.reader import EnergyReader, ReaderError
from telemetry.sampler import Sampler

log = logging.getLogger("joulegate")
FIRST_READING_S = 5.0  # the longest start-up waits for each energy counter's first reading


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    host: str
    source: str  # auto | nvml | rapl | estimate
    index: int
    idle_power_w: float | None
    estimate_max_power_w: float
    estimate_idle_power_w: float


def make_reader(spec: DeviceSpec) -> EnergyReader:
    """The named source, or for `auto` the best that works: nvml, rapl, estimate."""
    order = ["nvml", "rapl", "estimate"] if spec.source == "auto" else [spec.source]
    errors = []
    for source in order:
        try:
            if source == "nvml":
                return NvmlReader(spec.index)
            if source == "rapl":
                return RaplReader(spec.index)
            return EstimateReader(spec.estimate_idle_power_w, spec.estimate_max_power_w)
        except ReaderError as exc:
            errors.append(f"{source}: {exc}")
    raise ReaderError(f"device {spec.name}: no energy source works ({'; '.join(errors)})")


@dataclass
class MeteredDevice:
    spec: DeviceSpec
    reader: EnergyReader
    ledger: Ledger

    def view(self) -> DeviceView:
        return DeviceView(self.spec.name, self.spec.host, self.reader.source, self.ledger.totals)


def start_samplers(devices: Iterable[MeteredDevice], hz: float,
                   quiet_hz: float | None = None, defer_settling: bool = False
                   ) -> list[Sampler]:
    """One running sampler thread per device, feeding its ledger (at `quiet_hz`
    while few requests run on it, its steps then settled by the caller's event
    loop with `defer_settling`: telemetry/sampler.py)."""
    samplers = [Sampler(d.reader, d.ledger, hz, quiet_hz=quiet_hz,
                        defer_settling=defer_settling) for d in devices]
    for s in samplers:
        s.start()
    return samplers


def wait_for_readings(samplers: Iterable[Sampler], timeout_s: float = FIRST_READING_S,
                      poll_s: float = 0.005) -> list[str]:
    """Wait, up to `timeout_s`, until each sampler's ledger holds a reading of
    its counter: a request answered before its device's first reading
    overlaps no span of the counter and would keep 0 J. The readers still
    without one, each logged (a failing counter: requests get its figures
    once it reads)."""
    samplers = list(samplers)
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [s.reader.name for s in samplers if s.ledger.last_counter_j is None]
        if not missing or time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    for name in missing:
        log.warning("energy counter %s has not been read in %.1f s: requests answered "
                    "before its first reading get 0 J", name, timeout_s)
    return missing


def metered_device(spec: DeviceSpec, prefill_weight: float) -> MeteredDevice:
    reader = make_reader(spec)
    # An estimate's idle is whatever was configured; real counters learn theirs.
    idle = spec.estimate_idle_power_w if reader.source == "estimate" else spec.idle_power_w
    ledger = Ledger(reader.source, prefill_weight=prefill_weight, idle_power_w=idle)
    return MeteredDevice(spec, reader, ledger)
