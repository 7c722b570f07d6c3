"""The policy on hand-made curves and tables: each mode picks what it should."""

from __future__ import annotations

import math

import pytest

from router.curves import Curve
from router.policy import ActionSpec, Caps, Policy
from router.quality import ExpectedLengths, QualityTable
from router.targets import baseline, sweep
from router.thinking import CLOSING_TOKENS, ThinkingModel, budget_share


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
                  ["small", "large"], tolerance, Caps(512, 1024))


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


def test_a_per_query_tolerance_shrinks_where_the_best_is_unlikely() -> None:
    p = policy()
    assert p.full_tolerance_from == 0.7
    assert p.scaled(0.2, 0.9) == 0.2 and p.scaled(0.2, 0.7) == 0.2
    assert p.scaled(0.2, 0.35) == pytest.approx(0.1)
    assert p.scaled(0.2, 0.0) == 0.0
    # math: best 0.52 (large:cot); 0.45 in full would take small:direct (0.11),
    # scaled to 0.45 x 0.52 / 0.7 = 0.334 the floor is 0.186: large:direct,
    # cheaper than small:cot's chain of thought
    cands = p.candidates({"math": 1.0}, 100, None, {})
    chosen = p.choose(cands, "balanced", None, 0.45)
    assert chosen.chosen.spec.key == "large:direct"
    assert "0.334 below" in chosen.reason
    p.full_tolerance_from = 0.0  # the tolerance in full everywhere
    assert p.choose(cands, "balanced", None, 0.45).chosen.spec.key == "small:direct"
    # chat: best 0.82 >= 0.7, the tolerance in full
    chat = p.candidates({"chat": 1.0}, 100, None, {})
    assert p.choose(chat, "balanced", None, 0.05).chosen.spec.key == "small:direct"


def test_a_quality_target_never_asks_more_than_always_large_gives() -> None:
    p = policy()
    cands = p.candidates({"math": 1.0}, 100, None, {})
    # tolerance 0: the best is large:cot (0.52), but always-large answers
    # directly (0.39): the floor is that, and large:direct is the cheapest there
    chosen = p.choose(cands, "balanced", None, 0.0)
    assert chosen.chosen.spec.key == "large:direct"
    assert "always-large's own" in chosen.reason
    assert p.choose(cands, "max-quality", None).chosen.spec.key == "large:cot"


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


REASONING = [ActionSpec("small", "s", "direct", True), ActionSpec("small", "s", "cot", True),
             ActionSpec("large", "l", "direct", True), ActionSpec("large", "l", "cot", True)]


def thinking_policy(tolerance: float = 0.05) -> Policy:
    lengths = ExpectedLengths(values={"math": {"small:direct": 50, "large:direct": 50},
                                      "chat": {"small:direct": 40, "large:direct": 40}})
    return Policy(REASONING, QUALITY, lengths, {"s": curve("s", 0.7), "l": curve("l", 3.2)},
                  ["small", "large"], tolerance, Caps(512, 1024),
                  thinking=ThinkingModel(tokens={"math": 1000.0, "chat": 200.0}))


def test_a_reasoning_backend_offers_no_thinking_and_each_budget_rung() -> None:
    p = thinking_policy()
    cands = [c for c in p.candidates({"math": 1.0}, 100, None, {}) if c.spec.tier == "large"]
    assert [c.thinking_budget for c in cands] == [0, 256, 1024, 4096, 16384]
    none, b256, b1024, b4096, unbounded = cands
    assert none.thinking_tokens == 0 and none.expected_quality == pytest.approx(0.39)
    # 256 of a natural 1,000 keeps 1 + log2(0.256) / 2 = 2% of thinking's gain
    assert b256.expected_quality == pytest.approx(0.39 + 0.13 * (1 + math.log2(0.256) / 2))
    assert b256.thinking_tokens == 256 + CLOSING_TOKENS
    # a budget above the natural length keeps all of thinking's gain, spends what it needs
    assert b1024.expected_quality == b4096.expected_quality == pytest.approx(0.52)
    assert b1024.thinking_tokens == b4096.thinking_tokens == unbounded.thinking_tokens == 1000
    assert b1024.expected_joules == pytest.approx(3.2 * (1000 + 50))
    assert p.token_caps(b1024, None) == (1024 + CLOSING_TOKENS + 512, 1024)
    assert p.token_caps(b1024, 100) == (1024 + CLOSING_TOKENS + 100, 1024)
    assert p.token_caps(b1024, 800, limit_includes_thinking=True) == (800, 1024)
    assert p.token_caps(none, None) == (512, 0)


