"""Per-request energy on a real GPU: conservation, per-request accuracy, sampler cost.

Runs the real gateway (in this process) in front of a CUDA llama-server with
a Llama-3.2-1B-shaped model, metering the GPU through NVML, and measures:

(a) conservation: over runs of 8 concurrent requests of mixed lengths,
    |attributed + idle + unattributed - NVML delta| / NVML delta, where the
    NVML delta is read independently of the gateway's sampler;
(b) per-request accuracy: each request's attributed net joules in the
    concurrent run against the same request run alone. Batching makes every
    token cheaper, so the raw comparison measures batching as much as
    attribution; `share` errors compare each request's fraction of the batch
    with its fraction of the alone costs, which is what attribution controls.
    With --curve the split is by the curve's marginal token costs
    (telemetry.rates), else by token counts with a fitted prefill weight;
(c) the standalone estimate (usage.energy_standalone_joules, from the curve)
    against the same request measured alone (gross: net + its idle share);
(d) the sampler's CPU cost (% of one core) at the configured rate.

    python bench/gpu_telemetry.py --llama-server PATH --model llama-1b.gguf \
        [--curve curves/h200/llama-1b.json] --out DIR

Writes gpu-telemetry.json into --out (bench/results/ in the repo).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from app.catalog import parse_catalog
from app.factory import Seams
from app.tools.embedded import RunningGateway, run_gateway
from bench.gpu_common import engine_build, project_commit, start_llama, write_json
from telemetry.ledger import Ledger
from telemetry.nvml import NvmlReader
from telemetry.sampler import Sampler

# (prompt tokens, completion tokens): mixed, as real traffic is.
MIX = [(256, 64), (1024, 128), (128, 512), (2048, 256), (512, 1024), (4096, 64), (64, 768),
       (1536, 384), (64, 4), (32, 1)]  # the last two shorter than a counter step
SAMPLE_HZ = 20.0
VOCAB_MAX = 100000  # token ids drawn below this (the Llama-3 vocabulary has 128256)


def sampler_cost(seconds: float) -> dict[str, Any]:
    """CPU seconds per wall second of one NVML sampler thread, nothing else running."""
    reader = NvmlReader(0)
    sampler = Sampler(reader, Ledger("nvml"), hz=SAMPLE_HZ)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    sampler.start()
    time.sleep(seconds)
    sampler.stop()
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {
        "sampler_cpu_percent": 100.0 * cpu / wall,
        "sampler_hz": SAMPLE_HZ,
        "nvml_read_ms_mean": 1000.0 * sampler.read_seconds / max(1, sampler.reads),
        "sampler_reads": sampler.reads,
        "sampler_reads_per_s": sampler.reads / wall,
        # read on the counter's beat (telemetry/cadence.py) or on the timer
        "sampler_on_beat": sampler.cadence.state == "locked",
        "counter_beat_ms": 1000.0 * (sampler.cadence.beat_s or 0.0),
    }


def body(prompt: int, out: int, rng: random.Random) -> dict[str, Any]:
    return {"model": "small", "prompt": [rng.randint(1000, VOCAB_MAX) for _ in range(prompt)],
            "max_tokens": out, "ignore_eos": True, "cache_prompt": False, "temperature": 0}


# (phase, energy id, response usage, sent and answered: monotonic seconds)
SENT: list[tuple[str, str, dict[str, Any], float, float]] = []
# The counter's changes as the sampler gave them to the ledger: (when the
# change happened, as dated; when the read that found it ended; counter J).
INGESTS: list[tuple[float, float, float]] = []
AROUND_S = 0.3  # the changes kept with a request: this long before and after it


def record_ingests(ledger: Ledger) -> None:
    """Keep every change the sampler hands `ledger` (in INGESTS): with each
    request's send and answer times they show what its figures were made of."""
    inner = ledger.ingest

    def ingest(t: float, counter_j: float, power_w: float | None = None,
               now: float | None = None, defer: bool = False) -> None:
        if not INGESTS or INGESTS[-1][2] != counter_j:
            INGESTS.append((t, t if now is None else now, counter_j))
        inner(t, counter_j, power_w, now=now, defer=defer)
    ledger.ingest = ingest  # type: ignore[method-assign]


