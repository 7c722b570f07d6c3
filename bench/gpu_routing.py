"""The H200 benchmark: real operating curves, and the energy routing saves.

Two phases, each resumable (a phase whose result file exists is skipped):

  calibrate  `joulegate calibrate` against the 1B and 8B models (prompts up to
             4k, completions up to 2k, concurrency 1 and 8) -> curves/h200/*.json
             and gpu-curves.json (held-out MAPE for requests >= 0.5 s, R2)
  replay     a workload (--workload: chat-traffic, the reference, or the
             benchmark mix; app/tools/workload.py) through the gateway in three modes: `auto`
             (quality target 0.95), everything on the large tier, everything on
             the small tier with CoT; at concurrency 1 and 8 -> gpu-routing.json.
             Quality: the router's per-query expected quality of the action each
             request took. A failed request is counted and reported, never fatal.
             -> gpu-routing-<workload>.json

Answers have fixed lengths (random-weight models never stop by themselves):
`ignore_eos` with max_tokens = the direct cap for direct answers and the CoT
cap for CoT answers (scaled down from the 200/600-token defaults to fit the
device-time budget; stated in the results). `--answers varied`: each request's
length drawn once (the same in every mode) from a log-normal of the same
mean, so that closed-loop clients do not run in lock-step rounds (a batch
that finishes together, and a burst from nothing in flight each round);
`auto` then sends each request's length as its max_tokens, which caps a CoT
answer as it caps a direct one (and the split's CoT answers are capped
alike; always-small-CoT's are three times the length) (-> ...-varied.json).

    python3 bench/gpu_routing.py --phase calibrate --llama-server BIN --models-dir DIR --out DIR
    python3 bench/gpu_routing.py --phase replay    --llama-server BIN --models-dir DIR --out DIR
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.catalog import Catalog, parse_catalog
from app.factory import Seams
from app.forward.rewrite import COT_INSTRUCTION
from app.tools.calibrate import Sweep, calibrate
from app.tools.embedded import RunningGateway, free_port, run_gateway
from app.tools.workload import KIND_SHARE, MIX, TRIVIAL_SHARE, WORKLOADS
from bench.gpu_common import (
    ROOT,
    engine_build,
    merge_runs,
    metered_run,
    plot_modes,
    profiled_curves,
    project_commit,
    start_llama,
    write_json,
)
from router.curves import Curve

QUALITY_TARGET = 0.95
DIRECT_TOKENS = 64
COT_TOKENS = 192
# --answers varied: a request's direct length is DIRECT_TOKENS x a log-normal
# factor of mean 1 (sigma ANSWER_SIGMA: a median ~0.73 of the mean, a tenth
# of answers over ~1.8x), within ANSWER_RANGE; its CoT length COT_TOKENS x it.
ANSWER_SIGMA = 0.8
ANSWER_RANGE = (8, 5 * DIRECT_TOKENS)


def tier_ports() -> dict[str, int]:
    """A free port for each tier's worker (fixed ones collided with another
    benchmark or test on the same machine)."""
    return {"small": free_port(), "large": free_port()}


@dataclass(frozen=True)
class Setup:
    llama_server: str
    models_dir: Path
    out: Path
    shapes: dict[str, str]  # tier -> model shape
    source: str
    curves_dir: Path
    ports: dict[str, int] = field(default_factory=tier_ports)  # tier -> its worker's


def catalog_for(s: Setup, with_curves: bool, routing: dict[str, Any] | None = None) -> Catalog:
    shipped = yaml.safe_load((ROOT / "models.yaml").read_text())
    backends = []
    for tier, shape in s.shapes.items():
        b: dict[str, Any] = {"name": shape, "kind": "llamacpp", "tier": tier, "model": shape,
                             "replicas": [{"url": f"http://127.0.0.1:{s.ports[tier]}",
                                           "device": "gpu0"}]}
        if with_curves:
            b["curves"] = str(s.curves_dir / f"{shape}.json")
        backends.append(b)
    return parse_catalog({
        "tiers": list(s.shapes),
        "devices": [{"name": "gpu0", "source": s.source, "index": 0}],
        "backends": backends,
        "quality": shipped["quality"],
        "routing": {**shipped["routing"], "lengths_file": None,
                    "direct_max_tokens": DIRECT_TOKENS, "cot_max_tokens": COT_TOKENS,
                    **(routing or {})},
        "base_dir": str(ROOT),
    })


@contextlib.contextmanager
def workers_running(s: Setup) -> Iterator[None]:
    """Each tier's llama-server for the block's length, stopped however it ends."""
    procs = [start_llama(s.llama_server, str(s.models_dir / f"{shape}.gguf"), s.ports[tier], 8,
                         8192, s.out / f"llama-{shape}.log")
             for tier, shape in s.shapes.items()]
    try:
        yield
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)


def _loo_mape(c: Curve) -> float:
    loo = c.fit["leave_one_out"]
    return float(loo["mape_long"] if loo["mape_long"] is not None else loo["mape"])


def phase_calibrate(s: Setup, sweep: Sweep, name: str = "gpu-curves") -> None:
    catalog = catalog_for(s, with_curves=False)
    curves = calibrate(catalog, sweep, s.curves_dir)
    from app.tools.curves_plot import plot_curves

    plot_curves(list(curves.values()), s.out / f"{name}.png")
    write_json(s.out / f"{name}.json", {
        "device": next(iter(curves.values())).device,
        "source": next(iter(curves.values())).source,
        "engine_build": engine_build(s.llama_server),
        "commit": project_commit(),
        "sweep": {"prompts": sweep.prompts, "completions": sweep.completions,
                  "concurrency": sweep.concurrency, "repeat": sweep.repeat},
        "mape_holdout": max(_loo_mape(c) for c in curves.values()),
        "r2_holdout": min(c.fit["leave_one_out"]["r2"] for c in curves.values()),
        "mape_holdout_definition": "leave-one-out: each measurement predicted by a fit "
                                   "without it; mean |predicted - measured| / measured over "
                                   "requests of >= 0.5 s; worst backend",
        "mape_random_split_25pct": {n: c.fit["holdout"] for n, c in curves.items()},
        "per_backend": {n: {"model": c.model, "coef": c.coef, "holdout": c.fit["holdout"],
                            "leave_one_out": c.fit["leave_one_out"],
                            "train": c.fit["train"], "points": c.fit["points"]}
                        for n, c in curves.items()},
        "units": {"joules": "J (gross: net + the request's share of idle)", "seconds": "s"},
    })


def answer_lengths(n: int, varied: bool, seed: int = 11) -> list[int] | None:
    """Each request's direct answer length under `--answers varied` (None:
    the fixed DIRECT_TOKENS): log-normal factors scaled to a mean of 1, drawn
    once, so every mode sends the same."""
    if not varied:
        return None
    rng = random.Random(seed)
    factors = [rng.lognormvariate(0.0, ANSWER_SIGMA) for _ in range(n)]
    mean = sum(factors) / n
    low, high = ANSWER_RANGE
    return [min(high, max(low, round(DIRECT_TOKENS * f / mean))) for f in factors]


def varied_caps(lengths: list[int] | None) -> dict[str, int]:
    """The routing caps that let every varied length through (none when fixed)."""
    if lengths is None:
        return {}
    return {"direct_max_tokens": ANSWER_RANGE[1],
            "cot_max_tokens": ANSWER_RANGE[1] * COT_TOKENS // DIRECT_TOKENS}


def _body(mode: str, text: str, unloaded: str = "", answer: int | None = None
          ) -> dict[str, Any]:
    """The request body of `mode`; `split` sends the action the router takes
    for this prompt with nothing running (`unloaded`, e.g. "small:cot") as a
    forced tier: routing by quality alone, blind to load. `answer`: this
    request's varied direct length (None: the fixed one)."""
    msgs: list[dict[str, str]] = [{"role": "user", "content": text}]
    direct = answer or DIRECT_TOKENS
    cot = direct * COT_TOKENS // DIRECT_TOKENS
    if mode == "split":
        if answer:  # as under auto, whose max_tokens caps a CoT answer too
            cot = answer
        mode = {"small:direct": "small", "small:cot": "small-cot"}.get(unloaded, "large")
    if mode == "small":
        return {"model": "small", "messages": msgs, "max_tokens": direct, "ignore_eos": True}
    if mode in AUTO:  # + the quality target header
        return {"model": "auto", "messages": msgs, "ignore_eos": True,
                **({"max_tokens": answer} if answer else {})}
    if mode == "large":
        return {"model": "large", "messages": msgs, "max_tokens": direct, "ignore_eos": True}
    return {"model": "small", "max_tokens": cot, "ignore_eos": True,
            "messages": [{"role": "system", "content": COT_INSTRUCTION}, *msgs]}


