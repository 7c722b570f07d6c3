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


def _reference(text: str) -> list[float]:
    """difficulty_features the plain way: every regex run, one loop over the words."""
    import math
    numbers = F._NUMBER.findall(text)
    lower = text.lower()
    found = re.findall(r"\w+", lower)
    steps = len(F._STEP_PHRASES.findall(lower)) + sum(w in F._STEP_WORDS for w in found)
    demands = sum(w in F._DEMAND_WORDS for w in found)
    long_share = sum(len(w) >= F.LONG_WORD for w in found) / len(found) if found else 0.0
    return [math.log1p(len(text)), math.log1p(len(numbers)),
            math.log1p(sum(text.count(op) for op in F._OPERATORS)), float(text.count("?")),
            math.log1p(text.count("\n")), math.log1p(len(F._SENTENCE_END.findall(text))),
            math.log1p(len(set(numbers))), float(any("." in n for n in numbers)),
            math.log1p(steps), math.log1p(demands), long_share]


def test_difficulty_features_are_the_plain_ones() -> None:
    rng = random.Random(5)
    vocab = ["more", "less", "than", "thanks", "each", "explain", "json", "implementation",
             "characteristically", "3.5", "42", "x", "?", ".", "\n", "ü", "+", "per", "cent"]
    texts = [" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 30))) for _ in range(3000)]
    for t in [*texts, *_texts(), "no digits here, only words and more than enough of them"]:
        assert F.difficulty_features(t) == _reference(t), t
