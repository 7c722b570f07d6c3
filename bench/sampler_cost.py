"""What the energy sampler's reads cost at each rate it reads: the CPU share
of one sampler thread with nothing else running, reads a second, the mean
read, and how often the counter changed.

    python -m bench.sampler_cost [--seconds 8] [--rounds 2] [--nvml 0] [--out DIR]
        -> DIR/sampler-cost-<source>.json (DIR: bench/results)

Rates, in turns: `hz` 20 on the timer (the rate under load before the
counter's beat was learned); the quiet rate on the timer (hz 20, quiet_hz
100, held to reads that take at most 2% of the time: telemetry/sampler.py);
as shipped, where a counter that dear is read on its beat instead
(telemetry/cadence.py; the CPU estimate's reads are cheap, so it stays on
the timer); and 100 Hz flat, what the quiet rate read before the hold.
Each run's figures start once the beat is learned (about half a second of
reads back to back, reported apart as start_s and start_reads). With
`--nvml N` the counter is GPU N's through NVML; without, the CPU estimate
(/proc/stat). Then, in turns, how late each counter step is seen on the timer and on the
beat, and how far off the time the sampler gives each change is, against the
steps of a steady beat fitted to the main thread's back-to-back reads before
and after each run (the CPU estimate has no beat: no figures). Needs only the
standard library (and pynvml for --nvml).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

from bench.cadence_sim import error_figures
from bench.provenance import project_commit
from telemetry.cadence import LEARN_FOR_S, MIN_BEAT_S
from telemetry.ledger import Ledger
from telemetry.reader import EnergyReader, Reading
from telemetry.sampler import Sampler

ROOT = Path(__file__).resolve().parent.parent
RATES: dict[str, tuple[float, float | None, bool]] = {  # (hz, quiet_hz, on_beat)
    "hz 20 on the timer (under load, before the beat)": (20.0, None, False),
    "quiet on the timer (hz 20, quiet_hz 100, held to cheap reads)": (20.0, 100.0, False),
    "as shipped (quiet, and a dear counter read on its beat)": (20.0, 100.0, True),
    "100 Hz flat (the quiet rate before the hold)": (100.0, None, False),
}
REFERENCE_S = 2.0  # back-to-back reads before and after each lag run


class _Kept:
    """The reader, left open when a sampler stops."""

    def __init__(self, reader: EnergyReader) -> None:
        self._reader = reader
        self.source, self.name = reader.source, reader.name

    def read(self) -> Reading:
        return self._reader.read()

    def close(self) -> None:
        return None


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(reader: EnergyReader, source: str, seconds: float,
            rate: tuple[float, float | None, bool]) -> dict[str, float]:
    """One sampler on `reader` for `seconds` after its start (the beat's
    learning: up to LEARN_FOR_S, counted apart), no request open (quiet)."""
    sampler = Sampler(_Kept(reader), Ledger(source), hz=rate[0], quiet_hz=rate[1],
                      on_beat=rate[2])
    t_start = time.monotonic()
    sampler.start()
    _learned(sampler)
    learning_s, learning_reads = time.monotonic() - t_start, sampler.reads
    cpu0, t0, reads0, n0 = _cpu_s(), time.monotonic(), sampler.reads, len(sampler.samples)
    read_s0 = sampler.read_seconds
    time.sleep(seconds)
    wall, cpu = time.monotonic() - t0, _cpu_s() - cpu0
    reads, read_s = sampler.reads - reads0, sampler.read_seconds - read_s0
    sampler.stop()  # closes the _Kept, not the reader: the next rate reads it too
    counters = [s.counter_j for s in list(sampler.samples)[max(0, n0 - 1):]]
    changes = sum(1 for a, b in itertools.pairwise(counters) if b != a)
    return {"cpu_percent": 100.0 * cpu / wall, "reads_per_s": reads / wall,
            "read_ms_mean": 1000.0 * read_s / max(1, reads),
            "counter_changes_per_s": changes / wall, "quiet_period_ms":
            1000.0 * sampler.quiet_period_s(),
            "reads_per_change": reads / max(1, changes),
            "on_beat": float(sampler.cadence.state == "locked"),
            "beat_ms": 1000.0 * (sampler.cadence.beat_s or 0.0),
            "start_s": learning_s, "start_reads": float(learning_reads)}


def _learned(sampler: Sampler) -> None:
    """Waits for the sampler's start: a dear counter's beat learned (or given
    up: LEARN_FOR_S), a cheap one's first reads."""
    stop = time.monotonic() + LEARN_FOR_S + 0.5
    time.sleep(0.2)
    while time.monotonic() < stop and sampler.slow() and sampler.cadence.state != "locked":
        time.sleep(0.05)


def _steps(reader: EnergyReader, seconds: float) -> list[float]:
    """The counter's steps, read back to back by this thread alone for
    `seconds`: each placed at the middle of the two reads around it."""
    reads: list[tuple[float, float, float]] = []  # (start, end, counter_j)
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        start = time.monotonic()
        counter_j = reader.read().counter_j
        reads.append((start, time.monotonic(), counter_j))
    return [(a[0] + b[1]) / 2 for a, b in itertools.pairwise(reads) if b[2] != a[2]]