async def _mode(gw: RunningGateway, nvml: Any, mode: str, prompts: list[str],
                concurrency: int, quality: list[dict[str, float]], unloaded: list[str],
                answers: list[int] | None = None) -> dict[str, Any]:
    sem = asyncio.Semaphore(concurrency)
    routes: list[str] = []
    failures: list[str] = []
    expected: list[float] = []
    small_at: list[int] = []  # auto: the place in arrival order of each request sent small
    started = 0
    headers = {"x-joulegate-quality-target": str(QUALITY_TARGET)} if mode in AUTO else {}

    async def one(client: httpx.AsyncClient, i: int, text: str) -> None:
        nonlocal started
        async with sem:
            place, started = started, started + 1
            try:
                r = await client.post(gw.v1 + "/chat/completions",
                                      json=_body(mode, text, unloaded[i],
                                                 answers[i] if answers else None),
                                      headers=headers,
                                      timeout=600)
            except httpx.HTTPError as exc:
                failures.append(type(exc).__name__)
                return
            if r.status_code != 200:
                failures.append(str(r.status_code))
                return
            act = f"{r.headers['x-joulegate-tier']}:{r.headers['x-joulegate-strategy']}"
            if mode == "small-cot":
                act = "small:cot"
            elif mode == "split":
                act = unloaded[i]
            routes.append(act)
            expected.append(quality[i].get(act, float("nan")))
            if mode in AUTO and act.startswith("small:"):
                small_at.append(place)

    joules, wall = await metered_run(nvml, one, prompts)
    from collections import Counter

    return {"joules": joules, "wall_s": wall, "routes": dict(Counter(routes)),
            "failed": dict(Counter(failures)), "answered": len(routes),
            "expected_quality": sum(expected) / max(1, len(expected)),
            **({"small_at": sorted(small_at)} if mode in AUTO else {})}


