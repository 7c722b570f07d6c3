"""RAPL wrap-around, the estimate source and source selection."""

from __future__ import annotations

from pathlib import Path

import pytest

from telemetry.devices import DeviceSpec, make_reader
from telemetry.estimate import EstimateReader
from telemetry.rapl import RaplReader
from telemetry.reader import ReaderError


def test_rapl_unwraps_the_counter(tmp_path: Path) -> None:
    d = tmp_path / "intel-rapl:0"
    d.mkdir()
    (d / "max_energy_range_uj").write_text("1000000\n")
    (d / "energy_uj").write_text("900000\n")
    r = RaplReader(0, tmp_path)
    assert r.read().counter_j == pytest.approx(0.9)
    (d / "energy_uj").write_text("100000\n")  # wrapped past 1 J
    assert r.read().counter_j == pytest.approx(1.1)
    (d / "energy_uj").write_text("600000\n")
    assert r.read().counter_j == pytest.approx(1.6)


def test_rapl_missing_is_a_reader_error(tmp_path: Path) -> None:
    with pytest.raises(ReaderError):
        RaplReader(0, tmp_path)


def test_estimate_integrates_watts_times_utilisation() -> None:
    t = [0.0]
    busy = [(0.0, 0.0)]
    r = EstimateReader(10.0, 50.0, busy=lambda: busy[0], clock=lambda: t[0])
    t[0], busy[0] = 1.0, (50.0, 100.0)  # 50% busy for 1 s -> 10 + 40 * 0.5 = 30 W
    reading = r.read()
    assert reading.counter_j == pytest.approx(30.0)
    assert reading.power_w == pytest.approx(30.0)
    t[0], busy[0] = 3.0, (50.0, 200.0)  # idle for 2 s -> 20 J
    assert r.read().counter_j == pytest.approx(50.0)


def test_auto_falls_back_to_estimate_without_counters() -> None:
    spec = DeviceSpec("cpu", "localhost", "estimate", 0, None, 40.0, 5.0)
    assert make_reader(spec).source == "estimate"


def test_named_source_that_does_not_work_fails_clearly() -> None:
    spec = DeviceSpec("gpu", "localhost", "nvml", 0, None, 40.0, 5.0)
    with pytest.raises(ReaderError, match="no energy source works"):
        make_reader(spec)
