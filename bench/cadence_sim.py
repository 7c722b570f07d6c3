"""The sampler's read schedule against a simulated stepping counter: on the
20 Hz timer and on the counter's beat (telemetry/cadence.py), in simulated
time, so the figures are the schedule's alone (no GPU, no threads).

    python -m bench.cadence_sim [--seconds 120] [--seeds 5]
        ->  bench/results/cadence-sim.json

The counter steps on a beat with jitter, like NVML's energy counter (100 ms,
../shared/bench/h200-nvml-steps.txt); each read takes ~`read_s` (NVML: 3.5-4
ms of CPU, bench/results/sampler-cost-nvml-h100.json) and starts up to
`late_s` after it was due (a thread waiting for the interpreter); the counter
is taken at a moment inside the read. Per case: reads a second, how long
after each step the read that saw it ended (lag), reads that saw two
steps at once (merged), and how far off the time the sampler gives each
change is (dating error: the span ends the ledger splits energy by): on
the timer the read's end (as before the cadence dated changes) and the
middle of the change's bracket (a dear counter with no beat, now), on the
beat the step the cadence expected. All figures are `simulated`: the real counter's are
`python -m bench.sampler_cost --nvml 0`.
"""

from __future__ import annotations

import argparse
import bisect
import json
import random
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.provenance import project_commit
from telemetry.cadence import LEARN_FOR_S, PROBE_EVERY, Cadence

ROOT = Path(__file__).resolve().parent.parent
TIMER_S = 0.05  # the sampler's timer: SAMPLE_HZ 20
AFTER_STEP_S = 0.015  # a read starting this soon after a step may take longer


@dataclass
class Run:
    reads_per_s: float  # after the first LEARN_FOR_S
    lags_s: list[float]  # from each step to the end of the read that saw it
    dated_s: list[float]  # each change's time as dated, less the step's
    middle_s: list[float]  # the same, dated by the middle of its bracket
    merged: int  # reads in that time that saw two steps or more at once
    cadence: Cadence

    @property
    def lag_median_s(self) -> float:
        return statistics.median(self.lags_s)


def beats(beat_s: float, seconds: float, jitter_s: float = 0.0005, seed: int = 2) -> list[float]:
    """Step times: a beat from a random phase, each step off by up to `jitter_s`."""
    rng = random.Random(seed)
    first = rng.uniform(0, beat_s)
    return [first + k * beat_s + rng.uniform(-jitter_s, jitter_s)
            for k in range(int(seconds / beat_s) + 2)]


@dataclass(frozen=True)
class Read:
    start: float
    end: float
    steps: int  # steps passed when the counter was taken (a moment inside the read)
    changed: bool
    dated: float  # the change's time as the sampler gives it (the read's end on the timer)
    middle: float | None  # the middle of the change's bracket, where one read found none


def reads(steps: list[float], seconds: float, read_s: float = 0.004, late_s: float = 0.001,
          seed: int = 1, on_beat: bool = True, cadence: Cadence | None = None,
          after_step_s: float = 0.0) -> Iterator[Read]:
    """Reads as the sampler thread does: at the cadence's time (or the timer's),
    starting up to `late_s` late, each taking ~`read_s` (`after_step_s` more
    when it starts within AFTER_STEP_S of a step, as on an H100)."""
    rng = random.Random(seed)
    cadence = cadence or Cadence(min_beat_s=TIMER_S * (1 + 1 / PROBE_EVERY))
    t, n_prev, timer, unchanged_at = 0.0, None, 0.0, None
    while t < seconds:
        start = t + rng.uniform(0, late_s)
        k = bisect.bisect_right(steps, start)
        slower = after_step_s if k and start - steps[k - 1] < AFTER_STEP_S else 0.0
        end = start + read_s * rng.uniform(0.8, 1.2) + slower
        n = bisect.bisect_right(steps, rng.uniform(start, end))
        changed = n_prev is not None and n != n_prev
        at = cadence.observe(start, end, changed) if on_beat else end
        yield Read(start, end, n, changed, at,
                   (unchanged_at + end) / 2 if changed and unchanged_at is not None else None)
        n_prev, unchanged_at = n, None if changed else start
        timer = max(timer + TIMER_S, end)
        t = max(end, cadence.next_read(end, timer)) if on_beat else timer


