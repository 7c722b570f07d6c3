"""The policy on hand-made curves and tables: each mode picks what it should."""

from __future__ import annotations

import pytest

from router.curves import Curve
from router.policy import ActionSpec, Caps, Policy
from router.quality import ExpectedLengths, QualityTable


def curve(backend: str, per_token_j: float) -> Curve:
    # joules = per_token_j * completion tokens (coef on C, in kilotokens)
    return Curve(backend, "gpu0", "test", "m", "nvml", "today",
                 (0.0, 0.0, per_token_j * 1000, 0.0, 0.0, 0.0, 0.0))


ACTIONS = [ActionSpec("small", "s", "direct"), ActionSpec("small", "s", "cot"),
           ActionSpec("large", "l", "direct"), ActionSpec("large", "l", "cot")]
QUALITY = QualityTable({
    "math": {"small:direct": 0.11, "small:cot": 0.31, "large:direct": 0.39, "large:cot": 0.52},
    "chat": {"small:direct": 0.80, "small:cot": 0.80, "large:direct": 0.82, "large:cot": 0.82},
})


def policy(tolerance: float = 0.05) -> Policy:
    lengths = ExpectedLengths(values={
        "math": {"small:direct": 50, "small:cot": 400, "large:direct": 50, "large:cot": 400},
        "chat": {"small:direct": 40, "small:cot": 300, "large:direct": 40, "large:cot": 300}})
    return Policy(ACTIONS, QUALITY, lengths, {"s": curve("s", 0.7), "l": curve("l", 3.2)},
                  ["small", "large"], tolerance, Caps(512, 1024, 256))


def pick(mode: str, probs: dict[str, float], max_joules: float | None = None,
         tolerance: float = 0.05) -> str:
    p = policy(tolerance)
    cands = p.candidates(probs, 100, None, {})
    return p.choose(cands, mode, max_joules).chosen.spec.key  # type: ignore[arg-type]


def test_easy_chat_goes_small_direct_when_balanced() -> None:
    assert pick("balanced", {"chat": 1.0}) == "small:direct"


def test_hard_math_goes_large_when_balanced() -> None:
    assert pick("balanced", {"math": 1.0}) == "large:cot"
    assert pick("balanced", {"math": 1.0}, tolerance=0.30) == "large:direct"


def test_modes_are_the_ends() -> None:
    assert pick("min-energy", {"math": 1.0}) == "small:direct"
    assert pick("max-quality", {"chat": 1.0}) == "large:direct"  # tie with cot: fewer joules


def test_cap_removes_expensive_actions() -> None:
    # large:cot = 3.2 J x 400 = 1280 J; large:direct = 160 J; small:cot = 280 J
    assert pick("max-quality", {"math": 1.0}, max_joules=300) == "large:direct"


def test_cap_that_nothing_fits_takes_the_cheapest_and_says_so() -> None:
    p = policy()
    choice = p.choose(p.candidates({"math": 1.0}, 100, None, {}), "balanced", 1.0)
    assert choice.chosen.spec.key == "small:direct"
    assert "cap" in choice.reason


def test_expected_figures_and_token_caps() -> None:
    p = policy()
    cands = {c.spec.key: c for c in p.candidates({"math": 0.5, "chat": 0.5}, 100, 64, {})}
    assert cands["small:direct"].expected_quality == pytest.approx(0.455)
    assert cands["large:cot"].completion_tokens == 64  # client's max_tokens caps it
    assert cands["large:direct"].expected_joules == pytest.approx(3.2 * 45)
    assert p.token_caps(cands["large:cot"], None) == (1024, None)
    reasoning = ActionSpec("large", "l", "cot", reasoning=True)
    c = cands["large:cot"].__class__(reasoning, 0.5, 1.0, 10)
    assert p.token_caps(c, None) == (1024, 256)


def test_concurrency_lowers_expected_joules_on_batched_curves() -> None:
    batched = Curve("s", "g", "e", "m", "nvml", "d", (0, 0, 0, 0, 700.0, 0, 0))
    assert batched.joules(0, 100, 8) == pytest.approx(batched.joules(0, 100, 1) / 8)


def test_lengths_learn_from_traffic() -> None:
    lengths = ExpectedLengths()
    for _ in range(30):
        lengths.observe("chat", "small:direct", 20)
    assert lengths.expected({"chat": 1.0}, "small:direct") == pytest.approx(20)
    again = ExpectedLengths.from_json(lengths.to_json())
    assert again.expected({"chat": 1.0}, "small:direct") == pytest.approx(20)
