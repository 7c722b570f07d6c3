"""The energy report on hand-made sums: multipliers, divergence, predictions."""

from __future__ import annotations

import pytest

from app.tenancy.report import build_report, curve_alone_j, table
from router.curves import Curve


def group(category: str, backend: str, n: int, prompt: int, answer: int, gross: float,
          loops: int = 0, source: str = "nvml", unmetered: int = 0) -> dict[str, object]:
    m = n - unmetered
    return {"category": category, "backend": backend, "source": source, "requests": n,
            "prompt_tokens": prompt * n, "completion_tokens": answer * n,
            "energy_net_j": gross * 0.8 * m, "energy_gross_j": gross * m, "metered": m,
            "metered_prompt_tokens": prompt * m, "metered_completion_tokens": answer * m,
            "metered_prompt_x_completion": float(prompt * answer * m), "loop_stops": loops}


CURVE = Curve("b", "gpu0", "llama.cpp", "m", "nvml", "today",
              (1.0, 0.0, 100.0, 10.0, 0.0, 0.0, 0.0))  # 1 J + 0.1 J/answer token + PC


def test_divergence_against_the_reference_within_a_backend() -> None:
    rows = [group("chat", "b", 10, 100, 100, 20.0),
            group("math", "b", 10, 100, 300, 90.0, loops=2),  # 3x tokens, 4.5x joules
            group("math", "b", 2, 100, 300, 0.0, unmetered=2)]
    r = build_report(rows, {"b": CURVE})
    assert r["reference_category"] == "chat"  # the most metered requests (tie: by name)
    math = r["by_backend_category"]["b"]["math"]
    assert math["token_multiplier"] == pytest.approx(3.0)
    assert math["energy_multiplier"] == pytest.approx(4.5)
    assert math["divergence"] == pytest.approx(0.5)
    assert r["mean_divergence_by_backend"]["b"] == pytest.approx(0.25)  # chat 0, math 0.5
    cat = r["by_category"]["math"]
    assert cat["requests"] == 12 and cat["requests_without_energy"] == 2
    assert cat["loop_stops"] == 2 and cat["loop_rate"] == pytest.approx(2 / 12, abs=1e-4)
    # tokens x constant: the backend's 1,100 J over 6,000 tokens, times math's 4,000
    assert cat["predictions"]["token_linear_j"] == pytest.approx(1100 / 6000 * 4000, rel=1e-4)
    alone = 10 * (1 + 0.1 * 300 + 10 * 0.1 * 0.3)
    assert cat["predictions"]["curve_alone_j"] == pytest.approx(alone)
    assert cat["predictions"]["measured_over_curve_alone"] == pytest.approx(900 / alone,
                                                                            rel=1e-3)
    assert r["totals"]["sources"] == ["nvml"]
    assert "math" in table(r) and "reference category: chat" in table(r)


def test_curve_sums_equal_the_curve_per_request() -> None:
    reqs = [(100, 50), (2000, 10), (10, 700)]
    one = sum(CURVE.joules(p, c, 1) for p, c in reqs)
    summed = curve_alone_j(CURVE, len(reqs), sum(p for p, _ in reqs), sum(c for _, c in reqs),
                           sum(p * c for p, c in reqs))
    assert summed == pytest.approx(one)


def test_no_curve_and_no_energy() -> None:
    r = build_report([group("chat", "x", 3, 10, 10, 0.0, source="unavailable", unmetered=3)],
                     {})
    f = r["by_category"]["chat"]
    assert f["predictions"]["curve_alone_j"] is None and f["divergence"] is None
    assert f["sources"] == ["unavailable"] and f["joules_per_token"] is None
    assert build_report([], {})["totals"]["requests"] == 0
