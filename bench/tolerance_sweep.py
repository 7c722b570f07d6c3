"""How the balanced policy trades expected quality for energy, by tolerance.

For the 200-prompt mixed workload (bench/workload.py), with the H200 curves
(curves/h200) and the quality table, computes for each tolerance the expected
energy of `auto` against always-large and its expected quality ratio. These
are *expected* figures from the curves (source: estimate from nvml-fitted
curves), not measurements; bench/gpu_routing.py measures the default.

    python -m bench.tolerance_sweep  ->  bench/results/tolerance-sweep.json (+ .png)
"""

from __future__ import annotations

import json
from pathlib import Path

from app.catalog import load_catalog
from app.routing import LengthBook, build_router
from bench.workload import mixed_prompts
from router.decision import Query
from router.features import estimate_tokens

ROOT = Path(__file__).resolve().parent.parent
TOLERANCES = [0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5]


def main() -> None:
    base = load_catalog(ROOT / "deploy" / "models.gpu.yaml")
    prompts = [t for _, t in mixed_prompts(200)]
    rows = []
    for tol in TOLERANCES:
        catalog = base.model_copy(update={"routing": base.routing.model_copy(update={
            "tolerance": tol, "direct_max_tokens": 64, "cot_max_tokens": 192})})
        router = build_router(catalog, LengthBook(None))
        auto_j = large_j = auto_q = large_q = 0.0
        small = 0
        for text in prompts:
            q = Query(text, estimate_tokens(text))
            d = router.decide(q)
            probs = d.category_probabilities
            cands = {c.spec.key: c for c in router.policy.candidates(probs, q.prompt_tokens,
                                                                     None, {})}
            chosen = cands[f"{d.tier}:{d.strategy}"]
            auto_j += chosen.expected_joules or 0.0
            auto_q += chosen.expected_quality
            large_j += cands["large:direct"].expected_joules or 0.0
            large_q += cands["large:direct"].expected_quality
            small += d.tier == "small"
        rows.append({"tolerance": tol, "savings_vs_large": 1 - auto_j / large_j,
                     "quality_ratio_vs_large": auto_q / large_q, "to_small": small / len(prompts)})
    out = ROOT / "bench" / "results" / "tolerance-sweep.json"
    out.write_text(json.dumps({"source": "estimate (H200 nvml curves, concurrency 1)",
                               "answer_tokens": {"direct": 64, "cot": 192},
                               "n": len(prompts), "rows": rows}, indent=2) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["quality_ratio_vs_large"] for r in rows], [r["savings_vs_large"] for r in rows],
            "o-")
    for r in rows:
        ax.annotate(f"tol {r['tolerance']:.2f}",
                    (r["quality_ratio_vs_large"], r["savings_vs_large"]), fontsize=7)
    ax.set(xlabel="expected quality / always-large", ylabel="expected energy saved vs large",
           title="balanced policy by tolerance (estimate from H200 curves)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