# Modes in turns; at concurrency 8 (runs of ~20 s, where drift between runs is
# as large as the effect) auto and always-large twice each, ABBA.
WARMUP = 80  # requests of the unrecorded warm-up turn of a replay without c=1
ABBA = ("large", "auto", "small-cot", "auto", "large")
# The whole replay is c=1 and c=8; c=2 and c=4 (moderate overlapping load,
# where what a 1B batch beside an occasional 8B request costs is open) run
# only when asked for: `--concurrency 2,4`.
ORDERS = {1: ("auto", "large", "small-cot"), 8: ABBA}
EXTRA_ORDERS = {2: ABBA, 4: ABBA}
REPLAYABLE = {**ORDERS, **EXTRA_ORDERS}
# --split: is the router's load pricing right? `split` (each prompt to its
# unloaded action, blind to load) and `auto-<second>` (a second gateway on the
# same workers with the load pricing `--second` names: `share`, a joining
# request at its share of the batch and no co-location penalty, the default
# from 34a5aff to 83b3f8e; `margin`, x2, the default until 445b36e; `prompt`,
# the default from 20658a3 to 53047e9; `pairs`, prompt with a request that
# finds at most one in flight on its device priced at its share, router.pricing,
# the default since) against `auto` (as shipped) and always-large, in turns.
# The replays at 83b3f8e ran `auto` as share beside `auto-margin`; those at
# 20658a3 `auto` as margin beside `auto-prompt`.
PRICINGS: dict[str, dict[str, Any]] = {
    "margin": {"batch_pricing": "margin", "colocation_penalty": 1.0,
               "share_at_most_in_flight": 0},
    "share": {"batch_pricing": "share", "colocation_penalty": 0.0,
              "share_at_most_in_flight": 0},
    "prompt": {"batch_pricing": "prompt", "colocation_penalty": 1.0,
               "share_at_most_in_flight": 0},
    "pairs": {"batch_pricing": "prompt", "colocation_penalty": 1.0,
              "share_at_most_in_flight": 1},
    # not a pricing: the quality target's tolerance in full, as before 6687a29
    "fulltol": {"full_tolerance_from": 0.0}}
