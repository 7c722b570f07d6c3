"""The query classifier: text -> probabilities over request categories.

A scikit-learn pipeline (TF-IDF word 1-2-grams over the bounded text, and
character 2-4-grams over its last 300 characters, into a multinomial logistic
regression), trained by `joulegate train` and committed as
`router/artifacts/classifier.pkl` with its report. The character n-grams
carry misspellings and unseen words ("heyyy"): +2 points held-out, +2 on the
check prompts, measured.

Inference does not call scikit-learn: its per-call overhead alone is ~1 ms.
The fitted vocabularies, idf and coefficients are read out once and applied
with dict lookups, a count and one small matrix product, which gives the same
probabilities (tested against the pipeline) in a few tens of microseconds.
Nor does serving import it: those arrays are saved beside the pickle
(`classifier.npz`, app.artifacts) and the gateway loads only them.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from router.features import words

CATEGORIES: tuple[str, ...] = (
    "math", "code", "reasoning", "science", "knowledge", "social", "writing", "extraction",
    "chat",
)
Features = tuple[np.ndarray, np.ndarray]  # (feature indices, values)
HEAD_CHARS = 700
TAIL_CHARS = 700


def prepare(text: str) -> str:
    """Bound the text read (decision time must not grow with the conversation):
    its head and its tail, where the router puts the last user turn."""
    if len(text) <= HEAD_CHARS + TAIL_CHARS:
        return text
    return text[:HEAD_CHARS] + " \n " + text[-TAIL_CHARS:]


TOKEN_PATTERN = r"(?u)\b\w+\b"
CHAR_TAIL = 300
_SPACES = re.compile(r"\s\s+")


def char_view(text: str) -> str:
    """What the character n-grams read: the last characters, where the last user
    turn is. Module-level so the fitted pipeline pickles."""
    return text[-CHAR_TAIL:].lower()


def build_pipeline() -> Any:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import FeatureUnion, Pipeline

    return Pipeline([
        ("features", FeatureUnion([
            ("word", TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2,
                                     max_features=80000, token_pattern=TOKEN_PATTERN)),
            ("char", TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4),
                                     sublinear_tf=True, min_df=2, max_features=40000,
                                     preprocessor=char_view)),
        ])),
        ("clf", LogisticRegression(C=8.0, max_iter=3000)),
    ])


def word_ngrams(word: str, lo: int = 2, hi: int = 4) -> list[str]:
    """scikit-learn's `char_wb` n-grams of one word: every n-gram of " word "
    for n = lo..hi shorter than it, and the padded word itself once when it is
    no longer than hi."""
    w = f" {word} "
    size = len(w)
    out = [w[i:i + n] for n in range(lo, min(hi, size - 1) + 1) for i in range(size - n + 1)]
    if size <= hi:
        out.append(w)
    return out


def _normalise(v: np.ndarray) -> None:
    """Scale `v` (a view) to unit length, in place."""
    norm = math.sqrt(float(v @ v))
    if norm > 0:
        v /= norm


class _Words:
    """The word vectorizer's vocabulary (unigrams and "first second" bigrams):
    a request's terms are looked up directly, its bigrams joined as
    scikit-learn joins them."""

    def __init__(self, terms: list[str]) -> None:
        self.vocab: dict[str, int] = {t: i for i, t in enumerate(terms)}
        self.size = len(self.vocab)

    def features(self, tokens: list[str]) -> list[int]:
        """The feature index of every unigram and bigram occurrence in the vocabulary."""
        get = self.vocab.get
        ids = [i for i in map(get, tokens) if i is not None]
        ids += [i for i in map(get, map(" ".join, itertools.pairwise(tokens))) if i is not None]
        return ids


class _Chars:
    """The character vectorizer's vocabulary, with each word's n-gram ids
    remembered (bounded): words repeat, within a text and across requests."""

    CACHE_WORDS = 50_000

    def __init__(self, terms: list[str], offset: int) -> None:
        self.vocab: dict[str, int] = {t: i + offset for i, t in enumerate(terms)}
        self._ids: dict[str, tuple[int, ...]] = {}

    def _word_ids(self, word: str) -> tuple[int, ...]:
        ids = self._ids.get(word)
        if ids is None:
            ids = tuple(i for i in map(self.vocab.get, word_ngrams(word)) if i is not None)
            if len(self._ids) >= self.CACHE_WORDS:
                self._ids.clear()
            self._ids[word] = ids
        return ids

    def features(self, view: str) -> list[int]:
        """The feature index of every character n-gram occurrence in the vocabulary."""
        ids: list[int] = []
        for word in view.split():
            ids += self._word_ids(word)
        return ids


@dataclass(frozen=True)
class ClassifierArrays:
    """What inference reads of a fitted pipeline: the two vocabularies (each
    term at its feature index), the idf over both blocks, the logistic
    regression's coefficients (features x classes) and intercepts. Plain
    arrays: loading them imports no scikit-learn and runs no code (a pickle
    can), and costs a fraction of the pipeline's memory and time."""

    labels: list[str]
    word_terms: list[str]
    char_terms: list[str]
    idf: np.ndarray
    coef: np.ndarray
    intercept: np.ndarray

    @classmethod
    def of_pipeline(cls, pipeline: Any) -> ClassifierArrays:
        union, lr = pipeline.named_steps["features"], pipeline.named_steps["clf"]
        word, char = (t for _, t in union.transformer_list)
        return cls(
            [str(c) for c in pipeline.classes_], _terms(word.vocabulary_),
            _terms(char.vocabulary_),
            np.concatenate((np.asarray(word.idf_, dtype=np.float64),
                            np.asarray(char.idf_, dtype=np.float64))),
            np.ascontiguousarray(lr.coef_.T, dtype=np.float64),
            np.asarray(lr.intercept_, dtype=np.float64))


