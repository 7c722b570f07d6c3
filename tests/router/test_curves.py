"""Curve fitting recovers a known form from noisy synthetic measurements."""

from __future__ import annotations

import math
import random
from pathlib import Path

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


# An engine that batches 2-4 requests poorly (llama.cpp's F16 8B on an H100,
# docs/routing.md): measured / form = 2 at n = 2, 3 at n = 4, 1 at 1 and 8.
BUMP = {1: 1.0, 2: 2.0, 4: 3.0, 8: 1.0}


def bumpy(noise: float = 0.0, seed: int = 1) -> list[Point]:
    truth = Curve("b", "d", "e", "m", "nvml", "x", TRUE)
    rng = random.Random(seed)
    return [Point(p, c, n, truth.joules(p, c, n) * BUMP[n] * (1 + rng.gauss(0, noise)),
                  seconds=c / 500)
            for p in (64, 256, 1024, 4096) for c in (16, 64, 256, 1024, 2048) for n in BUMP]


def test_a_sweep_of_two_concurrencies_keeps_the_form_alone() -> None:
    curve = fit_curve(synthetic(0.0), META)
    assert curve.batch_profile == () and curve.batch_factor(4) == 1.0
    assert "batch_profile" not in curve.fit


def test_inner_concurrencies_make_a_batch_profile_over_the_form_fitted_at_the_ends() -> None:
    curve = fit_curve(bumpy(), META)
    truth = Curve("b", "d", "e", "m", "nvml", "x", TRUE)
    assert curve.coef == pytest.approx(TRUE, rel=1e-3)  # the ends fit the form exactly
    assert [n for n, _ in curve.batch_profile] == [1, 2, 4, 8]
    assert [f for _, f in curve.batch_profile] == pytest.approx([1.0, 2.0, 3.0, 1.0], rel=1e-3)
    assert curve.joules(500, 100, 4) == pytest.approx(3 * truth.joules(500, 100, 4), rel=1e-3)
    assert curve.batch_factor(3) == pytest.approx(2.5, rel=1e-3)  # linear between
    assert curve.batch_factor(6) == pytest.approx(2.0, rel=1e-3)
    assert curve.batch_factor(0.5) == 1.0 and curve.batch_factor(math.inf) == 1.0
    errors = curve.fit["batch_profile"]
    assert errors["n"] == 40 and errors["mape_with_profile"] < 1e-3 < errors["mape_form"]
    assert curve.fit["points"] == 40  # the ends' points fit the form


def test_the_profile_survives_its_file_and_nonsense_is_refused(tmp_path: Path) -> None:
    curve = fit_curve(bumpy(0.02), META)
    path = tmp_path / "c.json"
    save_curve(curve, path)
    again = load_curve(path)
    assert again.batch_profile == curve.batch_profile
    assert again.joules(300, 300, 3) == pytest.approx(curve.joules(300, 300, 3))
    for bad in (((2, 1.0), (1, 1.0)), ((1, 1.0), (1, 2.0)), ((1, 0.0),), ((1, math.nan),)):
        with pytest.raises(ValueError, match="batch_profile"):
            Curve("b", "d", "e", "m", "nvml", "x", TRUE, batch_profile=bad)


def test_joining_a_poorly_run_batch_costs_what_it_adds_never_less_than_its_own_work() -> None:
    form = Curve("b", "d", "e", "m", "nvml", "x", TRUE)
    bumped = Curve("b", "d", "e", "m", "nvml", "x", TRUE,
                   batch_profile=tuple((float(n), f) for n, f in BUMP.items()))
    own = form.joules(200, 64, math.inf)
    assert form.joins(200, 64, 3) == own  # the form: own work, whatever the batch
    # 3 -> 4 running: 4 J(4) - 3 J(3), the profile raising the batch's joules
    added = 4 * bumped.joules(200, 64, 4) - 3 * bumped.joules(200, 64, 3)
    assert bumped.joins(200, 64, 3) == pytest.approx(added) and added > 2 * own
    # 6 -> 7: the batch gets cheaper as a whole; priced at its own work, not below
    assert 7 * bumped.joules(200, 64, 7) - 6 * bumped.joules(200, 64, 6) < own
    assert bumped.joins(200, 64, 6) == own
