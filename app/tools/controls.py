"""Controls for the complexity model, after arXiv 2605.07395 (routers trained on
oracle labels that learned only the class prior): on every held-out set, the
complexity score's APGR next to scores that know less.

- `complexity`: the model as `joulegate train-complexity` fits it;
- `category_prior`: the quality table's gap (large - small, direct) for the
  classifier's category probabilities: what the category alone says;
- `length`: the request's length in characters;
- `random`: uniform scores (mean APGR of 20 draws: 0.5 by construction);
- `shuffled_labels`: the same model trained on the training labels shuffled
  within each source (its share of hard items kept, which item is hard lost);
- `random_features`: the same labels, 64 Gaussian features per item.
A score that learned difficulty beats the category prior and length; the
shuffled and random controls fall to ~0.5.

Held-out sets: the RouteLLM MMLU and GSM8K items `split` holds out, and the
open prompts of router/data/open_eval.tsv (never trained on), scored with
the small model as the weak one (right on items labelled easy) and the large
as the strong one (right on all).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from app.artifacts import load_classifier
from app.catalog import Catalog
from app.tools.complexity_training import (
    REGULARISATION_C,
    Item,
    apgr_cpt,
    design,
    load_items,
    own_items,
    split,
)

RANDOM_FEATURES = 64


def controls(data: Path, own: list[Path], held_open: Path, catalog: Catalog,
             seed: int = 1) -> dict[str, dict[str, float]]:
    """Set -> score -> APGR."""
    from sklearn.linear_model import LogisticRegression

    clf = load_classifier(with_pipeline=True)
    items = load_items(data, own)
    extra = own_items(held_open)
    everything = items + extra
    order, held = split(items, seed)
    train = [i for i in order if i not in held]
    x, y, weight, _ = design(clf, everything, train)
    rng = np.random.default_rng(seed)

    def fitted(features: Any, labels: np.ndarray) -> np.ndarray:
        lr = LogisticRegression(C=REGULARISATION_C, max_iter=5000)
        lr.fit(features[train], labels[train], sample_weight=weight[train])
        return np.asarray(lr.decision_function(features))

    shuffled = y.copy()  # within each source: its base rate kept, items' labels lost
    for source in sorted({it.source for it in items}):  # a set's order varies per process
        idx = [i for i in train if everything[i].source == source]
        shuffled[idx] = rng.permutation(y[idx])
    probs = [clf.probabilities(it.text) for it in everything]
    small, large = f"{catalog.tiers[0]}:direct", f"{catalog.tiers[-1]}:direct"
    gap = {cat: row.get(large, 0.0) - row.get(small, 0.0) for cat, row in catalog.quality.items()}
    scores = {
        "complexity": fitted(x, y),
        "category_prior": np.array([sum(p * gap.get(c, 0.0) for c, p in row.items())
                                    for row in probs]),
        "length": np.array([float(len(it.text)) for it in everything]),
        "shuffled_labels": fitted(x, shuffled),
        "random_features": fitted(rng.standard_normal((len(everything), RANDOM_FEATURES)), y),
    }
    sets = {source: sorted(i for i in held if items[i].source == source)
            for source in ("mmlu", "gsm8k")}
    sets["open_eval"] = list(range(len(items), len(everything)))
    out: dict[str, dict[str, float]] = {}
    for name, idx in sets.items():
        weak, strong = _outcomes([everything[i] for i in idx])
        row = {k: apgr_cpt(v[idx], weak, strong)["apgr"] for k, v in scores.items()}
        row["random"] = round(float(np.mean(
            [apgr_cpt(rng.random(len(idx)), weak, strong)["apgr"] for _ in range(20)])), 4)
        row["n"] = len(idx)
        out[name] = row
    return out


def _outcomes(items: list[Item]) -> tuple[np.ndarray, np.ndarray]:
    """(weak right, strong right) per item: RouteLLM's correctness, or for
    own prompts the small model right on easy ones and the large on all."""
    weak = np.array([it.weak if it.weak is not None else not it.hard for it in items])
    strong = np.array([it.strong if it.strong is not None else True for it in items])
    return weak, strong
