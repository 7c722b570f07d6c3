"""The one process supervisor: restarts with backoff, stops for good on a
configuration error, stops children the last started first."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from app.processes import CONFIG_ERROR, Command, Supervisor


def _child(tmp_path: Path, name: str, code: str) -> Command:
    return Command(name, [sys.executable, "-c", code], tmp_path / f"{name}.log")


def test_an_exited_child_is_restarted_with_backoff(tmp_path: Path) -> None:
    marker = tmp_path / "starts"
    flaky = _child(tmp_path, "flaky", f"open({str(marker)!r}, 'a').write('x'); "
                                      "raise SystemExit(1)")
    said: list[str] = []
    sup = Supervisor([flaky], say=said.append)
    sup.start()
    deadline = time.monotonic() + 10
    def starts() -> int:
        return marker.read_text().count("x") if marker.exists() else 0

    while starts() < 3:
        assert time.monotonic() < deadline, said
        assert sup.tend() is None
        time.sleep(0.05)
    sup.stop_all()
    assert "flaky exited with 1; restarting in 0.5 s" in said
    assert "flaky exited with 1; restarting in 1 s" in said  # 0.5 s, then 1 s, doubling


def test_a_configuration_error_stops_everything_and_is_not_retried(tmp_path: Path) -> None:
    steady = _child(tmp_path, "steady", "import time; time.sleep(60)")
    bad = _child(tmp_path, "bad", f"raise SystemExit({CONFIG_ERROR})")
    said: list[str] = []
    sup = Supervisor([steady, bad], say=said.append)
    started = time.monotonic()
    assert sup.run(on_signals=False) == CONFIG_ERROR
    assert time.monotonic() - started < 10
    assert said[0] == "bad exited with 2 (it cannot start): stopping"
    assert not any("restart" in line for line in said)
    assert steady.exitcode() is not None  # stopped with the rest


def test_stopping_ends_every_child(tmp_path: Path) -> None:
    children = [_child(tmp_path, f"c{i}", "import time; time.sleep(60)") for i in range(3)]
    sup = Supervisor(list(children), say=lambda _: None)
    threading.Timer(0.5, sup.stopping.set).start()
    assert sup.run(on_signals=False) == 0
    assert all(c.exitcode() is not None for c in children)
