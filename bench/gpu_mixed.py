"""One GPU under mixed load: what the operating curves miss.

Both tiers' llama-servers on one device, as the replays run them; closed
loops of `ks` clients on the small model and `kl` on the large one, sent to
the workers directly (no gateway, no router), each point of GRID held for
`--seconds` after a warm-up. Per point: the device counter's joules, each
model's completions and seconds per request, the joules per request, and
what the operating curves predict for the same completions, each model at
its own concurrency as if it ran alone. Their ratio is what the curves,
measured one model at a time in lock-step batches, cannot see: two
processes time-slicing the device, batch sizes between the calibrated ones,
arrivals staggered as a closed loop makes them, prefill landing in the
middle of other requests' decoding. Each request's prompt starts with its
own number, so no slot reuses another's cached prompt.

    python3 bench/gpu_mixed.py --llama-server BIN --models-dir DIR --out DIR
        [--small llama-1b --large llama-8b --curves-dir curves/h200 --seconds 8
         --source nvml]   ->  DIR/gpu-mixed.json (+ .png)

On the device: `bash bench/run_h200_mixed.sh` (setup, then the grid at 6 s
a point, ~5 min).

`--prompts WORKLOAD` (app/tools/workload.py, e.g. chat-traffic) gives each
request the workload's next prompt instead of the two fixed lengths, as the
routing replays send them (`fixed,chat-traffic`: both in turn, one set of
workers); `--via-gateway` sends every request through a
joulegate gateway on the same workers (`model: small` / `large`, the
replays' catalogue), so a point measured both ways says what the gateway
itself changes; `--name` names the result file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import httpx

from app.factory import Seams
from app.tools.embedded import run_gateway
from app.tools.workload import WORKLOADS
from bench.gpu_common import engine_build, project_commit, write_json
from bench.gpu_routing import Setup, catalog_for, setup_of, setup_parser, workers_running
from router.curves import Curve

# (clients on the small model, clients on the large one): each alone at 1-8,
# then mixes of eight and of four, both ways
GRID = [(0, 1), (0, 2), (0, 4), (0, 8), (1, 0), (2, 0), (4, 0), (8, 0),
        (1, 7), (2, 6), (4, 4), (6, 2), (7, 1), (1, 3), (2, 2), (3, 1)]
SENTENCE = "The committee reviewed the quarterly figures and asked for a summary. "
PROMPT_SENTENCES = {"short": 10, "long": 70}  # ~150 and ~1,000 words
ANSWER_TOKENS = 64
WARM_S = 2.0


async def _point(ks: int, kl: int, prompts: list[str], seconds: float, reader: Any,
                 urls: dict[str, str], named: bool = False) -> dict[str, Any]:
    """`ks` + `kl` closed-loop clients for WARM_S + `seconds`, the counter's
    joules over the last `seconds`, and each model's completions in that
    window: every request counts for the share of its time inside it (a
    request of 5 s, where the window is 6, is never whole inside it)."""
    counter = iter(range(10**9))
    window: dict[str, float] = {}
    done: dict[str, list[tuple[float, float, int]]] = {"small": [], "large": []}
    failed: dict[str, list[str]] = {"small": [], "large": []}
    stop_at = time.monotonic() + WARM_S + seconds

    async def client(http: httpx.AsyncClient, tier: str) -> None:
        url = urls[tier]
        misses = 0
        while time.monotonic() < stop_at and misses < 3:  # a worker refusing: stop asking
            t0 = time.monotonic()
            n = next(counter)
            body: dict[str, Any] = {
                "messages": [{"role": "user", "content": f"{n}. {prompts[n % len(prompts)]}"}],
                "max_tokens": ANSWER_TOKENS, "ignore_eos": True}
            if named:
                body["model"] = tier
            try:
                r = await http.post(url, json=body, timeout=600)
                r.raise_for_status()
                prompt_tokens = int(r.json()["usage"]["prompt_tokens"])
            except (httpx.HTTPError, KeyError, ValueError) as exc:
                misses += 1
                failed[tier].append(f"{type(exc).__name__}: {str(exc)[:120]}")
                continue
            misses = 0
            done[tier].append((t0, time.monotonic(), prompt_tokens))

    async def meter() -> None:
        await asyncio.sleep(WARM_S)
        e0, window["start"] = reader.read().counter_j, time.monotonic()
        await asyncio.sleep(seconds)
        window["end"] = time.monotonic()
        window["joules"] = reader.read().counter_j - e0

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=32)) as http:
        await asyncio.gather(meter(), *(client(http, "small") for _ in range(ks)),
                             *(client(http, "large") for _ in range(kl)))
    lo, hi = window["start"], window["end"]
    out: dict[str, Any] = {"clients": {"small": ks, "large": kl}, "seconds": round(hi - lo, 3),
                           "joules": round(window["joules"], 2),
                           "watts": round(window["joules"] / (hi - lo), 1),
                           "failed": {t: len(f) for t, f in failed.items()},
                           "first_failure": {t: f[0] for t, f in failed.items() if f}}
    total = 0.0
    for tier, rows in done.items():
        inside = [(max(0.0, min(t1, hi) - max(t0, lo)) / (t1 - t0), t1 - t0, p)
                  for t0, t1, p in rows if t1 > lo and t0 < hi and t1 > t0]
        share = sum(f for f, _, _ in inside)
        total += share
        out[tier] = {"completed": round(share, 2),
                     "seconds_per_request": round(sum(d for _, d, _ in inside) / len(inside), 3)
                     if inside else None,
                     "prompt_tokens": round(sum(p for _, _, p in inside) / len(inside))
                     if inside else None}
    out["joules_per_request"] = round(window["joules"] / total, 2) if total else None
    return out


def predicted(point: dict[str, Any], curves: dict[str, Curve]) -> float:
    """The curves' joules for the point's completions, each model at its own
    concurrency, as if it ran alone."""
    total = 0.0
    for tier, curve in curves.items():
        row, k = point[tier], point["clients"][tier]
        if row["completed"]:
            total += row["completed"] * curve.joules(row["prompt_tokens"], ANSWER_TOKENS, k)
    return total


def plot(path: Path, result: dict[str, Any]) -> None:
    """Joules per request by the clients on each model (a grid per prompt
    length), each cell with the measured over the curves' figure; below,
    each model alone: joules per request by its clients, measured and as the
    curves say."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(result["points"])
    fig, axes = plt.subplots(2, len(shapes), figsize=(5.5 * len(shapes), 8.6), squeeze=False)
    for ax, shape in zip(axes[1], shapes, strict=True):
        for tier, color in (("small", "tab:orange"), ("large", "tab:blue")):
            other = "large" if tier == "small" else "small"
            alone = sorted((p["clients"][tier], p["joules_per_request"],
                            p["curves_joules"] / p[tier]["completed"])
                           for p in result["points"][shape]
                           if p["clients"][tier] and not p["clients"][other]
                           and p["joules_per_request"] and p[tier]["completed"])
            if alone:
                ks, measured, curves = zip(*alone, strict=True)
                ax.plot(ks, measured, "o-", color=color, label=f"{tier}: measured")
                ax.plot(ks, curves, "x--", color=color, label=f"{tier}: the curves")
        ax.set_xlabel("clients on one model alone")
        ax.set_ylabel(f"J per request ({result['source']})")
        if ax.lines:
            ax.set_yscale("log")
            ax.legend(fontsize=8)
        ax.set_title(f"{shape} prompts: each model alone", fontsize=9)
    for ax, shape in zip(axes[0], shapes, strict=True):
        grid = [[float("nan")] * 9 for _ in range(9)]
        for p in result["points"][shape]:
            ks, kl = p["clients"]["small"], p["clients"]["large"]
            if p["joules_per_request"] is not None:
                grid[kl][ks] = p["joules_per_request"]
                ratio = p["measured_over_curves"]
                ax.text(ks, kl, f"{p['joules_per_request']:.0f}\n" +
                        (f"x{ratio:.2f}" if ratio else ""), ha="center", va="center",
                        fontsize=7, bbox={"facecolor": "white", "alpha": 0.7, "lw": 0})
        im = ax.imshow(grid, origin="lower", cmap="viridis_r")
        ax.set_xlabel("clients on the small model")
        ax.set_ylabel("clients on the large model")
        ax.set_title(f"{shape} prompts: J per request "
                     f"({result['source']}; x measured / curves)", fontsize=9)
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def prompt_sets(workloads: str) -> dict[str, list[str]]:
    """The prompts of each shape: for `fixed` (or nothing) the two fixed
    lengths, for a workload's name its prompts; comma-separated, in turn.
    ValueError for a name that is neither."""
    out: dict[str, list[str]] = {}
    for name in (workloads or "fixed").split(","):
        if name == "fixed":
            out.update({shape: [SENTENCE * k] for shape, k in PROMPT_SENTENCES.items()})
        elif name in WORKLOADS:
            out[name] = [t[:6000] for _, t in WORKLOADS[name](200)]
        else:
            raise ValueError(f"unknown prompts {name!r}: fixed or one of {', '.join(WORKLOADS)}")
    return out


