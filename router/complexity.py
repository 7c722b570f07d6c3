"""Per-query quality: how hard THIS request is, and what each action's answer
is then likely to be worth.

1. Difficulty: a logistic model over the classifier's TF-IDF features plus
   `features.difficulty_features`, trained on per-query labels (RouteLLM's
   MMLU and GSM8K: did the strong model answer correctly where the weak one
   failed), gives a logit `theta` (higher: harder).
2. Levels: an item-response model, P(action answers acceptably) =
   sigmoid(ability[category][action] - theta). Each ability is calibrated
   offline so that the average over the category's reference items equals
   the published accuracy of that model and strategy (the models.yaml table:
   Llama-3.2-1B / 3.1-8B model cards, Wilhelm et al.). Assumption: one
   difficulty scale for every model pair, slope 1 (below the median benchmark
   item the logit is stretched: `ComplexityModel.stretched`).
3. Complexity = P(large direct acceptable) x (1 - P(small direct acceptable)):
   the probability that the small tier's direct answer is worse.

Pure: arrays in, numbers out; loading and training live in app/.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from math import exp

import numpy as np

from router.classifier import Features, prepare
from router.features import difficulty_features


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x > -500 else 0.0


@dataclass(frozen=True)
class ComplexityModel:
    text_coef: np.ndarray  # over the classifier's feature space
    hand_coef: np.ndarray  # over features.NAMES (standardised)
    hand_mean: np.ndarray
    hand_scale: np.ndarray
    intercept: float
    abilities: Mapping[str, Mapping[str, float]]  # category -> action -> ability
    # Below `pivot` (the median benchmark item) the logit is stretched by
    # `easy_stretch`: easier than any benchmark item, the regression's scale
    # (set by noisy benchmark labels) understates how easy (app/tools/
    # complexity_training.py). Monotone: no ranking changes.
    pivot: float = 0.0
    easy_stretch: float = 1.0
    _hand: list[tuple[float, float]] = field(init=False, repr=False, compare=False)
    _by_action: dict[str, dict[str, float]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # What each request reads, as plain floats: eleven hand features
        # weighed in Python cost a third of numpy's small-array calls.
        object.__setattr__(self, "_hand", [
            (float(m), float(c) / float(s)) for m, s, c in
            zip(self.hand_mean, self.hand_scale, self.hand_coef, strict=True)])
        by_action: dict[str, dict[str, float]] = {}  # action -> category -> ability
        for cat, row in self.abilities.items():
            for act, ability in row.items():
                by_action.setdefault(act, {})[cat] = ability
        object.__setattr__(self, "_by_action", by_action)

    def theta(self, feats: Features, text: str) -> float:
        """Difficulty logit of a request."""
        idx, vals = feats
        z = self.intercept + (float(vals @ self.text_coef[idx]) if idx.size else 0.0)
        for x, (mean, weight) in zip(difficulty_features(prepare(text)), self._hand,
                                     strict=True):
            z += (x - mean) * weight
        return self.stretched(z)

    def stretched(self, z: float) -> float:
        return z if z >= self.pivot else self.pivot + self.easy_stretch * (z - self.pivot)

    def qualities(self, theta: float, probs: Mapping[str, float], actions: list[str]
                  ) -> dict[str, float]:
        """Expected acceptability of each action for this request: the item
        model per category, weighted by the category probabilities."""
        live = [(cat, p) for cat, p in probs.items() if p > 1e-4]
        out = {}
        for act in actions:
            by_category = self._by_action.get(act, {})
            total = weight = 0.0
            for cat, p in live:
                ability = by_category.get(cat)
                if ability is not None:  # sigmoid(ability - theta), inlined: 36 a decision
                    x = ability - theta
                    total += p / (1.0 + exp(-x)) if x > -500 else 0.0
                    weight += p
            out[act] = total / weight if weight > 0 else 0.5
        return out


def complexity(small: float, large: float) -> float:
    """P(the small answer is worse than the large one), answers independent
    given the request's difficulty."""
    return large * (1.0 - small)


def calibrate_ability(thetas: list[float], target: float) -> float:
    """The ability whose mean acceptability over items `thetas` is `target`."""
    target = min(max(target, 1e-4), 1 - 1e-4)
    lo, hi = -30.0, 30.0
    for _ in range(80):
        mid = (lo + hi) / 2
        mean = sum(sigmoid(mid - t) for t in thetas) / len(thetas)
        lo, hi = (mid, hi) if mean < target else (lo, mid)
    return (lo + hi) / 2
