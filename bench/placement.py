"""Packed vs spread placement (issue 32, item 3): two replicas of one model on
one device, a burst at concurrency 8 and 16, through the gateway with the
backend's placement `marginal_joules` (packing up to max_batch = the burst's
concurrency) or `least_outstanding` (spreading), in turns (ABAB). Energy is
the device counter's delta over each run (gross: idle included), with its
source; speed is each request's seconds per answer token (its latency over
its tokens, queueing included), p50 and p99, and the run's wall time.
`--bound S` adds a third arm, `bounded`: packing with the backend's
`max_seconds_per_token: S` (the latency bound learned from each replica's
own answers, app/upstream/pace.py), in the same turns.

    # the H200 (bench/run_h200_session.sh carries what it needs)
    python -m bench.placement --llama-server /tmp/jg/bin/llama-server \\
        --model /tmp/jg/models/llama-8b.gguf --curve curves/h200/llama-8b.json \\
        --source nvml --out bench/results
    # this machine (the CPU test shapes; the `estimate` or `rapl` source; one
    # thread per replica: two replicas' default threads oversubscribe 2 cores)
    python -m bench.placement --threads 1 --requests 32 --tokens 64 [--bound 0.05]

Results: placement-<source>.json and .png under --out.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from app.catalog import Catalog, parse_catalog
from app.factory import Seams
from app.tools.embedded import free_port, run_gateway
from bench.gpu_common import (
    engine_build,
    per_token_figures,
    project_commit,
    start_llama,
    timed_post,
    write_json,
)
from telemetry.devices import DeviceSpec, make_reader

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ("marginal_joules", "least_outstanding")
LABEL = {"marginal_joules": "packed", "least_outstanding": "spread"}
# an arm: its label, the backend's placement and its max_seconds_per_token
Arm = tuple[str, str, float | None]


def catalog(ports: list[int], curve: Path, source: str, max_batch: int) -> Catalog:
    return parse_catalog({
        "base_dir": str(ROOT), "tiers": ["large"],
        "devices": [{"name": "dev0", "source": source, "index": 0}],
        "backends": [{
            "name": "model", "kind": "llamacpp", "tier": "large", "model": "model",
            "curves": str(curve), "max_batch": max_batch,
            "replicas": [{"url": f"http://127.0.0.1:{p}", "device": "dev0",
                          "max_concurrency": 16} for p in ports]}],
        "routing": {"lengths_file": None},
    })


def with_policy(c: Catalog, policy: str, bound: float | None = None) -> Catalog:
    return c.model_copy(update={"backends": [
        b.model_copy(update={"placement": policy, "max_seconds_per_token": bound})
        for b in c.backends]})


async def burst(v1: str, n: int, concurrency: int, tokens: int, reader: Any
                ) -> dict[str, Any]:
    sem = asyncio.Semaphore(concurrency)
    per_token: list[float] = []
    replicas: Counter[str] = Counter()
    failed: Counter[str] = Counter()

    async def one(client: httpx.AsyncClient, i: int) -> None:
        async with sem:
            got = await timed_post(client, v1 + "/chat/completions", {
                "model": "large", "max_tokens": tokens, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"Request {i}: write on."}]}, {}, failed)
            if got is not None:
                per_token.append(got[1])
                replicas[got[0].headers.get("x-joulegate-placement", "one").split(":")[0]] += 1

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=64)) as client:
        await asyncio.sleep(1.0)
        e0, t0 = reader.read().counter_j, time.monotonic()
        await asyncio.gather(*(one(client, i) for i in range(n)))
        wall = time.monotonic() - t0
        await asyncio.sleep(0.3)  # the counter steps past the end
        joules = reader.read().counter_j - e0
    return {"joules": joules, "wall_s": wall, "answered": len(per_token),
            "joules_per_request": joules / max(1, len(per_token)),
            **per_token_figures(per_token), "replicas": dict(replicas), "failed": dict(failed)}


def mean_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("joules", "wall_s", "joules_per_request", "s_per_token_p50", "s_per_token_p99")
    out: dict[str, Any] = {k: statistics.fmean(r[k] for r in runs) for k in keys
                           if all(r[k] is not None for r in runs)}
    out["joules_runs"] = [r["joules"] for r in runs]
    out["replicas_first_run"] = runs[0]["replicas"]
    out["failed"] = dict(sum((Counter(r["failed"]) for r in runs), Counter()))
    return out


def plot(path: Path, results: dict[str, Any], source: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(results)
    labels = [a for a in ("packed", "spread", "bounded") if a in results[keys[0]]]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / len(labels)
    for j, label in enumerate(labels):
        xs = [i + (j - (len(labels) - 1) / 2) * width for i in range(len(keys))]
        axes[0].bar(xs, [results[k][label]["joules_per_request"] for k in keys],
                    width, label=label)
        axes[1].bar(xs, [1000 * results[k][label]["s_per_token_p99"] for k in keys],
                    width, label=label)
    for ax, label in zip(axes, (f"J per request ({source}, gross)",
                                "p99 ms per answer token"), strict=True):
        ax.set_xticks(range(len(keys)), [k.replace("c", "concurrency ") for k in keys])
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle("Two replicas on one device: packed vs spread")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", default=None, help="default: the project's CPU build")
    ap.add_argument("--model", type=Path, default=None, help="default: the tiny-large shape")
    ap.add_argument("--curve", type=Path, default=ROOT / "curves" / "cpu" / "large-llamacpp.json")
    ap.add_argument("--source", default="auto")
    ap.add_argument("--concurrency", default="8,16")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--ctx-per-slot", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU threads per replica (a CPU run: 1 each, so two replicas "
                         "do not oversubscribe two cores)")
    ap.add_argument("--bound", type=float, default=None,
                    help="a third arm: packing within max_seconds_per_token BOUND")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    arms: list[Arm] = [(LABEL[p], p, None) for p in POLICIES]
    if args.bound is not None:
        arms.append(("bounded", "marginal_joules", args.bound))
    from workers.local import llama_server, model_path

    binary = args.llama_server or str(llama_server())
    model = args.model or model_path("tiny-large")
    reader = make_reader(DeviceSpec("dev0", "localhost", args.source, 0, None, 65, 10))
    logs = Path(tempfile.mkdtemp(prefix="joulegate-placement-"))
    ports = [free_port(), free_port()]
    procs = [start_llama(binary, str(model), p, 16, args.ctx_per_slot, logs / f"r{i}.log",
                         args.threads) for i, p in enumerate(ports)]
    results: dict[str, Any] = {}
    try:
        for conc in (int(c) for c in args.concurrency.split(",")):
            base = catalog(ports, args.curve, args.source, conc)
            runs: dict[str, list[dict[str, Any]]] = {a[0]: [] for a in arms}
            # each turn starts one arm later (AB BA, ABC BCA ...): drift falls on all
            order = [arms[(t + k) % len(arms)] for t in range(args.turns)
                     for k in range(len(arms))]
            for label, policy, bound in order:
                with run_gateway(with_policy(base, policy, bound), Seams(),
                                 first_byte_timeout_seconds=600) as gw:
                    runs[label].append(asyncio.run(
                        burst(gw.v1, args.requests, conc, args.tokens, reader)))
            means = {label: mean_runs(r) for label, r in runs.items()}
            packed, spread = means["packed"], means["spread"]
            results[f"c{conc}"] = {
                "order": [a[0] for a in order], **means,
                "packed_over_spread_joules": packed["joules"] / spread["joules"],
                "packed_over_spread_p99": packed["s_per_token_p99"] / spread["s_per_token_p99"]}
            if "bounded" in means:
                results[f"c{conc}"]["bounded_over_packed_joules"] = (
                    means["bounded"]["joules"] / packed["joules"])
                results[f"c{conc}"]["bounded_over_packed_p99"] = (
                    means["bounded"]["s_per_token_p99"] / packed["s_per_token_p99"])
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    source = reader.source
    write_json(args.out / f"placement-{source}.json", {
        "device": reader.name, "source": source, "engine_build": engine_build(binary),
        "commit": project_commit(), "model": str(Path(model).name),
        "curve": str(args.curve.relative_to(ROOT) if args.curve.is_relative_to(ROOT)
                     else args.curve),
        "setup": {"replicas": 2, "slots_per_replica": 16, "requests": args.requests,
                  "threads_per_replica": args.threads or "the engine's default",
                  "answer_tokens": args.tokens, "turns_per_policy": args.turns,
                  "packed": "placement marginal_joules, max_batch = the concurrency",
                  "spread": "placement least_outstanding",
                  **({"bounded": f"placement marginal_joules, max_batch = the concurrency, "
                                 f"max_seconds_per_token {args.bound}"}
                     if args.bound is not None else {})},
        "units": {"joules": f"J, {source} counter delta over the run (gross, idle included)",
                  "s_per_token": "s per answer token per request, client-side, queueing "
                                 "included"},
        **results})
    plot(args.out / f"placement-{source}.png", results, source)
    for k, r in results.items():
        print(f"{k}: packed/spread joules {r['packed_over_spread_joules']:.3f}, "
              f"p99 s/token {r['packed_over_spread_p99']:.3f}")


if __name__ == "__main__":
    main()
