"""The committed classifier: the fast path equals scikit-learn, and obvious
prompts land where they should."""

from __future__ import annotations

import json
import random

import pytest

from app.artifacts import ARTIFACTS, load_classifier
from router.classifier import CATEGORIES, Classifier


@pytest.fixture(scope="module")
def clf() -> Classifier:
    return load_classifier()


def test_fast_inference_matches_the_pipeline(clf: Classifier) -> None:
    rng = random.Random(0)
    words = ["a", "bb", "x", "hello", "integral", "python", "  ", "\t", "\n", "zz", "poem"]
    texts = ["", "x", "heyyy", "Solve for x: 2x+3=7", "word " * 900]
    texts += ["".join(rng.choice(words) + rng.choice([" ", "  ", "", "\t"])
                      for _ in range(rng.randint(1, 80))) for _ in range(100)]
    for t in texts:
        fast = clf.probabilities(t)
        slow = dict(zip(clf.labels, clf.sklearn_probabilities(t), strict=True))
        assert fast.keys() == set(CATEGORIES)
        assert max(abs(fast[k] - slow[k]) for k in slow) < 1e-9, t[:40]


@pytest.mark.parametrize(("text", "category"), [
    ("hello! how are you?", "chat"),
    ("Write a Python function to merge two sorted lists.", "code"),
    ("Solve for x: 4x - 7 = 9", "math"),
    ("Write a haiku about the sea.", "writing"),
    ("Summarize the following text in two sentences: The committee met on Monday.",
     "extraction"),
])
def test_obvious_prompts(clf: Classifier, text: str, category: str) -> None:
    assert clf.top(text) == category


def test_report_is_committed_with_the_artifact() -> None:
    report = json.loads((ARTIFACTS / "classifier-report.json").read_text())
    assert report["held_out_accuracy"] > 0.75
    assert len(report["confusion_matrix"]["labels"]) == len(CATEGORIES)
    assert set(report["sources"]) >= {"mmlu", "gsm8k", "arena-hard", "own"}
