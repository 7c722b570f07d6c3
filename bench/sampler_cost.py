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
Each run includes the beat's learning (about half a second of reads back
to back). With
`--nvml N` the counter is GPU N's through NVML; without, the CPU estimate
(/proc/stat). Then, in turns, how late each counter step is seen on the timer and on the
beat, and how far off the time the sampler gives each change is, against the
main thread's back-to-back reads (on the CPU estimate, which changes on
nearly every read, this says little). Needs only the
standard library (and pynvml for --nvml).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

from bench.provenance import project_commit
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
    """One sampler on `reader` for `seconds`, no request open (quiet)."""
    sampler = Sampler(_Kept(reader), Ledger(source), hz=rate[0], quiet_hz=rate[1],
                      on_beat=rate[2])
    cpu0, t0 = _cpu_s(), time.monotonic()
    sampler.start()
    time.sleep(seconds)
    sampler.stop()  # closes the _Kept, not the reader: the next rate reads it too
    wall, cpu = time.monotonic() - t0, _cpu_s() - cpu0
    counters = [s.counter_j for s in sampler.samples]
    changes = sum(1 for a, b in itertools.pairwise(counters) if b != a)
    return {"cpu_percent": 100.0 * cpu / wall, "reads_per_s": sampler.reads / wall,
            "read_ms_mean": 1000.0 * sampler.read_seconds / max(1, sampler.reads),
            "counter_changes_per_s": changes / wall, "quiet_period_ms":
            1000.0 * sampler.quiet_period_s(),
            "reads_per_change": sampler.reads / max(1, changes),
            "on_beat": float(sampler.cadence.state == "locked"),
            "beat_ms": 1000.0 * (sampler.cadence.beat_s or 0.0)}


def lag(reader: EnergyReader, seconds: float, on_beat: bool) -> dict[str, float]:
    """How late the sampler sees each counter step: the main thread reads the
    counter back to back (the reference: each step bracketed by two of its
    reads, placed at their middle) while the sampler (hz 20, quiet_hz 100) runs.
    The reference's reads compete with the sampler's, so no CPU is reported."""
    sampler = Sampler(_Kept(reader), Ledger("lag"), hz=20.0, quiet_hz=100.0, on_beat=on_beat)
    sampler.start()
    time.sleep(1.0)  # the beat learned, where it is
    reference: list[tuple[float, float, float]] = []  # (start, end, counter_j)
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        start = time.monotonic()
        counter_j = reader.read().counter_j
        reference.append((start, time.monotonic(), counter_j))
    sampler.stop()
    # each value the counter stepped to -> when (between the two reads around it)
    step_at = {b[2]: (a[0] + b[1]) / 2 for a, b in itertools.pairwise(reference) if b[2] != a[2]}
    changes = [b for a, b in itertools.pairwise(list(sampler.samples))
               if b.counter_j != a.counter_j and b.counter_j in step_at
               and b.read_t < reference[-1][0]]
    lags = sorted(b.read_t - step_at[b.counter_j] for b in changes)
    dated = [b.t - step_at[b.counter_j] for b in changes]  # the span ends the ledger gets
    size = sorted(abs(e) for e in dated)
    return {"lag_ms_median": 1000.0 * statistics.median(lags) if lags else -1.0,
            "lag_ms_p90": 1000.0 * lags[int(0.9 * len(lags))] if lags else -1.0,
            "dated_error_ms_mean": 1000.0 * statistics.fmean(dated) if dated else -1.0,
            "dated_error_ms_median": 1000.0 * statistics.median(size) if size else -1.0,
            "dated_error_ms_p90": 1000.0 * size[int(0.9 * len(size))] if size else -1.0,
            "changes_timed": float(len(lags)),
            "reference_read_ms": 1000.0 * statistics.median(e - s for s, e, _ in reference)}


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
                    "quiet, hz 20; steps placed by back-to-back reads of the main thread; "
                    "medians of the rounds",
        "lag": _medians(lags),
        "lag_runs": lags}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"sampler-cost-{source}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(path)


if __name__ == "__main__":
    main()
