"""How the complexity model's easy stretch and own-item weight were chosen:
by cross-validation on the project's own open prompts, never on a set the
router is judged on.

    python -m bench.route_stretch     # bench/results/route-stretch.json

The own open prompts (router/data/open_prompts.tsv) are dealt into 4 folds
(seed 5), each validated once; for each stretch and weight of an own item
(RouteLLM MMLU items weigh 1, GSM8K 5) the complexity model is trained on
the other folds (with the RouteLLM
items and difficulty_prompts.tsv, as `joulegate train-complexity` does) and
its quality targets calibrated on the chat-traffic workload; then the fold is
routed at the default target (0.95) with the H200 curves. Reported: easy
prompts sent small, hard prompts sent large, their mean (balanced accuracy,
the criterion), and the expected savings on the chat-traffic workload. The
pair with the best balanced accuracy (ties: the smaller stretch, then the
smaller weight) is shipped as `EASY_STRETCH` and `SOURCE_WEIGHT["own"]` in
app/tools/complexity_training.py. The ranking (APGR) does
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

STRETCHES = (2.0, 3.0, 4.0)
OWN_WEIGHTS = (5.0, 15.0, 40.0)
TARGET = 0.95
FOLDS = 4


def _folds(folder: Path) -> list[tuple[Path, Path]]:
    """(train, validation) files of each fold: the own open prompts shuffled
    (seed 5) and dealt into FOLDS parts, each validated once."""
    lines = [x for x in (ROOT / "router" / "data" / "open_prompts.tsv").read_text().splitlines()
             if x and not x.startswith("#")]
    random.Random(5).shuffle(lines)
    out = []
    for k in range(FOLDS):
        val = lines[k::FOLDS]
        train = [x for j, x in enumerate(lines) if j % FOLDS != k]
        (folder / f"train{k}.tsv").write_text("\n".join(train) + "\n")
        (folder / f"val{k}.tsv").write_text("\n".join(val) + "\n")
        out.append((folder / f"train{k}.tsv", folder / f"val{k}.tsv"))
    return out


def one(stretch: float, weight: float, catalog: Catalog, folds: list[tuple[Path, Path]],
        traffic_prompts: list[tuple[str, str]], out: Path) -> dict[str, Any]:
    """Pooled recall over every fold's validation items, and the mean of the
    folds' RouteLLM held-out APGR and chat-traffic figures."""
    easy = hard = n_easy = n_hard = 0.0
    apgr: dict[str, list[float]] = {}
    traffic: list[dict[str, Any]] = []
    for k, (train, val) in enumerate(folds):
        report = training.train_complexity(
            DATA, [ROOT / "router" / "data" / "difficulty_prompts.tsv", train], catalog,
            out / str(k), easy_stretch=stretch, own_weight=weight)
        routed = catalog.model_copy(update={"routing": catalog.routing.model_copy(
            update={"complexity": str(out / str(k) / "complexity.npz"), "lengths_file": None})})
        router = build_router(routed, LengthBook(None))
        recall = tier_recall(router, training.own_items(val), TARGET)
        easy += recall["easy_to_small"] * recall["n_easy"]
        hard += recall["hard_to_large"] * recall["n_hard"]
        n_easy += recall["n_easy"]
        n_hard += recall["n_hard"]
        for source, ev in report["evaluation_held_out"].items():
            apgr.setdefault(source, []).append(ev["apgr"])
        traffic.append(workload_savings(router, traffic_prompts, TARGET))
    e, h = easy / n_easy, hard / n_hard
    return {"stretch": stretch, "own_weight": weight,
            "easy_to_small": round(e, 4), "hard_to_large": round(h, 4),
            "n_easy": int(n_easy), "n_hard": int(n_hard),
            "balanced_accuracy": round((e + h) / 2, 4),
            "routellm_held_out_apgr": {s: round(sum(v) / len(v), 4) for s, v in apgr.items()},
            "chat_traffic_mean_of_folds": {
                key: round(sum(t[key] for t in traffic) / len(traffic), 4)
                for key in ("quality_ratio_vs_large", "energy_saved_vs_large",
                            "trivial_to_small")}}


def main() -> None:
    catalog = load_catalog(ROOT / "deploy" / "models.gpu.yaml")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folds, prompts = _folds(Path(tmp)), chat_traffic(400, DATA)
        for weight in OWN_WEIGHTS:
            for stretch in STRETCHES:
                rows.append(one(stretch, weight, catalog, folds, prompts,
                                Path(tmp) / f"{weight}-{stretch}"))
                print(json.dumps(rows[-1]), flush=True)
    best = max(rows, key=lambda r: (r["balanced_accuracy"], -r["stretch"], -r["own_weight"]))
    result = {"commit": project_commit(), "target": TARGET,
              "split": f"own open prompts, {FOLDS}-fold cross-validation (seed 5), recall "
                       "pooled over the folds",
              "curves": "H200 (deploy/models.gpu.yaml)", "rows": rows,
              "chosen": {"stretch": best["stretch"], "own_weight": best["own_weight"]}}
    out = ROOT / "bench" / "results" / "route-stretch.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"chosen stretch {best['stretch']}, own weight {best['own_weight']} "
          f"(app/tools/complexity_training.py ships {training.EASY_STRETCH}, "
          f"{training.SOURCE_WEIGHT['own']}); wrote {out}")


if __name__ == "__main__":
    main()