def _beat_fit(before: list[float], after: list[float]) -> tuple[float, float] | None:
    """(phase, beat) of a counter that steps on a steady beat, fitted by least
    squares to the steps seen before and after a run: each step's number
    counted from the first by the beat the first stretch shows."""
    if len(before) < 3 or len(after) < 3:
        return None
    beat0 = statistics.median(b - a for a, b in itertools.pairwise(before))
    ks = [round((t - before[0]) / beat0) for t in before]
    beat1 = (before[-1] - before[0]) / max(1, ks[-1])  # sharper, for counting on
    ks += [round((t - before[0]) / beat1) for t in after]
    ts = before + after
    k_mean, t_mean = statistics.fmean(ks), statistics.fmean(ts)
    beat = sum((k - k_mean) * (t - t_mean) for k, t in zip(ks, ts, strict=True)) / sum(
        (k - k_mean) ** 2 for k in ks)
    return t_mean - beat * k_mean, beat


def lag(reader: EnergyReader, seconds: float, on_beat: bool) -> dict[str, float]:
    """How late the sampler (hz 20, quiet_hz 100) sees each counter step and how
    far off the time it gives each change is. The steps are placed by this
    thread's back-to-back reads for REFERENCE_S before the sampler starts and
    after it stops (not during it: with both reading at once, an H100 run saw
    steps later than a 50 ms timer can), a steady beat fitted to them and
    counted on through the run; a counter without a steady beat (the CPU
    estimate) gets no figures (-1)."""
    before = _steps(reader, REFERENCE_S)
    sampler = Sampler(_Kept(reader), Ledger("lag"), hz=20.0, quiet_hz=100.0, on_beat=on_beat)
    sampler.start()
    _learned(sampler)
    n0 = len(sampler.samples)
    time.sleep(seconds)
    sampler.stop()
    after = _steps(reader, REFERENCE_S)
    fit = _beat_fit(before, after)
    # the fit's residuals: how well a steady beat places each reference step
    residuals = [] if fit is None else sorted(
        abs(t - fit[0] - fit[1] * round((t - fit[0]) / fit[1])) for t in before + after)
    if fit is None or residuals[len(residuals) // 2] > 0.002 or fit[1] < MIN_BEAT_S:
        return {"lag_ms_median": -1.0, "lag_ms_p90": -1.0, "dated_error_ms_mean": -1.0,
                "dated_error_ms_median": -1.0, "dated_error_ms_p90": -1.0,
                "changes_timed": 0.0, "beat_ms": -1.0, "fit_residual_ms_median": -1.0}
    phase, beat = fit
    samples = list(sampler.samples)[max(0, n0 - 1):]
    changes = [b for a, b in itertools.pairwise(samples) if b.counter_j != a.counter_j]
    # each change's step: the last one on the beat before the read that found it
    steps = [phase + beat * math.floor((b.read_t - phase) / beat) for b in changes]
    lags = sorted(b.read_t - st for b, st in zip(changes, steps, strict=True))
    dated = [b.t - st for b, st in zip(changes, steps, strict=True)]
    return {"lag_ms_median": 1000.0 * statistics.median(lags),
            "lag_ms_p90": 1000.0 * lags[int(0.9 * len(lags))],
            **error_figures("dated", dated),
            "changes_timed": float(len(lags)), "beat_ms": 1000.0 * beat,
            "fit_residual_ms_median": 1000.0 * residuals[len(residuals) // 2]}


def _medians(runs: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Each row's fields, the median over its rounds."""
    return {name: {field: statistics.median(r[field] for r in rs) for field in rs[0]}
            for name, rs in runs.items()}


def _reader(nvml: int | None) -> tuple[EnergyReader, str, str]:
    if nvml is None:
        from telemetry.estimate import EstimateReader
        return EstimateReader(idle_power_w=50.0, max_power_w=150.0), "estimate", "cpu"
    from telemetry.nvml import NvmlReader
    reader = NvmlReader(nvml)
    import pynvml
    name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(nvml))
    return reader, "nvml", name if isinstance(name, str) else name.decode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--nvml", type=int, default=None, help="GPU index (default: CPU estimate)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    reader, source, device = _reader(args.nvml)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in RATES}
    for _ in range(args.rounds):  # in turns
        for name, rate in RATES.items():
            runs[name].append(measure(reader, source, args.seconds, rate))
            print(name, runs[name][-1], flush=True)
    lags: dict[str, list[dict[str, float]]] = {"on the timer": [], "on the beat": []}
    for _ in range(args.rounds):  # in turns
        for name in lags:
            lags[name].append(lag(reader, args.seconds, name == "on the beat"))
            print("lag", name, lags[name][-1], flush=True)
    reader.close()
    rows = _medians(runs)
    result: dict[str, Any] = {
        "commit": project_commit(), "source": source, "device": device, "cpu_count": os.cpu_count(),
        "seconds_each": args.seconds, "rounds": args.rounds,
        "note": "one sampler thread, no request open (the quiet case), nothing else "
                "running; cpu_percent is this process's CPU (the thread's) over wall time; "
                "medians of the rounds, in turns",
        "rates": rows, "runs": runs,
        "lag_note": "how long after a counter step the sampler's read that saw it ended "
                    "(lag), and how far off the time it gave the change is (dated_error: "
                    "mean, and median and p90 of its size; on the timer the read's end): "
                    "quiet, hz 20; steps placed by a steady beat fitted to back-to-back "
                    "reads of the main thread for 2 s before and after each run (not during "
                    "it: with both reading at once, an H100 run saw steps later than a 50 ms "
                    "timer can); medians of the rounds",
        "lag": _medians(lags),
        "lag_runs": lags}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"sampler-cost-{source}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(path)


if __name__ == "__main__":
    main()
