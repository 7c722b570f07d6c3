"""Which of the gateway's own parts make its one-connection tail: copies of
this checkout with a part taken out, beside the bare pass-through
(bench/passthrough.py), in turns in front of the same fixed-answer nginx
(bench.gateways), wrk at `--connections` (1 unless told). Each one's p50 and
p99 (medians of the rounds), req/s and CPU per request.

    python -m bench.tail_parts [--rounds 3 --seconds 5 --connections 1]
        ->  bench/results/tail-parts.json (--out to write elsewhere)

The copies are measurements, not configurations: `as is`; without all the
bookkeeping after the answer (bench/without.py's part: usage row, journal,
metrics, the final figure's wait); that and without the sampler thread
(the energy counter is never read, so no counter step is settled); that and
the garbage collector off. On a machine with 8 cores or more the gateways
run on cores 0-1, nginx on 6 and wrk on 7 (bench.gateways --pin), so that
the client's and the upstream's noise stays out of the tail.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from app.tools.embedded import free_port
from bench.ab import MESSAGES, measure_gateway, median_of
from bench.gateways import joulegate, passthrough, start_nginx, stop_nginx
from bench.gpu_common import project_commit
from bench.without import PARTS, patched_copy
from workers.local import ROOT

Patch = tuple[str, str, str]  # file, exact text, what replaces it
GC_OFF: Patch = ("app/cli.py", "    if args.workers <= 1:\n",
                 "    if args.workers <= 1:\n        import gc; gc.disable()\n")
NO_SAMPLER: Patch = ("app/factory.py",
                     "    samplers = start_samplers(devices, settings.sample_hz, "
                     "settings.sample_hz_quiet,\n"
                     "                              defer_settling=True)",
                     "    samplers = []")
BOOKKEEPING = PARTS["all bookkeeping"]
VARIANTS: dict[str, list[Patch]] = {
    "as is": [],
    "without bookkeeping": BOOKKEEPING,
    "without bookkeeping and the sampler": [*BOOKKEEPING, NO_SAMPLER],
    "without bookkeeping, the sampler and GC": [*BOOKKEEPING, NO_SAMPLER, GC_OFF],
}
FLOOR = "FastAPI pass-through"
SKIP = shutil.ignore_patterns(".git", ".venv", ".cache", ".whl", ".tools", ".llama", ".data",
                              "results")


def summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    def med(rs: list[dict[str, Any]], field: str) -> float | None:
        value = median_of(rs, field)
        return None if value is None else round(value, 4)

    floor = med(runs[FLOOR], "p99_ms")
    out = {}
    for name, rs in runs.items():
        p99 = med(rs, "p99_ms")
        out[name] = {"p50_ms": med(rs, "p50_ms"), "p99_ms": p99,
                     "p99_over_passthrough": round(p99 / floor, 3) if p99 and floor else None,
                     "req_per_s": med(rs, "req_per_s"),
                     "cpu_ms_per_request": med(rs, "cpu_ms_per_request"),
                     "failed_runs": sum("error" in r for r in rs)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--connections", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "tail-parts.json")
    args = ap.parse_args()
    pinned = len(os.sched_getaffinity(0)) >= 8
    cores, nginx_cores, wrk_cores = ({0, 1}, {6}, {7}) if pinned else (None, None, None)
    work = Path(tempfile.mkdtemp(prefix="joulegate-tail-parts-"))
    roots = {name: patched_copy(ROOT, work / f"v{i}", patches, name, SKIP)
             for i, (name, patches) in enumerate(VARIANTS.items())}
    upstream = start_nginx(work, nginx_cores)
    starts: dict[str, Callable[[int], subprocess.Popen[bytes]]] = {
        name: partial(joulegate, upstream=upstream, work=work, root=root, cores=cores)
        for name, root in roots.items()}
    starts[FLOOR] = partial(passthrough, upstream=upstream, work=work, cores=cores)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in starts}
    body = {"model": "small", "messages": MESSAGES}
    try:
        for i in range(args.rounds):
            order = list(starts) if i % 2 == 0 else list(reversed(starts))
            for name in order:
                port = free_port()
                runs[name].append(measure_gateway(starts[name](port), port, work, args.seconds,
                                                  args.connections, body, wrk_cores))
                print(i, name, runs[name][-1], flush=True)
    finally:
        stop_nginx(work)
    result = {"commit": project_commit(), "machine": f"{os.cpu_count()} cores",
              "pinned": pinned, "rounds": args.rounds, "seconds": args.seconds,
              "case": f"forced small tier, non-streamed, wrk -t1 -c{args.connections}",
              "runs": runs, "summary": summary(runs)}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, s in result["summary"].items():
        print(f"{name:42s} p50 {s['p50_ms']} p99 {s['p99_ms']} ({s['p99_over_passthrough']}x) "
              f"{s['req_per_s']} req/s {s['cpu_ms_per_request']} ms CPU")


if __name__ == "__main__":
    main()