def _terms(vocabulary: dict[Any, Any]) -> list[str]:
    """A fitted vocabulary's terms in feature order (its indices are 0..n-1)."""
    terms = [""] * len(vocabulary)
    for term, i in vocabulary.items():
        terms[int(i)] = str(term)
    return terms


class Classifier:
    def __init__(self, arrays: ClassifierArrays, pipeline: Any = None) -> None:
        """From the arrays inference reads; `pipeline`: the fitted scikit-learn
        pipeline they came from, where the caller has it (training, checks)."""
        self._pipe = pipeline
        self.arrays = arrays
        self._labels = list(arrays.labels)
        self._word = _Words(arrays.word_terms)
        self._char = _Chars(arrays.char_terms, self._word.size)
        self._idf = arrays.idf
        self._coef = arrays.coef  # features x classes
        self._intercept = arrays.intercept

    @classmethod
    def of_pipeline(cls, pipeline: Any) -> Classifier:
        return cls(ClassifierArrays.of_pipeline(pipeline), pipeline)

    def features(self, text: str) -> Features:
        """The text's TF-IDF features (sparse: indices and values), computed once
        and shared by every head that reads them (categories, complexity)."""
        text = prepare(text)
        # Term counts: the word block's first (the character ids are offset
        # past it, so the two never collide and insertion order keeps them apart).
        counts = Counter(self._word.features(words(text.lower())))
        k = len(counts)
        counts.update(self._char.features(_SPACES.sub(" ", char_view(text))))
        idx = np.fromiter(counts.keys(), dtype=np.intp, count=len(counts))
        n = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
        vals = (1.0 + np.log(n)) * self._idf[idx]  # sublinear tf x idf
        # Each vectorizer normalises its own block (the pipeline's FeatureUnion).
        _normalise(vals[:k])
        _normalise(vals[k:])
        return idx, vals

    def _scores(self, text: str) -> np.ndarray:
        return self.scores_of(self.features(text))

    def scores_of(self, feats: Features) -> np.ndarray:
        idx, vals = feats
        if not idx.size:
            return self._intercept.copy()
        scores: np.ndarray = vals @ self._coef[idx]
        scores += self._intercept
        return scores

    @property
    def n_features(self) -> int:
        return int(self._coef.shape[0])

    @property
    def pipeline(self) -> Any:
        """The fitted scikit-learn pipeline (app.artifacts pickles it); a
        classifier loaded from its arrays alone has none."""
        if self._pipe is None:
            raise ValueError("this classifier was loaded from its arrays: load its pickle "
                             "(app.artifacts.load_classifier(with_pipeline=True))")
        return self._pipe

    def probabilities(self, text: str) -> dict[str, float]:
        return self.probabilities_of(self.features(text))

    def probabilities_of(self, feats: Features) -> dict[str, float]:
        # The softmax of a handful of scores: plain floats cost less than arrays.
        scores = self.scores_of(feats).tolist()
        top = max(scores)
        e = [math.exp(x - top) for x in scores]
        total = math.fsum(e)
        probs = dict.fromkeys(CATEGORIES, 0.0)
        probs.update(zip(self._labels, (x / total for x in e), strict=True))
        return probs

    def top(self, text: str) -> str:
        probs = self.probabilities(text)
        return max(probs, key=lambda k: probs[k])

    def top_many(self, texts: list[str]) -> list[str]:
        return [self.top(t) for t in texts]

    def sklearn_probabilities(self, text: str) -> list[float]:
        """The pipeline's own answer, for checking the fast path."""
        return [float(x) for x in self.pipeline.predict_proba([prepare(text)])[0]]

    @property
    def labels(self) -> list[str]:
        return list(self._labels)
