"""What one reading of a kernel counter file costs: `/proc/stat` (the CPU
estimate's counter, read up to 100 times a second on the sampler thread) and,
where readable, RAPL's `energy_uj`, each read as before (`Path.read_text()`:
open, decode all of it, close) and as now (telemetry.kernelfile: kept open,
one `pread` of its first bytes), in turns.

Per read: wall time and the process's CPU time (reads back to back, the
medians of the rounds).

    python -m bench.kernel_reads [--reads 20000] [--rounds 3]
        ->  bench/results/kernel-reads.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.provenance import project_commit
from telemetry.kernelfile import KernelFile
from telemetry.rapl import POWERCAP

ROOT = Path(__file__).resolve().parent.parent
PROC_STAT = Path("/proc/stat")


def _before(path: Path) -> Callable[[], object]:
    if path == PROC_STAT:
        return lambda: path.read_text().split("\n", 1)[0]
    return lambda: int(path.read_text())


def _now(path: Path) -> tuple[Callable[[], object], Callable[[], None]]:
    f = KernelFile(path, 1024 if path == PROC_STAT else 64)
    if path == PROC_STAT:
        return (lambda: f.head().partition(b"\n")[0]), f.close
    return (lambda: int(f.head())), f.close


def _one(read: Callable[[], object], reads: int) -> dict[str, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(reads):
        read()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"wall_us": round(wall / reads * 1e6, 2), "cpu_us": round(cpu / reads * 1e6, 2)}


def measure(path: Path, reads: int, rounds: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {"read_text (before)": [],
                                               "kept open, pread (now)": []}
    now, close = _now(path)
    try:
        for _ in range(rounds):
            runs["read_text (before)"].append(_one(_before(path), reads))
            runs["kept open, pread (now)"].append(_one(now, reads))
    finally:
        close()
    return {"file": str(path), "bytes": len(path.read_bytes()),
            "medians": {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
                        for name, rs in runs.items()},
            "rounds": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reads", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "kernel-reads.json")
    args = ap.parse_args()
    files = [PROC_STAT]
    rapl = POWERCAP / "intel-rapl:0" / "energy_uj"
    try:
        rapl.read_text()
        files.append(rapl)
    except OSError:
        pass  # not readable here (most VMs; root only on most hosts)
    out = {"commit": project_commit(), "reads_per_round": args.reads, "rounds": args.rounds,
           "files": [measure(f, args.reads, args.rounds) for f in files]}
    if len(files) == 1:
        out["rapl"] = "not readable on this machine"
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for f in out["files"]:
        for name, m in f["medians"].items():
            print(f"{f['file']:<40} {name:<24} {m}")


if __name__ == "__main__":
    main()