AUTO = ("auto", *(f"auto-{p}" for p in PRICINGS))


def split_order(second: str) -> tuple[str, ...]:
    return ("large", "auto", "split", f"auto-{second}", "split", "auto", "large")


def _compared(runs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """A concurrency's figures: auto's (and, where they ran, the split's and
    auto-share's) savings and expected quality against always-large."""
    def saving(mode: str, against: str) -> float:
        return 1 - float(runs[mode]["joules"]) / float(runs[against]["joules"])

    def quality(mode: str) -> float:
        return float(runs[mode]["expected_quality"]) / float(runs["large"]["expected_quality"])

    out = {"savings_vs_large": saving("auto", "large")}
    if "small-cot" in runs:
        out["savings_vs_small_cot"] = saving("auto", "small-cot")
    if "split" in runs:
        out |= {"split_savings_vs_large": saving("split", "large"),
                "split_savings_vs_auto": saving("split", "auto"),
                "split_quality_ratio_vs_large": quality("split")}
        for second in PRICINGS:
            if f"auto-{second}" in runs:
                out |= {f"{second}_savings_vs_large": saving(f"auto-{second}", "large"),
                        f"{second}_quality_ratio_vs_large": quality(f"auto-{second}")}
    out["quality_ratio_vs_large"] = quality("auto")
    return out


def replay_name(workload: str, concurrencies: tuple[int, ...], split: bool = False,
                profiled: bool = False, varied: bool = False) -> str:
    """gpu-routing-<workload>.json for the whole replay (c=1 and 8), with a
    suffix for a part of it (e.g. -c1: one request at a time only) and -split
    for the load-blind comparison, -profile where `auto` priced with a batch
    profile, -varied with varied answer lengths."""
    part = "" if set(concurrencies) == set(ORDERS) and not split else "-" + "-".join(
        f"c{c}" for c in concurrencies)
    return (f"gpu-routing-{workload}{part}{'-split' if split else ''}"
            f"{'-profile' if profiled else ''}{'-varied' if varied else ''}.json")


def curves_used(s: Setup) -> dict[str, dict[str, Any]]:
    """Which curves a gateway priced with: each shape's device, date and batch
    profile (a replay's result says whether its curves carried one)."""
    out: dict[str, dict[str, Any]] = {}
    for shape in sorted(set(s.shapes.values())):
        f = s.curves_dir / f"{shape}.json"
        if f.exists():
            c = json.loads(f.read_text())
            out[shape] = {k: c.get(k) for k in ("device", "date", "batch_profile")}
    return out


def phase_replay(s: Setup, n: int, workload: str,
                 concurrencies: tuple[int, ...] = tuple(ORDERS), split: bool = False,
                 second: str = "share", profile_from: Path | None = None,
                 varied: bool = False) -> None:
    """`profile_from` (a gpu-loops-*.json): `auto`'s 8B curve carries the batch
    profile those loops measured (router/curves.py); the second gateway's
    curves stay as they are, so `--split --second prompt` is the A/B of the
    profile (-> ...-profile.json). `varied`: answer lengths drawn per request
    (answer_lengths)."""
    from collections import Counter

    from telemetry.devices import DeviceSpec, make_reader

    profile = None
    first = s
    if profile_from is not None:
        copy, profile = profiled_curves(s.curves_dir, profile_from.resolve(), s.shapes["large"])
        first = replace(s, curves_dir=copy)
    mix = WORKLOADS[workload](n)  # ../shared/data, or JOULEGATE_DATA (the device: .data)
    prompts = [t[:6000] for _, t in mix]
    answers = answer_lengths(len(prompts), varied)
    caps = varied_caps(answers)
    catalog = catalog_for(first, with_curves=True, routing=caps)
    reader = make_reader(DeviceSpec("gpu0", "localhost", s.source, 0, None, 65, 10))
    results: dict[str, Any] = {}
    name = replay_name(workload, concurrencies, split, profile is not None, varied)
    timeouts = {"first_byte_timeout_seconds": 600, "between_chunks_timeout_seconds": 600}
    with run_gateway(catalog, Seams(), **timeouts) as gw, contextlib.ExitStack() as more:
        gateways = {f"auto-{second}": more.enter_context(run_gateway(
            catalog_for(s, with_curves=True, routing={**PRICINGS[second], **caps}), Seams(),
            **timeouts))
        } if split else {}
        decisions = [httpx.post(gw.v1 + "/route", json=_body(
            "auto", t, "", answers[i] if answers else None), headers={
                "x-joulegate-quality-target": str(QUALITY_TARGET)}).json()
            for i, t in enumerate(prompts)]
        acts = [f"{d['tier']}:{d['strategy']}" for d in decisions]
        by_kind: dict[str, Counter[str]] = {}
        for (kind, _), act in zip(mix, acts, strict=True):
            by_kind.setdefault(kind, Counter())[act] += 1
        quality = [{f"{c['tier']}:{c['strategy']}": c["expected_quality"]
                    for c in d["candidates"]} for d in decisions]
        if 1 not in concurrencies:
            # A replay of the c=8 turns alone starts on a cold GPU: its first
            # turn used 10-23% more than the same mode's last (H100, 862eb23).
            # A warm-up turn, not recorded, puts every measured turn after it.
            asyncio.run(_mode(gw, reader, "large", prompts[:WARMUP], max(concurrencies),
                              quality, acts, answers))
        for conc, order in ((c, split_order(second) if split else REPLAYABLE[c])
                            for c in concurrencies):
            done: dict[str, list[dict[str, Any]]] = {}
            for m in order:
                done.setdefault(m, []).append(
                    asyncio.run(_mode(gateways.get(m, gw), reader, m, prompts, conc,
                                      quality, acts, answers)))
                # each turn as it ends: a call cut off by its time limit keeps them
                write_json(s.out / name.replace(".json", ".partial.json"), {
                        "commit": project_commit(), "device": reader.name,
                        "source": reader.source, "concurrency": conc, "n": len(prompts),
                        "unloaded_routes": dict(Counter(acts)), "turns_done": done})
            runs = {m: merge_runs(rs) for m, rs in done.items()}
            results[f"c{conc}"] = {"order": list(order), **_compared(runs), "modes": runs}
    # the headline figures: one request at a time where that ran, else the
    # first concurrency asked for (CONCURRENCY=8 replays the c=8 turns alone)
    c1 = results.get("c1") or results[f"c{concurrencies[0]}"]
    trivial = [a for (kind, _), a in zip(mix, acts, strict=True) if kind.endswith(":easy")]
    write_json(s.out / name, {
        "device": reader.name, "driver": getattr(reader, "driver", "unknown"),
        "source": reader.source, "engine_build": engine_build(s.llama_server),
        "commit": project_commit(),
        "models": {t: f"random-weight {sh} shape, F16 GGUF" for t, sh in s.shapes.items()},
        "workload": {"name": workload, "n": len(prompts),
                     "mix": {"chat-traffic": KIND_SHARE, "benchmark-mix": MIX}.get(
                         workload, "easy asks about long texts (app/tools/workload.py)"),
                     "trivial_share_declared": TRIVIAL_SHARE if workload == "chat-traffic"
                     else None,
                     "answer_tokens": {"direct": DIRECT_TOKENS, "cot": COT_TOKENS}
                     if answers is None else {
                         "direct": f"varied: mean {sum(answers) / len(answers):.1f}, "
                                   f"median {sorted(answers)[len(answers) // 2]}, "
                                   f"{min(answers)}-{max(answers)} (log-normal, sigma "
                                   f"{ANSWER_SIGMA}; auto's max_tokens caps CoT too)",
                         "cot": f"{COT_TOKENS // DIRECT_TOKENS}x the direct length"},
                     "auto_routes": dict(Counter(acts)),
                     "auto_routes_by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
                     "trivial_to_small": sum(a.startswith("small") for a in trivial)
                     / len(trivial) if trivial else None},
        **({"auto_batch_profile": profile} if profile else {}),
        "auto_curves": curves_used(first), "second_curves": curves_used(s),
        "policy": "balanced", "quality_target": QUALITY_TARGET,
        "quality_source": "the router's per-query expected quality (complexity model, "
                          "levels calibrated to the cited 1B/8B figures) of the action taken",
        "savings_vs_large": c1["savings_vs_large"],
        "savings_vs_small_cot": c1.get("savings_vs_small_cot"),
        "quality_ratio_vs_large": c1["quality_ratio_vs_large"],
        "headline_concurrency": 1 if "c1" in results else concurrencies[0],
        "concurrency_1": results.get("c1"), "concurrency_8": results.get("c8"),
        **({"by_concurrency": results} if set(results) - {"c1", "c8"} else {}),
        "units": {"joules": "J, NVML counter delta over the whole mode (gross, incl. idle)",
                  "wall_s": "s", "savings_*": "fraction", "quality_*": "fraction"},
    })
    if "c1" in results and "c8" in results:
        plot_modes(s.out / name.replace(".json", ".png"), results,
                   ["auto", "large", "small-cot"], ["tab:green", "tab:red", "tab:orange"])


def setup_parser() -> argparse.ArgumentParser:
    """The arguments of a GPU benchmark of the two tiers' workers."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--models-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--small", default="llama-1b")
    ap.add_argument("--large", default="llama-8b")
    ap.add_argument("--source", default="nvml")
    ap.add_argument("--curves-dir", type=Path, default=ROOT / "curves" / "h200")
    return ap


def setup_of(args: argparse.Namespace) -> Setup:
    args.out.mkdir(parents=True, exist_ok=True)
    return Setup(args.llama_server, args.models_dir, args.out,
                 {"small": args.small, "large": args.large}, args.source, args.curves_dir)


def main() -> None:
    ap = setup_parser()
    ap.add_argument("--phase", choices=["calibrate", "replay"], required=True)
    ap.add_argument("--prompts", default="64,512,4096")
    ap.add_argument("--completions", default="32,256,2048")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--workload", choices=list(WORKLOADS), default="chat-traffic")
    ap.add_argument("--split", action="store_true",
                    help="turns of large, auto, split (load-blind) and auto-<second> "
                         "instead of the usual modes")
    ap.add_argument("--second", choices=list(PRICINGS), default="share",
                    help="--split's second gateway's load pricing")
    ap.add_argument("--profile-from", type=Path,
                    help="a gpu-loops-*.json: auto's 8B curve with the batch profile it "
                         "measured (the second gateway's without)")
    ap.add_argument("--answers", choices=["fixed", "varied"], default="fixed",
                    help="answer lengths: fixed, or drawn per request (answer_lengths)")
    args = ap.parse_args()
    s = setup_of(args)
    concurrencies = tuple(int(c) for c in args.concurrency.split(","))
    if args.phase == "replay" and set(concurrencies) - set(REPLAYABLE):
        ap.error(f"--concurrency: a replay runs at {sorted(REPLAYABLE)}")
    done = args.out / ("gpu-curves.json" if args.phase == "calibrate"
                       else replay_name(args.workload, concurrencies, args.split,
                                        args.profile_from is not None,
                                        args.answers == "varied"))
    if done.exists():
        print(f"{done} exists: phase {args.phase} already done")
        return
    with workers_running(s):
        if args.phase == "calibrate":
            ints = [[int(x) for x in v.split(",")] for v in
                    (args.prompts, args.completions, args.concurrency)]
            phase_calibrate(s, Sweep(ints[0], ints[1], ints[2]))
        else:
            phase_replay(s, args.n, args.workload, concurrencies, args.split, args.second,
                         args.profile_from, args.answers == "varied")
    print(json.dumps(json.loads(done.read_text()), indent=1)[:3000])


if __name__ == "__main__":
    main()
