"""The usage journal: a process killed with kill -9 loses no answered row,
and none is written twice."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from app.tenancy.journal import UsageJournal
from app.tenancy.spend import SpendLedger
from tests.app.tenancy.test_spend import row
from workers.local import ROOT

# A gateway's part, then kill -9: rows 0-9 final and committed, 10-14 final
# and queued (the writer never wakes), 15-19 answered with the response's
# figure only.
DIES = textwrap.dedent("""
    import os, sys, time
    from dataclasses import replace
    from pathlib import Path
    from app.tenancy.spend import SpendLedger
    from tests.app.tenancy.test_spend import row
    ledger = SpendLedger(sys.argv[1], flush_s=0.05, journal=Path(sys.argv[2]))
    now = time.time()
    rows = [replace(row(now + i, 2.0), request_id=f"r{i}", energy_final=False)
            for i in range(20)]
    for r in rows:
        ledger.answered(r)
    for r in rows[:10]:
        ledger.record(replace(r, energy_net_j=1.0, energy_final=True))
    time.sleep(0.5)  # the writer commits them
    ledger._flush_s = 3600.0
    time.sleep(0.1)
    for r in rows[10:15]:
        ledger.record(replace(r, energy_net_j=1.0, energy_final=True))
    os.kill(os.getpid(), 9)
""")


def test_rows_of_a_killed_process_are_written_at_the_next_start(database: str,
                                                                   tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    proc = subprocess.run([sys.executable, "-c", DIES, database, str(journal)], cwd=ROOT,
                          capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()
    ledger = SpendLedger(database, journal=journal)  # a new gateway starts
    rows = {r["request_id"]: r for r in ledger.rows(None, 0.0)}
    assert sorted(rows, key=lambda i: int(i[1:])) == [f"r{i}" for i in range(20)]
    assert all(rows[f"r{i}"]["energy_net_j"] == 1.0 and rows[f"r{i}"]["energy_final"]
               for i in range(15))
    assert all(rows[f"r{i}"]["energy_net_j"] == 2.0 and rows[f"r{i}"]["energy_final"] is False
               for i in range(15, 20))  # the figure their responses carried
    ledger.close()
    assert list(journal.glob("*.jsonl")) == []
    again = SpendLedger(database, journal=journal)
    assert len(again.rows(None, 0.0)) == 20  # nothing twice
    again.close()


def test_a_row_committed_just_before_the_kill_is_not_written_twice(database: str,
                                                                  tmp_path: Path) -> None:
    """The database has the row; the journal's commit line never came."""
    from dataclasses import replace

    journal_dir = tmp_path / "journal"
    first = SpendLedger(database, flush_s=3600.0)
    r = replace(row(time.time(), 1.0), request_id="only", energy_final=True)
    first.record(r)
    first.close()  # written
    journal = UsageJournal(journal_dir)
    journal.answered({"request_id": "only", "time": r.time, "energy_net_j": 1.0})
    import os
    os.close(journal._held)  # as a kill -9 would: the lock goes
    again = SpendLedger(database, journal=journal_dir)
    assert [x["request_id"] for x in again.rows(None, 0.0)] == ["only"]
    again.close()


def test_a_living_process_segments_are_left_alone_and_old_ones_go(tmp_path: Path) -> None:
    journal = UsageJournal(tmp_path, segment_bytes=200)
    for i in range(6):
        journal.answered({"request_id": f"r{i}", "pad": "x" * 80})
    assert len(list(tmp_path.glob("*.jsonl"))) >= 3  # rotated
    from app.tenancy.journal import recover
    assert recover(tmp_path, lambda ids: set(), lambda rows: None) == 0  # all held
    journal.committed(f"r{i}" for i in range(6))
    assert len(list(tmp_path.glob("*.jsonl"))) == 1  # only the current segment
    journal.close()
    assert list(tmp_path.glob("*")) == []


