"""The loop detector fires on repetition and not on ordinary text."""

from __future__ import annotations

from router.loopguard import LoopGuard, find_loop

PROSE = ("Energy per request depends on the model, the prompt length, the output length "
         "and the batch. A gateway that meters every request can route easy questions to "
         "a small model and hard ones to a large model, and report what each answer cost. ")


def test_detects_a_repeated_phrase() -> None:
    g = LoopGuard()
    fired_at = None
    for i in range(400):
        if g.feed(" and then the cat sat"):
            fired_at = i
            break
    assert fired_at is not None and fired_at < 30
    assert g.period == len(" and then the cat sat")


def test_detects_single_token_loops() -> None:
    assert find_loop("x" * 300, 200, 4, 200) == 1
    assert find_loop("ab" * 150, 200, 4, 200) == 2


def test_ordinary_text_is_not_a_loop() -> None:
    g = LoopGuard()
    assert not any(g.feed(w + " ") for w in (PROSE * 3).split()[:150])
    assert find_loop(PROSE, 200, 4, 200) is None


def test_short_repeats_below_the_span_are_allowed() -> None:
    assert find_loop("hello " + "ha" * 20, 200, 4, 200) is None
