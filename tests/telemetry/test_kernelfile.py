"""Counter files kept open and read again from their start: /proc/stat for the
CPU estimate, sysfs energy_uj for RAPL."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from telemetry.estimate import EstimateReader, ProcStat, busy_total, proc_stat_busy
from telemetry.kernelfile import KernelFile
from telemetry.rapl import RaplReader
from telemetry.reader import ReaderError


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_each_read_sees_the_file_as_it_is_now(tmp_path: Path) -> None:
    f = tmp_path / "energy_uj"
    f.write_text("100\n")
    k = KernelFile(f, 64)
    assert k.head() == b"100\n"
    f.write_text("250000\n")  # rewritten in place, as the kernel's files are
    assert k.head() == b"250000\n"
    k.close()
    k.close()  # twice: nothing


def test_a_failed_read_opens_the_file_again(tmp_path: Path) -> None:
    f = tmp_path / "energy_uj"
    f.mkdir()  # opens, but cannot be read (EISDIR): the descriptor goes
    k = KernelFile(f, 64)
    before = _open_fds()
    with pytest.raises(OSError):
        k.head()
    assert _open_fds() == before
    f.rmdir()
    f.write_text("8\n")
    assert k.head() == b"8\n"  # the file now there, opened afresh
    k.close()


def test_proc_stat_first_line() -> None:
    head = b"cpu  300 0 100 1000 50 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1 2 3\n"
    assert busy_total(head) == (400.0, 1450.0)  # idle and iowait are not busy
    with pytest.raises(ValueError):
        busy_total(b"cpu  300 0 100")  # cut before its end
    with pytest.raises(ValueError):
        busy_total(b"intr 1 2 3\n")


def test_the_real_proc_stat_moves_and_leaks_no_descriptor() -> None:
    before = _open_fds()
    stat = ProcStat()
    busy0, total0 = stat()
    sum(i * i for i in range(300_000))  # some busy time
    busy1, total1 = stat()
    assert 0 <= busy0 <= total0 and total1 >= total0 and busy1 >= busy0
    assert _open_fds() == before + 1  # one descriptor, kept
    stat.close()
    assert _open_fds() == before
    assert proc_stat_busy()[1] > 0
    assert _open_fds() == before
    r = EstimateReader(10.0, 50.0)
    assert r.read().counter_j >= 0.0
    r.close()
    assert _open_fds() == before


def test_an_unreadable_stat_is_a_reader_error(tmp_path: Path) -> None:
    with pytest.raises(ReaderError):
        ProcStat(tmp_path / "absent")()
    bad = tmp_path / "stat"
    bad.write_text("nothing here\n")
    with pytest.raises(ReaderError):
        ProcStat(bad)()


def test_rapl_reader_keeps_one_descriptor(tmp_path: Path) -> None:
    d = tmp_path / "intel-rapl:0"
    d.mkdir()
    (d / "max_energy_range_uj").write_text("1000000\n")
    (d / "energy_uj").write_text("5\n")
    before = _open_fds()
    r = RaplReader(0, tmp_path)
    for _ in range(3):
        r.read()
    assert _open_fds() == before + 1
    r.close()
    assert _open_fds() == before
