"""The fast paths of the decision features give exactly what the regexes give."""

from __future__ import annotations

import random
import re

from router import features as F


def _texts() -> list[str]:
    rng = random.Random(3)
    alpha = "ab .!?\t\n\r\x0b\x0c1234567890.+-*/=^<>%$_ü"
    return ["".join(rng.choice(alpha) for _ in range(rng.randint(0, 40))) for _ in range(5000)]


def test_words_are_the_regex_tokens() -> None:
    for t in _texts():
        assert F.words(t) == re.findall(r"(?u)\b\w+\b", t)


def test_sentence_ends_and_numbers_match_the_regexes() -> None:
    for t in _texts():
        if t.isascii():
            assert F._sentence_ends(t) == len(F._SENTENCE_END.findall(t))
            assert F._ASCII_NUMBER.findall(t) == F._NUMBER.findall(t)


def test_step_words_match_the_word_boundary_regex() -> None:
    old = re.compile(r"\b(percent|half|twice|each|per|every|total|remaining|left|more than"
                     r"|less than|times)\b")
    for t in [*_texts(), "more than, less  than; each per cent percent more than_x"]:
        assert F._word_counts(t.lower())[0] == len(old.findall(t.lower()))
