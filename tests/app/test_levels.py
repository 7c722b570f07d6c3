"""A models file's own quality table sets the complexity model's levels."""

from __future__ import annotations

import json

import pytest

from app.artifacts import COMPLEXITY, abilities
from router.complexity import calibrate_ability, sigmoid


def test_a_level_the_table_changes_is_calibrated_the_rest_kept() -> None:
    report = json.loads(COMPLEXITY.with_name("complexity-report.json").read_text())
    table = {c: dict(row) for c, row in report["levels_table"].items()}
    assert abilities(report, table) == report["abilities"]  # the trained table: as trained
    table["math"]["large:cot"] = 0.97  # a thinking model's level
    table["math"]["small:think"] = 0.5  # an action the model was never trained for
    got = abilities(report, table)
    ref = report["reference_thetas"]["math"]
    assert got["math"]["large:cot"] == pytest.approx(calibrate_ability(ref, 0.97), abs=1e-4)
    mean = sum(sigmoid(got["math"]["large:cot"] - t) for t in ref) / len(ref)
    assert mean == pytest.approx(0.97, abs=1e-3)
    assert got["math"]["small:think"] == pytest.approx(calibrate_ability(ref, 0.5), abs=1e-4)
    assert got["science"] == report["abilities"]["science"]
