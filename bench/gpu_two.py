"""Routing and placement on two GPUs (issue 32, item 4; the `nvidia-h200-x2`
kind): what the one-H200 runs could not show, since there both models shared
one GPU and waking the second cost about twice its curve.

Two layouts, each a run of its own (`--layout`), the real-traffic workload
(app/tools/workload.py, chat-traffic) at concurrency 1, 8 and 32:

  split      the 1B on GPU 0, the 8B on GPU 1: `auto` (quality target 0.95)
             vs always-large, in turns (ABBA at c >= 8)
  two-large  an 8B replica on each GPU: always-large packed (placement
             marginal_joules, max_batch 8: the curves' measured range) vs
             spread (least_outstanding), in turns

Energy is the sum of both GPUs' counters over each run (gross: both GPUs'
idle included, also the one a mode leaves idle), with the source; per
request; p50/p99 seconds per answer token (client-side, queueing included);
expected quality as in bench/gpu_routing.py (the router's per-query levels of
the action taken). Each worker sees one GPU (CUDA_VISIBLE_DEVICES).

    python3 -m bench.gpu_two --layout split --llama-server BIN --models-dir DIR --out DIR
    # this CPU, a smoke run of the code (the test shapes, the labelled estimate
    # for both "GPUs"; nothing of it is a result):
    python3 -m bench.gpu_two --layout split --source estimate --small tiny-small \\
        --large tiny-large --models-dir ~/.cache/joulegate/models --n 8 --concurrency 1,8

-> gpu-two-<layout>.json and .png under --out.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.catalog import Catalog, parse_catalog
from app.factory import Seams
from app.tools.embedded import free_port, run_gateway
from app.tools.workload import KIND_SHARE, WORKLOADS
from bench.gpu_common import (
    ROOT,
    engine_build,
    per_token_figures,
    project_commit,
    start_llama,
    timed_post,
    write_json,
)
from bench.gpu_routing import COT_TOKENS, DIRECT_TOKENS, QUALITY_TARGET, _body
from telemetry.devices import DeviceSpec, make_reader

MAX_BATCH = 8  # the H200 curves were measured up to 8 at once
LAYOUTS = {"split": ("auto", "large"), "two-large": ("packed", "spread")}


@dataclass(frozen=True)
class Worker:
    tier: str
    shape: str
    gpu: int
    port: int


class Summed:
    """Both GPUs' energy counters as one (the sum of their readings)."""

    def __init__(self, readers: list[Any]) -> None:
        self.readers = readers
        self.source = "+".join(sorted({r.source for r in readers}))
        self.name = " + ".join(r.name for r in readers)

    def read_j(self) -> float:
        return float(sum(r.read().counter_j for r in self.readers))


def workers_for(layout: str, small: str, large: str) -> list[Worker]:
    if layout == "split":
        return [Worker("small", small, 0, free_port()), Worker("large", large, 1, free_port())]
    return [Worker("large", large, 0, free_port()), Worker("large", large, 1, free_port())]


def catalog_for(workers: list[Worker], source: str, curves_dir: Path, placement: str
                ) -> Catalog:
    shipped = yaml.safe_load((ROOT / "models.yaml").read_text())
    backends: dict[str, dict[str, Any]] = {}
    for w in workers:
        b = backends.setdefault(w.tier, {
            "name": w.shape, "kind": "llamacpp", "tier": w.tier, "model": w.shape,
            "curves": str(curves_dir / f"{w.shape}.json"), "placement": placement,
            "max_batch": MAX_BATCH, "replicas": []})
        b["replicas"].append({"url": f"http://127.0.0.1:{w.port}", "device": f"gpu{w.gpu}"})
    tiers = [t for t in ("small", "large") if t in backends]
    return parse_catalog({
        "tiers": tiers, "base_dir": str(ROOT),
        "devices": [{"name": f"gpu{g}", "source": source, "index": g}
                    for g in sorted({w.gpu for w in workers})],
        "backends": list(backends.values()),
        "quality": {cat: {a: q for a, q in row.items() if a.split(":")[0] in tiers}
                    for cat, row in shipped["quality"].items()},
        "routing": {**shipped["routing"], "lengths_file": None,
                    "direct_max_tokens": DIRECT_TOKENS, "cot_max_tokens": COT_TOKENS},
    })


