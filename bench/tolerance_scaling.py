"""How `routing.full_tolerance_from` was chosen: for each value, the router
with its quality targets calibrated again (build_router does it when the
value differs from the report's), its easy/hard recall at 0.95 on the
complexity model's own training prompts (router/data/open_prompts.tsv and
difficulty_prompts.tsv: what the choice may look at), and its expected
saving on the reference workload (chat-traffic, H200 curves, an estimate).
The held-out sets are bench.route_eval's, and are not read here.

    python -m bench.tolerance_scaling  ->  bench/results/tolerance-scaling.json
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from app.catalog import load_catalog
from app.routing import LengthBook, build_router
from app.tools.complexity_training import own_items
from app.tools.workload import WORKLOADS
from bench.gpu_common import project_commit
from bench.route_eval import tier_recall, workload_savings

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("JOULEGATE_DATA", ROOT.parent / "shared" / "data"))
VALUES = (0.0, 0.5, 0.6, 0.7, 0.8)
TARGET = 0.95


def main() -> None:
    base = load_catalog(ROOT / "deploy" / "models.gpu.yaml")
    training = [it for name in ("open_prompts.tsv", "difficulty_prompts.tsv")
                for it in own_items(ROOT / "router" / "data" / name)]
    reference = WORKLOADS["chat-traffic"](400, DATA)
    rows = []
    for value in VALUES:
        catalog = base.model_copy(update={"routing": base.routing.model_copy(
            update={"full_tolerance_from": value})})
        router = build_router(catalog, LengthBook(None))
        recall = tier_recall(router, training, TARGET)
        saved = workload_savings(router, reference, TARGET)
        rows.append({"full_tolerance_from": value,
                     "tolerance_at_target": router.targets.tolerance(TARGET),
                     "training_easy_to_small": recall["easy_to_small"],
                     "training_hard_to_large": recall["hard_to_large"],
                     "reference_quality_ratio_vs_large": saved["quality_ratio_vs_large"],
                     "reference_energy_saved_vs_large": saved["energy_saved_vs_large"]})
        print(rows[-1])
    out = ROOT / "bench" / "results" / "tolerance-scaling.json"
    out.write_text(json.dumps({
        "commit": project_commit(), "quality_target": TARGET,
        "source": "estimate (H200 curves x expected lengths; the router's expected quality)",
        "training_prompts": len(training), "reference_prompts": len(reference),
        "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
