"""bench.gpu_telemetry's summary survives figures of 0 J (a 1-token request
alone can settle at 0 J both times: a device run once lost all its data to a
division by zero there)."""

from __future__ import annotations

from bench.gpu_telemetry import summary


def _run(nets: list[float]) -> dict[str, object]:
    return {"nets": nets, "conservation_error": 1e-15}


def test_summary_skips_zero_references() -> None:
    first, second = [30.0, 60.0, 0.0], [32.0, 58.0, 0.0]
    out = summary(first, second, [40.0, 80.0, 0.0], [35.0, 70.0, 0.5],
                  [_run([31.0, 59.0, 0.2])], 0.1)
    assert out["alone_net_joules"] == [31.0, 59.0, 0.0]
    assert 0 < out["alone_repeat_median_abs_diff"] < 0.1
    assert out["standalone_estimate_median_abs_error"] > 0
    assert out["per_request_median_abs_error"] == 0.0
    assert out["conservation_error"] == 1e-15


def test_summary_of_nothing_measurable_says_none() -> None:
    out = summary([0.0], [0.0], [1.0], [None], [_run([0.0])], 0.1)
    assert out["alone_repeat_median_abs_diff"] is None
