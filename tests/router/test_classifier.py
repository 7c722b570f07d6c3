"""The committed classifier: the fast path equals scikit-learn, and obvious
prompts land where they should."""

from __future__ import annotations

import json
import logging
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.artifacts import ARTIFACTS, arrays_path, load_classifier, save_classifier
from router.classifier import CATEGORIES, Classifier

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def clf() -> Classifier:
    return load_classifier(with_pipeline=True)


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


def test_serving_reads_the_arrays_saved_beside_the_pickle(clf: Classifier) -> None:
    """The committed arrays are the committed pickle's: the same probabilities,
    to the last bit, without scikit-learn."""
    served = load_classifier()
    with pytest.raises(ValueError, match="loaded from its arrays"):
        _ = served.pipeline
    for t in ["", "heyyy", "Solve for x: 2x+3=7", "Write a haiku about the sea.", "word " * 900]:
        assert served.probabilities(t) == clf.probabilities(t)


def test_a_gateway_process_imports_no_scikit_learn() -> None:
    code = ("import sys; from pathlib import Path; from app.catalog import load_catalog; "
            "from app.routing import LengthBook, build_router; "
            "r = build_router(load_catalog(Path('models.yaml')), LengthBook(None)); "
            "print(sorted(m for m in ('sklearn', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_arrays_saved_from_another_pickle_are_not_read(clf: Classifier, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    """A pickle replaced without its arrays (copied in by hand): the pickle
    is loaded, and the log says why."""
    pkl = tmp_path / "mine.pkl"
    save_classifier(clf, pkl)
    assert load_classifier(pkl).probabilities("hello") == clf.probabilities("hello")
    with pytest.raises(ValueError):
        _ = load_classifier(pkl).pipeline  # its arrays were read
    shutil.copy(ARTIFACTS / "classifier.pkl", pkl)
    pkl.write_bytes(pkl.read_bytes() + b"\n")  # another pickle (same content, other bytes)
    with caplog.at_level(logging.WARNING, "joulegate.artifacts"):
        loaded = load_classifier(pkl)
    assert loaded.pipeline is not None
    assert "saved from another mine.pkl" in caplog.text
    direct = load_classifier(arrays_path(pkl))  # an .npz named directly is read as it is
    assert direct.probabilities("hello") == clf.probabilities("hello")
