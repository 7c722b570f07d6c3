"""Curve fitting recovers a known form from noisy synthetic measurements."""

from __future__ import annotations

import random

import pytest

from app.artifacts import load_curve, save_curve
from router.curves import Curve, Point, fit_curve

TRUE = (2.0, 5.0, 400.0, 30.0, 300.0, 10.0, 1.0)
META = {"backend": "b", "device": "d", "engine": "e", "model": "m", "source": "nvml",
        "date": "2026-12-02"}


def synthetic(noise: float, seed: int = 1) -> list[Point]:
    truth = Curve("b", "d", "e", "m", "nvml", "x", TRUE)
    rng = random.Random(seed)
    pts = []
    for p in (64, 256, 1024, 4096):
        for c in (16, 64, 256, 1024, 2048):
            for n in (1, 8):
                j = truth.joules(p, c, n) * (1 + rng.gauss(0, noise))
                pts.append(Point(p, c, n, j, seconds=c / 500))
    return pts


def test_fit_recovers_exact_form() -> None:
    curve = fit_curve(synthetic(0.0), META)
    for p, c, n in ((100, 100, 1), (3000, 1500, 8), (500, 20, 4)):
        truth = Curve("b", "d", "e", "m", "nvml", "x", TRUE).joules(p, c, n)
        assert curve.joules(p, c, n) == pytest.approx(truth, rel=1e-3)
    assert curve.fit["holdout"]["mape"] < 1e-3
    assert curve.fit["holdout"]["r2"] > 0.999


def test_fit_reports_holdout_error_under_noise(tmp_path: object) -> None:
    curve = fit_curve(synthetic(0.03), META)
    assert 0.005 < curve.fit["holdout"]["mape"] < 0.08
    from pathlib import Path

    path = Path(str(tmp_path)) / "c.json"
    save_curve(curve, path)
    again = load_curve(path)
    assert again.joules(300, 300, 2) == pytest.approx(curve.joules(300, 300, 2))
    assert again.fit["points"] == 40
