"""The EnergyReader seam: one device's energy counter and power field.

Everything that measures energy goes through this protocol, so tests can put a
fake GPU counter here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class ReaderError(Exception):
    """A reading failed (driver gone, file unreadable); the sampler survives it."""


@dataclass(frozen=True)
class Reading:
    counter_j: float  # cumulative energy since some origin; may reset or wrap
    power_w: float | None  # instant power, for the live gauge only


class EnergyReader(Protocol):
    source: str  # "nvml", "rapl" or "estimate"
    name: str  # device name for labels, e.g. "NVIDIA H200"

    def read(self) -> Reading: ...

    def close(self) -> None: ...
