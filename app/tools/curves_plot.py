"""`joulegate curves plot`: draw operating curves (and their measurements) to PNG."""

from __future__ import annotations

from pathlib import Path

from router.curves import Curve


def plot_curves(curves: list[Curve], out: Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # plotting is optional at run time
        raise SystemExit("joulegate curves plot needs matplotlib (pip install matplotlib)") \
            from exc
    profiled = [c for c in curves if c.batch_profile]
    fig, axes = plt.subplots(1, 3 if profiled else 2, figsize=(18 if profiled else 12, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, curve in enumerate(curves):
        color = colors[i % len(colors)]
        meas = curve.fit.get("measurements", [])
        conc = sorted({m["concurrency"] for m in meas}) or [1]
        prompts = sorted({m["prompt_tokens"] for m in meas}) or [256]
        comps = sorted({m["completion_tokens"] for m in meas}) or [256]
        if curve.batch_profile:  # the profile's factor by concurrency
            ns = [n for n, _ in curve.batch_profile]
            axes[2].plot(ns, [f for _, f in curve.batch_profile], "o-", color=color,
                         label=curve.model)
        for n, style in zip(sorted({conc[0], conc[-1]}), ("-", "--"), strict=False):
            p_mid = prompts[len(prompts) // 2]
            xs = [c for c in range(max(1, min(comps)), max(comps) + 1, max(1, max(comps) // 60))]
            axes[0].plot(xs, [curve.joules(p_mid, c, n) / c for c in xs], style, color=color,
                         label=f"{curve.model} n={n} (P={p_mid})")
            pts = [m for m in meas if m["concurrency"] == n and m["prompt_tokens"] == p_mid]
            axes[0].scatter([m["completion_tokens"] for m in pts],
                            [m["joules"] / max(1, m["completion_tokens"]) for m in pts],
                            color=color, s=12)
            c_mid = comps[len(comps) // 2]
            xp = [p for p in range(max(1, min(prompts)), max(prompts) + 1,
                                   max(1, max(prompts) // 60))]
            axes[1].plot(xp, [curve.joules(p, c_mid, n) / c_mid for p in xp], style,
                         color=color, label=f"{curve.model} n={n} (C={c_mid})")
            pts = [m for m in meas if m["concurrency"] == n and m["completion_tokens"] == c_mid]
            axes[1].scatter([m["prompt_tokens"] for m in pts],
                            [m["joules"] / max(1, m["completion_tokens"]) for m in pts],
                            color=color, s=12)
    src = ", ".join(sorted({f"{c.device} ({c.source})" for c in curves}))
    axes[0].set(xlabel="completion tokens", ylabel="joules per output token",
                title=f"vs completion length - {src}")
    axes[1].set(xlabel="prompt tokens", ylabel="joules per output token",
                title="vs prompt length")
    for ax in axes[:2]:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    if profiled:
        axes[2].axhline(1.0, color="grey", lw=0.8)
        axes[2].set(xlabel="requests running at once (n)",
                    ylabel="measured / the form's joules",
                    title="batch profile (calibrated at more than two n)")
        axes[2].grid(True, alpha=0.3)
        axes[2].legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
