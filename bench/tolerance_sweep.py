"""How the balanced policy trades expected quality for energy, by quality target.

For the 200-prompt mixed workload (bench/workload.py), with the H200 curves
(curves/h200) and the router's per-query expected qualities, computes for
each quality target (x-joulegate-quality-target; each has its calibrated
per-query tolerance, router/targets.py) the expected energy of `auto`
against always-large and its expected quality ratio. (`routing.tolerance`,
the relative tolerance, applies only without a complexity model.) These
are *expected* figures from the curves (source: estimate from nvml-fitted
curves), not measurements; bench/gpu_routing.py measures the default.

    python -m bench.tolerance_sweep  ->  bench/results/tolerance-sweep.json (+ .png)
"""

from __future__ import annotations

import json
from pathlib import Path

from app.catalog import load_catalog
from app.routing import LengthBook, build_router
from bench.gpu_common import project_commit
from bench.workload import mixed_prompts
from router.decision import Query
from router.features import estimate_tokens

ROOT = Path(__file__).resolve().parent.parent
TARGETS = [0.8, 0.85, 0.9, 0.95, 0.97, 0.99, 1.0]


def main() -> None:
    base = load_catalog(ROOT / "deploy" / "models.gpu.yaml")
    prompts = [t for _, t in mixed_prompts(200)]
    rows = []
    catalog = base.model_copy(update={"routing": base.routing.model_copy(update={
        "direct_max_tokens": 64, "cot_max_tokens": 192})})
    router = build_router(catalog, LengthBook(None))
    for target in TARGETS:
        auto_j = large_j = auto_q = large_q = 0.0
        small = 0
        for text in prompts:
            q = Query(text, estimate_tokens(text), quality_target=target)
            d = router.decide(q)  # its candidates: this request's qualities and prices
            cands = {f"{c['tier']}:{c['strategy']}": c for c in d.candidates}
            large = cands["large:direct"]
            auto_j += d.expected_joules or 0.0
            auto_q += d.expected_quality or 0.0
            large_j += large["expected_joules"] or 0.0
            large_q += large["expected_quality"]
            small += d.tier == "small"
        rows.append({"quality_target": target, "savings_vs_large": 1 - auto_j / large_j,
                     "quality_ratio_vs_large": auto_q / large_q, "to_small": small / len(prompts)})
    out = ROOT / "bench" / "results" / "tolerance-sweep.json"
    out.write_text(json.dumps({"commit": project_commit(),
                               "source": "estimate (H200 nvml curves, concurrency 1)",
                               "answer_tokens": {"direct": 64, "cot": 192},
                               "n": len(prompts), "rows": rows}, indent=2) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["quality_ratio_vs_large"] for r in rows], [r["savings_vs_large"] for r in rows],
            "o-")
    for r in rows:
        ax.annotate(f"target {r['quality_target']:.2f}",
                    (r["quality_ratio_vs_large"], r["savings_vs_large"]), fontsize=7)
    ax.set(xlabel="expected quality / always-large", ylabel="expected energy saved vs large",
           title="balanced policy by quality target (estimate, H200 curves)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
