"""The gateway and the bare pass-through under each Python interpreter, in
turns: what a newer CPython (faster asyncio, the interpreter's own work)
does to joulegate's cost per request and to its ratio to the pass-through.

    python -m bench.interpreters --python /path/to/venv312/bin/python \\
        [--python ...] [--rounds 3 --seconds 6 --connections 50 --model small]
        -> bench/results/interpreters-c<N>.json

This checkout's interpreter is always one of them; each `--python` is another
environment with the project installed (`python3.12 -m venv v && v/bin/pip
install -e .`). Each round measures every interpreter's gateway, then its
pass-through, in front of the same fixed-answer nginx (bench/gateways.py),
the interpreters' order turning each round.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from app.tools.embedded import free_port
from bench.ab import FIELDS, MESSAGES, measure_gateway, median_of
from bench.gateways import joulegate, passthrough, start_nginx, stop_nginx
from bench.provenance import project_commit
from workers.local import ROOT


def version(python: str) -> str:
    return subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True, check=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", action="append", default=[], help="another interpreter")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--model", default="small", help="small (a forced tier) or auto")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    pythons = {version(p): p for p in [sys.executable, *args.python]}
    body = {"model": args.model, "messages": MESSAGES}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        v: {"joulegate": [], "passthrough": []} for v in pythons}
    work = Path(tempfile.mkdtemp(prefix="joulegate-interp-"))
    upstream = start_nginx(work)
    try:
        order = list(pythons)
        for i in range(args.rounds):
            for v in order[i % len(order):] + order[:i % len(order)]:
                for name in ("joulegate", "passthrough"):
                    port = free_port()
                    proc = joulegate(port, upstream, work, python=[pythons[v]]) \
                        if name == "joulegate" else \
                        passthrough(port, upstream, work, python=pythons[v])
                    runs[v][name].append(measure_gateway(proc, port, work, args.seconds,
                                                         args.connections, body))
                    print(v, name, runs[v][name][-1], flush=True)
    finally:
        stop_nginx(work)
        shutil.rmtree(work, ignore_errors=True)
    summary: dict[str, Any] = {}
    for v, rs in runs.items():
        row: dict[str, Any] = {f"{name}_{field}_median": median_of(rs[name], field)
                               for name in rs for field in FIELDS}
        ratios = [j["req_per_s"] / p["req_per_s"]
                  for j, p in zip(rs["joulegate"], rs["passthrough"], strict=True)
                  if j["req_per_s"] and p["req_per_s"]]
        row["req_per_s_ratio_median"] = statistics.median(ratios) if ratios else None
        row["failed_runs"] = sum("error" in r for r in rs["joulegate"] + rs["passthrough"])
        summary[v] = row
        print(v, json.dumps(row), flush=True)
    result = {"commit": project_commit(), "rounds": args.rounds, "seconds": args.seconds,
              "case": f"model {args.model}, non-streamed, wrk -t1 -c{args.connections}",
              "note": "each interpreter's gateway and pass-through in turns; the ratio is "
                      "joulegate's req/s over its own interpreter's pass-through's, median "
                      "of the rounds",
              "summary": summary, "runs": runs}
    out = args.out or ROOT / "bench" / "results" / f"interpreters-c{args.connections}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(out)


if __name__ == "__main__":
    main()