def test_segments_waiting_for_the_database_hold_no_descriptor(tmp_path: Path) -> None:
    """A long outage fills many segments with rows the ledger let go of: the
    process keeps one descriptor for its lock and a few for the latest
    segments, however many wait; lines for older segments still land in them."""
    import os

    from app.tenancy.journal import OPEN_OLD

    def descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    journal = UsageJournal(tmp_path, segment_bytes=200)
    before = descriptors()
    for i in range(200):
        journal.answered({"request_id": f"r{i}", "pad": "x" * 80})
    for i in range(190):  # final: what the ledger lets go of
        journal.final(f"r{i}", 1.0, 1.5, "estimate", True)
    journal.forget(f"r{i}" for i in range(190))
    assert len(list(tmp_path.glob("*.jsonl"))) >= 60
    assert descriptors() == before + OPEN_OLD
    assert journal._where["r190"].fd is None  # an older segment: opened for the line
    journal.final("r190", 1.0, 1.5, "estimate", True)
    assert b'{"f":"r190"' in journal._where["r190"].path.read_bytes()
    written = [r["request_id"] for part in journal.left_out(50) for r in part]
    assert sorted(written) == sorted(f"r{i}" for i in range(190))
    journal.committed(f"r{i}" for i in range(190, 200))
    assert len(list(tmp_path.glob("*.jsonl"))) == 1  # only the current segment
    assert descriptors() <= before + OPEN_OLD
    journal.close()
    assert list(tmp_path.glob("*")) == []


def test_an_older_versions_segments_and_a_dead_lock_are_recovered(tmp_path: Path) -> None:
    """Segments with no lock file (a version that locked each segment) are
    recovered when their own lock is free; a dead process's lock file with
    no segment left is cleared; a living process's are left alone."""
    import fcntl
    import os

    from app.tenancy.journal import recover

    (tmp_path / "usage-0123456789ab-1.jsonl").write_bytes(
        b'{"a":{"request_id":"old","time":1.0}}\n')
    held = tmp_path / "usage-aaaaaaaaaaaa-1.jsonl"
    held.write_bytes(b'{"a":{"request_id":"busy","time":1.0}}\n')
    fd = os.open(held, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # an older version's process, alive
    (tmp_path / "usage-bbbbbbbbbbbb.lock").write_bytes(b"")  # dead, nothing left
    living = UsageJournal(tmp_path)
    living.answered({"request_id": "mine", "time": 2.0})
    written: list[str] = []
    assert recover(tmp_path, lambda rows: set(),
                   lambda rows: written.extend(r["request_id"] for r in rows)) == 1
    assert written == ["old"]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "usage-0123456789ab-1.jsonl" not in names and "usage-bbbbbbbbbbbb.lock" not in names
    assert held.name in names and any(n.endswith(".lock") for n in names)
    os.close(fd)
    living.close()  # "mine" is pending: kept, with its lock file, for the next start
    assert recover(tmp_path, lambda rows: set(),
                   lambda rows: written.extend(r["request_id"] for r in rows)) == 2
    assert sorted(written) == ["busy", "mine", "old"]
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_is_said_once_and_rotation_waits_for_room(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes that fail (/dev/full: ENOSPC from the kernel) are logged when
    they start and when they stop, not once per request; a segment that
    cannot be started leaves the current one in use (it was listed as old
    again on every request, a list that grew without end)."""
    import os

    journal = UsageJournal(tmp_path, segment_bytes=200)
    good = journal._current.fd
    journal._current.fd = os.open("/dev/full", os.O_WRONLY)

    def no_room() -> object:
        raise OSError(28, "No space left on device")

    with caplog.at_level("WARNING", logger="joulegate.usage"):
        for i in range(50):
            journal.answered({"request_id": f"r{i}", "pad": "x" * 80})
        journal._current.size = 10_000  # full enough to rotate
        monkeypatch.setattr(journal, "_new_segment", no_room)
        for i in range(50, 60):
            journal.answered({"request_id": f"r{i}", "pad": "x" * 80})
        assert journal._old == []
        os.close(journal._current.fd)
        journal._current.fd = good  # room again
        monkeypatch.undo()
        journal.answered({"request_id": "r60", "pad": "x"})
    said = [r.getMessage() for r in caplog.records if r.name == "joulegate.usage"]
    assert len(said) == 2, said
    assert "No space left on device" in said[0] and "answers again" in said[1]
    journal.committed(f"r{i}" for i in range(61))
    journal.close()
