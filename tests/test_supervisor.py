"""`make run`'s supervisor restarts a child that exits, with backoff."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from workers.local import Supervised


def test_exited_child_is_restarted_with_backoff(tmp_path: Path) -> None:
    marker = tmp_path / "starts"
    code = f"open({str(marker)!r}, 'a').write('x'); raise SystemExit(3)"
    child = Supervised("flaky", [sys.executable, "-c", code], tmp_path / "flaky.log")
    child.start()
    deadline = time.monotonic() + 10
    while child.restarts < 2 and time.monotonic() < deadline:
        child.tend(time.monotonic())
        time.sleep(0.05)
    assert child.restarts == 2
    assert child.proc is not None
    child.proc.wait(timeout=5)  # the third start has run (and written) by then
    assert marker.read_text() == "xxx"
    assert child.backoff_s == 4.0  # 1 s, then 2 s, doubling
