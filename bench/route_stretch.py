"""How the complexity model's easy stretch was chosen: on a validation
split of the project's own open prompts, never on a set the router is judged on.

    python -m bench.route_stretch     # bench/results/route-stretch.json

The own open prompts (router/data/open_prompts.tsv) are split 75/25 (seed 5);
for each stretch the complexity model is trained on the 75% (with the RouteLLM
items and difficulty_prompts.tsv, as `joulegate train-complexity` does) and
its quality targets calibrated on the chat-traffic workload; then the 25% are
routed at the default target (0.95) with the H200 curves. Reported: easy
prompts sent small, hard prompts sent large, their mean (balanced accuracy,
the criterion), and the expected savings on the chat-traffic workload. The
factor with the best balanced accuracy (ties: the smaller) is shipped as
`EASY_STRETCH` in app/tools/complexity_training.py. The ranking (APGR) does
not depend on it; the levels, and so each query's quality gap, do.
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path
from typing import Any

import app.tools.complexity_training as training
from app.catalog import Catalog, load_catalog
from app.routing import LengthBook, build_router
from app.tools.workload import chat_traffic
from bench.gpu_common import project_commit
from bench.route_eval import DATA, ROOT, tier_recall, workload_savings

STRETCHES = (1.0, 2.0, 3.0, 4.0, 5.0)
TARGET = 0.95


def _split(folder: Path) -> tuple[Path, Path]:
    lines = [x for x in (ROOT / "router" / "data" / "open_prompts.tsv").read_text().splitlines()
             if x and not x.startswith("#")]
    random.Random(5).shuffle(lines)
    val, train = lines[: len(lines) // 4], lines[len(lines) // 4:]
    (folder / "train.tsv").write_text("\n".join(train) + "\n")
    (folder / "val.tsv").write_text("\n".join(val) + "\n")
    return folder / "train.tsv", folder / "val.tsv"


def one(stretch: float, catalog: Catalog, train: Path, val: Path, out: Path) -> dict[str, Any]:
    training.train_complexity(DATA, [ROOT / "router" / "data" / "difficulty_prompts.tsv", train],
                              catalog, out, easy_stretch=stretch)
    routed = catalog.model_copy(update={"routing": catalog.routing.model_copy(
        update={"complexity": str(out / "complexity.npz"), "lengths_file": None})})
    router = build_router(routed, LengthBook(None))
    recall = tier_recall(router, training.own_items(val), TARGET)
    return {"stretch": stretch, **recall,
            "balanced_accuracy": round((recall["easy_to_small"] + recall["hard_to_large"]) / 2, 4),
            "chat_traffic": workload_savings(router, chat_traffic(400, DATA), TARGET)}


def main() -> None:
    catalog = load_catalog(ROOT / "deploy" / "models.gpu.yaml")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        train, val = _split(Path(tmp))
        for stretch in STRETCHES:
            rows.append(one(stretch, catalog, train, val, Path(tmp) / str(stretch)))
            print(json.dumps(rows[-1]), flush=True)
    best = max(rows, key=lambda r: (r["balanced_accuracy"], -r["stretch"]))
    result = {"commit": project_commit(), "target": TARGET, "split": "own open prompts 75/25, "
              "seed 5", "curves": "H200 (deploy/models.gpu.yaml)", "rows": rows,
              "chosen": best["stretch"]}
    out = ROOT / "bench" / "results" / "route-stretch.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"chosen stretch {best['stretch']} (app/tools/complexity_training.py ships "
          f"{training.EASY_STRETCH}); wrote {out}")


if __name__ == "__main__":
    main()
