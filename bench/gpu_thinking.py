"""The H200 thinking benchmark: per-query thinking budgets on a reasoning pair.

Two random-weight models of Qwen3-1.7B's and Qwen3-8B's published shapes
(workers/make_models.py: `qwen3` architecture, a reasoning template that opens
a think span, single think tokens), both `reasoning: true` behind the gateway
on one H200 (llama.cpp, thinking budgets native).

  calibrate  their operating curves (NVML) -> gpu-thinking-curves.json
  replay     the chat-traffic workload (app/tools/workload.py) in four modes,
             at concurrency 1 and 8 -> gpu-thinking.json (+ .png):
             auto (quality target 0.95), always-large-thinking,
             always-large-no-thinking, always-small-thinking.

**Where a think span ends.** Random weights never close one. Each request
gets a natural thinking length, drawn once per request (the same in every
mode) from NATURAL_THINKING for its kind, and sends it as its own
`thinking_budget_tokens`: the gateway honours a client's budget as a ceiling
the router does not see (docs/api.md), so the engine closes the span at
min(the gateway's budget, the natural length), as a model that would have
stopped there. Answers are ANSWER_TOKENS long (`ignore_eos`). Every figure
from this file says so.

**Quality** is expected, never measured (random weights answer noise): per
request, the router's per-query quality of the tier's no-thinking answer and
of its full thinking (the complexity model at the Qwen3 pair's levels,
deploy/models.thinking.yaml), and for a budget B the share of thinking's gain B keeps at the
request's *true* natural length (router.thinking.budget_share): a budget
below it costs quality by the same curve the router assumes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.catalog import Catalog, parse_catalog
from app.factory import Seams
from app.tools.calibrate import Sweep
from app.tools.embedded import RunningGateway, run_gateway
from app.tools.workload import chat_traffic
from bench.gpu_common import (
    ROOT,
    engine_build,
    merge_runs,
    metered_run,
    plot_modes,
    project_commit,
    write_json,
)
from bench.gpu_routing import Setup, phase_calibrate, workers_running
from router.thinking import budget_share

QUALITY_TARGET = 0.95
ANSWER_TOKENS = 64
SHAPES = {"small": "qwen3-1.7b", "large": "qwen3-8b"}
MODES = ("auto", "large-think", "large-nothink", "small-think")
ORDERS = {1: ("auto", "large-think", "large-nothink", "small-think"),
          8: ("large-think", "auto", "large-nothink", "small-think", "auto")}

# Expected quality per category x action for the Qwen3 pair (`tier:direct`:
# no thinking; `tier:cot`: thinking to its own end), cited there.
PAIR = ROOT / "deploy" / "models.thinking.yaml"

# Natural thinking tokens (median) per kind of request of the chat-traffic
# workload, for a hybrid thinking model thinking to its own end. Sources:
# math_calc, "Do NOT Think That Much for 2+3=?" (arXiv 2412.21187, Table 1):
# QwQ-32B-Preview thinks 772 tokens on GSM8K's word problems (the hard
# math_calc pool is GSM8K); programming and data analysis [A] ~1.5x that
# (LiveCodeBench-style items run to thousands, everyday questions fewer);
# explanations (tutoring, how-to, health, ideation, reflection) [A] 500-700;
# writing [A] 300-800 (fiction plans most); look-ups and translation [A]
# 150-400; chitchat [A] 200 (the overthinking the paper above describes:
# hundreds of tokens on a greeting). Within a kind: easy x0.6, hard x1.6 [A],
# log-normal spread sigma 0.5 [A], at most MAX_NATURAL.
NATURAL_THINKING = {
    "tutoring": 700, "how_to": 500, "health": 500, "ideation": 600, "edit_text": 300,
    "personal_writing": 500, "translation": 150, "summary": 400, "fiction": 800,
    "specific_info": 350, "products": 500, "recipes": 400, "programming": 1200,
    "math_calc": 800, "data_analysis": 1200, "chitchat": 200, "reflection": 500,
    "role_play": 400,
}
EASY, HARD, SIGMA, MAX_NATURAL = 0.6, 1.6, 0.5, 6000


def natural_lengths(mix: list[tuple[str, str]], seed: int = 7) -> list[int]:
    rng = random.Random(seed)
    out = []
    for kind, _ in mix:
        name, _, level = kind.partition(":")
        median = NATURAL_THINKING[name] * (EASY if level == "easy" else HARD)
        out.append(int(min(MAX_NATURAL, max(16, median * math.exp(rng.gauss(0, SIGMA))))))
    return out


def catalog_for(s: Setup) -> Catalog:
    shipped = yaml.safe_load((ROOT / "models.yaml").read_text())
    backends = [{"name": shape, "kind": "llamacpp", "tier": tier, "model": shape,
                 "reasoning": True, "curves": str(s.curves_dir / f"{shape}.json"),
                 "replicas": [{"url": f"http://127.0.0.1:{s.ports[tier]}", "device": "gpu0"}]}
                for tier, shape in s.shapes.items()]
    return parse_catalog({
        "tiers": list(s.shapes), "devices": [{"name": "gpu0", "source": s.source, "index": 0}],
        "backends": backends, "quality": yaml.safe_load(PAIR.read_text())["quality"],
        # The random vocabulary spells words letter by letter: a short closing
        # line, about the CLOSING_TOKENS a real tokenizer's default takes.
        "routing": {**shipped["routing"], "lengths_file": None,
                    "budget_message": "\nTime is up.\n"},
        "base_dir": str(ROOT)})


def _body(mode: str, text: str, natural: int) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": text}],
                            "max_tokens": ANSWER_TOKENS, "ignore_eos": True,
                            "thinking_budget_tokens": natural}
    if mode == "auto":
        return {**body, "model": "auto"}
    if mode == "large-nothink":
        return {**body, "model": "large", "reasoning_effort": "none"}
    return {**body, "model": mode.split("-")[0]}


async def _mode(gw: RunningGateway, nvml: Any, mode: str, prompts: list[str],
                naturals: list[int], concurrency: int, levels: list[dict[str, tuple[float, float]]]
                ) -> dict[str, Any]:
    sem = asyncio.Semaphore(concurrency)
    routes: list[str] = []
    failures: list[str] = []
    expected: list[float] = []
    thinking: list[int] = []
    headers = {"x-joulegate-quality-target": str(QUALITY_TARGET)} if mode == "auto" else {}

    async def one(client: httpx.AsyncClient, i: int, text: str) -> None:
        async with sem:
            try:
                r = await client.post(gw.v1 + "/chat/completions", headers=headers,
                                      json=_body(mode, text, naturals[i]), timeout=900)
            except httpx.HTTPError as exc:
                failures.append(type(exc).__name__)
                return
            if r.status_code != 200:
                failures.append(str(r.status_code))
                return
            tier = r.headers["x-joulegate-tier"]
            budget = int(r.headers.get("x-joulegate-thinking-budget", "0"))
            routes.append(f"{tier}:{'think' if budget else 'nothink'}")
            direct, full = levels[i][tier]
            expected.append(direct + (full - direct) * budget_share(budget, naturals[i])
                            if budget else direct)
            thinking.append(int(r.json()["usage"].get("thinking_tokens", 0)))

    joules, wall = await metered_run(nvml, one, prompts)
    return {"joules": joules, "wall_s": wall, "routes": dict(Counter(routes)),
            "failed": dict(Counter(failures)), "answered": len(routes),
            "thinking_tokens": sum(thinking),
            "expected_quality": sum(expected) / max(1, len(expected))}


def _levels(gw: RunningGateway, prompts: list[str]) -> tuple[list[dict[str, Any]],
                                                             list[dict[str, tuple[float, float]]]]:
    """Each request's dry-run decision, and per tier (no thinking, full thinking)."""
    decisions = [httpx.post(gw.v1 + "/route", timeout=30, headers={
        "x-joulegate-quality-target": str(QUALITY_TARGET)}, json={
        "model": "auto", "messages": [{"role": "user", "content": t}],
        "max_tokens": ANSWER_TOKENS}).json() for t in prompts]
    levels = []
    for d in decisions:
        per: dict[str, tuple[float, float]] = {}
        for tier in ("small", "large"):
            cands = [c for c in d["candidates"] if c["tier"] == tier]
            direct = next(c["expected_quality"] for c in cands if c["thinking_budget"] == 0)
            full = max(c["expected_quality"] for c in cands)
            per[tier] = (direct, full)
        levels.append(per)
    return decisions, levels


