"""The shipped thinking pair (deploy/models.thinking.yaml): its own levels and
targets, and a thinking budget that varies with the query."""

from __future__ import annotations

from app.catalog import load_catalog
from app.routing import LengthBook, build_router
from router.decision import Query
from router.features import estimate_tokens
from workers.local import ROOT

PROMPTS = {
    "Hi! How are you today?": "easy",
    "What is the capital of Australia?": "easy",
    "A store sells pens at 3 for $2. Maria buys 27 pens and pays with a $20 bill. How much "
    "change does she get? Show your reasoning.": "hard",
    "Prove that the square root of 2 is irrational, then explain where the proof uses the "
    "fundamental theorem of arithmetic.": "hard",
    "Write a Python function that finds the longest palindromic substring in O(n^2) time, "
    "and explain its complexity.": "hard",
}


def test_budgets_vary_with_the_query_and_targets_are_the_pairs_own() -> None:
    router = build_router(load_catalog(ROOT / "deploy" / "models.thinking.yaml"),
                          LengthBook(None))
    shipped = build_router(load_catalog(ROOT / "models.yaml"), LengthBook(None))
    assert router.targets.tolerance(0.95) != shipped.targets.tolerance(0.95)
    budgets = {}
    for text, level in PROMPTS.items():
        d = router.decide(Query(text, estimate_tokens(text)))
        assert d.thinking_budget is not None  # every action is a reasoning model's
        budgets[text] = (level, d.thinking_budget, d.tier)
        assert any(c["thinking_budget"] == 4096 for c in d.candidates)
    easy = [b for level, b, _ in budgets.values() if level == "easy"]
    hard = [(b, tier) for level, b, tier in budgets.values() if level == "hard"]
    assert easy == [0, 0]  # no thinking on a greeting or a one-fact question
    # a hard one thinks, or gets the 8B's answer (the pens: the 8B without
    # thinking, 0.863 at 635 J, meets the floor and costs less than the 1.7B
    # thinking to 1,024, 0.902 at 1,205 J)
    assert all(b > 0 or tier == "large" for b, tier in hard)
    assert max(b for b, _ in hard) == 4096 and len({b for _, b, _ in budgets.values()}) >= 2
