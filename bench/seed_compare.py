"""The seeds' reproductions side by side (issue 28): no measuring here, only
the result files of bench/seed_shots.py and bench/seed_energy.py read back.

  seed-cpu-gpu-shots.json/.png   seed 003: every seed-shots-<where>.json (this
                                 machine's CPU, the GPU host's CPU, the H200):
                                 time, energy with its source, answer tokens,
                                 pass@1, three-shot over zero-shot, and which
                                 greedy answers are identical between devices
  seed-energy-by-kind.png        seed 000: per kind, the token and energy
                                 multipliers against `general`, measured over
                                 the token-linear and the curve predictions,
                                 loop rate

    python -m bench.seed_compare
"""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("zero_shot", "three_shot")


def load_shots(results: Path) -> dict[str, dict[str, Any]]:
    return {p.stem.removeprefix("seed-shots-"): json.loads(p.read_text())
            for p in sorted(results.glob("seed-shots-*.json"))}


def identity(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Per mode: of the problems both runs answered, how many answers match."""
    out: dict[str, Any] = {}
    for m in MODES:
        ha, hb = a["modes"][m]["answers_sha1"], b["modes"][m]["answers_sha1"]
        both = sorted(set(ha) & set(hb))
        same = [t for t in both if ha[t] == hb[t]]
        out[m] = {"compared": len(both), "identical": len(same),
                  "identical_share": round(len(same) / len(both), 4) if both else None,
                  "differing": [t for t in both if ha[t] != hb[t]]}
    return out


def shots_summary(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    devices = {}
    for where, r in runs.items():
        modes = {m: {k: r["modes"][m][k] for k in ("wall_s", "energy_gross_j", "energy_net_j",
                                                   "energy_source", "prompt_tokens",
                                                   "answer_tokens", "pass_at_1")}
                 for m in MODES}
        devices[where] = {"device": r["device"], "source": r["source"], "commit": r["commit"],
                          "engine_build": r["engine_build"], "threads": r.get("threads"),
                          "problems": r["problems"], "modes": modes,
                          "three_shot_vs_zero_shot": r["three_shot_vs_zero_shot"]}
    pairs = {f"{a} vs {b}": identity(runs[a], runs[b]) for a, b in combinations(runs, 2)}
    gpu = next((w for w in runs if runs[w]["source"] == "nvml"), None)
    vs_gpu: dict[str, Any] = {}
    if gpu is not None:
        for where, r in runs.items():
            if where == gpu:
                continue
            vs_gpu[where] = {m: {
                "time_saved_on_gpu": round(1 - runs[gpu]["modes"][m]["wall_s"]
                                           / r["modes"][m]["wall_s"], 4),
                "energy_saved_on_gpu": round(1 - runs[gpu]["modes"][m]["energy_gross_j"]
                                             / r["modes"][m]["energy_gross_j"], 4)
                if r["modes"][m]["energy_gross_j"] else None,
                "sources": f"{runs[gpu]['source']} vs {r['source']}"} for m in MODES}
    from bench.gpu_common import project_commit

    return {"commit": project_commit(), "inputs": [f"seed-shots-{w}.json" for w in runs],
            "runs": devices, "identity": pairs, "gpu_vs_cpu": vs_gpu,
            "units": {"wall_s": "s", "energy_*": "J (each run's own source: nvml on the "
                      "GPU; estimate or rapl on a CPU)", "*_saved_*": "fraction"}}


def plot_shots(path: Path, summary: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = summary["runs"]
    names = list(runs)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    width = 0.38
    for j, m in enumerate(MODES):
        xs = [i + (j - 0.5) * width for i in range(len(names))]
        for ax, key, scale in ((axes[0], "energy_gross_j", 1.0), (axes[1], "wall_s", 1.0),
                               (axes[2], "answer_tokens", 1.0)):
            ax.bar(xs, [runs[n]["modes"][m][key] * scale for n in names], width,
                   label=m.replace("_", "-"))
    labels = [f"{n}\n({runs[n]['source']})" for n in names]
    for ax, title in zip(axes, ("energy, J (gross; log)", "wall time, s (log)",
                                "answer tokens"), strict=True):
        ax.set_xticks(range(len(names)), labels, fontsize=8)
        ax.set_title(title)
        ax.legend(fontsize=8)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    fig.suptitle("Seed 003 with SmolLM2-135M: zero-shot vs three-shot HumanEval, CPU vs GPU")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_kinds(path: Path, energy: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(energy["by_kind"])
    k = energy["by_kind"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    width = 0.38
    xs = range(len(kinds))
    axes[0].bar([x - width / 2 for x in xs], [k[n]["token_multiplier"] or 0 for n in kinds],
                width, label="token multiplier")
    axes[0].bar([x + width / 2 for x in xs], [k[n]["energy_multiplier"] or 0 for n in kinds],
                width, label="energy multiplier")
    axes[0].set_title("against `general` (per request)")
    for j, key in enumerate(("measured_over_token_linear", "measured_over_curve_alone")):
        axes[1].bar([x + (j - 0.5) * width for x in xs],
                    [k[n]["predictions"][key] or 0 for n in kinds], width,
                    label=key.replace("measured_over_", "measured / "))
    axes[1].axhline(1.0, color="k", lw=0.8)
    axes[1].set_title("measured over predicted")
    axes[2].bar(xs, [k[n]["loop_rate"] or 0 for n in kinds], color="tab:red")
    axes[2].set_title("loop-guard stops (share of requests)")
    axes[2].set_ylim(0, 1)
    for ax in axes:
        ax.set_xticks(list(xs), [n.replace("_", "\n") for n in kinds], fontsize=8)
    for ax in axes[:2]:
        ax.legend(fontsize=8)
    fig.suptitle(f"Seed 000 with SmolLM2-135M ({energy['source']}, {energy['device']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    runs = load_shots(RESULTS)
    if runs:
        summary = shots_summary(runs)
        (RESULTS / "seed-cpu-gpu-shots.json").write_text(json.dumps(summary, indent=2) + "\n")
        plot_shots(RESULTS / "seed-cpu-gpu-shots.png", summary)
        print("seed-cpu-gpu-shots:", {p: {m: v[m]["identical_share"] for m in MODES}
                                      for p, v in summary["identity"].items()})
    energy_file = RESULTS / "seed-energy-by-kind.json"
    if energy_file.exists():
        plot_kinds(energy_file.with_suffix(".png"), json.loads(energy_file.read_text()))
        print("seed-energy-by-kind.png written")


if __name__ == "__main__":
    main()