async def run_mode(v1: str, meter: Summed, mode: str, prompts: list[str], concurrency: int,
                   quality: list[dict[str, float]]) -> dict[str, Any]:
    """One pass of every prompt: energy of both GPUs, latency per answer token,
    the actions taken and their expected quality."""
    sem = asyncio.Semaphore(concurrency)
    per_token: list[float] = []
    routes: Counter[str] = Counter()
    placed: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    expected: list[float] = []
    body_mode = "auto" if mode == "auto" else "large"
    headers = {"x-joulegate-quality-target": str(QUALITY_TARGET)} if mode == "auto" else {}

    async def one(client: httpx.AsyncClient, i: int, text: str) -> None:
        async with sem:
            got = await timed_post(client, v1 + "/chat/completions", _body(body_mode, text),
                                   headers, failed)
            if got is None:
                return
            r, seconds = got
            per_token.append(seconds)
            act = f"{r.headers['x-joulegate-tier']}:{r.headers['x-joulegate-strategy']}"
            routes[act] += 1
            placed[r.headers.get("x-joulegate-placement", "replica 0").split(":")[0]] += 1
            expected.append(quality[i].get(act, float("nan")))

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=64)) as client:
        await asyncio.sleep(1.0)
        e0, t0 = meter.read_j(), time.monotonic()
        await asyncio.gather(*(one(client, i, t) for i, t in enumerate(prompts)))
        wall = time.monotonic() - t0
        await asyncio.sleep(0.3)  # the counters step past the end
        joules = meter.read_j() - e0
    n = len(per_token)
    return {"joules": joules, "wall_s": wall, "answered": n,
            "joules_per_request": joules / max(1, n), **per_token_figures(per_token),
            "expected_quality": statistics.fmean(expected) if expected else None,
            "routes": dict(routes), "replicas": dict(placed), "failed": dict(failed)}


