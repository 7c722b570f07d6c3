"""Evaluate the router like the field does, with controls, and what it saves.

    python -m bench.route_eval     # bench/results/route-eval.json and route-eval.png

1. RouteLLM's metrics (APGR, CPT(50%), CPT(80%)) on the held-out RouteLLM
   MMLU and GSM8K items (the same seeded split `joulegate train-complexity`
   holds out; never trained on), scored by the shipped router itself (its
   fast path, as in production), next to random (APGR 0.5) and RouteLLM's
   best published routers.
2. Controls (app/tools/controls.py): on those sets and on the held-out open
   prompts (router/data/open_eval.tsv), the complexity score's APGR next to
   the category prior alone, length alone, random, shuffled labels and random
   features.
3. Easy/hard recall on the held-out open prompts at targets 0.90, 0.95 and
   0.99: easy ones sent to the small tier, hard ones to the large; the same
   on the chat-traffic workload's own prompts (router/data/traffic_prompts.tsv,
   also never trained on), each prompt once; and on the stop-51 probe
   (router/data/probe_stop51.tsv: not held out, it found misroutes that were
   then fixed) and the stop-52, stop-53 and stop-60 probes (router/data/
   probe_stop52.tsv, probe_stop53.tsv, probe_stop60.tsv: held out, nothing
   trained on them).
4. Expected energy saved against always-large at those targets on both
   workloads (app/tools/workload.py: chat-traffic, the reference, and the
   benchmark mix), with the H200 curves (deploy/models.gpu.yaml) and the
   router's per-query expected qualities: an expectation from the model, not
   a measurement (the H200 replay is). On chat-traffic, also the share of its
   easy (trivial) requests sent small, and the quality kept at 0.95 on
   samples of 200 to 3,000 (does the calibrated tolerance hold off its sample).
5. The thinking pair (deploy/models.thinking.yaml): the budgets its router
   gives the workload's held-out easy and hard prompts.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from app.catalog import load_catalog
from app.routing import LengthBook, build_router
from app.tools.complexity_training import (
    ROUTELLM_BEST,
    Item,
    apgr_cpt,
    load_items,
    own_items,
    split,
)
from app.tools.controls import controls
from app.tools.workload import TRIVIAL_SHARE, WORKLOADS
from bench.gpu_common import project_commit
from router.decision import Query
from router.features import estimate_tokens

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("JOULEGATE_DATA", ROOT.parent / "shared" / "data"))
OWN = [ROOT / "router" / "data" / "difficulty_prompts.tsv",
       ROOT / "router" / "data" / "open_prompts.tsv"]
OPEN_EVAL = ROOT / "router" / "data" / "open_eval.tsv"
TRAFFIC = ROOT / "router" / "data" / "traffic_prompts.tsv"
PROBE = ROOT / "router" / "data" / "probe_stop51.tsv"
PROBE_52 = ROOT / "router" / "data" / "probe_stop52.tsv"
PROBE_53 = ROOT / "router" / "data" / "probe_stop53.tsv"
PROBE_60 = ROOT / "router" / "data" / "probe_stop60.tsv"
TARGETS = (0.90, 0.95, 0.99)


def routellm_metrics(router: Any) -> dict[str, Any]:
    items = load_items(DATA, OWN)
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


def tier_recall(router: Any, items: list[Item], target: float) -> dict[str, Any]:
    """Easy items sent to the cheapest tier, hard ones to the largest; and
    the shares behind them: easy ones the small model answers with a chain of
    thought (small, but dearer than direct), hard ones it answers directly
    (what the label says falls short; the rest of the hard ones sent small
    get its chain of thought)."""
    small, large = router.tiers
    sent: Counter[tuple[bool, str, str]] = Counter()
    for it in items:
        d = router.decide(Query(it.text, estimate_tokens(it.text), quality_target=target),
                          explain=False)
        sent[(it.hard, d.tier, d.strategy)] += 1

    def share(hard: bool, tier: str, strategy: str | None = None) -> float:
        n = sum(v for (h, t, s), v in sent.items() if h == hard and t == tier
                and strategy in (None, s))
        return round(n / max(1, sum(v for (h, _, _), v in sent.items() if h == hard)), 4)

    return {"easy_to_small": share(False, small), "hard_to_large": share(True, large),
            "easy_to_small_cot": share(False, small, "cot"),
            "hard_to_small_direct": share(True, small, "direct"),
            "n_easy": sum(v for (h, _, _), v in sent.items() if not h),
            "n_hard": sum(v for (h, _, _), v in sent.items() if h)}


def workload_savings(router: Any, prompts: list[tuple[str, str]], target: float
                     ) -> dict[str, Any]:
    """Expected quality and energy against always-large (direct) at `target`."""
    quality = large_q = energy = large_e = 0.0
    actions: Counter[str] = Counter()
    trivial: Counter[str] = Counter()
    for kind, text in prompts:
        d = router.decide(Query(text, estimate_tokens(text), quality_target=target))
        large = next(c for c in d.candidates if c["tier"] == router.tiers[1]
                     and c["strategy"] == "direct")
        quality += d.expected_quality
        energy += d.expected_joules
        large_q += large["expected_quality"]
        large_e += large["expected_joules"]
        actions[f"{d.tier}:{d.strategy}"] += 1
        if kind.endswith(":easy"):
            trivial[d.tier] += 1
    row: dict[str, Any] = {"quality_ratio_vs_large": round(quality / large_q, 4),
                           "energy_saved_vs_large": round(1 - energy / large_e, 4),
                           "actions": dict(actions)}
    if trivial:
        row["trivial_to_small"] = round(trivial[router.tiers[0]] / sum(trivial.values()), 4)
    return row


def savings(router: Any, n: int = 400) -> dict[str, Any]:
    out: dict[str, Any] = {"curves": "H200 (deploy/models.gpu.yaml)",
                           "source": "estimate (curves x expected lengths; the router's "
                                     "expected quality)",
                           "trivial_share_declared": round(TRIVIAL_SHARE, 4)}
    for name, make in WORKLOADS.items():
        prompts = make(n, DATA)
        out[name] = {"n": len(prompts), "by_target": {
            str(t): workload_savings(router, prompts, t) for t in (*TARGETS, 1.0)}}
    return out


def sample_sizes(router: Any) -> dict[str, float]:
    """The chat-traffic workload's expected quality kept at 0.95 on stratified
    samples of several sizes: a tolerance calibrated on one sample holds on
    another (an expectation: the router's own expected qualities)."""
    make = WORKLOADS["chat-traffic"]
    return {str(n): workload_savings(router, make(n, DATA), 0.95)["quality_ratio_vs_large"]
            for n in (200, 400, 600, 3000)}


def thinking_budgets(traffic: list[Item]) -> dict[str, Any]:
    """The thinking pair (deploy/models.thinking.yaml) at its default target:
    the budgets its router gives the workload's held-out easy and hard prompts
    (0: no thinking), by tier."""
    router = build_router(load_catalog(ROOT / "deploy" / "models.thinking.yaml"),
                          LengthBook(None))
    out: dict[str, Any] = {}
    for hard in (False, True):
        given: Counter[str] = Counter()
        for it in (i for i in traffic if i.hard == hard):
            d = router.decide(Query(it.text, estimate_tokens(it.text)), explain=False)
            given[f"{d.tier}:{d.thinking_budget or 0}"] += 1
        out["hard" if hard else "easy"] = dict(sorted(given.items()))
    return out


def plot(sweep: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([100 * (1 - s["energy_saved"]) for s in sweep],
            [s["quality_ratio"] for s in sweep], marker=".")
    ax.set_xlabel("expected energy, % of always-large (H200 curves)")
    ax.set_ylabel("expected quality / always-large")
    ax.set_title("joulegate auto: per-query tolerance sweep (chat-traffic workload)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    catalog = load_catalog(ROOT / "deploy" / "models.gpu.yaml")
    router = build_router(catalog, LengthBook(None))
    assert router.model is not None, "no complexity model: run joulegate train-complexity"
    report = json.loads((ROOT / "router" / "artifacts" / "complexity-report.json").read_text())
    held_open, traffic, probe = own_items(OPEN_EVAL), own_items(TRAFFIC), own_items(PROBE)
    probe_52, probe_53, probe_60 = own_items(PROBE_52), own_items(PROBE_53), own_items(PROBE_60)
    result = {"commit": project_commit(), "routellm_held_out": routellm_metrics(router),
              "controls_apgr": controls(DATA, OWN, OPEN_EVAL, catalog),
              "open_eval_recall": {str(t): tier_recall(router, held_open, t) for t in TARGETS},
              "traffic_prompts_recall": {str(t): tier_recall(router, traffic, t)
                                         for t in TARGETS},
              "probe_stop51_recall": {str(t): tier_recall(router, probe, t) for t in TARGETS},
              "probe_stop52_recall": {str(t): tier_recall(router, probe_52, t)
                                      for t in TARGETS},
              "probe_stop53_recall": {str(t): tier_recall(router, probe_53, t)
                                      for t in TARGETS},
              "probe_stop60_recall": {str(t): tier_recall(router, probe_60, t)
                                      for t in TARGETS},
              "savings": savings(router), "quality_targets": report["quality_targets"],
              "chat_traffic_quality_at_0.95_by_sample_size": sample_sizes(router),
              "thinking_pair_budgets": thinking_budgets(traffic)}
    out = ROOT / "bench" / "results" / "route-eval.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(report["tolerance_sweep"], out.with_suffix(".png"))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
