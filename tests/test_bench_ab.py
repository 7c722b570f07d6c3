"""The A/B tools keep going when one gateway never gets ready: that run is
recorded with its error and no figures, and the medians use the others."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from app.tools.embedded import free_port
from bench.ab import FIELDS, measure_gateway, median_of


def test_a_gateway_that_exits_at_start_gives_a_run_with_its_error(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    run = measure_gateway(proc, free_port(), tmp_path, 1, 1, {"model": "small"})
    assert "exited with 3" in run["error"]
    assert all(run[f] is None for f in FIELDS)
    assert proc.poll() is not None


def test_medians_skip_runs_without_figures() -> None:
    runs = [{"req_per_s": 10.0}, {"req_per_s": None, "error": "x"}, {"req_per_s": 30.0}]
    assert median_of(runs, "req_per_s") == 20.0
    assert median_of([{"req_per_s": None}], "req_per_s") is None
