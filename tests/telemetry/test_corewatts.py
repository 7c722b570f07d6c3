"""The host's watts per busy core: measured from RAPL counters (a fake powercap
tree read by the real RaplReader) against busy core-seconds, or configured."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from telemetry.corewatts import CoreWatts, busy_core_seconds, host_packages


class Host:
    """Packages' RAPL files and the machine's busy core-seconds, driven by a
    load: `run(seconds, busy_cores)` at `idle_w + w_per_core x busy_cores`."""

    def __init__(self, root: Path, packages: int = 2, idle_w: float = 30.0,
                 w_per_core: float = 12.0) -> None:
        self.root, self.t, self.busy_s = root, 0.0, 0.0
        self.idle_w, self.w_per_core = idle_w, w_per_core
        self.uj = [0] * packages
        for i in range(packages):
            zone = root / f"intel-rapl:{i}"
            zone.mkdir(parents=True)
            (zone / "max_energy_range_uj").write_text("262143328850\n")
            sub = root / f"intel-rapl:{i}:0"  # a sub-zone (the cores): not counted twice
            sub.mkdir()
            (sub / "energy_uj").write_text("0\n")
            (sub / "max_energy_range_uj").write_text("262143328850\n")
        self._write()

    def run(self, seconds: float, busy_cores: float) -> None:
        joules = (self.idle_w + self.w_per_core * busy_cores) * seconds
        for i in range(len(self.uj)):  # split between the packages
            self.uj[i] += int(joules / len(self.uj) * 1e6)
        self.t += seconds
        self.busy_s += busy_cores * seconds
        self._write()

    def _write(self) -> None:
        for i, uj in enumerate(self.uj):
            (self.root / f"intel-rapl:{i}" / "energy_uj").write_text(f"{uj}\n")

    def core_watts(self, configured_w: float = 10.0) -> CoreWatts:
        return CoreWatts(configured_w, host_packages(self.root), lambda: self.busy_s,
                         lambda: self.t)


def test_a_varying_load_measures_the_marginal_watts_of_a_busy_core(tmp_path: Path) -> None:
    host = Host(tmp_path, idle_w=30.0, w_per_core=12.0)
    cw = host.core_watts()
    assert cw.measured and cw.rate() == (10.0, "estimate")  # nothing measured yet
    for busy in (0.2, 1.5, 0.6, 2.0, 1.0, 0.3):
        host.run(2.0, busy)
        watts, source = cw.rate()
    assert source == "rapl"
    assert watts == pytest.approx(12.0, rel=0.01)  # the idle 30 W is not in it


def test_a_steady_load_keeps_the_configured_figure(tmp_path: Path) -> None:
    host = Host(tmp_path)
    cw = host.core_watts(configured_w=7.5)
    for _ in range(10):  # busy cores never vary: the slope cannot be told from idle
        host.run(2.0, 1.0)
        assert cw.rate() == (7.5, "estimate")


def test_windows_shorter_than_a_second_are_not_read(tmp_path: Path) -> None:
    host = Host(tmp_path)
    cw = host.core_watts()
    for busy in (0.1, 2.0, 0.1, 2.0, 0.1, 2.0):
        host.run(0.1, busy)  # the counters are read at most once a second
        cw.rate()
    assert cw.rate() == (10.0, "estimate")
    host.run(1.0, 0.5)
    assert cw.rate()[1] == "estimate"  # one window: not enough for a slope


def test_packages_are_all_read_or_none(tmp_path: Path) -> None:
    Host(tmp_path, packages=2)
    assert len(host_packages(tmp_path)) == 2  # not the sub-zones
    (tmp_path / "intel-rapl:1" / "energy_uj").unlink()  # root-only on most hosts
    assert host_packages(tmp_path) == []
    assert host_packages(tmp_path / "absent") == []
    cw = CoreWatts(10.0)
    assert not cw.measured and cw.rate() == (10.0, "estimate")


def test_busy_core_seconds_reads_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal, in jiffies
    stat.write_text("cpu  300 0 100 1000 50 0 0 0 0 0\ncpu0 1 2 3 4\n")
    assert busy_core_seconds(stat) == pytest.approx(400 / os.sysconf("SC_CLK_TCK"))
