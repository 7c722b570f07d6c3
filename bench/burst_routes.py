"""Which requests `auto` sends small when clients arrive together: the
decisions of the H200 replay's gateway (the H200 curves, both tiers on one
GPU, quality target 0.95) from a cold start at concurrency 1, 2, 4 and 8,
with this machine's CPU llama.cpp workers (random-weight tiny models) in
place of the GPU's. It records decisions only: the energy is the replay's
(bench/gpu_routing.py on a GPU).

    python -m bench.burst_routes [--n 96] [--concurrency 1,2,4,8] [--pricing share]
                                 [--workload long-documents]
        ->  bench/results/burst-routes-<pricing>[-<workload>].json

`--pricing margin` (this bench's default; the gateway's is `pairs`): a
request joining a batch at the margin, x2 beside another model; `share`: at
its share of the batch it makes, no penalty; `prompt`: by the prompt's
length between the two; `pairs`: `prompt`, with a request that finds at most
one in flight on its device priced at its share (router.pricing;
bench.gpu_routing's PRICINGS).

`--profile-from FILE` (a `gpu-loops-*.json` of bench/gpu_mixed.py): the 8B's
curve with the batch profile those closed loops measured (measured over the
curves at each count of clients, relative to one client; router/curves.py),
in a copy of the curves: what the profile would do to the decisions before
a GPU replay says what it saves (-> burst-routes-<pricing>-profile.json).

Each concurrency gets a fresh gateway (no memory of earlier traffic) and the
workload's first `n` prompts (chat-traffic unless told), sent by closed-loop clients. For
each request: its place in arrival order and the tier it went to; the
summary splits the small share between a burst's first 2 x concurrency
arrivals and the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import httpx

from app.tools.embedded import run_gateway
from app.tools.workload import WORKLOADS
from bench.gpu_common import profiled_curves, project_commit
from bench.gpu_routing import PRICINGS, QUALITY_TARGET, Setup, catalog_for
from workers.local import WorkerSpec, llama_server, start_worker, stop

ROOT = Path(__file__).resolve().parent.parent
SHAPES = {"small": "llama-1b", "large": "llama-8b"}  # the curves the router prices with
TINY = {"small": "tiny-small", "large": "tiny-large"}  # the models that answer here


async def burst(v1: str, prompts: list[tuple[str, str]], concurrency: int
                ) -> list[dict[str, Any]]:
    """The prompts from `concurrency` closed-loop clients; each request's
    arrival place, kind and tier, in arrival order."""
    queue = list(prompts)
    placed: list[dict[str, Any]] = []

    async def client(http: httpx.AsyncClient) -> None:
        while queue:
            kind, text = queue.pop(0)
            row: dict[str, Any] = {"place": len(placed), "kind": kind}
            placed.append(row)
            try:
                r = await http.post(v1 + "/chat/completions", json={
                    "model": "auto", "messages": [{"role": "user", "content": text}]},
                    headers={"x-joulegate-quality-target": str(QUALITY_TARGET)}, timeout=300)
            except httpx.HTTPError as exc:  # counted as an error, the run goes on
                row["tier"] = f"error {type(exc).__name__}"
                continue
            row["tier"] = r.headers.get("x-joulegate-tier") if r.status_code == 200 \
                else f"error {r.status_code}"

    async with httpx.AsyncClient() as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    return placed


def summary(rows: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    head = 2 * concurrency

    def small_share(part: list[dict[str, Any]]) -> float | None:
        return round(sum(r["tier"] == "small" for r in part) / len(part), 3) if part else None

    return {"n": len(rows), "small_share": small_share(rows),
            f"small_share_first_{head}": small_share(rows[:head]),
            "small_share_after": small_share(rows[head:]),
            "small_at": [r["place"] for r in rows if r["tier"] == "small"],
            "errors": sum(str(r["tier"]).startswith("error") for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=96)
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--pricing", choices=list(PRICINGS), default="margin",
                    help="how load is priced (router.pricing)")
    ap.add_argument("--workload", choices=list(WORKLOADS), default="chat-traffic")
    ap.add_argument("--profile-from", type=Path,
                    help="a gpu-loops-*.json: the 8B's curve with the batch profile it measured")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    prompts = WORKLOADS[args.workload](args.n)
    curves_dir, profile = ROOT / "curves" / "h200", None
    if args.profile_from:
        curves_dir, profile = profiled_curves(curves_dir, args.profile_from.resolve(),
                                              SHAPES["large"])
    setup = Setup("", Path(), Path(), SHAPES, "estimate", curves_dir)
    catalog = catalog_for(setup, with_curves=True,
                          routing=PRICINGS[args.pricing])
    logs = Path(tempfile.mkdtemp(prefix="jg-burst-"))
    # 8,192 tokens a slot, as the GPU replay gives: a long-documents prompt is ~5,000
    # characters (more tokens than characters on these random vocabularies)
    workers = [start_worker(WorkerSpec(tier, TINY[tier], setup.ports[tier], parallel=8, ctx=65536),
                            llama_server(),
                            logs) for tier in SHAPES]
    results: dict[str, Any] = {}
    try:
        for c in levels:
            with run_gateway(catalog) as gw:
                rows = asyncio.run(burst(gw.v1, prompts, c))
            results[f"c={c}"] = {**summary(rows, c), "requests": rows}
            print(c, {k: v for k, v in results[f"c={c}"].items() if k != "requests"},
                  flush=True)
    finally:
        stop(workers)
    out = ROOT / "bench" / "results" / (
        f"burst-routes-{args.pricing}"
        f"{'' if args.workload == 'chat-traffic' else '-' + args.workload}"
        f"{'-profile' if profile else ''}.json")
    out.write_text(json.dumps({
        "commit": project_commit(), "workload": args.workload, "quality_target": QUALITY_TARGET,
        "catalogue": "the H200 replay's: llama-1b and llama-8b curves (curves/h200), one GPU",
        **({"batch_profile": profile} if profile else {}),
        "load_pricing": {"batch_pricing": catalog.routing.batch_pricing,
                         "colocation_penalty": catalog.routing.colocation_penalty,
                         "share_at_most_in_flight":
                             catalog.routing.share_at_most_in_flight},
        "workers": "this machine's CPU llama.cpp workers, random-weight tiny models",
        "measures": "decisions only (arrival place -> tier); no energy", **results},
        indent=1) + "\n")


if __name__ == "__main__":
    main()