def run(s: Setup, seconds: float, grid: list[tuple[int, int]], sets: dict[str, list[str]],
        workloads: str = "", gateway: str = "", name: str = "gpu-mixed") -> dict[str, Any]:
    """The grid for each prompt set (`prompt_sets(workloads)`), to the workers
    or through `gateway` (a running joulegate's URL)."""
    from telemetry.devices import DeviceSpec, make_reader

    reader = make_reader(DeviceSpec("gpu0", "localhost", s.source, 0, None, 65, 10))
    curves = {tier: Curve.from_json(json.loads((s.curves_dir / f"{shape}.json").read_text()))
              for tier, shape in s.shapes.items()}
    urls = {tier: f"{gateway}/v1/chat/completions" if gateway
            else f"http://127.0.0.1:{port}/v1/chat/completions" for tier, port in s.ports.items()}
    points: dict[str, list[dict[str, Any]]] = {}
    path = s.out / f"{name}.json"
    for shape, prompts in sets.items():
        points[shape] = []
        for ks, kl in grid:
            p = asyncio.run(_point(ks, kl, prompts, seconds, reader, urls, bool(gateway)))
            expected = predicted(p, curves)
            p["curves_joules"] = round(expected, 2)
            p["measured_over_curves"] = round(p["joules"] / expected, 3) if expected else None
            points[shape].append(p)
            print(shape, ks, kl, p["joules_per_request"], p["measured_over_curves"], flush=True)
            # each point as it ends: a call cut off by its time limit keeps them
            write_json(path.with_suffix(".partial.json"), {"points": points})
    result = {"device": reader.name, "source": reader.source,
              "engine_build": engine_build(s.llama_server), "commit": project_commit(),
              "models": s.shapes, "curves": str(s.curves_dir), "answer_tokens": ANSWER_TOKENS,
              "seconds_per_point": seconds, "warm_up_s": WARM_S,
              "prompts": workloads or "fixed",
              "fixed_prompts": "short ~150 and long ~1,000 words, numbered (tokens as the engine "
                                "counts them: each point's prompt_tokens)",
              "path": "through a joulegate gateway (forced tiers)" if gateway
              else "to the workers directly",
              "units": {"joules": "J, device counter delta over the window (gross)",
                        "measured_over_curves": "the window's joules over the curves' "
                                                "prediction for the same completions"},
              "points": points}
    write_json(path, result)
    plot(path.with_suffix(".png"), result)
    return result


def main() -> None:
    ap = setup_parser()
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--grid", default="", help="points as ks:kl,ks:kl (default: GRID)")
    ap.add_argument("--prompts", default="",
                    help="comma-separated: `fixed` (the two fixed lengths, the default) "
                         f"and workloads' prompts ({', '.join(WORKLOADS)}), in turn")
    ap.add_argument("--via-gateway", action="store_true",
                    help="through a joulegate gateway on the same workers")
    ap.add_argument("--name", default="gpu-mixed", help="the result file's name")
    args = ap.parse_args()
    try:  # before the workers start
        sets = prompt_sets(args.prompts)
    except ValueError as exc:
        ap.error(f"--prompts: {exc}")
    grid = [(int(a), int(b)) for a, b in (p.split(":") for p in args.grid.split(","))] \
        if args.grid else GRID
    s = setup_of(args)
    with workers_running(s), contextlib.ExitStack() as more:
        gateway = more.enter_context(run_gateway(
            catalog_for(s, with_curves=True), Seams(), first_byte_timeout_seconds=600,
            between_chunks_timeout_seconds=600)).url if args.via_gateway else ""
        run(s, args.seconds, grid, sets, args.prompts, gateway, args.name)


if __name__ == "__main__":
    main()