def changes_around(t0: float, t1: float) -> list[list[float]]:
    """The counter's changes from AROUND_S before `t0` to AROUND_S after `t1`:
    [dated, read end (both seconds from t0), joules since the change before]."""
    out = []
    for (_, _, before), (t, read_t, counter_j) in itertools.pairwise(INGESTS):
        if t0 - AROUND_S <= t <= t1 + AROUND_S:
            out.append([round(t - t0, 4), round(read_t - t0, 4), round(counter_j - before, 3)])
    return out


async def send(client: httpx.AsyncClient, gw: RunningGateway, b: dict[str, Any],
               phase: str = "warm-up") -> str:
    t0 = time.monotonic()
    r = await client.post(gw.v1 + "/completions", json=b, timeout=300)
    t1 = time.monotonic()
    r.raise_for_status()
    energy_id = r.headers["x-joulegate-energy-id"]
    SENT.append((phase, energy_id, r.json().get("usage") or {}, t0, t1))
    return energy_id


async def response_vs_final(client: httpx.AsyncClient, gw: RunningGateway
                            ) -> dict[str, Any]:
    """The figure each response carried (`usage.energy_joules`, provisional
    unless `energy_final`) against its final one, by phase (issue 24: the
    response's figure is the best estimate when it is sent)."""
    out: dict[str, Any] = {}
    for phase in sorted({x[0] for x in SENT if x[0] != "warm-up"}):
        rel, final_in_response, rows = [], 0, []
        for _, eid, usage, t0, t1 in (x for x in SENT if x[0] == phase):
            final = (await final_figure(client, gw, eid))["net_j"]
            final_in_response += bool(usage.get("energy_final"))
            sent = usage.get("energy_joules")
            rows.append({"prompt_tokens": usage.get("prompt_tokens"),
                         "completion_tokens": usage.get("completion_tokens"),
                         "sent_j": sent, "final_j": final, "answered_s": round(t1 - t0, 4),
                         "changes": changes_around(t0, t1)})
            if sent is not None and final > 0:
                rel.append((sent - final) / final)
        absolute = sorted(abs(x) for x in rel)
        out[phase] = {
            "n": len(rel), "final_when_sent": final_in_response,
            "median_abs_rel_error": statistics.median(absolute) if absolute else None,
            "p90_abs_rel_error": absolute[int(0.9 * (len(absolute) - 1))] if absolute else None,
            "median_signed_rel_error": statistics.median(rel) if rel else None,
            "requests": rows,
        }
    return out


async def final_figure(client: httpx.AsyncClient, gw: RunningGateway, energy_id: str
                       ) -> dict[str, Any]:
    for _ in range(100):
        fig: dict[str, Any] = (await client.get(f"{gw.v1}/energy/{energy_id}")).json()
        if fig["final"]:
            return fig
        await asyncio.sleep(0.05)
    raise TimeoutError(f"energy {energy_id} never became final")


async def final_net(client: httpx.AsyncClient, gw: RunningGateway, energy_id: str) -> float:
    return float((await final_figure(client, gw, energy_id))["net_j"])


async def alone(client: httpx.AsyncClient, gw: RunningGateway, bodies: list[dict[str, Any]]
                ) -> list[dict[str, Any]]:
    out = []
    for b in bodies:
        eid = await send(client, gw, b, "alone")
        out.append(await final_figure(client, gw, eid))
        await asyncio.sleep(1.0)  # let the tail decay before the next one
    return out


async def aligned(ledger: Ledger, nvml: NvmlReader) -> tuple[float, float]:
    """(NVML counter read here, energy the ledger booked up to that same counter
    value): retried until the sampler has ingested exactly the value read."""
    for _ in range(50):
        counter_j = nvml.read().counter_j
        await asyncio.sleep(0.08)
        t = ledger.totals()
        if ledger.last_counter_j == counter_j and t.open_windows == 0:
            return counter_j, t.attributed_j + t.idle_j + t.unattributed_j
    raise RuntimeError("could not align the ledger with an NVML reading")


