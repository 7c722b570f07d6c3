"""What dating each counter change at its step buys a request's figure:
short requests, one at a time, on a simulated NVML-like counter, attributed
by the real ledger with each change dated three ways.

    python -m bench.attribution_dating [--seconds 120] [--seeds 5]
        ->  bench/results/attribution-dating.json

The device idles at IDLE_W and each request adds its own power while it runs
(one at a time, 20-400 ms long, 20-300 ms apart: interactive traffic, where a
request is as short as a counter step or two). The counter publishes the
energy up to each step (100 ms beat, like NVML's); the sampler's reads are
bench/cadence_sim.py's (4 ms reads, woken up to 1 ms late). Each change goes
to a `telemetry.ledger.Ledger` (idle known, simulated clock) dated:

- at the read that found it, on the 20 Hz timer (before c7ef69d);
- at the middle of its bracket, on the timer (a dear counter with no beat);
- at the step the cadence expected, on the beat (as shipped, NVML).

Per dating: each request's net figure against the energy it added (its
power above idle x its time), as the median and p90 of the relative error,
for all requests and for those shorter than a step; and the share of all
requests' energy that reached them (the rest went to the tail account).
Source `simulated`: the ledger is the real one, the counter and the reads are
not (a real counter's dating: `python -m bench.sampler_cost --nvml 0`).
"""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import dataclass
from typing import Any

from bench.cadence_sim import beats, reads, simulation_args, write_simulated
from telemetry.cadence import LEARN_FOR_S
from telemetry.ledger import Ledger

IDLE_W = 100.0
BEAT_S = 0.1
TOKENS_PER_S = 50.0  # each request's answer, decoded evenly (the split only needs some work)
DATINGS = ("at the read, on the timer", "bracket middle, on the timer",
           "the expected step, on the beat")


@dataclass(frozen=True)
class Request:
    start: float
    end: float
    power_w: float  # above idle, while it runs


def requests(seconds: float, seed: int) -> list[Request]:
    rng = random.Random(seed)
    out: list[Request] = []
    t = LEARN_FOR_S + 1.0  # the beat learned
    while True:
        start = t + rng.uniform(0.02, 0.3)
        end = start + rng.uniform(0.02, 0.4)
        if end > seconds - 3.0:  # the last ones settle before the reads stop
            return out
        out.append(Request(start, end, rng.uniform(100.0, 400.0)))
        t = end


def energy_at(steps: list[float], reqs: list[Request]) -> list[float]:
    """The counter's value at each step: idle plus every request's added power, integrated."""
    return [IDLE_W * s + sum(r.power_w * max(0.0, min(s, r.end) - r.start) for r in reqs
                             if r.start < s) for s in steps]


class _Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def attribute(steps: list[float], reqs: list[Request], seconds: float, seed: int,
              dating: str) -> list[tuple[Request, float]]:
    """Each request and its net figure from the ledger, its changes dated by `dating`."""
    clock = _Clock()
    ledger = Ledger("nvml", prefill_weight=0.0, idle_power_w=IDLE_W, clock=clock)
    counter = energy_at(steps, reqs)
    events = sorted([(r.start, i, True) for i, r in enumerate(reqs)]
                    + [(r.end, i, False) for i, r in enumerate(reqs)])
    wids: dict[int, str] = {}
    k = 0
    on_beat = dating.endswith("on the beat")
    for read in reads(steps, seconds, seed=seed, on_beat=on_beat):
        while k < len(events) and events[k][0] <= read.end:
            t, i, opens = events[k]
            clock.t = t
            if opens:
                wids[i] = ledger.open()
            else:
                dur = reqs[i].end - reqs[i].start
                ledger.close(wids[i], [(0.0, 0, 0), (dur, 0, int(TOKENS_PER_S * dur) + 1)])
            k += 1
        clock.t = read.end
        if read.steps == 0:
            continue
        at = read.middle if dating.startswith("bracket") and read.middle is not None \
            else read.dated
        ledger.ingest(at, counter[read.steps - 1], now=read.end)
    figures = [(r, ledger.result(wids[i])) for i, r in enumerate(reqs)]
    return [(r, f.net_j) for r, f in figures if f is not None and f.final]


def errors(pairs: list[tuple[Request, float]]) -> dict[str, float]:
    """Relative errors of the figures against each request's added energy."""
    rel = sorted(abs(net / (r.power_w * (r.end - r.start)) - 1.0) for r, net in pairs)
    return {"requests": float(len(rel)),
            "error_pct_median": 100.0 * statistics.median(rel),
            "error_pct_p90": 100.0 * rel[int(0.9 * len(rel))]}


def run(seconds: float, seeds: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for dating in DATINGS:
        pairs: list[tuple[Request, float]] = []
        true_j = 0.0
        for seed in range(seeds):
            reqs = requests(seconds, seed)
            true_j += sum(r.power_w * (r.end - r.start) for r in reqs)
            pairs += attribute(beats(BEAT_S, seconds, seed=seed), reqs, seconds, seed, dating)
        short = [(r, net) for r, net in pairs if r.end - r.start < BEAT_S]
        rows[dating] = {"all": errors(pairs), "shorter than a step": errors(short),
                        "share_of_energy_reaching_requests_pct":
                            100.0 * sum(net for _, net in pairs) / true_j}
        print(dating, json.dumps(rows[dating]), flush=True)
    return rows


def main() -> None:
    args = simulation_args(__doc__)
    write_simulated(args.out / "attribution-dating.json", args.seconds, args.seeds,
                    "one request at a time, 20-400 ms, 20-300 ms apart, 100-400 W above "
                    f"a {IDLE_W:.0f} W idle; a counter stepping every {BEAT_S * 1000:.0f} ms; "
                    "the real ledger, the counter's changes dated three ways; errors are "
                    "|figure / added energy - 1| over requests pooled across seeds",
                    datings=run(args.seconds, args.seeds))


if __name__ == "__main__":
    main()
