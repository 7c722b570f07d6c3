"""Difficulty features of a request's text, beyond its topic: length, numbers
and operators, sentences, questions, quantities that imply steps. Pure and
cheap (a few regular expressions over the bounded text)."""

from __future__ import annotations

import math
import re
import string

_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_OPERATORS = "+-*/=^<>%$"
_ASCII_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_DIGITS = "0123456789"
_ASCII_SPACES = str.maketrans(dict.fromkeys("\t\n\r\f\v", " "))
_SENTENCE_END = re.compile(r"[.!?](?:\s|$)")
_STEP_WORDS = frozenset(
    ("percent", "half", "twice", "each", "per", "every", "total", "remaining", "left", "times"))
_STEP_PHRASES = re.compile(r"\b(?:more|less) than\b")
# What asks for structure, constraints or depth beyond the topic (open requests:
# "in under 150 words", "explain each change", "with tests", "as JSON").
_DEMAND_WORDS = frozenset((
    "must", "exactly", "least", "most", "without", "include", "including", "keep", "only",
    "never", "avoid", "format", "json", "table", "bullet", "bullets", "words", "sentences",
    "paragraphs", "explain", "compare", "justify", "prove", "derive", "design", "implement",
    "analyse", "analyze", "plan", "evaluate", "critique", "tests", "handling", "trade",
    "structure", "outline", "detailed", "step", "steps", "cite", "citing", "evidence"))
LONG_WORD = 10  # characters: technical and niche vocabulary
_SHORTER_THAN_LONG = LONG_WORD - 1  # (LONG_WORD - 1) < len(w): a long word
_WORD = re.compile(r"\w+")
_ASCII_NON_WORD = str.maketrans(
    {chr(i): " " for i in range(128) if chr(i) not in string.ascii_letters + string.digits + "_"})


def words(text: str) -> list[str]:
    """The `\\w+` runs of the text (scikit-learn's default tokens): for ASCII
    text str.translate and split, ~5x faster than the regex, which reads the
    rest."""
    if text.isascii():
        return text.translate(_ASCII_NON_WORD).split()
    return _WORD.findall(text)


def conversation_text(turns: list[tuple[str, str]]) -> str:
    """The conversation as the router reads it, from (role, text) turns: the
    last user turn, repeated twice so it weighs most, after the earlier turns."""
    last_user = next((text for role, text in reversed(turns) if role == "user"), "")
    return "\n".join([*(text for _, text in turns), last_user, last_user])


def estimate_tokens(text: str) -> int:
    """~4 characters a token for English with Llama-3 tokenizers; corrected from
    the worker's usage when the request ends."""
    return max(1, len(text) // 4)


NAMES = ("log_chars", "log_numbers", "log_operators", "questions", "log_lines",
         "log_sentences", "log_distinct_numbers", "has_decimal", "log_step_words",
         "log_demand_words", "long_word_share")


def difficulty_features(text: str) -> list[float]:
    """One value per NAMES entry."""
    ascii_ = text.isascii()
    if ascii_ and not any(d in text for d in _DIGITS):
        numbers = []  # the regex would try every position to find none
    else:
        numbers = (_ASCII_NUMBER if ascii_ else _NUMBER).findall(text)
    steps, demands, long_share = _word_counts(text.lower())
    return [
        math.log1p(len(text)),
        math.log1p(len(numbers)),
        math.log1p(sum(text.count(op) for op in _OPERATORS)),
        float(text.count("?")),
        math.log1p(text.count("\n")),
        math.log1p(_sentence_ends(text) if ascii_ else len(_SENTENCE_END.findall(text))),
        math.log1p(len(set(numbers))),
        float(any("." in n for n in numbers)),
        math.log1p(steps),
        math.log1p(demands),
        long_share,
    ]


def _sentence_ends(text: str) -> int:
    """`_SENTENCE_END` matches in ASCII text, by str.count (3x faster): each
    match is one of . ! ? and the whitespace it consumes, or the text's end."""
    spaced = text.translate(_ASCII_SPACES)
    return sum(spaced.count(f"{p} ") for p in ".!?") + (spaced[-1:] in (".", "!", "?"))


def _word_counts(lower: str) -> tuple[int, int, float]:
    """In one pass over the words: those implying steps (percent, each, more
    than...), those demanding structure or depth, and the share of long words."""
    phrases = len(_STEP_PHRASES.findall(lower)) \
        if "more than" in lower or "less than" in lower else 0
    found = words(lower)
    # Each count one pass in C (map and sum), not a Python loop over the words.
    steps = sum(map(_STEP_WORDS.__contains__, found))
    demands = sum(map(_DEMAND_WORDS.__contains__, found))
    long_words = sum(map(_SHORTER_THAN_LONG.__lt__, map(len, found)))
    return phrases + steps, demands, long_words / len(found) if found else 0.0
