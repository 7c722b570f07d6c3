"""Evaluate the router like the field does, and what it saves.

    python -m bench.route_eval     # bench/results/route-eval.json and route-eval.png

1. RouteLLM's metrics (APGR, CPT(50%), CPT(80%)) on the held-out RouteLLM
   MMLU and GSM8K items (the same seeded split `joulegate train-complexity`
   holds out; never trained on), scored by the shipped router itself (its
   fast path, as in production), next to random (APGR 0.5) and RouteLLM's
   best published routers.
2. Expected energy saved against always-large at quality targets 0.90, 0.95
   and 0.99 on the mixed workload (bench/workload.py), with the H200 curves
   (deploy/models.gpu.yaml) and the router's per-query expected qualities:
   an expectation from the model, not a measurement (the H200 replay is).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from app.catalog import load_catalog
from app.routing import LengthBook, build_router
from app.tools.complexity_training import ROUTELLM_BEST, apgr_cpt, load_items, split
from bench.gpu_common import project_commit
from bench.workload import MIX, mixed_prompts
from router.decision import Query
from router.features import estimate_tokens

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("JOULEGATE_DATA", ROOT.parent / "shared" / "data"))
TARGETS = (0.90, 0.95, 0.99)


def routellm_metrics(router: Any) -> dict[str, Any]:
    items = load_items(DATA, ROOT / "router" / "data" / "difficulty_prompts.tsv")
    _, held = split(items)
    out = {}
    for source in ("mmlu", "gsm8k"):
        idx = sorted(i for i in held if items[i].source == source)
        score = np.array([router.model.theta(router.classifier.features(items[i].text),
                                             items[i].text) for i in idx])
        weak = np.array([items[i].weak for i in idx])
        strong = np.array([items[i].strong for i in idx])
        rng = np.random.default_rng(0)
        randoms = [apgr_cpt(rng.random(len(idx)), weak, strong)["apgr"] for _ in range(20)]
        out[source] = {**apgr_cpt(score, weak, strong),
                       "random_apgr_mean_of_20": round(float(np.mean(randoms)), 4),
                       "routellm_best": ROUTELLM_BEST[source]}
    return out


def savings(router: Any, n: int = 400) -> dict[str, Any]:
    prompts = mixed_prompts(n, DATA)
    rows = {}
    for target in (*TARGETS, 1.0):
        quality = large_q = energy = large_e = 0.0
        tiers: dict[str, int] = {}
        for _, text in prompts:
            d = router.decide(Query(text, estimate_tokens(text), quality_target=target))
            large = next(c for c in d.candidates
                         if c["tier"] == "large" and c["strategy"] == "direct")
            quality += d.expected_quality
            energy += d.expected_joules
            large_q += large["expected_quality"]
            large_e += large["expected_joules"]
            key = f"{d.tier}:{d.strategy}"
            tiers[key] = tiers.get(key, 0) + 1
        rows[str(target)] = {"quality_ratio_vs_large": round(quality / large_q, 4),
                             "energy_saved_vs_large": round(1 - energy / large_e, 4),
                             "actions": tiers}
    return {"n": len(prompts), "mix": MIX, "curves": "H200 (deploy/models.gpu.yaml)",
            "source": "estimate (curves x expected lengths; the router's expected quality)",
            "by_target": rows}


def plot(sweep: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([100 * (1 - s["energy_saved"]) for s in sweep],
            [s["quality_ratio"] for s in sweep], marker=".")
    ax.set_xlabel("expected energy, % of always-large (H200 curves)")
    ax.set_ylabel("expected quality / always-large")
    ax.set_title("joulegate auto: per-query tolerance sweep (reference workload)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    catalog = load_catalog(ROOT / "deploy" / "models.gpu.yaml")
    router = build_router(catalog, LengthBook(None))
    assert router.model is not None, "no complexity model: run joulegate train-complexity"
    report = json.loads((ROOT / "router" / "artifacts" / "complexity-report.json").read_text())
    result = {"commit": project_commit(), "routellm_held_out": routellm_metrics(router),
              "savings": savings(router), "quality_targets": report["quality_targets"]}
    out = ROOT / "bench" / "results" / "route-eval.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(report["tolerance_sweep"], out.with_suffix(".png"))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