def phase_replay(s: Setup, n_by_conc: dict[int, int]) -> dict[str, Any]:
    from telemetry.devices import DeviceSpec, make_reader

    catalog = catalog_for(s)
    n = max(n_by_conc.values())
    mix = chat_traffic(n)
    prompts = [t[:6000] for _, t in mix]
    naturals = natural_lengths(mix)
    reader = make_reader(DeviceSpec("gpu0", "localhost", s.source, 0, None, 65, 10))
    results: dict[str, Any] = {}
    with run_gateway(catalog, Seams(), first_byte_timeout_seconds=900,
                     between_chunks_timeout_seconds=900) as gw:
        decisions, levels = _levels(gw, prompts)
        for conc, order in ORDERS.items():
            k = n_by_conc[conc]
            done: dict[str, list[dict[str, Any]]] = {}
            for m in order:
                done.setdefault(m, []).append(asyncio.run(
                    _mode(gw, reader, m, prompts[:k], naturals[:k], conc, levels[:k])))
            runs = {m: merge_runs(rs) for m, rs in done.items()}
            auto, think, nothink = runs["auto"], runs["large-think"], runs["large-nothink"]
            results[f"c{conc}"] = {
                "order": list(order), "requests": k,
                "savings_vs_large_thinking": 1 - auto["joules"] / think["joules"],
                "savings_vs_large_no_thinking": 1 - auto["joules"] / nothink["joules"],
                "quality_ratio_vs_large_thinking": auto["expected_quality"]
                / think["expected_quality"],
                "quality_ratio_vs_large_no_thinking": auto["expected_quality"]
                / nothink["expected_quality"],
                "modes": runs}
    by_kind: dict[str, Counter[str]] = {}
    for (kind, _), d in zip(mix, decisions, strict=True):
        b = d["thinking_budget"]
        by_kind.setdefault(kind, Counter())[f"{d['tier']}:{b if b else 'nothink'}"] += 1
    return {"results": results, "mix": mix, "naturals": naturals, "decisions": decisions,
            "by_kind": by_kind, "reader": reader}


