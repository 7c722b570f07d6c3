"""The energy report as a picture: joules per request by category against
answer tokens per request, each relative to the reference category."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_report(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cats = [(c, f) for c, f in report["by_category"].items()
            if f["token_multiplier"] is not None]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = [c for c, _ in cats]
    x = range(len(cats))
    left.bar([i - 0.2 for i in x], [f["token_multiplier"] for _, f in cats], 0.4,
             label="answer tokens per request")
    left.bar([i + 0.2 for i in x], [f["energy_multiplier"] for _, f in cats], 0.4,
             label="gross joules per request")
    left.set_xticks(list(x), names, rotation=30, fontsize=8)
    left.set_ylabel(f"x the reference ({report['reference_category']})")
    left.legend(fontsize=8)
    left.set_title("energy vs tokens, by category")
    preds = [(c, f["predictions"]) for c, f in report["by_category"].items()]
    right.bar([i - 0.27 for i in range(len(preds))],
              [p["measured_gross_j"] for _, p in preds], 0.27, label="measured")
    right.bar(list(range(len(preds))), [p["token_linear_j"] for _, p in preds], 0.27,
              label="tokens x constant")
    right.bar([i + 0.27 for i in range(len(preds))],
              [p["curve_alone_j"] or 0 for _, p in preds], 0.27, label="curve, alone")
    right.set_xticks(list(range(len(preds))), [c for c, _ in preds], rotation=30, fontsize=8)
    sources = ", ".join(report["totals"]["sources"])
    right.set_ylabel(f"gross joules ({sources})")
    right.legend(fontsize=8)
    right.set_title("three predictions of the same requests")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