def test_easy_chat_does_not_think_and_hard_math_does() -> None:
    p = thinking_policy()
    chat = p.choose(p.candidates({"chat": 1.0}, 50, None, {}), "balanced", None).chosen
    assert chat.thinking_budget == 0
    math_ = p.choose(p.candidates({"math": 1.0}, 50, None, {}), "max-quality", None).chosen
    assert math_.thinking_budget == 1024  # the cheapest rung with all of the gain
    harder = p.choose(p.candidates({"math": 1.0}, 50, None, {}, difficulty=2.0),
                      "max-quality", None).chosen
    assert harder.thinking_budget == 4096  # thinks longer on a harder item


def test_a_clients_effort_and_total_limit_bound_the_ladder() -> None:
    p = thinking_policy()
    low = [c.thinking_budget for c in p.candidates({"math": 1.0}, 50, None, {}, ceiling=256)
           if c.spec.tier == "large"]
    assert low == [0, 256]
    none = [c.thinking_budget for c in p.candidates({"math": 1.0}, 50, None, {}, ceiling=0)]
    assert none == [0, 0]
    total = [c for c in p.candidates({"math": 1.0}, 50, 600, {}, limit_includes_thinking=True)
             if c.spec.tier == "large"]
    assert [c.thinking_budget for c in total] == [0, 256, 550]  # 600 less the answer's 50
    assert all(c.completion_tokens <= 600 + CLOSING_TOKENS for c in total)


def test_budget_share_follows_the_evidence() -> None:
    assert budget_share(None, 900) == budget_share(1000, 900) == 1.0
    assert budget_share(500, 1000) == pytest.approx(0.5)
    assert budget_share(250, 1000) == pytest.approx(0.0)
    assert budget_share(10, 1000) == -0.5
    m = ThinkingModel(tokens={"math": 1000.0})
    assert m.natural({"math": 1.0}, {}, 0.0) == 1000
    assert m.natural({"math": 1.0}, {"math": 400.0}, 0.0) == 400  # learned from traffic
    assert m.natural({"math": 1.0}, {}, 10.0) == 4000  # clipped at 4x


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


def test_the_targets_baseline_is_the_large_tier_as_asked_by_name() -> None:
    p = thinking_policy()
    cands = p.candidates({"math": 1.0}, 50, None, {})
    assert baseline(cands, "large").thinking_budget == 16384  # a reasoning model thinks
    plain = policy().candidates({"math": 1.0}, 50, None, {})
    assert baseline(plain, "large").spec.key == "large:direct"
    targets, rows = sweep(p, [cands, p.candidates({"chat": 1.0}, 50, None, {})], "large", 11)
    assert rows[0]["quality_ratio"] >= 1.0 - 1e-9 and targets["0.8"] >= targets["0.99"]


def test_a_query_under_load_differs_from_it_in_the_load_only() -> None:
    from dataclasses import replace

    from router.decision import Query

    q = Query("Why is the sky blue?", 7, 64, "min-energy", 20.0, {"a": 1}, frozenset({"b"}),
              0.9, 256, True, False)
    running, down = {"a": 3, "c": 1}, frozenset({"b", "d"})
    assert q.under(running, down) == replace(q, concurrency=running, unavailable=down)