def write_replay(s: Setup, out: dict[str, Any]) -> None:
    results, reader = out["results"], out["reader"]
    c1 = results["c1"]
    write_json(s.out / "gpu-thinking.json", {
        "device": reader.name, "driver": getattr(reader, "driver", "unknown"),
        "source": reader.source, "engine_build": engine_build(s.llama_server),
        "commit": project_commit(),
        "models": {t: f"random-weight {sh} shape (qwen3 architecture, reasoning template), "
                      "F16 GGUF, thinking budgets native (llama.cpp)"
                   for t, sh in s.shapes.items()},
        "workload": {"name": "chat-traffic", "requests": {k: v["requests"]
                                                          for k, v in results.items()},
                     "answer_tokens": ANSWER_TOKENS,
                     "natural_thinking": {"per_kind_median": NATURAL_THINKING,
                                          "easy": EASY, "hard": HARD, "sigma": SIGMA,
                                          "mean_of_requests": sum(out["naturals"])
                                          / len(out["naturals"])},
                     "where_a_span_ends": "random weights never close a think span: each "
                     "request sends its natural thinking length as its own "
                     "thinking_budget_tokens, a ceiling the router does not see; the engine "
                     "closes the span at min(gateway's budget, natural length)",
                     "auto_actions_by_kind": {k: dict(v) for k, v in
                                              sorted(out["by_kind"].items())}},
        "policy": "balanced", "quality_target": QUALITY_TARGET,
        "quality_source": "expected: the router's per-query levels (complexity model at the "
                          "Qwen3 pair's cited levels) of the tier's no-thinking and full-"
                          "thinking answers, a budget keeping budget_share(budget, the "
                          "request's true natural length) of thinking's gain",
        "savings_vs_large_thinking": c1["savings_vs_large_thinking"],
        "savings_vs_large_no_thinking": c1["savings_vs_large_no_thinking"],
        "quality_ratio_vs_large_thinking": c1["quality_ratio_vs_large_thinking"],
        "concurrency_1": c1, "concurrency_8": results["c8"],
        "units": {"joules": "J, NVML counter delta over the whole mode (gross, incl. idle)",
                  "wall_s": "s", "savings_*": "fraction", "quality_*": "fraction"},
    })
    plot_modes(s.out / "gpu-thinking.png", results, list(MODES),
               ["tab:green", "tab:red", "tab:blue", "tab:orange"],
               "Thinking budgets on the H200: Qwen3-1.7B / 8B shapes, random weights")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", choices=["calibrate", "replay"], required=True)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--models-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--source", default="nvml")
    ap.add_argument("--small", default=SHAPES["small"])
    ap.add_argument("--large", default=SHAPES["large"])
    ap.add_argument("--curves-dir", type=Path, default=ROOT / "curves" / "h200")
    ap.add_argument("--prompts", default="64,512,2048")
    ap.add_argument("--completions", default="32,512,2048")
    ap.add_argument("--n1", type=int, default=40, help="requests at concurrency 1")
    ap.add_argument("--n8", type=int, default=64, help="requests at concurrency 8")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    s = Setup(args.llama_server, args.models_dir, args.out,
              {"small": args.small, "large": args.large}, args.source, args.curves_dir)
    done = args.out / ("gpu-thinking-curves.json" if args.phase == "calibrate"
                       else "gpu-thinking.json")
    if done.exists():
        print(f"{done} exists: phase {args.phase} already done")
        return
    with workers_running(s):
        if args.phase == "calibrate":
            ints = [[int(x) for x in v.split(",")] for v in (args.prompts, args.completions)]
            phase_calibrate(s, Sweep(ints[0], ints[1], [1, 8]), "gpu-thinking-curves")
        else:
            write_replay(s, phase_replay(s, {1: args.n1, 8: args.n8}))
    print(json.dumps(json.loads(done.read_text()), indent=1)[:3000])


if __name__ == "__main__":
    main()