async def concurrent(client: httpx.AsyncClient, gw: RunningGateway, ledger: Ledger,
                     nvml: NvmlReader, bodies: list[dict[str, Any]]) -> dict[str, Any]:
    await asyncio.sleep(1.0)
    before_t = ledger.totals()
    before_j, before_booked = await aligned(ledger, nvml)
    t0 = time.monotonic()
    ids = await asyncio.gather(*(send(client, gw, b, "concurrent") for b in bodies))
    wall = time.monotonic() - t0
    nets = [await final_net(client, gw, i) for i in ids]
    await asyncio.sleep(1.0)
    after_j, after_booked = await aligned(ledger, nvml)
    after_t = ledger.totals()
    nvml_delta = after_j - before_j
    booked = after_booked - before_booked
    return {"nets": nets, "wall_s": wall, "nvml_delta_j": nvml_delta, "booked_j": booked,
            "attributed_j": after_t.attributed_j - before_t.attributed_j,
            "idle_j": after_t.idle_j - before_t.idle_j,
            "unattributed_j": after_t.unattributed_j - before_t.unattributed_j,
            "conservation_error": abs(booked - nvml_delta) / nvml_delta}


def fit_prefill_weight(alone_j: list[float]) -> tuple[float, float]:
    """Least squares: net = a x decode + b x prefill; w = b / a."""
    x = np.array([[out, prompt] for prompt, out in MIX], dtype=float)
    coef, *_ = np.linalg.lstsq(x, np.array(alone_j), rcond=None)
    a, b = float(coef[0]), float(coef[1])
    return (max(0.0, b / a) if a > 0 else 0.1), a


def errors(conc: list[float], ref: list[float]) -> dict[str, float | None]:
    pairs = [(c, r) for c, r in zip(conc, ref, strict=True) if r > 0]
    if not pairs:
        return dict.fromkeys(("raw_median", "share_median", "share_max",
                              "batch_to_alone_ratio"))
    conc, ref = [c for c, _ in pairs], [r for _, r in pairs]
    raw = [abs(c - r) / r for c, r in zip(conc, ref, strict=True)]
    scale = sum(conc) / sum(ref)
    share = [abs(c - r * scale) / (r * scale) for c, r in zip(conc, ref, strict=True)]
    return {"raw_median": statistics.median(raw), "share_median": statistics.median(share),
            "share_max": max(share), "batch_to_alone_ratio": scale}


async def measure(gw: RunningGateway, ledger: Ledger, nvml: NvmlReader) -> dict[str, Any]:
    rng = random.Random(7)
    bodies = [body(p, o, rng) for p, o in MIX]
    async with httpx.AsyncClient() as client:
        await send(client, gw, body(64, 16, rng))  # warm-up: CUDA graphs, allocations
        await asyncio.sleep(4.0)  # quiet: the ledger learns the idle baseline
        first_figs = await alone(client, gw, bodies)
        first = [f["net_j"] for f in first_figs]
        w, j_per_decode = fit_prefill_weight(first)
        ledger.prefill_weight = w  # used only without a curve
        second_figs = await alone(client, gw, bodies)
        second = [f["net_j"] for f in second_figs]
        gross = [(a["gross_j"] + b["gross_j"]) / 2
                 for a, b in zip(first_figs, second_figs, strict=True)]
        estimates = [f.get("standalone_j") for f in first_figs]
        runs = [await concurrent(client, gw, ledger, nvml, bodies) for _ in range(3)]
        sent_vs_final = await response_vs_final(client, gw)
    raw = {"alone_net_joules_first": first, "alone_net_joules_second": second,
           "alone_gross_joules": gross, "standalone_estimate_j": estimates,
           "concurrent_runs": runs, "response_vs_final": sent_vs_final,
           "idle_power_w": ledger.idle_power_w, "prefill_weight_fitted": w,
           "alone_net_j_per_decode_token": j_per_decode}
    try:  # a summary that fails (a figure of 0 somewhere) still leaves the raw data
        return {**raw, **summary(first, second, gross, estimates, runs, w)}
    except (ArithmeticError, ValueError, statistics.StatisticsError) as exc:
        return {**raw, "summary_error": repr(exc)}


