"""NVML energy reader: the GPU's total-energy counter and instant power field.

The only module that imports pynvml. On the H200 both values step every
~100 ms and one call costs ~3-4 ms (../shared/bench); the counter is the truth
for energy, the power field only feeds the live gauge.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from telemetry.reader import ReaderError, Reading


class NvmlReader:
    source = "nvml"

    def __init__(self, index: int, power_every_s: float = 1.0) -> None:
        # Each NVML call costs ~4 ms of CPU in a VM; the power field only feeds a
        # gauge, so it is read once per `power_every_s`, the counter every time.
        self._power_every_s = power_every_s
        self._power_at = float("-inf")
        self._power_w: float | None = None
        try:
            import pynvml
        except ImportError as exc:
            raise ReaderError("pynvml (nvidia-ml-py) is not installed") from exc
        self._nvml: Any = pynvml
        try:
            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            raw_name = pynvml.nvmlDeviceGetName(self._handle)
            self.name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
            self.driver = str(pynvml.nvmlSystemGetDriverVersion())
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
        except pynvml.NVMLError as exc:
            raise ReaderError(f"NVML device {index}: {exc}") from exc

    def read(self) -> Reading:
        nv = self._nvml
        try:
            mj = nv.nvmlDeviceGetTotalEnergyConsumption(self._handle)
            now = time.monotonic()
            if now - self._power_at >= self._power_every_s:
                self._power_at = now
                fields = nv.nvmlDeviceGetFieldValues(
                    self._handle, [nv.NVML_FI_DEV_POWER_INSTANT])
                if fields and fields[0].nvmlReturn == nv.NVML_SUCCESS:
                    self._power_w = float(fields[0].value.uiVal) / 1000.0
        except nv.NVMLError as exc:
            raise ReaderError(f"NVML read: {exc}") from exc
        return Reading(counter_j=mj / 1000.0, power_w=self._power_w)

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def nvml_available(index: int) -> bool:
    try:
        NvmlReader(index).close()
    except ReaderError:
        return False
    return True
