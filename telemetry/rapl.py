"""RAPL energy reader (Intel/AMD CPU packages via /sys/class/powercap), wrap-aware.

The raw `energy_uj` counter wraps at `max_energy_range_uj`; this reader
unwraps it into a monotonic counter in joules.
"""

from __future__ import annotations

from pathlib import Path

from telemetry.kernelfile import KernelFile
from telemetry.reader import ReaderError, Reading

POWERCAP = Path("/sys/class/powercap")


class RaplReader:
    source = "rapl"

    def __init__(self, package: int, root: Path = POWERCAP) -> None:
        self._dir = root / f"intel-rapl:{package}"
        self.name = f"cpu-package-{package}"
        try:
            self._range_uj = int((self._dir / "max_energy_range_uj").read_text())
        except (OSError, ValueError) as exc:
            raise ReaderError(f"RAPL {self._dir}: {exc}") from exc
        # kept open and read again from its start (telemetry.kernelfile)
        self._energy = KernelFile(self._dir / "energy_uj", 64)
        try:
            self._last_uj = int(self._energy.head())
        except (OSError, ValueError) as exc:
            self._energy.close()
            raise ReaderError(f"RAPL {self._dir}: {exc}") from exc
        self._wraps = 0

    def read(self) -> Reading:
        try:
            uj = int(self._energy.head())
        except (OSError, ValueError) as exc:
            raise ReaderError(f"RAPL read: {exc}") from exc
        if uj < self._last_uj:
            self._wraps += 1
        self._last_uj = uj
        return Reading(counter_j=(self._wraps * self._range_uj + uj) / 1e6, power_w=None)

    def close(self) -> None:
        self._energy.close()


def rapl_available(package: int, root: Path = POWERCAP) -> bool:
    try:
        RaplReader(package, root).close()
    except ReaderError:
        return False
    return True