def summary(first: list[float], second: list[float], gross: list[float],
            estimates: list[float | None], runs: list[dict[str, Any]], w: float
            ) -> dict[str, Any]:
    """The alone and concurrent figures' errors; relative ones only over
    nonzero references (a 1-token request's final can be 0 J both times)."""
    ref = [(a + b) / 2 for a, b in zip(first, second, strict=True)]
    per_run = [errors(r["nets"], ref) for r in runs]
    standalone: dict[str, Any] = {"standalone_estimate_median_abs_error": None}
    if all(e is not None for e in estimates):
        est_err = [abs(float(e or 0.0) - g) / g
                   for e, g in zip(estimates, gross, strict=True) if g > 0]
        standalone = {"standalone_estimate_median_abs_error": statistics.median(est_err),
                      "standalone_estimate_max_abs_error": max(est_err)}
    repeat = [abs(a - b) / ((a + b) / 2) for a, b in zip(first, second, strict=True) if a + b > 0]
    return {
        **standalone,
        "attribution": "curve marginal token costs" if estimates[0] is not None
        else f"token counts, prefill weight {w:.4f}",
        "alone_net_joules": ref,
        "alone_repeat_median_abs_diff": statistics.median(repeat) if repeat else None,
        "conservation_error": max(r["conservation_error"] for r in runs),
        "per_request_median_abs_error": _over_runs(statistics.median, per_run, "raw_median"),
        "per_request_share_median_abs_error": _over_runs(statistics.median, per_run,
                                                         "share_median"),
        "per_request_share_max_abs_error": _over_runs(max, per_run, "share_max"),
        "batch_to_alone_energy_ratio": _over_runs(statistics.median, per_run,
                                                  "batch_to_alone_ratio"),
    }


def _over_runs(f: Callable[[list[float]], float], runs: list[dict[str, float | None]],
               key: str) -> float | None:
    values = [v for r in runs if (v := r[key]) is not None]
    return f(values) if values else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--port", type=int, default=8301)
    ap.add_argument("--curve", type=Path, default=None,
                    help="the 1B's operating curve (attribution by marginal token cost)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cost = sampler_cost(10.0)
    nvml = NvmlReader(0)
    proc = start_llama(args.llama_server, args.model, args.port, 8, 8192,
                       args.out / "llama-server.log")
    catalog = parse_catalog({
        "tiers": ["small"],
        "devices": [{"name": "gpu0", "source": "nvml", "index": 0}],
        "backends": [{"name": "llama-1b", "kind": "llamacpp", "tier": "small",
                      "model": "llama-1b",
                      **({"curves": str(args.curve.resolve())} if args.curve else {}),
                      "replicas": [
                          {"url": f"http://127.0.0.1:{args.port}", "device": "gpu0"}]}],
    })
    seams = Seams()
    try:
        with run_gateway(catalog, seams, sample_hz=SAMPLE_HZ,
                     first_byte_timeout_seconds=600, between_chunks_timeout_seconds=600) as gw:
            ledger = seams.devices[0].ledger
            record_ingests(ledger)
            result = asyncio.run(measure(gw, ledger, nvml))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    data = {
        "device": nvml.name, "driver": nvml.driver, "source": "nvml",
        "engine": "llama.cpp llama-server (CUDA, sm_90)",
        "engine_build": engine_build(args.llama_server),
        "model": "random-weight Llama-3.2-1B shape, F16 GGUF",
        "commit": project_commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "requests": [{"prompt_tokens": p, "completion_tokens": o} for p, o in MIX],
        "units": {"*_j": "joules", "*_w": "watts", "*_error": "fraction", "wall_s": "seconds"},
        **cost, **result,
    }
    write_json(args.out / "gpu-telemetry.json", data)
    print({k: data.get(k) for k in ("device", "conservation_error", "per_request_median_abs_error",
                                    "per_request_share_median_abs_error",
                                    "standalone_estimate_median_abs_error", "sampler_cpu_percent")})


if __name__ == "__main__":
    main()