def simulate(steps: list[float], seconds: float, read_s: float = 0.004, late_s: float = 0.001,
             seed: int = 1, on_beat: bool = True, after_step_s: float = 0.0) -> Run:
    """The reads' count, lags and dating errors after the first LEARN_FOR_S."""
    cadence = Cadence(min_beat_s=TIMER_S * (1 + 1 / PROBE_EVERY))
    count, merged, n_prev = 0, 0, 0
    lags: list[float] = []
    dated: list[float] = []
    middle: list[float] = []
    for r in reads(steps, seconds, read_s, late_s, seed, on_beat, cadence, after_step_s):
        if r.start > LEARN_FOR_S:
            count += 1
            if r.changed:
                step = steps[r.steps - 1]
                lags.append(r.end - step)
                dated.append(r.dated - step)
                if r.middle is not None:
                    middle.append(r.middle - step)
                merged += r.steps - n_prev > 1
        n_prev = r.steps
    return Run(count / (seconds - LEARN_FOR_S), lags, dated, middle, merged, cadence)


CASES: dict[str, dict[str, float]] = {
    "NVML-like: 100 ms beat, 4 ms reads, woken up to 1 ms late": {},
    "busy interpreter: woken up to 10 ms late, beat jitter 3 ms": {"late_s": 0.01,
                                                                  "jitter_s": 0.003},
    "reads just after a step 1.6 ms longer (an H100: 5.3 against 3.7 ms)": {
        "after_step_s": 0.0016},
    "a 250 ms beat": {"beat_s": 0.25},
    "a 40 ms beat (faster than the timer: stays on it)": {"beat_s": 0.04},
}


def case(seconds: float, seeds: int, on_beat: bool, beat_s: float = 0.1,
         jitter_s: float = 0.0005, late_s: float = 0.001,
         after_step_s: float = 0.0) -> dict[str, float]:
    runs = [simulate(beats(beat_s, seconds, jitter_s, seed), seconds, late_s=late_s,
                     seed=seed, on_beat=on_beat, after_step_s=after_step_s)
            for seed in range(seeds)]
    lags = sorted(lag for r in runs for lag in r.lags_s)
    row = {"reads_per_s": statistics.median(r.reads_per_s for r in runs),
           "lag_ms_median": 1000.0 * statistics.median(lags),
           "lag_ms_p90": 1000.0 * lags[int(0.9 * len(lags))],
           "lag_ms_max": 1000.0 * lags[-1],
           "merged_reads": float(sum(r.merged for r in runs)),
           "on_the_beat_at_the_end": float(sum(r.cadence.state == "locked" for r in runs))}
    row.update(error_figures("dated", [e for r in runs for e in r.dated_s]))
    if not on_beat:
        row.update(error_figures("bracket_middle", [e for r in runs for e in r.middle_s]))
    return row


def error_figures(name: str, errors_s: list[float]) -> dict[str, float]:
    """A dating's errors: their mean (the bias) and the median and p90 of their
    size, in ms; none where no change was dated."""
    size = sorted(abs(e) for e in errors_s)
    if not size:
        return {}
    return {f"{name}_error_ms_mean": 1000.0 * statistics.fmean(errors_s),
            f"{name}_error_ms_median": 1000.0 * statistics.median(size),
            f"{name}_error_ms_p90": 1000.0 * size[int(0.9 * len(size))]}


def simulation_args(doc: str) -> argparse.Namespace:
    """A simulation's options: --seconds of each run, --seeds, --out (a folder)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    return ap.parse_args()


def main() -> None:
    args = simulation_args(__doc__)
    rows: dict[str, Any] = {}
    for name, kw in CASES.items():
        rows[name] = {"timer (20 Hz)": case(args.seconds, args.seeds, False, **kw),
                      "on the beat": case(args.seconds, args.seeds, True, **kw)}
        print(name, json.dumps(rows[name]), flush=True)
    write_simulated(args.out / "cadence-sim.json", args.seconds, args.seeds,
                    "simulated counter and reads (no GPU, no threads): the schedule's "
                    "figures alone; reads_per_s is the median over seeds, lags and "
                    "dating errors pooled (dated: the time the sampler gives each change; "
                    "on the timer the read's end, bracket_middle what a dear counter "
                    "without a beat now gets), "
                    "merged_reads and on_the_beat_at_the_end summed over seeds", cases=rows)


def write_simulated(path: Path, seconds: float, seeds: int, note: str, **rows: Any) -> None:
    """A simulation's result file: its commit, source `simulated`, its runs and rows."""
    result = {"commit": project_commit(), "source": "simulated", "seconds_each": seconds,
              "seeds": seeds, "note": note, **rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(path)


if __name__ == "__main__":
    main()