def merged(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("joules", "wall_s", "joules_per_request", "s_per_token_p50", "s_per_token_p99",
            "expected_quality")
    out: dict[str, Any] = {k: statistics.fmean(r[k] for r in runs) for k in keys
                           if all(r[k] is not None for r in runs)}
    out["joules_runs"] = [r["joules"] for r in runs]
    for k in ("routes", "replicas", "failed"):
        out[k] = dict(sum((Counter(r[k]) for r in runs), Counter()))
    out["answered"] = sum(r["answered"] for r in runs)
    return out


def turns(a: str, b: str, concurrency: int) -> list[str]:
    """One run each alone (c=1 runs are long and steady), ABBA under load
    (short runs, where drift between runs is as large as the effect)."""
    return [a, b] if concurrency == 1 else [a, b, b, a]


def plot(path: Path, layout: str, results: dict[str, Any], source: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a, b = LAYOUTS[layout]
    keys = list(results)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.38
    for j, mode in enumerate((a, b)):
        xs = [i + (j - 0.5) * width for i in range(len(keys))]
        axes[0].bar(xs, [results[k]["modes"][mode]["joules_per_request"] for k in keys],
                    width, label=mode)
        axes[1].bar(xs, [1000 * (results[k]["modes"][mode].get("s_per_token_p99") or 0)
                         for k in keys], width, label=mode)
    for ax, label in zip(axes, (f"J per request, both GPUs ({source}, gross)",
                                "p99 ms per answer token"), strict=True):
        ax.set_xticks(range(len(keys)), [f"c={k[1:]}" for k in keys])
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle(f"Two GPUs, layout {layout}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", choices=list(LAYOUTS), required=True)
    ap.add_argument("--llama-server", default=None, help="default: the project's CPU build")
    ap.add_argument("--models-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--small", default="llama-1b")
    ap.add_argument("--large", default="llama-8b")
    ap.add_argument("--source", default="nvml")
    ap.add_argument("--curves-dir", type=Path, default=ROOT / "curves" / "h200")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    from workers.local import llama_server

    binary = args.llama_server or str(llama_server())
    args.out.mkdir(parents=True, exist_ok=True)
    workers = workers_for(args.layout, args.small, args.large)
    gpu = args.source == "nvml"
    procs = [start_llama(binary, str(args.models_dir / f"{w.shape}.gguf"), w.port, 32, 4096,
                         args.out / f"llama-{w.tier}-gpu{w.gpu}.log",
                         None if gpu else 1, {"CUDA_VISIBLE_DEVICES": str(w.gpu)})
             for w in workers]
    meter = Summed([make_reader(DeviceSpec(f"gpu{g}", "localhost", args.source, g, None, 65, 10))
                    for g in sorted({w.gpu for w in workers})])
    mix = WORKLOADS["chat-traffic"](args.n)
    prompts = [t[:6000] for _, t in mix]
    a, b = LAYOUTS[args.layout]
    policy = {"packed": "marginal_joules", "spread": "least_outstanding"}
    results: dict[str, Any] = {}
    try:
        cats = {m: catalog_for(workers, args.source, args.curves_dir,
                               policy.get(m, "marginal_joules")) for m in (a, b)}
        with run_gateway(cats[a], Seams(), first_byte_timeout_seconds=600) as gw:
            decisions = [httpx.post(gw.v1 + "/route", json={"model": "auto", "messages": [
                {"role": "user", "content": t}]}, headers={
                    "x-joulegate-quality-target": str(QUALITY_TARGET)}).json() for t in prompts]
        quality = [{f"{c['tier']}:{c['strategy']}": c["expected_quality"]
                    for c in d["candidates"]} for d in decisions]
        for conc in (int(c) for c in args.concurrency.split(",")):
            runs: dict[str, list[dict[str, Any]]] = {a: [], b: []}
            order = turns(a, b, conc)
            for mode in order:
                with run_gateway(cats[mode], Seams(), first_byte_timeout_seconds=600) as gw:
                    runs[mode].append(asyncio.run(
                        run_mode(gw.v1, meter, mode, prompts, conc, quality)))
            modes = {m: merged(rs) for m, rs in runs.items()}
            results[f"c{conc}"] = {
                "order": order, "modes": modes,
                f"{a}_over_{b}_joules": modes[a]["joules"] / modes[b]["joules"],
                f"{a}_over_{b}_quality": (modes[a].get("expected_quality") or 0)
                / (modes[b].get("expected_quality") or 1),
                f"{a}_over_{b}_p99": (modes[a].get("s_per_token_p99") or 0)
                / (modes[b].get("s_per_token_p99") or 1)}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    write_json(args.out / f"gpu-two-{args.layout}.json", {
        "device": meter.name, "source": meter.source, "engine_build": engine_build(binary),
        "commit": project_commit(), "layout": args.layout,
        "workers": [{"tier": w.tier, "model": f"random-weight {w.shape} shape, F16 GGUF",
                     "gpu": w.gpu} for w in workers],
        "workload": {"name": "chat-traffic", "n": len(prompts), "mix": KIND_SHARE,
                     "answer_tokens": {"direct": DIRECT_TOKENS, "cot": COT_TOKENS}},
        "quality_target": QUALITY_TARGET, "max_batch": MAX_BATCH,
        "modes": {"auto": "model auto, quality target 0.95", "large": "everything on the 8B",
                  "packed": "8B, placement marginal_joules", "spread":
                  "8B, placement least_outstanding"},
        "units": {"joules": f"J, both GPUs' {meter.source} counters over the run (gross)",
                  "s_per_token": "s per answer token per request, client-side, queueing "
                                 "included", "expected_quality": "expected (the router's "
                                 "per-query levels of the action taken)"},
        **results})
    plot(args.out / f"gpu-two-{args.layout}.png", args.layout, results, meter.source)
    for k, r in results.items():
        print(k, {m: round(v["joules"]) for m, v in r["modes"].items()},
              {f: round(v, 3) for f, v in r.items() if f.endswith(("joules", "p99"))})


if __name__ == "__main__":
    main()
