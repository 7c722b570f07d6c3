"""`joulegate calibrate` against a real llama-server: a sweep of three
concurrencies writes a curve whose form is fitted to the smallest and
largest and whose batch profile holds the one between."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import Workers, models_file
from workers.local import ROOT

pytestmark = pytest.mark.integration


def test_calibrate_with_three_concurrencies_writes_a_batch_profile(workers: Workers,
                                                                    tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOULEGATE_")}
    out = subprocess.run(
        [sys.executable, "-m", "app.cli", "calibrate", "--models",
         str(models_file(workers, tmp_path)), "--out", str(tmp_path / "curves"),
         "--prompts", "16,64", "--completions", "4,16", "--concurrency", "1,2,4",
         "--backend", "small-llamacpp"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "small-llamacpp: batch profile (measured / form by concurrency) n=1 x1.00, n=2 x" \
        in out.stdout
    curve = json.loads((tmp_path / "curves" / "small-llamacpp.json").read_text())
    profile = curve["batch_profile"]
    assert [n for n, _ in profile] == [1, 2, 4] and profile[0][1] == profile[2][1] == 1.0
    assert profile[1][1] > 0
    assert curve["fit"]["points"] == 8  # 2 prompts x 2 answers x the two ends
    assert curve["fit"]["batch_profile"]["n"] == 4
    assert len(curve["fit"]["measurements"]) == 12
    # and `joulegate curves plot` draws it, the profile in a panel of its own
    png = tmp_path / "curves.png"
    plotted = subprocess.run(
        [sys.executable, "-m", "app.cli", "curves", "plot",
         str(tmp_path / "curves" / "small-llamacpp.json"), "--out", str(png)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert plotted.returncode == 0, plotted.stderr[-2000:]
    assert png.stat().st_size > 10_000
